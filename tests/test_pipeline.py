"""The whole pipeline for real: build the default recipe, smoke it, publish it, pip-install it.

Slow (a real DeepSpeed build, about 2 minutes on 2 cores, plus fresh venvs with torch).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import venv
import zipfile
from collections.abc import Iterator
from email.parser import Parser
from pathlib import Path

import pytest
from browser import ARTIFACTS, NO_BROWSER, chromium, full_page_screenshot
from fakes import default_recipe_text
from nodes import node_venv

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[1]
VERSION = "0.19.8+cpu.torch2.13"
# The default recipe's floor: compiled in the toolkit's Debian 11 root (gcc 10) with pow pinned, its ops
# need GLIBC_2.17 at most (manylinux_2_24); the wheel takes torch 2.13.0's own floor, manylinux_2_28.
PLATFORM = "manylinux_2_28_x86_64"
WHEEL = f"deepspeed-{VERSION}-cp311-cp311-{PLATFORM}.whl"
OPS = ("cpu_adam", "cpu_adagrad", "cpu_lion", "deepspeed_shm_comm", "fused_adam")
OPTIMIZERS = OPS[:3]  # checked against torch's; shm comm is what the CPU engine loads at init


def builder(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder", *args], cwd=ROOT, capture_output=True, text=True, env=env)


@pytest.fixture(scope="module")
def pipeline(
    workspace: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """`build-wheel` with no recipe (the default), as a new user runs it, into a fresh wheelhouse, with
    a TMPDIR of its own that must be empty after (the test below)."""
    house = tmp_path_factory.mktemp("wheelhouse")
    tmp = tmp_path_factory.mktemp("pipeline-TMPDIR", numbered=False)
    result = builder("build-wheel", "--work-dir", str(workspace), "--wheelhouse", str(house),
                     env={**os.environ, "TMPDIR": str(tmp)})  # fmt: skip
    assert result.returncode == 0, result.stderr[-5000:]
    return house, result


@pytest.fixture(scope="module")
def clean_rebuild(
    pipeline: tuple[Path, subprocess.CompletedProcess[str]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, Path, subprocess.Popen[bytes]]]:
    """A second clean build of the default recipe, in a folder of another name with its own cold
    ccache and without the precompiled torch header (DS_BUILDER_PCH=0), started in the background
    once the first is published: it compiles while the tests below use the wheelhouse (most of them
    wait on processes, not cores), and the reproducibility test reads it. Killed at the module's end
    if it is still running (its compilers die with it)."""
    other = tmp_path_factory.mktemp("rebuild") / "another-work-folder"
    log = other.parent / "build-wheel.log"
    with open(log, "wb") as out:
        argv = [sys.executable, "-m", "builder", "build-wheel", "--work-dir", str(other), "--no-smoke"]
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "DS_BUILDER_PCH": "0"})  # fmt: skip
    yield other, log, proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_build_wheel_leaves_a_smoke_tested_wheel_in_the_wheelhouse(
    pipeline: tuple[Path, subprocess.CompletedProcess[str]],
    workspace: Path,
    clean_rebuild: tuple[Path, Path, subprocess.Popen[bytes]],  # started here, read by the reproducibility test
) -> None:
    house, result = pipeline
    assert [p.name for p in house.glob("deepspeed-*.whl")] == [WHEEL]
    # Nothing left in the temporary folder: the smoke's 91 configs, its engine check and its tiny model
    # left a folder each in /tmp before (8,000 after a day of runs).
    assert sorted(p.name for p in (house.parent / "pipeline-TMPDIR").iterdir()) == []
    # DeepSpeed's runtime closure rides along for air-gapped nodes: everything but torch.
    bundled = {p.name.split("-")[0].lower() for p in house.glob("*.whl")}
    assert {"einops", "hjson", "msgpack", "ninja", "numpy", "psutil", "py_cpuinfo", "pydantic", "tqdm"} <= bundled
    assert not any(name.startswith(("torch", "nvidia")) for name in bundled)
    if f"==> up to date: {WHEEL}" not in result.stderr:  # a kept BUILDER_TEST_WORK_DIR may hold it
        assert f"==> built {WHEEL} in" in result.stderr
        assert "ops:   cpu_adam, cpu_adagrad, cpu_lion, deepspeed_shm_comm, fused_adam" in result.stderr
    # Op units (issue 21): each op compiled by a setup.py run of its own, its log named in the build
    # record; the wheel assembled from them is the one a single run makes (checked on real wheels).
    record = json.loads((workspace / "dist" / f"{WHEEL}.build.json").read_text())
    assert sorted(record["units"]) == sorted(OPS)
    if f"==> up to date: {WHEEL}" not in result.stderr:
        # Issue 39: one torch header for the CPU optimizers' flag set (7 sources), used by each of
        # their sources compiled now (a unit another test built is cached), none compiled without it.
        built = {op for op, unit in record["units"].items() if unit["status"] == "built"}
        sources = sum(n for op, n in {"cpu_adam": 2, "cpu_lion": 2, "cpu_adagrad": 1, "fused_adam": 2}.items()
                      if op in built)  # fmt: skip
        if sources:
            assert record["precompiled_header"]["used"] == sources, record["precompiled_header"]
            assert record["precompiled_header"]["fallbacks"] == []
    logs = {op: Path(unit["log"]).read_text() for op, unit in record["units"].items()}
    for op, text in logs.items():  # setup.py's Install Ops= line: that op alone
        said = [line for line in text.splitlines() if line.startswith("Install Ops=")]
        assert said and all(f"'{op}': 1" in line and line.count("': 1") == 1 for line in said), said

    with zipfile.ZipFile(house / WHEEL) as zf:
        names = zf.namelist()
        for op_dir, op in (
            ("adam", "cpu_adam"),
            ("adagrad", "cpu_adagrad"),
            ("lion", "cpu_lion"),
            ("comm", "deepspeed_shm_comm"),
            ("adam", "fused_adam"),
        ):
            assert any(n.startswith(f"deepspeed/ops/{op_dir}/{op}_op.") and n.endswith(".so") for n in names)
        installed = zf.read("deepspeed/git_version_info_installed.py").decode()
        meta = Parser().parsestr(zf.read(f"deepspeed-{VERSION}.dist-info/METADATA").decode())
        manifest = json.loads(zf.read(f"deepspeed-{VERSION}.dist-info/ds_builder.json"))
    assert f"version='{VERSION}'" in installed
    assert all(f"'{op}': 1" in installed for op in OPS)
    assert meta["Version"] == VERSION
    assert "torch==2.13.0" in (meta.get_all("Requires-Dist") or [])
    assert manifest["ops"] == list(OPS) and manifest["torch"]["version"] == "2.13.0+cpu"
    assert manifest["source"]["sha256"] == "9e491abd0827ea5c389dd702e15e11e13d83d904bac4a20d6c2a4cb37207a9af"
    assert manifest["cpu_target"] == "x86-64-v3" and manifest["flags"]["DS_BUILDER_CPU_ARCH"] == "-march=x86-64-v3"
    assert all("-march=native" not in text for text in logs.values())

    entry = json.loads((house / "manifest.json").read_text())["wheels"][WHEEL]
    assert entry["smoke"]["passed"] is True
    checks = {name: check["status"] for name, check in entry["smoke"]["checks"].items()}
    for op in OPS:
        assert checks[f"load:{op}"] == "passed"
    for op in OPTIMIZERS:
        assert checks[f"numerics:{op}"] == "passed"
    # DeepSpeed's CPU engine loads shm comm at init: from the wheel, nothing JIT-compiled.
    assert "nothing JIT-compiled" in entry["smoke"]["checks"]["engine:zero2-offload"]["detail"]
    assert checks["import"] == "passed" and checks["no-jit"] == "passed"
    # The full CPU suite: every check that can run without a GPU passed; the GPU ones say why not.
    for name in (
        "ds_report",
        "engine:zero2-offload",
        "quantized:int8:auto",
        "quantized:nf4:auto",
        "quantized:fp4:auto",
        "quantized:int8:max_memory",
        "quantized:nf4:max_memory",
        "load:fp16+disk-offload",
        "overflow-scan:fp16",
        "dist:gloo:1x2",
        "dist:gloo:2-nodes",
    ):
        assert checks[name] == "passed", (name, entry["smoke"]["checks"][name])
    assert checks["dist:nccl"] == "skipped"
    assert "no GPU visible" in entry["smoke"]["checks"]["dist:nccl"]["detail"]
    assert "Linear8bitLt (torch.int8)" in entry["smoke"]["checks"]["quantized:int8:auto"]["detail"]
    assert "backend gloo" in entry["smoke"]["checks"]["dist:gloo:2-nodes"]["detail"]
    assert [c for c, status in checks.items() if status == "failed"] == []
    # Issue 29: the configs a user writes, each run from the wheel with no compiler and an empty
    # extensions folder. The table: Adam/AdamW without offload loaded fused_adam (JIT before).
    details = {name: check["detail"] for name, check in entry["smoke"]["checks"].items()}
    for site in ("adam-zero0", "adamw-zero1", "adam-zero3", "adam-zero2-offload", "adagrad-zero2-offload",
                 "lion-zero2-offload"):  # fmt: skip
        assert checks[f"config:site/configs/{site}.json"] == "passed", details[f"config:site/configs/{site}.json"]
    assert (
        "ops deepspeed_shm_comm, fused_adam; 3 steps with FusedAdam" in details["config:site/configs/adam-zero0.json"]
    )
    assert "ops cpu_adam, deepspeed_shm_comm; 3 steps with DeepSpeedCPUAdam" in details[
        "config:site/configs/adam-zero2-offload.json"]  # fmt: skip
    assert checks["config:site/configs/lion-zero2.json"] == "skipped"
    assert details["config:site/configs/lion-zero2.json"] == (
        "not supported by DeepSpeed on cpu: ValueError: This op had not been implemented on CPU backend."
    )
    matrix = {n: st for n, st in checks.items() if n.startswith("config:matrix/")}
    assert len(matrix) == 84  # 6 optimizers x 7 stage/offload x fp32, bf16 (no async_io: no NVMe)
    for optimizer in ("Adam", "AdamW", "Adagrad"):
        assert all(st == "passed" for n, st in matrix.items() if f"/{optimizer}/" in n), optimizer
    assert details["config:matrix/Muon/zero1/none/fp32"].startswith("torch.compile (inductor) compiles code")
    if "already passed its smoke tests" not in result.stderr:  # a kept BUILDER_TEST_WORK_DIR may hold it
        assert "config Adam     runs: ZeRO 0-3, ZeRO 1-3 + CPU offload" in result.stderr
        assert "config Lion     not supported by DeepSpeed: ZeRO 0-3; runs: ZeRO 1-3 + CPU offload" in result.stderr
    index = (house / "simple" / "deepspeed" / "index.html").read_text()
    assert f"#sha256={entry['sha256']}" in index


def test_check_config_says_what_each_config_needs_and_every_bad_one(
    pipeline: tuple[Path, subprocess.CompletedProcess[str]], workspace: Path, tmp_path: Path
) -> None:
    """check-config against the real wheel (a fresh venv, no compiler): ZeRO-3 with NVMe offload asks
    for async_io, which the default wheel lacks (found by running it, with the recipe line); the bad
    configs each get their line and the others are still reported; exit 14."""
    house, _ = pipeline
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    base = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}}
    files = {
        "nvme.json": {**base, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme",
                                                                                      "nvme_path": str(nvme)}}},
        "adamw.json": {**base, "optimizer": {"type": "AdamW"}, "bf16": {"enabled": True}},
        "unwritable.json": {**base, "zero_optimization": {"stage": 3, "offload_optimizer": {
            "device": "nvme", "nvme_path": str(tmp_path / "no-such-disk")}}},
        "system.json": {**base, "zero_optimization": {"stage": 3, "offload_optimizer": {
            "device": "nvme", "nvme_path": "/etc"}}},
        "typo-top.json": {**base, "zero_optimisation": {"stage": 2}},
        "too-many.json": {**base, "train_batch_size": 4096},
        "typo.json": {**base, "zero_optimization": {"stage": 2, "offload_optimiser": {"device": "cpu"}}},
    }  # fmt: skip
    for name, config in files.items():
        (tmp_path / name).write_text(json.dumps(config))
    (tmp_path / "broken.json").write_text("{'single': quotes}")
    names = [*files, "broken.json", "absent.json"]
    done = builder("check-config", "--work-dir", str(workspace), "--wheel", str(house / WHEEL), "--json",
                   *(str(tmp_path / n) for n in names))  # fmt: skip
    assert done.returncode == 14, done.stderr[-3000:]
    got = {Path(r["config"]).name: r for r in json.loads(done.stdout)}
    # async_io's builder loads pin_memory first: the wheel has neither, so both are named.
    assert got["nvme.json"]["status"] == "needs-op" and got["nvme.json"]["needs"] == ["async_io", "pin_memory"]
    assert got["nvme.json"]["means"] == ('needs op async_io, pin_memory, which the wheel lacks: add "async_io", '
                                         '"pin_memory" to the recipe\'s ops')  # fmt: skip
    assert got["adamw.json"]["status"] == "passed" and "fused_adam" in got["adamw.json"]["ops"]
    assert "torch.bfloat16" in got["adamw.json"]["detail"]
    assert got["unwritable.json"]["detail"] == (f"the config offloads to nvme_path {str(tmp_path / 'no-such-disk')!r}, "
                                                "which is not a folder this user can write: create it or name "
                                                "another")  # fmt: skip
    assert "the system folder /etc: DeepSpeed would write its swap files there" in got["system.json"]["detail"]
    assert got["typo-top.json"]["status"] == "invalid"  # DeepSpeed itself would run it at ZeRO 0 and say nothing
    assert "'zero_optimisation' (did you mean 'zero_optimization'?)" in got["typo-top.json"]["detail"]
    assert list(nvme.iterdir()) == [] and not Path("/etc/zero_stage_3").exists()  # the checks' scratch is gone
    assert got["too-many.json"]["detail"].startswith("the config needs 1024 processes")
    assert got["typo.json"]["status"] == "invalid" and "offload_optimiser" in got["typo.json"]["detail"]
    assert got["broken.json"]["detail"].startswith(f"{tmp_path / 'broken.json'} is not JSON")
    assert got["absent.json"]["detail"] == f"{tmp_path / 'absent.json'} does not exist"
    assert "error: 8 of 9 configs do not run from the wheel" in done.stderr
    assert not list((workspace / "tmp").glob("check-config-*"))  # its venv is gone
    # A time limit per config: one that runs past it is stopped and said to. Muon starts torch.compile
    # (importing inductor alone takes over a second here), so 0.3 s stops it mid-way.
    muon = tmp_path / "muon.json"
    muon.write_text(json.dumps({**base, "optimizer": {"type": "Muon"}, "zero_optimization": {"stage": 1}}))
    slow = builder("check-config", "--work-dir", str(workspace), "--wheel", str(house / WHEEL), "--timeout", "0.3",
                   str(muon))  # fmt: skip
    assert slow.returncode == 14
    assert "the config did not finish within 0.3 s (its time limit)" in slow.stdout


def test_the_printed_install_command_works_with_only_the_wheelhouse_reachable(
    pipeline: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    """An air-gapped node: torch installed, no pip configuration, only the wheelhouse's index.
    The command build-wheel printed is run exactly as printed; DeepSpeed's dependencies must
    come from the wheelhouse."""
    _, result = pipeline
    printed = [line for line in result.stderr.splitlines() if line.startswith("==> install it with: ")]
    assert len(printed) == 1, result.stderr[-3000:]
    command = shlex.split(printed[0].removeprefix("==> install it with: "))
    assert command[:3] == ["pip", "install", "--index-url"] and command[3].startswith("file://")
    env_dir = tmp_path / "node"
    python = node_venv(env_dir, "torch==2.13.0")  # nodes have torch
    offline = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    offline.update(PIP_CONFIG_FILE="/dev/null", PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    done = subprocess.run([str(env_dir / "bin" / "pip"), *command[1:]], capture_output=True, text=True, env=offline)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert WHEEL.replace("+", "%2B") in done.stdout or WHEEL in done.stdout
    probe = subprocess.run(
        [
            python,
            "-c",
            "import deepspeed, json; from deepspeed.git_version_info import installed_ops as o; "
            "print(json.dumps([deepspeed.__version__, o]))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    version, installed = json.loads(probe.stdout.strip().splitlines()[-1])
    assert version == VERSION
    assert all(installed[op] for op in OPS)


def test_publish_refuses_a_wheel_without_a_smoke_report(
    pipeline: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    house, _ = pipeline
    lone = tmp_path / WHEEL
    lone.write_bytes((house / WHEEL).read_bytes())
    result = builder("publish", str(lone), "--wheelhouse", str(tmp_path / "other-house"))
    assert result.returncode == 7
    assert f"error: {WHEEL} has no smoke report" in result.stderr
    assert not (tmp_path / "other-house").exists()


def test_verify_passes_on_the_published_wheelhouse(pipeline: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    house, _ = pipeline
    result = builder("verify", "--wheelhouse", str(house))
    assert result.returncode == 0, result.stderr
    assert "1 wheels; signature, hashes, metadata, smoke reports, index, page and manifest agree" in result.stderr
    from builder.node import fingerprint_of, parse_manifest

    manifest = parse_manifest((house / "manifest.json").read_text())
    assert f"signed by {fingerprint_of(manifest.signer)} (this host's key): serial {manifest.serial}" in result.stderr


def test_pip_finds_the_wheel_with_no_index_and_find_links(
    pipeline: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    house, _ = pipeline
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-index", "--find-links", str(house),
         "-d", str(tmp_path), f"deepspeed=={VERSION}"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / WHEEL).read_bytes() == (house / WHEEL).read_bytes()


def test_pip_on_an_older_os_refuses_the_wheel(
    pipeline: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    """Tagged with its glibc floor, manylinux_2_28 (compiled in the Debian 11 root): every symbol of
    every op holds it (read back from the .so files, not from the manifest), pip for a platform older
    than it (glibc 2.27: Ubuntu 18.04) finds nothing, RHEL 8's (2.28) and this host's accept it."""
    from builder.glibc import above_floor, needed_symbols

    house, _ = pipeline
    with zipfile.ZipFile(house / WHEEL) as zf:
        wheel_file = zf.read(f"deepspeed-{VERSION}.dist-info/WHEEL").decode()
        manifest = json.loads(zf.read(f"deepspeed-{VERSION}.dist-info/ds_builder.json"))
        zf.extractall(tmp_path / "tree")
    assert f"Tag: cp311-cp311-{PLATFORM}" in wheel_file and "linux_x86_64\n" not in wheel_file.replace(PLATFORM, "")
    record = manifest["platform"]
    assert record["tags"] == [PLATFORM] and record["floor"] == "manylinux_2_28"
    assert record["torch_floor"] == "manylinux_2_28" and record["ops_floor"] == "manylinux_2_24"
    assert record["needs"] == {"GLIBC": "2.17", "GLIBCXX": "3.4.22", "CXXABI": "1.3.9"}
    assert record["root"]["describe"] == "Debian bullseye" and record["root"]["gcc"].startswith("10.")
    needed = needed_symbols(tmp_path / "tree")
    ops_files = {n.so for n in needed}
    assert len([f for f in ops_files if f.endswith(".so")]) == len(OPS)
    assert above_floor(needed, "manylinux_2_28") == [] and above_floor(needed, "manylinux_2_24") == []
    assert {(n.symbol, n.version) for n in needed if n.symbol == "pow"} == {("pow", "GLIBC_2.2.5")}  # the pin
    shutil.rmtree(tmp_path / "tree")

    def download(*platform: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-index", "--find-links", str(house),
             "--only-binary=:all:", "--python-version", "3.11", *platform, "-d", str(tmp_path),
             f"deepspeed=={VERSION}"],
            capture_output=True, text=True,
        )  # fmt: skip

    old = download("--platform", "manylinux_2_27_x86_64")
    assert old.returncode != 0 and "No matching distribution found for deepspeed" in old.stderr, old.stderr
    assert download("--platform", "manylinux_2_28_x86_64").returncode == 0
    assert download().returncode == 0  # this machine's own platform (glibc 2.36)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_node_installs_its_wheel_from_the_served_wheelhouse(
    pipeline: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    """An air-gapped node with only Python, pip and its torch (no pip configuration, the index on a
    closed port): `builder install` over HTTP from `builder serve` installs the real wheel and its
    14-odd dependency wheels from the wheelhouse alone, every file hash-checked (issue 20)."""
    import time
    import urllib.request

    house, _ = pipeline
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "builder", "serve", "--wheelhouse", str(house), "--port", str(port)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}/"
        for _ in range(100):
            try:
                urllib.request.urlopen(url + "simple/", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        node = tmp_path / "node"
        python = node_venv(node, "torch==2.13.0")
        no_packaging = subprocess.run([python, "-c", "import packaging"], capture_output=True)
        assert no_packaging.returncode != 0  # the node has nothing of the builder's dependencies
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
        env.update(PYTHONPATH=str(ROOT), PIP_CONFIG_FILE="/dev/null", PIP_INDEX_URL="http://127.0.0.1:9/simple/",
                   PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1")  # fmt: skip
        done = subprocess.run(
            [python, "-m", "builder", "install", "--wheelhouse", url, "--json"], env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"==> chosen: {WHEEL}" in done.stderr and "verified" in done.stderr
        deps = json.loads(done.stdout)["dependencies"]
        assert any(d.startswith("hjson-") for d in deps) and any(d.startswith("psutil-") for d in deps), deps
        version = (
            subprocess.run(
                [python, "-c", "import deepspeed; print(deepspeed.__version__)"],
                capture_output=True,
                text=True,
                check=True,
            )
            .stdout.strip()
            .splitlines()[-1]
        )
        assert version == VERSION
        # Issue 29 on the node: its own configs against what is installed, with the wheelhouse's
        # checker (tools/ds-config-check.py, its sha256 from the manifest): Adam ZeRO-0 runs from
        # the wheel; ZeRO-3 with NVMe offload needs ops the default wheel lacks; exit 14.
        nvme = tmp_path / "nvme.json"
        (tmp_path / "disk").mkdir()
        nvme.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "Adam"},
                                    "zero_optimization": {"stage": 3, "offload_optimizer": {
                                        "device": "nvme", "nvme_path": str(tmp_path / "disk")}}}))  # fmt: skip
        adam = ROOT / "recipes" / "configs" / "adam-zero0.json"
        done = subprocess.run([python, "-m", "builder", "install", "--wheelhouse", url, "--dry-run", "--json",
                               "--check-config", str(adam), "--check-config", str(nvme)],
                              env=env, capture_output=True, text=True)  # fmt: skip
        assert done.returncode == 14, done.stdout + done.stderr
        checked = {Path(r["name"]).name: r for r in json.loads(done.stdout)["configs_checked"]}
        assert checked["adam-zero0.json"]["status"] == "passed" and "fused_adam" in checked["adam-zero0.json"]["ops"]
        assert checked["nvme.json"]["status"] == "needs-op"
        assert checked["nvme.json"]["jit"] == ["async_io", "pin_memory"]
        assert "error: 1 config(s) do not run from the installed wheel" in done.stderr
        # And plain pip through the same server.
        other = tmp_path / "plain"
        venv.create(other, with_pip=True)
        done = subprocess.run(
            [str(other / "bin" / "python"), "-m", "pip", "download", "--no-deps", "-d", str(tmp_path / "dl"),
             "--index-url", url + "simple/", f"deepspeed=={VERSION}"],
            capture_output=True, text=True,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
    finally:
        server.terminate()
        server.wait(10)


def test_unchanged_recipe_is_up_to_date(
    pipeline: tuple[Path, subprocess.CompletedProcess[str]], workspace: Path
) -> None:
    house, _ = pipeline
    before = (house / WHEEL).read_bytes()
    again = builder("build-wheel", "--work-dir", str(workspace), "--wheelhouse", str(house))
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"==> up to date: {WHEEL} (build key" in again.stderr
    assert "pip wheel" not in again.stderr and "already passed its smoke tests" in again.stderr
    assert (house / WHEEL).read_bytes() == before


def test_a_clean_build_in_another_folder_gives_the_identical_wheel(
    pipeline: tuple[Path, subprocess.CompletedProcess[str]], clean_rebuild: tuple[Path, Path, subprocess.Popen[bytes]]
) -> None:
    """Reproducible wheels: a second clean build of the default recipe, in a folder of another
    name, with its own cold ccache and without the precompiled torch header the first one used,
    gives the same bytes as the published one (issue 39: the header changes no byte that ships)."""
    house, _ = pipeline
    other, log, proc = clean_rebuild
    proc.wait(timeout=1800)
    said = log.read_text(errors="replace")
    assert proc.returncode == 0, said[-5000:]
    assert f"==> built {WHEEL} in" in said  # really built, not found by key
    assert "precompiled torch header:" not in said and "precompiled torch headers 0 MB" in said  # none made or used
    rebuilt = (other / "dist" / WHEEL).read_bytes()
    published = (house / WHEEL).read_bytes()
    if rebuilt != published:
        with zipfile.ZipFile(house / WHEEL) as a, zipfile.ZipFile(other / "dist" / WHEEL) as b:
            differ = [i.filename for i in a.infolist() if i.CRC != b.getinfo(i.filename).CRC]
        pytest.fail(f"the two builds differ in {differ or 'the zip layout'}")


def test_lock_installs_with_hashes_required(
    pipeline: tuple[Path, subprocess.CompletedProcess[str]], workspace: Path, tmp_path: Path
) -> None:
    house, _ = pipeline
    done = builder("lock", "--wheelhouse", str(house), "--work-dir", str(workspace))
    assert done.returncode == 0, done.stderr[-3000:]
    lock_file = house / "locks" / "cpu.lock"
    text = lock_file.read_text()
    assert f"deepspeed=={VERSION} \\" in text and "torch==2.13.0" in text and "--hash=sha256:" in text
    assert (house / "locks" / "cpu.Containerfile").is_file()
    # Every file the lock pins is now in the wheelhouse (torch too) and listed: pip needs no index.
    manifest = json.loads((house / "manifest.json").read_text())
    assert any(name.startswith("torch-2.13.0") for name in manifest["dependencies"])
    # The three files `lock` wrote are in the signed statement, each with its sha256 (issue 38).
    assert {rel: entry["sha256"] for rel, entry in manifest["locks"].items()} == {
        rel: hashlib.sha256((house / rel).read_bytes()).hexdigest()
        for rel in ("locks/cpu.lock", "locks/pylock.cpu.toml", "locks/cpu.Containerfile")
    }
    assert builder("verify", "--wheelhouse", str(house)).returncode == 0
    image = tmp_path / "image"
    venv.create(image, with_pip=True)
    python = str(image / "bin" / "python")
    installed = subprocess.run(
        [python, "-m", "pip", "install", "--no-index", "--require-hashes", "--find-links", str(house), "-r",
         str(lock_file)],
        capture_output=True, text=True, env={**os.environ, "PIP_CONFIG_FILE": os.devnull},
    )  # fmt: skip
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    version = (
        subprocess.run(
            [python, "-c", "import deepspeed; print(deepspeed.__version__)"], capture_output=True, text=True, check=True
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    assert version == VERSION
    # A lock that names a different hash is refused by pip.
    tampered = tmp_path / "tampered.lock"
    tampered.write_text(text.replace("--hash=sha256:", "--hash=sha256:0", 1))
    refused = subprocess.run(
        [python, "-m", "pip", "install", "--force-reinstall", "--no-deps", "--require-hashes", "--find-links",
         str(house), "-r", str(tampered)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert refused.returncode != 0 and "HASHES" in (refused.stdout + refused.stderr).upper()


@pytest.mark.skipif(not os.path.isfile("/usr/share/lmod/lmod/init/bash"), reason="needs Lmod: apt-get install lmod")
def test_the_lock_becomes_an_lmod_module_that_runs_a_config(
    pipeline: tuple[Path, subprocess.CompletedProcess[str]], workspace: Path, tmp_path: Path
) -> None:
    """Issue 40: `module` puts the wheel and its lock (torch included) under a prefix, proven with Lmod
    (every op [YES] in ds_report) before its modulefile is written; a user's login shell loads it, runs
    a DeepSpeed config with it (the wheelhouse's checker, nothing compiled) and purges it."""
    house, _ = pipeline
    if not (house / "locks" / "cpu.lock").is_file():
        assert builder("lock", "--wheelhouse", str(house), "--work-dir", str(workspace)).returncode == 0
    prefix = tmp_path / "shared" / "software"
    adam = ROOT / "recipes" / "configs" / "adam-zero0.json"
    done = builder("module", "--wheelhouse", str(house), "--prefix", str(prefix), "--python", sys.executable,
                   "--check-config", str(adam), "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout)
    root = Path(result["root"])
    assert result["module"] == f"deepspeed/{VERSION}-py3.11" and result["installed"] and root.is_relative_to(prefix)
    assert result["checked"] == [f"python {root}/bin/python", *(f"{op} [YES]" for op in OPS)], result["checked"]
    assert [r["status"] for r in result["configs_checked"]] == ["passed"], result["configs_checked"]
    home = tmp_path / "home"
    home.mkdir()
    script = (f"module use {prefix}/modulefiles && module load deepspeed && command -v python && python -c 'import "
              "deepspeed, torch; print(deepspeed.__version__, torch.__version__)' && module purge && echo PURGED "
              '"${VIRTUAL_ENV-}"; command -v python || echo NO-PYTHON')  # fmt: skip
    shell = subprocess.run(["bash", "-lc", script], capture_output=True, text=True,
                           env={"HOME": str(home), "PATH": "/usr/bin:/bin", "USER": "someone"})  # fmt: skip
    assert shell.returncode == 0, shell.stderr[-2000:]
    lines = shell.stdout.splitlines()  # DeepSpeed's own warnings go to stdout too
    assert lines[0] == f"{root}/bin/python" and f"{VERSION} 2.13.0+cpu" in lines, shell.stdout
    assert "PURGED " in shell.stdout and f"{root}/bin/python" not in shell.stdout.split("PURGED")[1]
    assert list(home.iterdir()) == []
    print(f"module: {result['size'] / 1e6:.0f} MB")


def test_the_pylock_installs_offline_with_uv_and_pip(
    pipeline: tuple[Path, subprocess.CompletedProcess[str]], workspace: Path, tmp_path: Path
) -> None:
    """Issue 31: `lock` also writes locks/pylock.cpu.toml (PEP 751) for the same files, by paths
    into the wheelhouse and sha256: the uv the toolkit pins installs it offline, pip 26.1+ with no
    index, and a tampered entry is refused."""
    import tomllib

    from builder.envs import uv_binary

    house, _ = pipeline
    if not (house / "locks" / "pylock.cpu.toml").is_file():
        assert builder("lock", "--wheelhouse", str(house), "--work-dir", str(workspace)).returncode == 0
    pylock = house / "locks" / "pylock.cpu.toml"
    doc = tomllib.loads(pylock.read_text())
    pins = {p["name"]: p["wheels"][0]["hashes"]["sha256"] for p in doc["packages"]}
    assert (
        doc["lock-version"] == "1.0" and pins["deepspeed"] == hashlib.sha256((house / WHEEL).read_bytes()).hexdigest()
    )
    assert "torch" in pins and all((pylock.parent / p["wheels"][0]["path"]).is_file() for p in doc["packages"])
    assert builder("verify", "--wheelhouse", str(house)).returncode == 0  # the pylock is the lock's, not a stray file
    offline = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    uv = uv_binary(tmp_path / "tools")
    subprocess.run([uv, "venv", "-q", "-p", sys.executable, str(tmp_path / "uv-node")], check=True)
    got = subprocess.run([uv, "pip", "install", "--python", str(tmp_path / "uv-node" / "bin" / "python"), "--offline",
                          "--no-cache", "-r", str(pylock)], capture_output=True, text=True, env=offline)  # fmt: skip
    assert got.returncode == 0, got.stderr[-3000:]
    check = "import deepspeed, torch; print(deepspeed.__version__, torch.__version__)"
    said = subprocess.run([tmp_path / "uv-node" / "bin" / "python", "-c", check], capture_output=True, text=True)
    assert said.stdout.split()[-2:] == [VERSION, "2.13.0+cpu"], said.stderr[-2000:]
    # pip reads PEP 751 from 26.1 (experimental): one from this machine's sources, then no index at all.
    venv.create(tmp_path / "pip-node", with_pip=True)
    pip_python = str(tmp_path / "pip-node" / "bin" / "python")
    subprocess.run([pip_python, "-m", "pip", "install", "-q", "pip>=26.1"], check=True, capture_output=True)
    got = subprocess.run([pip_python, "-m", "pip", "install", "--no-index", "-r", str(pylock)], capture_output=True,
                         text=True, env={**offline, "PIP_CONFIG_FILE": os.devnull})  # fmt: skip
    assert got.returncode == 0, got.stdout[-2000:] + got.stderr[-2000:]
    said = subprocess.run([pip_python, "-c", check], capture_output=True, text=True)
    assert said.stdout.split()[-2:] == [VERSION, "2.13.0+cpu"], said.stderr[-2000:]
    # A tampered entry (another sha256 for DeepSpeed's wheel) is refused by the installer reading it.
    tampered = pylock.parent / "pylock.tampered.toml"
    try:
        tampered.write_text(pylock.read_text().replace(pins["deepspeed"], "0" * 64))
        subprocess.run([uv, "venv", "-q", "-p", sys.executable, str(tmp_path / "uv-bad")], check=True)
        bad = subprocess.run([uv, "pip", "install", "--python", str(tmp_path / "uv-bad" / "bin" / "python"),
                              "--offline", "--no-cache", "-r", str(tampered)], capture_output=True, text=True,
                             env=offline)  # fmt: skip
        assert bad.returncode != 0 and "hash" in bad.stderr.lower(), bad.stderr[-2000:]
        assert not list((tmp_path / "uv-bad").glob("lib/python3.*/site-packages/deepspeed"))
    finally:
        tampered.unlink()


def _podman_state() -> tuple[set[str], set[str]]:
    """Every container (buildah's included) and image podman holds, by ID."""
    env = {**os.environ, "CONTAINERS_CONF": str(ROOT / "builder" / "resources" / "containers.conf")}
    ps = subprocess.run(["podman", "ps", "-a", "--external", "-q", "--no-trunc"], capture_output=True, text=True,
                        env=env, check=True)  # fmt: skip
    images = subprocess.run(["podman", "images", "-a", "-q", "--no-trunc"], capture_output=True, text=True, env=env,
                            check=True)  # fmt: skip
    return set(ps.stdout.split()), set(images.stdout.split())


NO_PODMAN = next(
    (why for missing, why in (
        (not shutil.which("podman"), "podman is not installed (apt-get install podman runc)"),
        (not shutil.which("debootstrap"), "debootstrap is not installed (apt-get install debootstrap)"),
        (os.geteuid() != 0, "rootful podman and debootstrap need root"),
    ) if missing),
    None,
)  # fmt: skip


@pytest.mark.skipif(NO_PODMAN is not None, reason=str(NO_PODMAN))
def test_the_ci_image_is_built_from_the_wheelhouse_proven_inside_and_reproducible(
    pipeline: tuple[Path, subprocess.CompletedProcess[str]], workspace: Path
) -> None:
    """Issue 22: the default recipe's image on the debootstrap base, the smoke inside it with no
    network, published to images/ and verified; built again, the same image ID and digest. Issue 40:
    its Slurm container image (--squashfs), the smoke suite run from the squashfs's own files, published
    beside the archive and verified (the same archive gives the same squashfs: test_images.py)."""
    house, _ = pipeline
    squashfs = ["--squashfs"] if shutil.which("mksquashfs") else []  # .ci/run installs squashfs-tools
    done = builder("image", "--wheelhouse", str(house), "--work-dir", str(workspace), "--wheel", WHEEL, *squashfs)
    assert done.returncode == 0, done.stderr[-5000:]
    manifest = json.loads((house / "manifest.json").read_text())
    ((name, entry),) = manifest["images"].items()
    if squashfs:
        sq = entry["squashfs"]
        assert (
            sq["name"] == name.removesuffix(".oci.tar") + ".sqsh" and (house / sq["name"]).stat().st_size == sq["size"]
        )
        assert hashlib.sha256((house / sq["name"]).read_bytes()).hexdigest() == sq["sha256"]
        row = entry["smoke"]["checks"]["squashfs"]
        assert row["status"] == "passed" and "the smoke suite ran from its files" in row["detail"], row
        assert f"srun --container-image={house / sq['name']}" in done.stdout + done.stderr
    assert name.startswith("images/cpu-") and (house / name).is_file() and entry["wheel"] == WHEEL
    assert entry["base"].startswith("localhost/ds-builder-base:bookworm-") and entry["lock"] == "locks/cpu.lock"
    checks = {name: (c["status"], c["detail"]) for name, c in entry["smoke"]["checks"].items()}
    assert entry["smoke"]["passed"] and all(checks[f"numerics:{op}"][0] == "passed" for op in OPTIMIZERS), checks
    assert checks["dist:gloo:2-nodes"][0] == "passed" and checks["engine:zero2-offload"][0] == "passed"
    assert "nothing JIT-compiled" in checks["engine:zero2-offload"][1]  # no compiler in the image, none needed
    assert checks["quantized:int8:auto"][0] == "skipped" and "no transformers" in checks["quantized:int8:auto"][1]
    assert (house / name).stat().st_mode & 0o777 == 0o644
    assert builder("verify", "--wheelhouse", str(house)).returncode == 0
    before = _podman_state()

    # The same lock, wheels and base: the same image, to the digest (not a cached layer: --no-cache).
    again = builder("image", "--wheelhouse", str(house), "--work-dir", str(workspace), "--wheel", WHEEL,
                    "--no-publish", "--no-smoke")  # fmt: skip
    assert again.returncode == 0, again.stderr[-5000:]
    assert f"ID {entry['image_id'][:12]}" in again.stderr, again.stderr[-3000:]
    assert f"archive (sha256 {entry['sha256'][:16]}...)" in again.stderr  # the archive's bytes too (issue 28)
    assert "STEP 2/3: RUN" in again.stderr and "Using cache" not in again.stderr
    refused = builder("image", "--wheelhouse", str(house), "--work-dir", str(workspace), "--no-smoke")
    assert refused.returncode == 12 and "published only after its smoke checks" in refused.stderr
    assert _podman_state() == before  # nothing left behind: no container, no new image

    # What the archive holds loads as that image.
    env = {**os.environ, "CONTAINERS_CONF": str(ROOT / "builder" / "resources" / "containers.conf")}
    subprocess.run(["podman", "rmi", entry["ref"]], env=env, capture_output=True, check=True)
    loaded = subprocess.run(["podman", "load", "-i", str(house / name)], env=env, capture_output=True, text=True)
    assert loaded.returncode == 0 and entry["image_id"] in loaded.stdout + loaded.stderr, loaded.stderr


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("squashfuse") or not shutil.which("unshare"),
    reason="needs root, squashfuse and unshare: a node made of namespaces mounts the squashfs",
)
def test_the_slurm_container_image_runs_the_smoke_through_enroots_rc_on_a_node_with_no_network(
    pipeline: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    """Issue 40: the published squashfs as Enroot starts it, on a node made of namespaces (its own
    mount, UTS, PID and network namespace: loopback only): mounted read-only with squashfuse under a
    writable overlay (Enroot's rootfs is writable), /proc, /dev, a /tmp and the node's /etc/hosts and
    /etc/hostname put in as Enroot's fstabs do, its /etc/environment as the whole environment and
    /etc/rc as the entrypoint; the smoke suite (bound in read-only at /mnt) runs: every op loads and
    computes, ZeRO-Offload, torchrun on one node and on two over loopback."""
    from builder.smoke import parse_checks, write_checks

    house, _ = pipeline
    images = json.loads((house / "manifest.json").read_text()).get("images", {})
    published = [e["squashfs"]["name"] for e in images.values() if "squashfs" in e]
    if not published:
        pytest.skip("no squashfs is published: the image test makes one where mksquashfs is installed")
    node = tmp_path / "node"
    write_checks(tmp_path / "checks")  # the smoke checks in one file, the distributed worker beside them
    for folder in ("lower", "root", "ovl"):
        (node / folder).mkdir(parents=True)
    (node / "hosts").write_text("127.0.0.1 localhost\n127.0.1.1 ds-node\n")
    (node / "hostname").write_text("ds-node\n")
    torch = {"version": "2.13.0+cpu", "cuda": None}
    spec = json.dumps({"version": VERSION, "ops": list(OPS), "accelerator": "cpu", "suite": "image", "torch": torch,
                       "dist_worker": "/mnt/smoke_dist.py"})  # fmt: skip
    root = node / "root"
    script = "\n".join([
        "set -e", "hostname ds-node", f"squashfuse -o ro {house / published[0]} {node}/lower",
        f"mount -t tmpfs tmpfs {node}/ovl", f"mkdir {node}/ovl/upper {node}/ovl/work",
        f"mount -t overlay overlay -o lowerdir={node}/lower,upperdir={node}/ovl/upper,workdir={node}/ovl/work {root}",
        f"mount -t proc proc {root}/proc", f"mount --rbind /dev {root}/dev",
        f"mount -t tmpfs -o mode=1777 tmpfs {root}/tmp",
        *(f"touch {root}/etc/{f} && mount --bind -o ro {node}/{f} {root}/etc/{f}" for f in ("hosts", "hostname")),
        f"mount --bind -o ro {tmp_path / 'checks'} {root}/mnt", "ip link set lo up",
        f"exec chroot {root} env -i $(cat {root}/etc/environment) HOME=/tmp TORCH_EXTENSIONS_DIR=/tmp/ext "
        'DS_ACCELERATOR=cpu sh /etc/rc python /mnt/smoke_checks.py "$0"',
    ])  # fmt: skip
    done = subprocess.run(["unshare", "--net", "--mount", "--uts", "--pid", "--fork", "--propagation", "private", "sh",
                           "-c", script, spec], capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    checks = {c.name: c for c in parse_checks(done.stdout)}
    assert not [c.name for c in checks.values() if c.status == "failed"], checks
    assert all(checks[f"numerics:{op}"].status == "passed" for op in OPTIMIZERS), checks
    assert checks["engine:zero2-offload"].status == "passed" and "nothing JIT-compiled" in checks[
        "engine:zero2-offload"].detail  # fmt: skip
    assert checks["dist:gloo:2-nodes"].status == "passed"
    assert not os.path.ismount(root) and not os.path.ismount(node / "lower")  # gone with the node's namespaces


@pytest.mark.skipif(NO_PODMAN is not None, reason=str(NO_PODMAN))
def test_a_bad_image_input_leaves_nothing_behind(
    pipeline: tuple[Path, subprocess.CompletedProcess[str]], workspace: Path, tmp_path: Path
) -> None:
    """A base that does not exist, podman missing, a lock naming a file the wheelhouse lacks: exit
    12 with the fix, no archive in images/, no container or image left in podman's storage."""
    house, _ = pipeline
    assert builder("lock", "--wheelhouse", str(house), "--work-dir", str(workspace)).returncode == 0
    listing = sorted(p.relative_to(house) for p in house.rglob("*"))
    before = _podman_state()
    done = builder("image", "--wheelhouse", str(house), "--work-dir", str(workspace), "--base",
                   "localhost/no-such-base:1")  # fmt: skip
    assert done.returncode == 12 and "localhost/no-such-base:1 does not exist here" in done.stderr, done.stderr
    assert "fix: name an image podman holds" in done.stderr and "Traceback" not in done.stderr

    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python").symlink_to(sys.executable)
    no_podman = subprocess.run([sys.executable, "-m", "builder", "image", "--wheelhouse", str(house), "--work-dir",
                                str(workspace)], cwd=ROOT, capture_output=True, text=True,
                               env={**os.environ, "PATH": str(bare)})  # fmt: skip
    assert no_podman.returncode == 12 and "podman was not found on PATH" in no_podman.stderr, no_podman.stderr
    assert "apt-get install" in no_podman.stderr

    lock = house / "locks" / "cpu.lock"
    text = lock.read_text()
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("torch=="))
    lines[at : at + 2] = ["torch==9.9.9 \\", f"    --hash=sha256:{'0' * 64}"]  # a pin the wheelhouse lacks
    lock.write_text("\n".join(lines) + "\n")
    try:
        missing = builder("image", "--wheelhouse", str(house), "--work-dir", str(workspace), "--lock", "cpu.lock")
    finally:
        lock.write_text(text)
    assert missing.returncode == 12 and "pins 1 file(s) the wheelhouse lacks: torch==9.9.9" in missing.stderr
    assert sorted(p.relative_to(house) for p in house.rglob("*")) == listing
    assert _podman_state() == before


@pytest.mark.skipif(NO_PODMAN is not None, reason=str(NO_PODMAN))
def test_an_interrupted_image_build_and_a_full_disk_leave_nothing_behind(
    pipeline: tuple[Path, subprocess.CompletedProcess[str]], workspace: Path, tmp_path: Path
) -> None:
    """Ctrl-C while podman builds (SIGINT to the process group, as a terminal sends it), then a work
    folder whose disk fills while the build context is written: each exits with its code and the
    fix, leaving nothing in the wheelhouse and no container or image of its own in podman."""
    import signal
    import time

    house, _ = pipeline
    listing = sorted(p.relative_to(house) for p in house.rglob("*"))
    before = _podman_state()
    err = tmp_path / "stderr"
    with open(err, "w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "builder", "image", "--wheelhouse", str(house), "--work-dir",
                                 str(workspace), "--wheel", WHEEL, "--no-publish"],
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=sink, start_new_session=True,
                                # as in a terminal: a job started in the background by a script
                                # (as CI may start the tests) inherits SIGINT ignored
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
        deadline = time.monotonic() + 300
        while "STEP 2/3" not in err.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(5)  # pip is installing inside the build container
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=300)
    said = err.read_text()
    assert code == 130 and "error: interrupted" in said, said[-3000:]
    assert _podman_state() == before
    assert sorted(p.relative_to(house) for p in house.rglob("*")) == listing
    # Issue 51, item 13: SIGTERM (a CI cancel, `kill`) ended the process at once and left the image
    # context and the debootstrap tree (265 MB) in the work folder. Now it unwinds as Ctrl-C does.
    with open(err, "w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "builder", "image", "--wheelhouse", str(house), "--work-dir",
                                 str(workspace), "--wheel", WHEEL, "--no-publish"],
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=sink)  # fmt: skip
        deadline = time.monotonic() + 300
        while "STEP 2/3" not in err.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=300)
    said = err.read_text()
    assert code == 143 and "terminated (SIGTERM)" in said and "Traceback" not in said, said[-3000:]
    assert not [p for p in (workspace / "tmp").iterdir() if p.name.startswith(("image-", "debootstrap-"))]
    assert _podman_state() == before

    if os.geteuid() != 0:
        return
    small = tmp_path / "work"
    (small / "tmp").mkdir(parents=True)
    (small / "cache").symlink_to(workspace / "cache", target_is_directory=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(small / "tmp")],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill ({mounted.stderr.strip()})")
    try:
        full = builder("image", "--wheelhouse", str(house), "--work-dir", str(small), "--wheel", WHEEL)
    finally:
        subprocess.run(["umount", str(small / "tmp")], check=True)
    assert full.returncode == 12 and "No space left on device" in full.stderr, full.stderr[-3000:]
    assert "fix: free space" in full.stderr and "Traceback" not in full.stderr
    assert _podman_state() == before
    assert sorted(p.relative_to(house) for p in house.rglob("*")) == listing


