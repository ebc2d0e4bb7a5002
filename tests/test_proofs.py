"""Issue 58: a CUDA wheel carries the proof of the GPU it ran on.

No GPU is here. The wheel is FAKE (tests/fakes.py: a zip with a CUDA build manifest, its smoke report
bound to its bytes), and each proof is made by `prove`'s own writer (builder.proof.finish) from a
RECORDED set of results: the checks and node facts of an H200 run (issue 56's numbers). The node
installer runs for real, asked of a FAKE node Python that reports an H200 (compute capability 9.0)
or an A100 (8.0); `prove` itself runs for real here, and refuses: torch sees no GPU.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from browser import NO_BROWSER, chromium
from fakes import NAME, fake_wheel

from builder import node
from builder.cli import main
from builder.contracts import PROOF_TYPE, Check, Gpu, GpuFacts, Proof
from builder.errors import SmokeError
from builder.files import sha256_of
from builder.proof import facts_of, finish, proof_path, sign_proof
from builder.wheelhouse import publish, verify
from builder.wheelhouse.layout import load_manifest
from builder.wheelhouse.page import PAGE

ROOT = Path(__file__).resolve().parents[1]
CUDA_NAME = "deepspeed-0.19.8+cu130.torch2.11-cp311-cp311-linux_x86_64.whl"
CUDA_BUILD: dict[str, Any] = {
    "recipe": {"name": "cu130", "torch": "2.11.0"},
    "accelerator": "cuda",
    "torch": {"version": "2.11.0+cu130", "cuda": "13.0"},
    "archs": ["9.0"],
    "ops": ["cpu_adam", "fused_adam", "quantizer"],
    "op_archs": {"cpu_adam": [], "fused_adam": ["9.0"], "quantizer": ["9.0"]},  # cpu_adam: host code only
}
H200 = GpuFacts((Gpu("NVIDIA H200", "9.0", 143771),), "580.95.05", "13.0", "2.11.0+cu130", "2.28.9", "3.11.9",
                "gpu-node-1")  # fmt: skip
# RECORDED: what the checks said on an H200 node (issue 56), the CUDA ops' numbers included.
CHECKS = (
    Check("torch", "passed", "torch 2.11.0+cu130, CUDA 13.0, 1 GPU"),
    Check("load:cpu_adam", "passed", "loaded from the wheel, no JIT"),
    Check("load:fused_adam", "passed", "loaded from the wheel, no JIT"),
    Check("load:quantizer", "passed", "loaded from the wheel, no JIT"),
    Check("numerics:cpu_adam", "passed", "max abs diff 7.2e-07 against torch.optim.Adam"),
    Check("numerics:fused_adam", "passed", "max abs diff 1.2e-07 against torch.optim.AdamW on cuda"),
    Check("numerics:quantizer", "passed", "int8 round trip within one step of torch's rounding per group"),
    Check("no-jit", "passed", "TORCH_EXTENSIONS_DIR is empty"),
    Check("dist:nccl", "passed", "torchrun 1 node x 1 GPU processes: all_reduce and barrier OK, NCCL 2.28.9"),
    Check("config:adamw/zero2/none/bf16", "passed", "ran 3 steps; ops fused_adam"),
    Check("config:adagrad/zero0/none/fp16", "upstream", "DeepSpeed's own failure, not the wheel's: KeyError: 'sum'"),
)


def cuda_house(tmp_path: Path) -> tuple[Path, Path]:
    """A wheelhouse holding one FAKE CUDA wheel (sm_90 only), published as build-wheel publishes."""
    dist = tmp_path / "dist"
    dist.mkdir()
    wheel = fake_wheel(dist, name=CUDA_NAME, **CUDA_BUILD)
    house = tmp_path / "house"
    publish([wheel], house)
    return house, wheel


def write_proof(tmp_path: Path, wheel: Path, checks: tuple[Check, ...] = CHECKS, facts: GpuFacts = H200,
                sha256: str | None = None) -> Path:  # fmt: skip
    """A proof as `prove` writes it (its writer, finish), from RECORDED results; SmokeError is what prove
    raises for a failed one, after writing it."""
    dest = tmp_path / "node"
    proof = Proof(wheel.name, sha256 or sha256_of(wheel), facts, checks, "2026-11-28T03:00:00Z",
                  "2026-11-28T03:01:50Z", 110.0, "ds-wheel-builder 0.2.0", "https://wheels.example/house")  # fmt: skip
    try:
        finish(proof, dest, tmp_path / "prove.log")
    except SmokeError as exc:  # the proof is written before a failure is raised
        assert "failed on this node's GPUs" in str(exc)
    return proof_path(dest, wheel.name)


def state(house: Path) -> tuple[bytes, list[str]]:
    return (house / "manifest.json").read_bytes(), sorted(p.name for p in house.iterdir())


def test_a_proof_is_an_in_toto_statement_bound_to_the_wheel(tmp_path: Path) -> None:
    _, wheel = cuda_house(tmp_path)
    path = write_proof(tmp_path, wheel)
    data = json.loads(path.read_text())
    assert data["_type"] == "https://in-toto.io/Statement/v1" and data["predicateType"] == PROOF_TYPE
    assert data["subject"] == [{"name": CUDA_NAME, "digest": {"sha256": sha256_of(wheel)}}]
    predicate = data["predicate"]
    assert predicate["gpus"] == [{"name": "NVIDIA H200", "capability": "9.0", "memory_mib": 143771}]
    assert (predicate["driver"], predicate["cuda"], predicate["torch"], predicate["nccl"]) == (
        "580.95.05", "13.0", "2.11.0+cu130", "2.28.9")  # fmt: skip
    assert predicate["passed"] is True and len(predicate["checks"]) == len(CHECKS)
    assert {"name": "numerics:fused_adam", "status": "passed",
            "detail": "max abs diff 1.2e-07 against torch.optim.AdamW on cuda"} in predicate["checks"]  # fmt: skip
    assert Proof.from_json(path.read_bytes(), str(path)).facts == H200
    assert oct(path.stat().st_mode & 0o777) == "0o644"  # copied to the build host by anyone


def test_a_good_proof_is_signed_in_shown_verified_and_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    house, wheel = cuda_house(tmp_path)
    page = (house / PAGE).read_text()
    assert "not proven on a GPU" in page
    path = write_proof(tmp_path, wheel)
    assert main(["publish", "--wheelhouse", str(house), "--proof", str(path)]) == 0
    entry = load_manifest(house).wheels[CUDA_NAME]  # read through its signature
    (proof,) = entry.proofs
    assert proof.name == node.proof_name(CUDA_NAME, sha256_of(path)) and proof.capabilities == ("9.0",)
    assert (house / proof.name).read_bytes() == path.read_bytes()
    assert proof.describe() == "proven on NVIDIA H200 (9.0), driver 580.95.05, CUDA 13.0, torch 2.11.0, on 2026-11-28"
    assert proof.describe() in (house / PAGE).read_text()
    assert verify(house) == []
    capsys.readouterr()
    assert main(["verify", "--wheelhouse", str(house)]) == 0
    # A second node's proof (another H200 box; an A100 one would be refused for this sm_90 wheel) is kept too.
    other = write_proof(tmp_path / "second", wheel, facts=dataclasses.replace(H200, host="gpu-node-2",
                                                                             driver="580.82.07"))  # fmt: skip
    assert main(["publish", "--wheelhouse", str(house), "--proof", str(other)]) == 0
    assert len(load_manifest(house).wheels[CUDA_NAME].proofs) == 2
    assert main(["publish", "--wheelhouse", str(house), "--proof", str(other)]) == 0  # the same file again: one entry
    assert len(load_manifest(house).wheels[CUDA_NAME].proofs) == 2
    assert verify(house) == []


@pytest.mark.parametrize("case", ["wrong-sha256", "edited", "failed-op", "sm80-on-sm90", "no-gpu-check", "other-wheel",
                                  "a-cpu-wheel", "version-2", "not-json", "deep", "fifo"])  # fmt: skip
def test_a_bad_proof_is_refused_by_name_and_nothing_is_written(tmp_path: Path, case: str,
                                                               capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    house, wheel = cuda_house(tmp_path)
    path, said = _bad_proof(tmp_path, house, wheel, case)
    before = state(house)
    capsys.readouterr()
    assert main(["publish", "--wheelhouse", str(house), "--proof", str(path)]) == 7
    err = capsys.readouterr().err
    assert said in err, err
    assert state(house) == before  # nothing written, the signed manifest as it was
    assert verify(house) == []


def _bad_proof(tmp_path: Path, house: Path, wheel: Path, case: str) -> tuple[Path, str]:
    """Each hostile proof and the words its refusal must hold."""
    if case == "wrong-sha256":
        return write_proof(tmp_path, wheel, sha256="ab" * 32), "not of the " + CUDA_NAME
    if case == "edited":  # a failure turned into a pass by hand after prove wrote it
        path = write_proof(tmp_path, wheel, checks=(*CHECKS[:5], Check("numerics:fused_adam", "failed", "diff 3.1"),
                                                    *CHECKS[6:]))  # fmt: skip
        data = json.loads(path.read_text())
        for c in data["predicate"]["checks"]:
            if c["name"] == "numerics:fused_adam":
                c.update(status="passed", detail="max abs diff 1.2e-07")
        data["predicate"]["passed"] = True
        path.write_text(json.dumps(data, indent=2))
        return path, "was changed after `prove` wrote it"
    if case in ("failed-op", "no-gpu-check"):  # no-gpu-check: a CPU host's smoke, nothing computed on a GPU
        status, detail = (("failed", "max abs diff 3.1 against torch.optim.AdamW") if case == "failed-op" else
                          ("skipped", "no GPU visible: fused_adam computes on CUDA tensors"))  # fmt: skip
        checks = tuple(Check(c.name, status, detail) if c.name == "numerics:fused_adam" else c for c in CHECKS)
        said = ("the wheel's own checks failed on the GPU: numerics:fused_adam" if case == "failed-op" else
                "what CUDA op fused_adam computes was not checked on the GPU")  # fmt: skip
        return write_proof(tmp_path, wheel, checks=checks), said
    if case == "sm80-on-sm90":
        a100 = dataclasses.replace(H200, gpus=(Gpu("NVIDIA A100-SXM4-80GB", "8.0", 81920),))
        return write_proof(tmp_path, wheel, facts=a100), "ran on compute capability 8.0 (NVIDIA A100-SXM4-80GB), which"
    if case == "other-wheel":
        other = fake_wheel(tmp_path, name=CUDA_NAME.replace("0.19.8", "0.19.9"), **CUDA_BUILD)
        return write_proof(tmp_path, other), "which " + str(house) + " does not hold"
    if case == "a-cpu-wheel":
        (tmp_path / "cpu").mkdir()
        cpu = fake_wheel(tmp_path / "cpu")
        publish([cpu], house)
        return write_proof(tmp_path, cpu), "is a CPU wheel"
    path = write_proof(tmp_path, wheel)
    if case == "version-2":
        data = json.loads(path.read_text())
        data["predicateType"] = PROOF_TYPE.replace(":v1", ":v2")
        path.write_text(json.dumps(data))
        return path, "a version this toolkit does not read"
    if case == "not-json":
        path.write_bytes(b"\xff\xfe not json")
        return path, "is not UTF-8"
    if case == "deep":
        path.write_text("[" * 100_000 + "]" * 100_000)
        return path, "is not valid JSON"
    fifo = tmp_path / "proof.fifo"
    os.mkfifo(fifo)
    return fifo, "cannot read the proof"


def test_a_proof_changed_in_the_wheelhouse_fails_verify(tmp_path: Path) -> None:
    house, wheel = cuda_house(tmp_path)
    assert main(["publish", "--wheelhouse", str(house), "--proof", str(write_proof(tmp_path, wheel))]) == 0
    (proof,) = load_manifest(house).wheels[CUDA_NAME].proofs
    kept = (house / proof.name).read_bytes()
    (house / proof.name).write_bytes(kept.replace(b"580.95.05", b"999.99.99"))
    assert f"{proof.name}: sha256 differs from manifest.json" in verify(house)
    (house / proof.name).unlink()
    assert f"{proof.name}: missing" in verify(house)
    (house / proof.name).write_bytes(kept)
    assert verify(house) == []


def test_a_publish_killed_midway_leaves_no_proof_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    publishing = importlib.import_module("builder.wheelhouse.publish")

    house, wheel = cuda_house(tmp_path)
    before = state(house)

    def killed(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt  # as Ctrl-C between the copy and the signed manifest

    monkeypatch.setattr(publishing, "commit", killed)
    with pytest.raises(KeyboardInterrupt):
        publishing.take_in_proofs(house, [write_proof(tmp_path, wheel)])
    assert state(house) == before and verify(house) == []


def test_pruning_a_wheel_removes_its_proofs(tmp_path: Path) -> None:
    from builder.wheelhouse import prune

    house, wheel = cuda_house(tmp_path)
    publish([fake_wheel(tmp_path)], house)  # a CPU wheel stays, so the wheelhouse is not emptied
    assert main(["publish", "--wheelhouse", str(house), "--proof", str(write_proof(tmp_path, wheel))]) == 0
    (proof,) = load_manifest(house).wheels[CUDA_NAME].proofs
    assert CUDA_NAME in prune(house, ["cpu"], set(), dry_run=False)
    assert not (house / proof.name).exists() and verify(house) == []


def fake_node_python(tmp_path: Path, gpus: list[str]) -> Path:
    """A FAKE node Python: whatever it is asked, it answers the node probe with a CUDA 13.0 torch and
    these GPUs (this machine has none)."""
    script = tmp_path / f"python-{'-'.join(gpus)}"
    probe = {"python_tag": "cp311", "torch": "2.11.0+cu130", "cuda": "13.0", "gpus": gpus, "glibc": "2.36"}
    script.write_text(f"#!/bin/sh\necho '{json.dumps(probe)}'\n")
    script.chmod(0o755)
    return script


def install(house: Path, python: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """The node installer as a node runs it (the published file), choosing and checking the wheel (dry run:
    the FAKE wheel is no DeepSpeed to pip-install)."""
    from builder import signing

    return subprocess.run([sys.executable, str(house / node.INSTALLER), "--wheelhouse", str(house), "--python",
                           str(python), "--trust", signing.keys().key().line(), "--dry-run", "--json", *flags],
                          capture_output=True, text=True, check=False,
                          env={**os.environ, "DS_NODE_STATE_DIR": str(house.parent / "node-state")})  # fmt: skip


@pytest.mark.spawns
def test_the_installer_relies_on_the_proof_and_require_gpu_proof_refuses_a_wheel_without_one(tmp_path: Path) -> None:
    house, wheel = cuda_house(tmp_path)
    h200 = fake_node_python(tmp_path, ["9.0"])
    done = install(house, h200, "--require-gpu-proof")
    assert done.returncode == 9, done.stderr
    assert f"{CUDA_NAME} has no GPU proof for this node's compute capability 9.0 (--require-gpu-proof)" in done.stderr
    assert "python -m builder prove --wheelhouse" in done.stderr
    without = install(house, h200)  # without the flag: chosen, with a warning
    assert without.returncode == 0, without.stderr
    assert "is not proven on a GPU of compute capability 9.0" in without.stderr
    assert json.loads(without.stdout)["gpu_proofs"] == []
    assert main(["publish", "--wheelhouse", str(house), "--proof", str(write_proof(tmp_path, wheel))]) == 0
    proven = install(house, h200, "--require-gpu-proof")
    assert proven.returncode == 0, proven.stderr
    (name,) = load_manifest(house).wheels[CUDA_NAME].proofs
    assert json.loads(proven.stdout)["gpu_proofs"] == [name.name]
    assert "==> GPU proof: proven on NVIDIA H200 (9.0), driver 580.95.05, CUDA 13.0, torch 2.11.0" in proven.stderr
    eight = install(house, fake_node_python(tmp_path, ["9.0"] * 8), "--require-gpu-proof")  # 8 GPUs, one kind
    assert eight.returncode == 0, eight.stderr


def test_provision_scripts_and_the_module_command_carry_require_gpu_proof(tmp_path: Path) -> None:
    from builder.node.trust import Trust
    from builder.signing import keys
    from builder.wheelhouse.provision import Host, host_script

    trust = Trust((keys().key(),) if keys().exists() else ())
    assert " --require-gpu-proof" in host_script(Host("n1"), "/w", trust, require_gpu_proof=True)
    assert "--require-gpu-proof" not in host_script(Host("n1"), "/w", trust)
    assert "--require-gpu-proof" in node.parser("module", module_only=True).format_help()


@pytest.mark.spawns
def test_prove_refuses_where_torch_sees_no_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`prove` run for real on this machine (CPU torch, no GPU): exit 3, why, and no proof written."""
    house, _ = cuda_house(tmp_path)
    dest = tmp_path / "proofs"
    code = main(["prove", "--wheelhouse", str(house), "--dest", str(dest), "--work-dir", str(tmp_path / "work")])
    assert code == 3
    err = capsys.readouterr().err
    assert "sees no GPU" in err and "prove runs the CUDA checks on a GPU node" in err
    assert not dest.exists() or not list(dest.iterdir())


