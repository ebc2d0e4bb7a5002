"""Every op, for real, on the CPU accelerator (issue 21): ops = "all" with ops_except, async_io with
libaio carried inside the wheel and used on a node whose system has no libaio, a failing op named
with the compiler's words, then dropped with on_op_failure = "drop" and said missing by the
manifest, the coverage report and `install --dry-run`.

deepspeed_ccl_comm is the failing op: CCL_ROOT points at a folder with no oneCCL (as on a node with
oneCCL's runtime but not its headers), so g++ stops at `#include <oneapi/ccl.hpp>`. The CPU
optimizers and the two cheap extra ops are left out (ops_except): they are built by test_pipeline.
About 5 minutes on 2 cores (async_io's 12 files).

The drop run is also the real matrix test: two recipes x two Pythons, failing targets on purpose.
The recipes name torch's CPU build (variant = "cpu") from a local folder index standing in for
PyTorch's /whl/cpu, which holds this machine's one CPU torch: for Python 3.11. Python 3.12 (pyenv)
has no CPU torch 2.13.0 anywhere these machines reach (PyPI's 2.13.0 is the CUDA build, which a CPU
recipe refuses), so its targets fail at their build environment, naming the index. The ccl recipe
(deepspeed_ccl_comm alone, failing on a failed op) fails to compile. The matrix must go on past
every failure, publish the good target and report the bad ones with the reason (exit 11).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from fakes import CPU_TORCH, default_recipe_text, local_cpu_torch, pytorch_like_index
from nodes import node_venv

from builder.errors import ToolError
from builder.targets import find_interpreter

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the cpu recipe's local torch wheel is for Python 3.11"),
    pytest.mark.skipif(
        not Path("/usr/include/libaio.h").exists(),
        reason="async_io needs libaio-dev on the build host: apt-get install libaio-dev (.ci/run installs it)",
    ),
    pytest.mark.skipif(local_cpu_torch() is None, reason=f"needs {CPU_TORCH} in pip's find-links"),
]
ROOT = Path(__file__).resolve().parents[1]
WHEEL = "deepspeed-0.19.8+cpu.torch2.13.all-cp311-cp311-manylinux_2_28_x86_64.whl"
EXCEPT = ["cpu_adam", "cpu_adagrad", "cpu_lion", "deepspeed_shm_comm", "fused_adam"]
AIO_CHECK = """
import os, torch
from deepspeed.ops.op_builder import AsyncIOBuilder
h = AsyncIOBuilder().load(verbose=False).aio_handle(1024 * 1024, 8, False, False, 1)
t = torch.randn(1024 * 1024)
path = os.path.join(os.getcwd(), "aio.bin")
h.sync_pwrite(t, path)
back = torch.zeros_like(t)
h.sync_pread(back, path)
os.remove(path)
assert torch.equal(back, t), "read back differs"
maps = sorted({line.split()[-1] for line in open("/proc/self/maps") if "libaio" in line})
print("LIBAIO", " ".join(maps))
"""


def _python312() -> str | None:
    try:
        return str(find_interpreter("3.12").path)
    except ToolError:
        return None


PY312 = _python312()


def _torch(text: str, index: str) -> str:
    """A recipe's text with [torch] naming the CPU build from `index` (the stand-in for PyTorch's)."""
    return text[: text.index("[torch]")] + f'[torch]\nversion = "2.13.0"\nvariant = "cpu"\nindex = "{index}"\n'


def _recipe(folder: Path, name: str, index: str, on_failure: str = "fail") -> Path:
    """recipes/cpu-all.toml less EXCEPT, failing on a failed op (or dropping it)."""
    text = (ROOT / "recipes" / "cpu-all.toml").read_text()
    text = text.replace('name = "cpu-all"', f'name = "{name}"')
    text = text.replace('on_op_failure = "drop"', f'on_op_failure = "{on_failure}"\nops_except = {json.dumps(EXCEPT)}')
    path = folder / f"{name}.toml"
    path.write_text(_torch(text, index))
    return path


@pytest.fixture(scope="module")
def runs(workspace: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The same op selection built twice into one work folder: a recipe whose on_op_failure is
    "fail", then a matrix holding it with on_op_failure = "drop" and the ccl recipe, for Python 3.11
    and 3.12 (it writes the coverage report); then the matrix again, which builds nothing."""
    folder = tmp_path_factory.mktemp("every-op")
    wheel = local_cpu_torch()
    assert wheel is not None
    index = pytorch_like_index(folder / "pytorch", wheel)
    no_oneccl = folder / "oneccl"  # CCL_ROOT without oneCCL in it
    (no_oneccl / "lib").mkdir(parents=True)
    env = {**os.environ, "CCL_ROOT": str(no_oneccl), "DS_BUILDER_SDIST_CACHE": str(workspace / "cache" / "sdists")}
    work, house = folder / "work", folder / "wheelhouse"
    common = ["--work-dir", str(work), "--wheelhouse", str(house)]
    failed = subprocess.run([sys.executable, "-m", "builder", "build-wheel", "--recipe",
                             str(_recipe(folder, "every", index)), *common],
                            cwd=ROOT, capture_output=True, text=True, env=env)  # fmt: skip
    left = sorted(p.name for p in (work / "dist").glob("*.whl")) + sorted(p.name for p in house.glob("*"))
    _recipe(folder, "every-m", index, on_failure="drop")
    text = default_recipe_text()
    start = text.index("ops = [")
    ccl = (
        text[:start].replace('name = "cpu"', 'name = "ccl"')
        + 'ops = ["deepspeed_ccl_comm"]'
        + text[text.index("]", start) + 1 :]
    )
    (folder / "ccl.toml").write_text(_torch(ccl, index))
    matrix = folder / "matrix.toml"
    pythons = ["3.11", "3.12"] if PY312 else ["3.11"]  # the second Python's targets are the test below's
    matrix.write_text(f'recipes = ["every-m.toml", "ccl.toml"]\npython = {json.dumps(pythons)}\n')
    argv = [sys.executable, "-m", "builder", "build-wheel", "--matrix", str(matrix), *common]
    dropped = subprocess.run([*argv, "--json"], cwd=ROOT, capture_output=True, text=True, env=env)
    coverage = json.loads((work / "coverage" / "coverage.json").read_text()) if dropped.returncode == 11 else {}
    again = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env=env)
    return {"failed": failed, "dropped": dropped, "work": work, "house": house, "folder": folder, "left": left,
            "index": index, "coverage": coverage, "again": again}  # fmt: skip