@pytest.mark.skipif(NO_BROWSER is not None, reason=str(NO_BROWSER))
def test_the_wheelhouse_page_in_a_browser(
    pipeline: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    """Issue 23: the page of the real published wheelhouse (with its lock and CI image, when the
    tests above made them), opened from file:// in headless chromium: the targets, the op grid,
    every smoke check and the install commands read back from the rendered page and compared with
    the manifest; nothing overflows a phone's width; a screenshot is kept. A manifest value holding
    markup shows as text and runs nothing."""
    from selenium.webdriver.common.by import By

    from builder import node
    from builder.wheelhouse.page import install_commands, op_cell, write_page

    house, result = pipeline
    manifest = node.parse_manifest((house / "manifest.json").read_text())
    entry = manifest.wheels[WHEEL]
    with chromium() as driver:
        driver.get((house / "index.html").as_uri())
        assert driver.title == "DeepSpeed wheelhouse"
        rows = driver.find_elements(By.CSS_SELECTOR, "#targets tbody tr")
        assert [r.get_attribute("data-wheel") for r in rows] == sorted(manifest.wheels)
        cells = [td.text for td in rows[0].find_elements(By.TAG_NAME, "td")]
        assert cells[1:10] == [
            entry.recipe,
            "0.19.8",
            entry.torch,
            "none (cpu)",
            "cp311",
            "cpu",
            "x86-64-v3",
            "2.28",
            str(len(OPS)),
        ], cells  # glibc floor: manylinux_2_28
        assert cells[10] == "passed"
        # The op grid: one row per op, the cell saying what the manifest says (built, loaded, checked).
        grid = {td.get_attribute("data-op"): td.text for td in driver.find_elements(By.CSS_SELECTOR, "#ops td")
                if td.get_attribute("data-wheel") == WHEEL}  # fmt: skip
        assert sorted(grid) == sorted(OPS)
        for row in node.op_table(entry):
            assert grid[row["op"]] == op_cell(row, entry.archs)[1]
            assert grid[row["op"]].startswith("built") and "load passed" in grid[row["op"]]
        # The DeepSpeed config grid (issue 29): what the smoke found running each config from the wheel.
        assert driver.find_element(By.CSS_SELECTOR, 'td[data-config="Adam/zero0/none"]').text == "runs"
        assert driver.find_element(By.CSS_SELECTOR, 'td[data-config="Lion/zero2/none"]').text == (
            "not supported by DeepSpeed"
        )
        # Every smoke check, with its result and reason, once its <details> is opened.
        details = driver.find_element(By.CSS_SELECTOR, f'details[data-wheel="{WHEEL}"]')
        details.find_element(By.TAG_NAME, "summary").click()
        shown = {tr.get_attribute("data-check"): [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
                 for tr in details.find_elements(By.CSS_SELECTOR, "tbody tr")}  # fmt: skip
        assert {name: status for name, (_, status, _) in shown.items()} == {
            name: status for name, (status, _) in entry.smoke.checks.items()
        }
        assert shown["dist:nccl"][2] == " ".join(entry.smoke.checks["dist:nccl"][1].split())
        # The commands, as a person copies them: the same text the manifest makes, and the pip line
        # the one build-wheel printed, with WH set to this wheelhouse's file:// URL.
        commands = {(pre.get_attribute("data-kind"), pre.get_attribute("data-wheel")): pre.text
                    for pre in driver.find_elements(By.CSS_SELECTOR, "pre.cmd")}  # fmt: skip
        for kind, text in install_commands(manifest, entry).items():
            assert commands[(kind, WHEEL)] == text
        assert commands[("wh", "")].startswith('WH="file:///path/to/this/wheelhouse"')  # a copy stays valid
        printed = next(line for line in result.stderr.splitlines() if line.startswith("==> install it with: "))
        wh = house.resolve().as_uri()
        pip_line = commands[("pip", WHEEL)].splitlines()[-1].replace("$WH", wh)
        assert shlex.split(pip_line) == shlex.split(printed.removeprefix("==> install it with: "))
        # The node command carries the signer's key and checks the installer against the signed manifest.
        assert (
            manifest.signer in commands[("node-installer", "")]
            and "ssh-keygen -Y verify" in commands[("node-installer", "")]
        )
        images = driver.find_elements(By.CSS_SELECTOR, "#images tr[data-image]")
        assert [tr.get_attribute("data-image") for tr in images] == sorted(manifest.images)
        locks = [tr.get_attribute("data-lock") for tr in driver.find_elements(By.CSS_SELECTOR, "#locks tr[data-lock]")]
        assert locks == sorted(str(p.relative_to(house)) for p in (house / "locks").glob("*.lock"))
        full_page_screenshot(driver, ARTIFACTS / "wheelhouse-page.png", 1280)

        # A phone's width: the page itself never scrolls sideways (wide tables scroll in their box).
        driver.set_window_size(390, 844)
        driver.get((house / "index.html").as_uri())
        assert driver.execute_script("return document.documentElement.scrollWidth") <= 390
        full_page_screenshot(driver, ARTIFACTS / "wheelhouse-page-narrow.png", 390)

        # Markup in a manifest value (a smoke check's detail is free text) is shown, not run.
        evil = '<script>document.title="pwned"</script><b id="injected">bold</b>'
        data = json.loads((house / "manifest.json").read_text())
        data["wheels"][WHEEL]["smoke"]["checks"]["dist:nccl"]["detail"] = evil
        hostile = tmp_path / "hostile"
        hostile.mkdir()
        page = write_page(hostile, node.parse_manifest(json.dumps(data)))
        driver.set_window_size(1280, 1000)
        driver.get(page.as_uri())
        assert driver.title == "DeepSpeed wheelhouse"
        assert driver.find_elements(By.ID, "injected") == []
        details = driver.find_element(By.CSS_SELECTOR, f'details[data-wheel="{WHEEL}"]')
        details.find_element(By.TAG_NAME, "summary").click()
        assert evil in details.find_element(By.CSS_SELECTOR, 'tr[data-check="dist:nccl"]').text


@pytest.mark.skipif(not shutil.which("curl"), reason="curl is not installed (apt-get install curl)")
def test_the_pages_node_installer_command_installs_on_an_air_gapped_node(
    pipeline: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    """The node installer's command exactly as the page shows it (read from the page, unescaped),
    run by bash on a node with only Python, pip and its torch: no pip configuration, no index
    reachable, WH the wheelhouse's file:// URL. It fetches tools/ds-node-install.py, checks its
    sha256 and installs the wheel that fits."""
    import html
    import re

    from builder import node
    from builder.wheelhouse.page import node_installer_command

    house, _ = pipeline
    page = (house / "index.html").read_text()
    (shown,) = re.findall(r'<pre class="cmd" data-kind="node-installer" data-wheel=""><code>(.*?)</code></pre>', page,
                          re.S)  # fmt: skip
    command = html.unescape(shown)
    manifest = node.parse_manifest((house / "manifest.json").read_text())
    assert command == node_installer_command(manifest)
    python = node_venv(tmp_path / "node", "torch==2.13.0")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_", "PYTHON"))}
    env.update(
        PATH=f"{tmp_path / 'node' / 'bin'}{os.pathsep}{env['PATH']}",
        PIP_CONFIG_FILE="/dev/null",
        PIP_INDEX_URL="http://127.0.0.1:9/simple/",
        PIP_NO_CACHE_DIR="1",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        TMPDIR=str(tmp_path / "tmp"),  # the command's `mktemp -d` folders: the test's, not /tmp's
    )
    (tmp_path / "run").mkdir()
    (tmp_path / "tmp").mkdir()
    done = subprocess.run(["bash", "-c", f'WH="{house.resolve().as_uri()}"\n{command}'], cwd=tmp_path / "run",
                          env=env, capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "ds-node-install.py: OK" in done.stdout and f"==> chosen: {WHEEL}" in done.stderr
    version = subprocess.run([python, "-c", "import deepspeed; print(deepspeed.__version__)"], capture_output=True,
                             text=True, check=True).stdout.strip().splitlines()[-1]  # fmt: skip
    assert version == VERSION
    assert f"manifest signed by {node.fingerprint_of(manifest.signer)}" in done.stderr
    # A tampered installer in the wheelhouse is refused by the command's own check: nothing runs.
    tool = house / "tools" / "ds-node-install.py"
    original = tool.read_bytes()
    try:
        tool.write_bytes(original + b"\nraise SystemExit('tampered installer ran')\n")
        refused = subprocess.run(["bash", "-c", f'WH="{house.resolve().as_uri()}"\n{command}'],
                                 cwd=tmp_path / "run", env=env, capture_output=True, text=True)  # fmt: skip
        assert refused.returncode != 0 and "FAILED" in refused.stdout + refused.stderr
        assert "tampered installer ran" not in refused.stdout + refused.stderr
    finally:
        tool.write_bytes(original)
    # Issue 28's forgery on the real wheel, on a copy of the wheelhouse: a line planted in DeepSpeed's
    # __init__.py, the new sha256 put into the smoke report and the manifest. The page's command
    # stops at the signature: neither the installer nor pip runs.
    forged = tmp_path / "forged"
    shutil.copytree(house, forged)
    wheel = forged / WHEEL
    with zipfile.ZipFile(house / WHEEL) as src, zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            data = src.read(info)
            dst.writestr(info, data + b"\nraise SystemExit('planted line ran')\n" if info.filename ==
                         "deepspeed/__init__.py" else data)  # fmt: skip
    data = json.loads((forged / "manifest.json").read_text())
    data["wheels"][WHEEL]["sha256"] = hashlib.sha256(wheel.read_bytes()).hexdigest()
    (forged / "manifest.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    refused = subprocess.run(["bash", "-c", f'WH="{forged.as_uri()}"\n{command}'], cwd=tmp_path / "run", env=env,
                             capture_output=True, text=True)  # fmt: skip
    assert refused.returncode != 0 and "Could not verify signature" in refused.stdout + refused.stderr
    assert "==> chosen" not in refused.stderr and "pip install" not in refused.stderr


def test_adding_an_op_compiles_that_op_alone(
    pipeline: tuple[Path, subprocess.CompletedProcess[str]], workspace: Path, tmp_path: Path
) -> None:
    """Op units (issue 21): the default recipe plus pin_memory, built in another work folder that
    shares the first one's unit cache (DS_BUILDER_UNIT_CACHE, as a cluster shares one): the default's units
    come from the cache, only the new op compiles, and the wheel assembled from them holds every op."""
    text = default_recipe_text()
    recipe = tmp_path / "cpu-pin.toml"
    recipe.write_text(text.replace('ops = ["cpu_adam"', 'ops = ["pin_memory", "cpu_adam"'))
    env = {**os.environ, "DS_BUILDER_UNIT_CACHE": str(workspace / "cache" / "units")}
    work = tmp_path / "work"
    done = subprocess.run([sys.executable, "-m", "builder", "build-wheel", "--recipe", str(recipe), "--work-dir",
                           str(work), "--no-smoke"], cwd=ROOT, capture_output=True, text=True, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-5000:]
    record = json.loads((work / "dist" / f"{WHEEL}.build.json").read_text())
    statuses = {op: unit["status"] for op, unit in record["units"].items()}
    assert statuses == {**dict.fromkeys(OPS, "cached"), "pin_memory": "built"}, statuses
    assert "unit cpu_adam: cached" in done.stderr
    with zipfile.ZipFile(work / "dist" / WHEEL) as zf:
        names = zf.namelist()
        installed = zf.read("deepspeed/git_version_info_installed.py").decode()
    for op in (*OPS, "pin_memory"):
        assert f"'{op}': 1" in installed
    assert sum(n.endswith(".so") for n in names) == len(OPS) + 1


def test_a_recipes_configs_add_the_ops_they_load(
    pipeline: tuple[Path, subprocess.CompletedProcess[str]], workspace: Path, tmp_path: Path
) -> None:
    """Issue 29, recipes from configs: a recipe naming cpu_adam and shm comm, and the site's Adam
    ZeRO-0 config. The build runs the config from its wheel, finds fused_adam loaded (refused, not
    compiled), adds it and builds again; every unit comes from the shared unit cache."""
    configs = tmp_path / "configs"  # a recipe reads configs from its own folder only
    configs.mkdir()
    for name in ("adam-zero0.json", "adam-zero2-offload.json"):
        shutil.copy(ROOT / "recipes" / "configs" / name, configs / name)
    text = default_recipe_text().replace('name = "cpu"', 'name = "site"')
    text = text.replace('ops = ["cpu_adam", "cpu_adagrad", "cpu_lion", "deepspeed_shm_comm", "fused_adam"]',
                        'ops = ["cpu_adam", "deepspeed_shm_comm"]\nconfigs = ["configs/adam-zero0.json", '
                        '"configs/adam-zero2-offload.json"]')  # fmt: skip
    recipe = tmp_path / "site.toml"
    recipe.write_text(text)
    env = {**os.environ, "DS_BUILDER_UNIT_CACHE": str(workspace / "cache" / "units")}
    work = tmp_path / "work"
    done = subprocess.run([sys.executable, "-m", "builder", "build-wheel", "--recipe", str(recipe), "--work-dir",
                           str(work), "--no-smoke"], cwd=ROOT, capture_output=True, text=True, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-5000:]
    assert ("site: configs/adam-zero0.json loads fused_adam: adding fused_adam to its ops and building "
            "again") in done.stderr  # fmt: skip
    with zipfile.ZipFile(work / "dist" / WHEEL) as zf:
        manifest = json.loads(zf.read(f"deepspeed-{VERSION}.dist-info/ds_builder.json"))
    assert manifest["ops"] == ["cpu_adam", "deepspeed_shm_comm", "fused_adam"]
    assert manifest["ops_from_configs"] == ["fused_adam"]
    assert sorted(manifest["configs"]) == ["configs/adam-zero0.json", "configs/adam-zero2-offload.json"]
    record = json.loads((work / "dist" / f"{WHEEL}.build.json").read_text())
    assert {op: unit["status"] for op, unit in record["units"].items()} == dict.fromkeys(manifest["ops"], "cached")


def no_ssh_keygen(argv: list[str]) -> list[str]:
    """`argv` run where ssh-keygen is not on PATH: /dev/null bound over it in a mount namespace of its
    own (root only; the test skips otherwise)."""
    found = shutil.which("ssh-keygen")
    if os.getuid() != 0 or found is None or shutil.which("unshare") is None:
        pytest.skip("hiding ssh-keygen needs root, unshare and an ssh-keygen to hide")
    return ["unshare", "--mount", "--propagation", "private", "sh", "-ec", 'mount --bind /dev/null "$0"; exec "$@"',
            found, *argv]  # fmt: skip


LBFGS = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "LBFGS", "params": {"lr": 1e-3}},
         "zero_optimization": {"stage": 0}}  # fmt: skip
LBFGS_ERROR = "TypeError: LBFGS.step() missing 1 required positional argument: 'closure'"


def test_deepspeeds_own_failure_is_told_from_the_wheels_and_a_listed_one_is_published(
    pipeline: tuple[Path, subprocess.CompletedProcess[str]], workspace: Path, tmp_path: Path
) -> None:
    """Issue 49: a config that fails from the wheel runs again without it (DeepSpeed 0.19.8 from its
    sdist, no op prebuilt, torch 2.13.0+cpu). A real DeepSpeed failure on CPU: DeepSpeed accepts any
    torch.optim name and its engine steps LBFGS without the closure LBFGS needs. A site config with it,
    listed under [known_failures], is published as DeepSpeed's own; the same config not listed, or as a
    matrix row, is judged from the same real reference runs; a config that passes there is the wheel's."""
    from builder import configs, reference
    from builder.contracts import BuildManifest
    from builder.smoke import run_folders
    from builder.workspace import Workspace

    folder = tmp_path / "configs"  # a recipe reads configs from its own folder only
    folder.mkdir()
    (folder / "lbfgs-zero0.json").write_text(json.dumps(LBFGS))
    shutil.copy(ROOT / "recipes" / "configs" / "adam-zero0.json", folder / "adam-zero0.json")
    text = default_recipe_text().replace('name = "cpu"', 'name = "site"')
    text = text.replace(
        "\n[deepspeed]",
        'configs = ["configs/adam-zero0.json", "configs/lbfgs-zero0.json"]\n\n'
        '[known_failures]\n"configs/lbfgs-zero0.json" = { reason = "DeepSpeed steps LBFGS without '
        'its closure", link = "https://github.com/deepspeedai/DeepSpeed/issues/0" }\n\n[deepspeed]',
        1,
    )
    recipe = tmp_path / "site.toml"
    recipe.write_text(text)
    work, house = tmp_path / "work", tmp_path / "house"
    env = {**os.environ, "DS_BUILDER_UNIT_CACHE": str(workspace / "cache" / "units")}
    argv = [sys.executable, "-m", "builder", "build-wheel", "--recipe", str(recipe), "--work-dir", str(work),
            "--wheelhouse", str(house)]  # fmt: skip
    # Issue 49, a GPU node as it comes: no OpenSSH client. Publishing says so before building; a build
    # and its smoke with --no-publish need none (the shared units' signatures are checked with openssl).
    refused = subprocess.run(no_ssh_keygen(argv), cwd=ROOT, capture_output=True, text=True, env=env)
    assert refused.returncode == 13, refused.stderr[-3000:]
    assert "publishing signs the wheelhouse's manifest with ssh-keygen, which is not on PATH" in refused.stderr
    assert "--no-publish" in refused.stderr and not (work / "dist").exists()
    done = subprocess.run(no_ssh_keygen([*argv, "--no-publish"]), cwd=ROOT, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-5000:]
    published = builder("publish", str(work / "dist" / WHEEL), "--work-dir", str(work), "--wheelhouse", str(house))
    assert published.returncode == 0, published.stderr[-3000:]
    name = "config:site/configs/lbfgs-zero0.json"
    report = json.loads((work / "dist" / f"{WHEEL}.smoke.json").read_text())
    checks = {c["name"]: c for c in report["checks"]}
    assert checks[name]["status"] == "upstream", checks[name]
    first = checks[name]["detail"].splitlines()[0]
    assert first.startswith("DeepSpeed's own failure, not the wheel's: the same error with DeepSpeed 0.19.8 from its "
                            "sdist with no op prebuilt and torch 2.13.0+cpu; it compiled deepspeed_shm_comm at first "
                            f"use: {LBFGS_ERROR}; listed by the recipe as a known failure: DeepSpeed steps LBFGS "
                            "without its closure (https://github.com/deepspeedai/DeepSpeed/issues/0)")  # fmt: skip
    assert checks["config:site/configs/adam-zero0.json"]["status"] == "passed"
    manifest = json.loads((house / "manifest.json").read_text())
    assert manifest["wheels"][WHEEL]["smoke"]["checks"][name] == {"status": "upstream", "detail": first}
    page = (house / "index.html").read_text()
    assert "fails in DeepSpeed itself" in page and "DeepSpeed steps LBFGS without its closure" in page
    # The same real reference (made above, kept in the work folder's cache) judges the other cases.
    wheel = work / "dist" / WHEEL
    built = BuildManifest.from_wheel(wheel)
    ws = Workspace(work)
    run = tmp_path / "again"
    run.mkdir()
    cases = [
        configs.ConfigCase("LBFGS/zero0/none/fp32", LBFGS),  # a matrix row with DeepSpeed's failure
        configs.ConfigCase("configs/adam-zero0.json", json.loads((folder / "adam-zero0.json").read_text()), "site"),
    ]
    failed = [configs.Outcome(c.name, "failed", f"{LBFGS_ERROR}\nas the wheel's run said") for c in cases[:1]]
    # FAKE outcome: a failure the wheel's run never had (the wheel passes it), to see the reference's word.
    failed.append(configs.Outcome(cases[1].name, "failed", "RuntimeError: only with the wheel"))
    said = reference.blame(failed, cases, built, ws, None, run_folders(run), run, tmp_path / "ref.log")
    row = configs.as_check(failed[0], "cpu", site=False, blame=said[cases[0].name])
    assert row.status == "upstream" and row.detail.startswith("DeepSpeed's own failure, not the wheel's")
    unlisted = configs.as_check(failed[0], "cpu", site=True, blame=said[cases[0].name])
    assert unlisted.status == "failed" and "under [known_failures]" in unlisted.detail.splitlines()[0]
    assert said[cases[1].name].whose == "wheel"
    assert configs.as_check(failed[1], "cpu", site=True, blame=said[cases[1].name]).status == "failed"