def test_the_facts_a_proof_records_are_what_the_node_has() -> None:
    facts = facts_of("2.11.0+cu130", "13.0.48", "2.28.9", [Gpu("NVIDIA H200", "9.0", 143771)] * 8, "580.95.05",
                     "3.12.3", "n1")  # fmt: skip
    assert facts.cuda == "13.0" and len(facts.gpus) == 8
    assert facts.describe() == "8x NVIDIA H200 (9.0), driver 580.95.05, CUDA 13.0, torch 2.11.0"  # what it ran on
    with pytest.raises(Exception, match="NVIDIA driver's version cannot be read"):
        facts_of("2.11.0+cu130", "13.0", None, [Gpu("NVIDIA H200", "9.0", 1)], None, "3.12.3", "n1")


@pytest.mark.spawns
@pytest.mark.skipif(NO_BROWSER is not None, reason=str(NO_BROWSER))
def test_the_page_shows_each_wheels_proof_in_the_browser(tmp_path: Path) -> None:
    house, wheel = cuda_house(tmp_path)
    publish([fake_wheel(tmp_path)], house)
    assert main(["publish", "--wheelhouse", str(house), "--proof", str(write_proof(tmp_path, wheel))]) == 0
    (proof,) = load_manifest(house).wheels[CUDA_NAME].proofs
    with chromium() as driver:
        driver.get((house / PAGE).as_uri())
        rows = {r.get_attribute("data-wheel"): r.text for r in driver.find_elements("css selector", "#targets tr")
                if r.get_attribute("data-wheel")}  # fmt: skip
        link = driver.find_element("css selector", "#targets a.proof")
        href = link.get_attribute("href")
    assert "proven on NVIDIA H200 (9.0), driver 580.95.05, CUDA 13.0, torch 2.11.0, on 2026-11-28" in rows[CUDA_NAME]
    assert "a CPU wheel" in rows[NAME]
    assert href.endswith(proof.name.replace("+", "%2B")) or href.endswith(proof.name)