def test_a_failing_op_fails_the_build_naming_it_in_the_compilers_words(runs: dict[str, object]) -> None:
    done = runs["failed"]
    assert isinstance(done, subprocess.CompletedProcess)
    assert done.returncode == 5, done.stderr[-4000:]
    assert "op deepspeed_ccl_comm failed to compile" in done.stderr, done.stderr[-4000:]
    assert "oneapi/ccl.hpp: No such file or directory" in done.stderr
    assert 'on_op_failure = "drop"' in done.stderr and "op units are cached and not rebuilt" in done.stderr
    assert runs["left"] == []  # no wheel in dist/, nothing published


def test_a_dropped_op_ships_the_wheel_without_it_and_says_why(runs: dict[str, object]) -> None:
    done, work = runs["dropped"], runs["work"]
    assert isinstance(done, subprocess.CompletedProcess) and isinstance(work, Path)
    assert done.returncode == 11, done.stderr[-5000:]  # the matrix's other targets failed (below)
    assert (
        'dropped, as the recipe allows (on_op_failure = "drop"): op deepspeed_ccl_comm failed to compile' in done.stderr
    )
    record = json.loads((work / "dist" / f"{WHEEL}.build.json").read_text())
    statuses = {op: unit["status"] for op, unit in record["units"].items()}
    # The failed build's good units were kept: the second build only retried the failing op.
    assert statuses == {"async_io": "cached", "pin_memory": "cached"}, statuses
    with zipfile.ZipFile(work / "dist" / WHEEL) as zf:
        manifest = json.loads(zf.read("deepspeed-0.19.8+cpu.torch2.13.all.dist-info/ds_builder.json"))
        names = zf.namelist()
    assert manifest["ops"] == ["async_io", "pin_memory"]
    assert manifest["recipe"]["ops"] == {"all": EXCEPT} and manifest["recipe"]["on_op_failure"] == "drop"
    assert manifest["recipe"]["name"] == "every-m"
    why = manifest["missing_ops"]["deepspeed_ccl_comm"]
    assert why.startswith("failed: op deepspeed_ccl_comm failed to compile") and "oneapi/ccl.hpp" in why
    assert set(manifest["missing_ops"]) == {"deepspeed_ccl_comm"}  # deepspeed_not_implemented is no op
    # libaio travels inside the wheel, under a name no system library has.
    (grafted,) = [n for n in names if n.startswith("deepspeed.libs/libaio-")]
    assert manifest["grafted_libraries"] == {"libaio.so.1": grafted.split("/")[1]}
    coverage = (work / "coverage" / "coverage.md").read_text()
    assert "| async_io | yes | cpu | passed | passed |" in coverage
    assert "| deepspeed_ccl_comm | no | - | - | - | failed: op deepspeed_ccl_comm failed to compile" in coverage
    smoke = json.loads((work / "dist" / f"{WHEEL}.smoke.json").read_text())
    checks = {c["name"]: c for c in smoke["checks"]}
    assert (
        checks["numerics:async_io"]["status"] == "passed"
        and "deepspeed.libs/libaio-" in checks["numerics:async_io"]["detail"]
    )
    assert checks["numerics:pin_memory"]["status"] == "passed"


