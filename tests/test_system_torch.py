"""torch = "system": build from inside a venv that already has the CPU torch, as on a cluster image."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from builder import envs

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.integration


def one_op_recipe(folder: Path) -> Path:
    """recipes/system-cpu.toml with cpu_adam alone: what is under test is the system torch, not
    the number of ops (the default recipe's three are built by test_pipeline)."""
    text = (ROOT / "recipes" / "system-cpu.toml").read_text()
    start = text.index("ops = [")
    end = text.index("]", start) + 1
    assert "cpu_adam" in text[start:end]
    recipe = folder / "system-cpu.toml"
    recipe.write_text(text[:start] + 'ops = ["cpu_adam"]' + text[end:])
    return recipe


def test_system_torch_recipe_builds_and_smokes_against_the_installed_torch(tmp_path: Path) -> None:
    image = tmp_path / "image"  # stands in for a cluster image's Python with its own torch
    uv = envs.uv_binary(envs.TOOLS)  # the image is made by uv for speed; the builder inside it uses venv + pip
    subprocess.run([uv, "venv", "--quiet", "--python", sys.executable, str(image)], check=True)
    python = str(image / "bin" / "python")
    sources = envs.pip_sources().uv_args()
    subprocess.run(
        [uv, "pip", "install", "--quiet", "--python", python, *sources, "torch==2.13.0", str(ROOT)], check=True
    )
    torch_version = subprocess.run(
        [python, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True, check=True
    ).stdout.strip()
    house = tmp_path / "wheelhouse"
    result = subprocess.run(
        [python, "-m", "builder", "build-wheel", "--recipe", str(one_op_recipe(tmp_path)),
         "--work-dir", str(tmp_path / "work"), "--wheelhouse", str(house)],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-5000:]
    assert 'torch = "system": building against the torch installed for' in result.stderr
    # The image's torch was used, not a fresh download: uv was asked what the image lacks, and
    # only DeepSpeed's own needs were installed beside it (in the build env and in the smoke env).
    installed = [line for line in result.stderr.splitlines() if "packages beside the system's:" in line]
    assert len(installed) == 2 and all(" torch==" not in line for line in installed), installed
    assert "ninja==" in installed[0] and "transformers==" in installed[1]
    entry = next(iter(json.loads((house / "manifest.json").read_text())["wheels"].values()))
    assert entry["torch"] == torch_version
    assert entry["version"] == "0.19.8+cpu.torch2.13"
    assert entry["smoke"]["passed"] and entry["smoke"]["checks"]["numerics:cpu_adam"]["status"] == "passed"
    unchanged = subprocess.run(
        [python, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert unchanged == torch_version  # the image's torch was not touched
