"""A recipe names torch's build, and the build environment is checked to have got it (issue 31, item 6).

PyTorch's indexes (download.pytorch.org/whl/cpu, /cu126, ...) cannot be reached from these machines,
so a local folder index laid out as PyTorch's stands in for one: the same PEP 503 pages, holding this
machine's torch 2.13.0+cpu wheel. pip's sources are narrowed to ones without that wheel, so the torch
the environment gets can only have come from the index the recipe names. Each case runs the real
`detect --recipe`, which makes the recipe's build environment and checks it as a build does, in a
work folder of its own, not the run's shared folder of environments (an environment with that exact
torch elsewhere would rightly be reused).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest
from conftest import own_envs
from fakes import CPU_TORCH, default_recipe_text, local_cpu_torch, pytorch_like_index

from builder import envs

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.integration
WHEEL = local_cpu_torch()
needs_wheel = pytest.mark.skipif(
    WHEEL is None or sys.version_info[:2] != (3, 11),
    reason=f"needs {CPU_TORCH} in pip's find-links (this machine's local CPU torch) and Python 3.11",
)


def sources_without_torch(wheel: Path) -> dict[str, str]:
    """This machine's pip sources less the folder that holds the CPU torch wheel (and no config file)."""
    mine = envs.pip_sources()
    # uv's own variables too: nox hands pip's sources to uv as UV_FIND_LINKS and friends.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env["PIP_CONFIG_FILE"] = os.devnull
    links = [f for f in mine.find_links if Path(urllib.parse.urlparse(f).path or f) != wheel.parent]
    env["PIP_FIND_LINKS"] = " ".join(links)
    if mine.extra_index_urls:
        env["PIP_EXTRA_INDEX_URL"] = " ".join(mine.extra_index_urls)
    if mine.index_url:
        env["PIP_INDEX_URL"] = mine.index_url
    return env


def recipe_with_torch(folder: Path, torch_table: str, name: str = "named") -> Path:
    text = default_recipe_text().replace('name = "cpu"', f'name = "{name}"')
    start = text.index("[torch]")
    path = folder / f"{name}.toml"
    path.write_text(text[:start] + "[torch]\n" + torch_table)
    return path


def detect(recipe: Path, work: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "builder", "detect", "--recipe", str(recipe), "--work-dir", str(work), "--json"],
        cwd=ROOT, capture_output=True, text=True, env=own_envs(env), timeout=900,
    )  # fmt: skip


@needs_wheel
def test_torchs_named_build_comes_from_the_recipes_index(tmp_path: Path) -> None:
    assert WHEEL is not None
    index = pytorch_like_index(tmp_path / "pytorch", WHEEL)
    env = sources_without_torch(WHEEL)
    recipe = recipe_with_torch(tmp_path, f'version = "2.13.0"\nvariant = "cpu"\nindex = "{index}"\n')
    done = detect(recipe, tmp_path / "work", env)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["torch"]["version"] == "2.13.0+cpu" and report["torch"]["cuda"] is None
    assert f"torch==2.13.0+cpu: from {index}" in done.stderr
    assert f"--extra-index-url {index}" in done.stderr  # handed to uv as the recipe says


@needs_wheel
def test_a_named_build_no_source_has_is_an_error_naming_the_index(tmp_path: Path) -> None:
    """variant = "cpu" with no index: pip's sources lack torch 2.13.0+cpu, so PyTorch's own index is
    asked, which this machine cannot reach: one clear error naming it and what to do."""
    assert WHEEL is not None
    env = sources_without_torch(WHEEL)
    recipe = recipe_with_torch(tmp_path, 'version = "2.13.0"\nvariant = "cpu"\n', name="unreached")
    done = detect(recipe, tmp_path / "work", env)
    assert done.returncode == 3, done.stderr[-3000:]
    assert "torch==2.13.0+cpu: from https://download.pytorch.org/whl/cpu" in done.stderr
    assert ("fix: torch==2.13.0+cpu comes from https://download.pytorch.org/whl/cpu (pip's sources do not have "
            "it): check that this machine reaches it, or name a mirror it reaches in the recipe's [torch] index"
            in done.stderr)  # fmt: skip
    assert "Traceback" not in done.stderr


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="torch 2.14.1's CUDA build here is for Python 3.11")
def test_a_cpu_recipe_given_an_indexs_cuda_build_is_refused(tmp_path: Path) -> None:
    """The issue's trap: a CPU recipe pinning a version whose default build on the index is CUDA
    (PyPI's torch 2.14.1: CUDA 13.0, with its nvidia packages) was labelled +cpu; now refused."""
    recipe = recipe_with_torch(tmp_path, 'version = "2.14.1"\n', name="cudatorch")
    done = detect(recipe, tmp_path / "work", dict(os.environ))
    assert done.returncode == 5, done.stderr[-3000:]
    assert ("error: recipe cudatorch is a cpu recipe, but its build environment got torch 2.14.1+cu130, the CUDA "
            "13.0 build (from pip's sources)") in done.stderr  # fmt: skip
    assert 'variant = "cpu" (PyTorch\'s index https://download.pytorch.org/whl/cpu' in done.stderr
    assert "Traceback" not in done.stderr