def test_a_slurm_matrix_takes_in_the_proofs_its_gpu_smoke_jobs_wrote(tmp_path: Path) -> None:
    """The collect job's step after publishing a target: the proofs its GPU smoke jobs left in the run's
    results (RECORDED results here: a GPU smoke job writes them only where it saw a GPU)."""
    from builder.slurm.results import _take_proofs, results_dir

    house, wheel = cuda_house(tmp_path)
    run = tmp_path / "run"
    results_dir(run).mkdir(parents=True)
    assert _take_proofs(run, "cu130-py3.11", house) == ""  # no GPU smoke saw a GPU: nothing to take in
    (results_dir(run) / "cu130-py3.11.proof.h200.json").write_bytes(write_proof(tmp_path, wheel).read_bytes())
    sign_proof(results_dir(run) / "cu130-py3.11.proof.h200.json")  # as the GPU smoke job signs it
    assert _take_proofs(run, "cu130-py3.11", house) == "proven on the GPUs of 1 smoke job(s)"
    assert len(load_manifest(house).wheels[CUDA_NAME].proofs) == 1
    a100 = dataclasses.replace(H200, gpus=(Gpu("NVIDIA A100-SXM4-80GB", "8.0", 81920),))
    (results_dir(run) / "cu130-py3.11.proof.a100.json").write_bytes(
        write_proof(tmp_path / "a100", wheel, facts=a100).read_bytes())  # fmt: skip
    sign_proof(results_dir(run) / "cu130-py3.11.proof.a100.json")
    said = _take_proofs(run, "cu130-py3.11", house)  # the H200 one again (one file, one entry), the A100 one refused
    assert said.startswith("proven on the GPUs of 1 smoke job(s); GPU proof refused:") and "capability 8.0" in said
    assert len(load_manifest(house).wheels[CUDA_NAME].proofs) == 1
    assert verify(house) == []


