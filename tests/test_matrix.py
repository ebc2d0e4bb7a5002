"""A real matrix on this machine: two recipes x two Pythons, failing targets on purpose.

The recipes name torch's CPU build (variant = "cpu") from a local folder index standing in for
PyTorch's /whl/cpu, which holds this machine's one CPU torch: for Python 3.11. Python 3.12 (pyenv)
has no CPU torch 2.13.0 anywhere these machines reach (PyPI's 2.13.0 is the CUDA build, which a CPU
recipe refuses), so its targets fail at their build environment, naming the index. The ccl recipe
asks for deepspeed_ccl_comm, which needs Intel oneCCL (CCL_ROOT; not here). The matrix must go on
past every failure, publish the good target and report the bad ones with the reason (exit 11).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fakes import CPU_TORCH, default_recipe_text, local_cpu_torch, pytorch_like_index

from builder.errors import ToolError
from builder.targets import find_interpreter

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.integration


def _python312() -> str | None:
    try:
        return str(find_interpreter("3.12").path)
    except ToolError:
        return None


PY312 = _python312()


def _reasons(workspace: Path, stderr: str) -> str:
    """What a failed assertion shows: the coverage report's reasons and the end of stderr."""
    md = workspace / "coverage" / "coverage.md"
    return (md.read_text() if md.exists() else "(no coverage report)") + "\n" + stderr[-6000:]


@pytest.mark.skipif(PY312 is None, reason="no Python 3.12 on this machine (pyenv install 3.12 to run this test)")
@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the cpu recipe's local torch wheel is for Python 3.11")
@pytest.mark.skipif(local_cpu_torch() is None, reason=f"needs {CPU_TORCH} in pip's find-links")
def test_a_matrix_of_two_recipes_and_two_pythons(own_workspace: Path, tmp_path: Path) -> None:
    # adam.toml makes the wheel file name recipes/cpu.toml makes: it gets a dist/ of its own.
    workspace = own_workspace
    wheel = local_cpu_torch()
    assert wheel is not None
    index = pytorch_like_index(tmp_path / "pytorch", wheel)
    text = default_recipe_text()
    text = text[: text.index("[torch]")] + f'[torch]\nversion = "2.13.0"\nvariant = "cpu"\nindex = "{index}"\n'
    start = text.index("ops = [")
    end = text.index("]", start) + 1
    (tmp_path / "adam.toml").write_text(
        text[:start].replace('name = "cpu"', 'name = "adam"') + 'ops = ["cpu_adam"]' + text[end:]
    )
    (tmp_path / "ccl.toml").write_text(
        text[:start].replace('name = "cpu"', 'name = "ccl"') + 'ops = ["deepspeed_ccl_comm"]' + text[end:]
    )
    matrix = tmp_path / "matrix.toml"
    matrix.write_text('recipes = ["adam.toml", "ccl.toml"]\npython = ["3.11", "3.12"]\n')
    house = tmp_path / "wheelhouse"
    done = subprocess.run(
        [sys.executable, "-m", "builder", "build-wheel", "--matrix", str(matrix), "--work-dir", str(workspace),
         "--wheelhouse", str(house), "--json"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 11, done.stderr[-5000:]
    failed = ["adam-cp312", "ccl", "ccl-cp312"]
    assert f"3 of 4 targets failed: {', '.join(failed)}" in done.stderr, _reasons(workspace, done.stderr)
    report = json.loads((workspace / "coverage" / "coverage.json").read_text())
    rows = {t["target"]: t for t in report["targets"]}
    assert list(rows) == ["adam", "adam-cp312", "ccl", "ccl-cp312"] and report["failed"] == failed
    stages = {s: v["status"] for s, v in rows["adam"]["stages"].items()}
    assert stages == {"build": "passed", "smoke": "passed", "publish": "passed"}, rows["adam"]
    assert "-cp311-cp311-manylinux_" in rows["adam"]["wheel"]
    for name in ("adam-cp312", "ccl-cp312"):  # the build environment: no CPU torch for cp312 in the index
        build = rows[name]["stages"]["build"]
        assert build["status"] == "failed" and f"torch==2.13.0+cpu comes from {index}" in build["reason"], build
    build = rows["ccl"]["stages"]["build"]
    assert build["status"] == "failed" and "deepspeed_ccl_comm" in build["reason"] and "CCL_ROOT" in build["reason"]
    for name in failed:
        assert rows[name]["stages"]["publish"] == {"status": "skipped", "reason": "the build failed", "seconds": 0.0}
    assert "| adam-cp312 | 3.12." in (workspace / "coverage" / "coverage.md").read_text()

    # The good target's wheel, smoke and manifest entry; its torch the CPU build, from the recipe's index.
    wheels = json.loads((house / "manifest.json").read_text())["wheels"]
    assert [e["python_tag"] for e in wheels.values()] == ["cp311"]
    assert all(e["smoke"]["passed"] and e["smoke"]["checks"]["numerics:cpu_adam"]["status"] == "passed"
               for e in wheels.values())  # fmt: skip
    # The run's coverage is published into the wheelhouse and shown on its page, failures with why.
    assert (house / "coverage.json").read_bytes() == (workspace / "coverage" / "coverage.json").read_bytes()
    page = (house / "index.html").read_text()
    assert "1 of 4 targets passed every stage they ran" in page and '<tr data-target="ccl-cp312">' in page

    # Re-running builds nothing: every good target is found by its build key, its smoke reused.
    again = subprocess.run(
        [sys.executable, "-m", "builder", "build-wheel", "--matrix", str(matrix), "--work-dir", str(workspace),
         "--wheelhouse", str(house)],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert again.returncode == 11
    rerun = json.loads((workspace / "coverage" / "coverage.json").read_text())
    assert {t["target"]: t["stages"]["build"]["status"] for t in rerun["targets"]} == {
        "adam": "reused", "adam-cp312": "failed", "ccl": "failed", "ccl-cp312": "failed"
    }  # fmt: skip
    assert "pip wheel" not in again.stderr