def _hide_system_libaio(args: list[str]) -> list[str] | None:
    """`args` run where every system copy of libaio is an empty file (a private mount namespace, as
    root), as on a node without libaio installed; None where this machine cannot do that."""
    from builder.wheelbuild.graft import find_system_library

    system = find_system_library("libaio.so.1")  # where the loader finds it; its siblings too
    found = sorted({os.path.realpath(p) for p in glob.glob(f"{system.parent}/libaio.so*")}) if system else []
    if not found or os.geteuid() != 0 or not shutil.which("unshare"):
        return None
    masks = " && ".join(f"mount --bind /dev/null {p}" for p in found)
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", f'{masks} && exec "$@"', "sh", *args]


def test_async_io_works_on_a_node_without_libaio(runs: dict[str, object], tmp_path: Path) -> None:
    """The node installer puts the wheel on a node (a venv with pip and torch), `install --dry-run`
    shows the op table with the dropped op and why; then, with every system libaio hidden, async_io
    still writes and reads back 4 MiB through the wheel's own libaio."""
    house = runs["house"]
    python = node_venv(tmp_path / "node", "torch==2.13.0")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    dry = subprocess.run([python, "-m", "builder", "install", "--wheelhouse", str(house), "--dry-run", "--json"],
                         capture_output=True, text=True, env=env)  # fmt: skip
    assert dry.returncode == 0, dry.stderr[-3000:]
    table = {row["op"]: row for row in json.loads(dry.stdout)["op_table"]}
    assert table["async_io"]["built"] == "yes" and table["async_io"]["checked"] == "passed"
    assert table["deepspeed_ccl_comm"]["built"] == "no" and "oneapi/ccl.hpp" in table["deepspeed_ccl_comm"]["why"]
    assert "op deepspeed_ccl_comm" in dry.stderr and "built no" in dry.stderr
    done = subprocess.run([python, "-m", "builder", "install", "--wheelhouse", str(house)],
                          capture_output=True, text=True, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    hidden = _hide_system_libaio([python, "-c", "import ctypes; ctypes.CDLL('libaio.so.1')"])
    if hidden is None:
        pytest.skip("hiding the system's libaio needs root, unshare and a system libaio to hide")
    # The mask works: the system's libaio cannot be loaded in there.
    assert subprocess.run(hidden, capture_output=True, cwd=tmp_path).returncode != 0
    used = subprocess.run(_hide_system_libaio([python, "-c", AIO_CHECK]) or [], capture_output=True, text=True,
                          cwd=tmp_path)  # fmt: skip
    assert used.returncode == 0, used.stderr[-3000:]
    (line,) = [x for x in used.stdout.splitlines() if x.startswith("LIBAIO ")]
    assert "/site-packages/deepspeed.libs/libaio-" in line and "/usr/lib" not in line


@pytest.mark.skipif(PY312 is None, reason="no Python 3.12 on this machine (pyenv install 3.12 to run this test)")
def test_a_matrix_goes_on_past_its_failed_targets_and_reports_them(runs: dict[str, object]) -> None:
    """Two recipes x two Pythons: the good target is built, smoked and published; the others fail
    with their reasons (a compile error, no CPU torch for cp312 in the recipe's index), exit 11."""
    done, work, house, index = runs["dropped"], runs["work"], runs["house"], runs["index"]
    assert isinstance(done, subprocess.CompletedProcess) and isinstance(work, Path) and isinstance(house, Path)
    failed = ["every-m-cp312", "ccl", "ccl-cp312"]
    assert f"3 of 4 targets failed: {', '.join(failed)}" in done.stderr, done.stderr[-6000:]
    report = runs["coverage"]
    assert isinstance(report, dict)
    rows = {t["target"]: t for t in report["targets"]}
    assert list(rows) == ["every-m", "every-m-cp312", "ccl", "ccl-cp312"] and report["failed"] == failed
    stages = {s: v["status"] for s, v in rows["every-m"]["stages"].items()}
    assert stages == {"build": "passed", "smoke": "passed", "publish": "passed"}, rows["every-m"]
    assert rows["every-m"]["wheel"].endswith(WHEEL)
    for name in ("every-m-cp312", "ccl-cp312"):  # the build environment: no CPU torch for cp312 in the index
        build = rows[name]["stages"]["build"]
        assert build["status"] == "failed" and f"torch==2.13.0+cpu comes from {index}" in build["reason"], build
    build = rows["ccl"]["stages"]["build"]
    assert build["status"] == "failed" and "op deepspeed_ccl_comm failed to compile" in build["reason"], build
    for name in failed:
        assert rows[name]["stages"]["publish"] == {"status": "skipped", "reason": "the build failed", "seconds": 0.0}
    assert "| ccl-cp312 | 3.12." in (work / "coverage" / "coverage.md").read_text()
    # The good target's wheel in the manifest; the run's coverage published and shown on the page.
    wheels = json.loads((house / "manifest.json").read_text())["wheels"]
    assert list(wheels) == [WHEEL] and wheels[WHEEL]["smoke"]["passed"]
    page = (house / "index.html").read_text()
    assert "1 of 4 targets passed every stage they ran" in page and '<tr data-target="ccl-cp312">' in page

    # Re-running builds nothing: the good target is found by its build key, its smoke reused.
    again = runs["again"]
    assert isinstance(again, subprocess.CompletedProcess)
    assert again.returncode == 11, again.stderr[-3000:]
    assert (house / "coverage.json").read_bytes() == (work / "coverage" / "coverage.json").read_bytes()
    rerun = json.loads((work / "coverage" / "coverage.json").read_text())
    assert {t["target"]: t["stages"]["build"]["status"] for t in rerun["targets"]} == {
        "every-m": "reused", "every-m-cp312": "failed", "ccl": "failed", "ccl-cp312": "failed"
    }  # fmt: skip
    assert "pip wheel" not in again.stderr