@pytest.mark.parametrize("dest", ["/etc", "/etc/ds-proofs", "/", "a-file"])
def test_prove_refuses_a_bad_dest_before_anything_runs(tmp_path: Path, dest: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    (tmp_path / "a-file").write_text("not a folder")
    target = dest if dest.startswith("/") else str(tmp_path / dest)
    code = main(["prove", "--wheelhouse", str(tmp_path / "no-house"), "--dest", target,
                 "--work-dir", str(tmp_path / "work")])  # fmt: skip
    assert code == 10
    assert "--dest" in capsys.readouterr().err
    assert (tmp_path / "a-file").read_text() == "not a folder" and not (tmp_path / "work").exists()


@pytest.mark.parametrize(("edit", "said"), [
    (lambda p: p.update(gpus=["NVIDIA H200", "NVIDIA H200"]), "one compute capability per GPU"),
    (lambda p: p.update(sha256="cd" * 32), "not " + CUDA_NAME + ".proof.cdcdcdcdcdcdcdcd.json"),
    (lambda p: p.update(gpus=["NVIDIA H200\\x1b[2J"]), "field 'gpus' holds an invalid item"),
    (lambda p: p.update(driver="580; rm -rf /"), "field 'driver' is not valid"),
])  # fmt: skip
def test_a_nodes_reader_refuses_a_manifests_proof_entry_that_lies(tmp_path: Path, edit: Any, said: str) -> None:
    """The manifest's proof entries as a node reads them (the one contract reader): a tampered one named."""
    house, wheel = cuda_house(tmp_path)
    assert main(["publish", "--wheelhouse", str(house), "--proof", str(write_proof(tmp_path, wheel))]) == 0
    data = json.loads((house / "manifest.json").read_text())
    (entry,) = data["wheels"][CUDA_NAME]["proofs"].values()
    edit(entry)
    with pytest.raises(node.ManifestError, match=re.escape(said)):
        node.parse_manifest(json.dumps(data))


def test_a_gpu_name_is_recorded_in_what_the_proofs_reader_takes() -> None:
    from builder.proof import gpu_name

    assert gpu_name("NVIDIA H100 80GB HBM3") == "NVIDIA H100 80GB HBM3"
    assert gpu_name("NVIDIA® GeForce RTX™ 4090\x1b[2J") == "NVIDIA- GeForce RTX- 4090--2J"
    assert gpu_name("\u2122\u2122") == "unnamed GPU" and len(gpu_name("A" * 300)) == 100


def test_a_wheel_for_two_gpu_types_keeps_a_proof_of_each_and_a_node_relies_on_its_own(tmp_path: Path) -> None:
    """An sm_80 + sm_90 wheel proven on an H100 node and on an A100 node: both kept; the installer of an
    A100 node relies on the A100 proof, and --require-gpu-proof finds it."""
    both = {**CUDA_BUILD, "archs": ["8.0", "9.0"], "op_archs": {"cpu_adam": [], "fused_adam": ["8.0", "9.0"],
                                                                "quantizer": ["8.0", "9.0"]}}  # fmt: skip
    dist = tmp_path / "dist"
    dist.mkdir()
    wheel = fake_wheel(dist, name=CUDA_NAME, **both)
    house = tmp_path / "house"
    publish([wheel], house)
    h100 = dataclasses.replace(H200, gpus=(Gpu("NVIDIA H100 80GB HBM3", "9.0", 81559),) * 8, host="h100-1")
    a100 = dataclasses.replace(H200, gpus=(Gpu("NVIDIA A100-SXM4-80GB", "8.0", 81920),) * 4, host="a100-1")
    proofs = [write_proof(tmp_path / kind, wheel, facts=facts) for kind, facts in (("h", h100), ("a", a100))]
    assert main(["publish", "--wheelhouse", str(house), "--proof", *map(str, proofs)]) == 0
    kept = load_manifest(house).wheels[CUDA_NAME].proofs
    assert sorted(p.describe().split(",")[0] for p in kept) == ["proven on 4x NVIDIA A100-SXM4-80GB (8.0)",
                                                                "proven on 8x NVIDIA H100 80GB HBM3 (9.0)"]  # fmt: skip
    entry = load_manifest(house).wheels[CUDA_NAME]
    a100_node = node.Node("cp311", "2.11.0+cu130", "13.0", ("8.0",) * 4)
    assert [p.host for p in node.proofs_for(entry, a100_node)] == ["a100-1"] and not node.unproven(entry, a100_node)
    assert node.unproven(entry, node.Node("cp311", "2.11.0+cu130", "13.0", ("8.6",))) == ["8.6"]  # sm_80 code runs
    assert verify(house) == []
