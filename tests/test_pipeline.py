"""The default recipe built for real, as a new user runs it: units compiled in the Debian 11 root,
the smoke, the signed publish; what pip and verify make of the wheelhouse; an unchanged recipe up to
date; a clean rebuild in another folder giving the same bytes. The build is conftest's
`default_build` (once per run); test_pipeline_installs.py, test_pipeline_images.py and
test_pipeline_units.py read it from other workers.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from email.parser import Parser
from pathlib import Path

import pytest
from conftest import DefaultBuild, copy_house, own_envs
from pipeline_common import OPS, OPTIMIZERS, PLATFORM, ROOT, VERSION, WHEEL, builder

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def clean_rebuild(
    pipeline: tuple[Path, subprocess.CompletedProcess[str]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, Path, subprocess.Popen[bytes]]]:
    """A second clean build of the default recipe, in a folder of another name with its own cold
    ccache, its own build environment (at another path) and without the precompiled torch header
    (DS_BUILDER_PCH=0), started in the background once the first is published: it compiles while the
    tests below use the wheelhouse (most of them wait on processes, not cores), and the
    reproducibility test reads it. Killed at the module's end if it is still running (its compilers
    die with it)."""
    other = tmp_path_factory.mktemp("rebuild") / "another-work-folder"
    log = other.parent / "build-wheel.log"
    with open(log, "wb") as out:
        argv = [sys.executable, "-m", "builder", "build-wheel", "--work-dir", str(other), "--no-smoke"]
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env=own_envs({**os.environ, "DS_BUILDER_PCH": "0"}))  # fmt: skip
    yield other, log, proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_build_wheel_leaves_a_smoke_tested_wheel_in_the_wheelhouse(
    default_build: DefaultBuild,
    clean_rebuild: tuple[Path, Path, subprocess.Popen[bytes]],  # started here, read by the reproducibility test
) -> None:
    house, result, workspace = default_build.house, default_build.result, default_build.work
    assert [p.name for p in house.glob("deepspeed-*.whl")] == [WHEEL]
    # Nothing left in the temporary folder: the smoke's 91 configs, its engine check and its tiny model
    # left a folder each in /tmp before (8,000 after a day of runs).
    assert sorted(p.name for p in default_build.tmpdir.iterdir()) == []
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


def test_unchanged_recipe_is_up_to_date(default_build: DefaultBuild, tmp_path: Path) -> None:
    """build-wheel again in the same work folder: nothing built or smoked again. It publishes into a
    copy of the wheelhouse: other workers read the original, which a new serial would change."""
    house = copy_house(default_build, tmp_path / "wheelhouse")
    before = (house / WHEEL).read_bytes()
    again = builder("build-wheel", "--work-dir", str(default_build.work), "--wheelhouse", str(house))
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
