"""Unit tests cannot start processes by accident; integration tests share one cached workspace."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).with_name("data")

# One sdist cache for every work folder the integration tests make (each worker's, the
# reproducibility build's, the system-torch image's, the matrix targets'), inherited by every
# builder they start: sdists are verified by sha256 on every use, so sharing them is safe.
SDIST_CACHE = Path(tempfile.gettempdir()) / f"ds-builder-test-sdists-{os.getuid()}"
os.environ.setdefault("DS_BUILDER_SDIST_CACHE", str(SDIST_CACHE))
# The signing key and the node's record of accepted serials: the test run's own (each pytest worker
# makes one key on its first publish), never the user's ~/.config or a node's /var/lib.
_TRUST_HOME = Path(tempfile.mkdtemp(prefix="ds-builder-test-trust-"))
atexit.register(shutil.rmtree, _TRUST_HOME, True)
os.environ.setdefault("DS_BUILDER_KEYS", str(_TRUST_HOME / "keys"))
os.environ.setdefault("DS_NODE_STATE_DIR", str(_TRUST_HOME / "node-state"))


def pytest_report_header() -> list[str]:
    try:
        import torch

        torch_line = f"torch {torch.__version__} (CUDA {torch.version.cuda}, GPU visible: {torch.cuda.is_available()})"
    except ImportError:
        torch_line = "torch: not installed in the test environment"
    nvcc = shutil.which("nvcc") or (os.path.exists("/usr/local/cuda/bin/nvcc") and "/usr/local/cuda/bin/nvcc")
    return [
        f"builder tests on Python {sys.version.split()[0]}, {os.cpu_count()} cores",
        torch_line,
        f"nvcc: {nvcc or 'absent'}",
    ]


@pytest.fixture(autouse=True)
def _no_accidental_processes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("integration") or request.node.get_closest_marker("spawns"):
        return

    popen = subprocess.Popen

    def refuse(*args: Any, **kwargs: Any) -> Any:
        argv = args[0] if args else kwargs.get("args")
        if isinstance(argv, (list, tuple)) and argv and os.path.basename(str(argv[0])) == "ssh-keygen":
            return popen(*args, **kwargs)  # signing and verifying a manifest: every wheelhouse write does (ms)
        raise AssertionError(f"unit test tried to start a process: {argv if argv is not None else kwargs}")

    monkeypatch.setattr(subprocess, "Popen", refuse)


@pytest.fixture(scope="session")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One work folder for every integration test of a pytest worker, so the sdist and build env
    are fetched once per worker (xdist workers run test files side by side; each gets its own).

    BUILDER_TEST_WORK_DIR reuses a folder across runs (its cache) when set.
    """
    fixed = os.environ.get("BUILDER_TEST_WORK_DIR")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    yield (Path(fixed) / worker if worker else Path(fixed)) if fixed else tmp_path_factory.mktemp("work")


@pytest.fixture
def own_workspace(workspace: Path, tmp_path: Path) -> Path:
    """A work folder of this test's own (dist/, coverage/, logs/) whose cache/ is the worker's,
    for a test whose recipes make the same wheel file names as another test's: sharing dist/
    would make the second build refuse the name clash (or, with --force, replace the other's wheel)."""
    (workspace / "cache").mkdir(parents=True, exist_ok=True)
    own = tmp_path / "work"
    own.mkdir()
    (own / "cache").symlink_to(workspace / "cache", target_is_directory=True)
    return own


# The order test files reach the pytest workers (nox -s tests: --dist loadfile, --no-loadscope-reorder;
# each worker is handed two files at the start, then one whenever it has fewer than two). The three
# longest start at once, one a worker, each with a short file behind it; the medium ones go next to
# whichever worker is free first; the short ones fill in after.
LONGEST = ("test_pipeline.py", "test_cluster.py", "test_every_op.py")
MEDIUM = ("test_cuda_pipeline.py", "test_system_torch.py", "test_torch_builds.py")


def file_order(names: list[str]) -> list[str]:
    """Test files in the order they should start (pure)."""
    short = [n for n in names if n not in LONGEST and n not in MEDIUM]
    first = [n for n in LONGEST if n in names]
    return first + short[: len(first)] + [n for n in MEDIUM if n in names] + short[len(first) :]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The GPU tier's one table of what ran and what it measured (nox -s gpu)."""
    from gpu_table import ROWS, render

    for line in render(ROWS):
        terminalreporter.write_line(line)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(file_order(sorted({item.path.name for item in items})))}
    items.sort(key=lambda item: rank[item.path.name])  # stable: each file's own order is kept
