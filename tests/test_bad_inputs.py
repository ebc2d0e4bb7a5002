"""Bad recipes through the real CLI, against the real DeepSpeed sdist: one clear error, no wheel."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fakes import default_recipe_text

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = default_recipe_text()


def builder(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder", *args], cwd=ROOT, capture_output=True, text=True)


def recipe(tmp_path: Path, old: str, new: str) -> Path:
    assert old in DEFAULT
    path = tmp_path / "r.toml"
    path.write_text(DEFAULT.replace(old, new))
    return path


@pytest.mark.spawns
def test_unknown_key_fails_before_any_work(tmp_path: Path) -> None:
    path = recipe(tmp_path, "ops =", "opz =")
    result = builder("build-wheel", "--recipe", str(path), "--work-dir", str(tmp_path / "w"))
    assert result.returncode == 2
    assert f'error: {path}: unknown key "opz" (did you mean "ops"?)' in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "w").exists()


@pytest.mark.integration
def test_unknown_op_is_checked_against_deepspeeds_own_list(tmp_path: Path, workspace: Path) -> None:
    path = recipe(tmp_path, '"cpu_lion",', '"cpu_loin",')
    result = builder("build-wheel", "--recipe", str(path), "--work-dir", str(workspace))
    assert result.returncode == 2, result.stderr[-3000:]
    assert 'error: unknown op "cpu_loin" for the cpu accelerator (did you mean "cpu_lion"?)' in result.stderr
    assert "pip wheel" not in result.stderr  # refused before a build was started


@pytest.mark.integration
def test_incompatible_op_is_named_with_the_reason(tmp_path: Path, workspace: Path) -> None:
    """deepspeed_ccl_comm passes DeepSpeed's own check, then its builder raises for want of oneCCL:
    refused before anything compiles, with the reason and the fix."""
    path = recipe(tmp_path, '"fused_adam"]', '"fused_adam", "deepspeed_ccl_comm"]')
    result = builder("build-wheel", "--recipe", str(path), "--work-dir", str(workspace))
    assert result.returncode == 5, result.stderr[-3000:]
    assert "error: cannot build deepspeed_ccl_comm here: deepspeed_ccl_comm: it links Intel oneCCL" in result.stderr
    assert "CCL_ROOT" in result.stderr and 'on_op_failure = "drop"' in result.stderr
    assert "pip wheel" not in result.stderr  # refused before a build was started


@pytest.mark.integration
def test_sdist_with_the_wrong_hash_is_refused(tmp_path: Path) -> None:
    bad = "0" * 64
    path = recipe(tmp_path, "9e491abd0827ea5c389dd702e15e11e13d83d904bac4a20d6c2a4cb37207a9af", bad)
    work = tmp_path / "w"
    result = builder("build-wheel", "--recipe", str(path), "--work-dir", str(work))
    assert result.returncode == 4, result.stderr[-3000:]
    assert f"has sha256 9e491abd0827ea5c389dd702e15e11e13d83d904bac4a20d6c2a4cb37207a9af, the recipe pins {bad}" in (
        result.stderr
    )
    assert not list(work.rglob("*.tar.gz"))  # the unverified download was not kept
