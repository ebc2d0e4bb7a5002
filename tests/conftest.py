"""Unit tests cannot start processes by accident; integration tests share one cached workspace."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
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
def held() -> Iterator[contextlib.ExitStack]:
    """What a test holds until it ends (a lock, a folder it empties then), released after it."""
    with contextlib.ExitStack() as stack:
        yield stack


@pytest.fixture
def own_workspace(workspace: Path, tmp_path: Path) -> Path:
    """A work folder of this test's own (dist/, coverage/, logs/) whose cache/ is the worker's,
    for a test whose recipes make the same wheel file names as another test's: sharing dist/
    would make the second build refuse the name clash (or, with --force, replace the other's wheel)."""
    (workspace / "cache").mkdir(parents=True, exist_ok=True)
    return work_sharing_cache(workspace, tmp_path / "work")


def work_sharing_cache(work: Path, folder: Path) -> Path:
    """A new work folder `folder` whose cache/ is `work`'s (its sdists, build env, units, the image
    base): its tmp/, dist/ and logs/ are its own, so a test can assert they are clean."""
    folder.mkdir(parents=True)
    (folder / "cache").symlink_to(work / "cache", target_is_directory=True)
    return folder


@dataclass(frozen=True)
class DefaultBuild:
    """The default recipe built, smoke-tested and published once for the whole test run."""

    work: Path  # its work folder: dist/ (the wheel, its build record), cache/ (sdists, build env, units)
    house: Path  # its wheelhouse: read it; a test that writes into one copies it (copy_house)
    result: subprocess.CompletedProcess[str]  # what `build-wheel` said
    tmpdir: Path  # the TMPDIR it ran with, which it must leave empty


def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder every pytest worker of this run shares (xdist gives each worker a folder inside it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session", autouse=True)
def _shared_build_envs(tmp_path_factory: pytest.TempPathFactory) -> None:
    """One folder of build environments for every work folder of the run (DS_BUILDER_ENV_CACHE,
    inherited by every builder the tests start): the same CPU-torch environment, 6,000 files
    bytecode-compiled, was made eight times a run, now three. Run-wide, not machine-wide: a run still
    makes each once. The default build and the clean rebuild keep their own (a new user's start, and
    a build whose environment lies at another path), as does the air-gapped build (made from its folder)."""
    from builder.envs import ENV_CACHE_ENV

    os.environ.setdefault(ENV_CACHE_ENV, str(run_folder(tmp_path_factory) / "envs"))


def own_envs(env: dict[str, str]) -> dict[str, str]:
    """`env` for a build that makes its environment in its own work folder (DS_BUILDER_ENV_CACHE unset)."""
    from builder.envs import ENV_CACHE_ENV

    return {k: v for k, v in env.items() if k != ENV_CACHE_ENV}


@pytest.fixture(scope="session")
def default_build(tmp_path_factory: pytest.TempPathFactory) -> DefaultBuild:
    """`build-wheel` with no recipe (the default), as a new user runs it, into a fresh wheelhouse with a
    TMPDIR of its own, made once per test run: the first worker to ask builds it under a file lock,
    the others wait and read what it said (it is the suite's longest single build: units, smoke,
    publish). The run's one signing key (DS_BUILDER_KEYS, above, inherited by every worker) signed it.
    BUILDER_TEST_WORK_DIR keeps its work folder between runs."""
    from filelock import FileLock

    shared = run_folder(tmp_path_factory) / "default-build"
    fixed = os.environ.get("BUILDER_TEST_WORK_DIR")
    work = Path(fixed) / "default-build" if fixed else shared / "work"
    house, tmp, said = shared / "wheelhouse", shared / "TMPDIR", shared / "build-wheel.json"
    shared.mkdir(exist_ok=True)
    with FileLock(str(shared) + ".lock"):
        if not said.exists():
            tmp.mkdir()
            done = subprocess.run([sys.executable, "-m", "builder", "build-wheel", "--work-dir", str(work),
                                   "--wheelhouse", str(house)], cwd=ROOT, capture_output=True, text=True,
                                  env=own_envs({**os.environ, "TMPDIR": str(tmp)}))  # fmt: skip
            record = {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr}
            said.with_suffix(".part").write_text(json.dumps(record))
            said.with_suffix(".part").rename(said)
        record = json.loads(said.read_text())
    result = subprocess.CompletedProcess(["build-wheel"], record["returncode"], record["stdout"], record["stderr"])
    assert result.returncode == 0, result.stderr[-5000:]
    return DefaultBuild(work, house, result, tmp)


@pytest.fixture(scope="session")
def pipeline(default_build: DefaultBuild) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The default build's wheelhouse (to read, not to write) and what build-wheel said."""
    return default_build.house, default_build.result


def copy_house(build: DefaultBuild, into: Path) -> Path:
    """A wheelhouse of a test file's own, copied from the default build's and made a wheelhouse of its
    own (`sign --new-id`: the toolkit refuses to write into a copy of a wheelhouse it publishes
    elsewhere, which nodes would take for a rollback): for tests that write into one (locks, images, a
    tampered file) while other workers read the original."""
    shutil.copytree(build.house, into, symlinks=True)
    done = subprocess.run([sys.executable, "-m", "builder", "sign", "--new-id", "--wheelhouse", str(into),
                           "--work-dir", str(into.with_name(into.name + ".work"))], cwd=ROOT, capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return into


# The order test files reach the pytest workers (nox -s tests: --dist loadfile, --no-loadscope-reorder;
# each worker is handed two files at the start, then one whenever it has two tests or fewer left). The
# longest start at once, one a worker, each with a short file behind it. The files that read the
# default build (conftest's default_build, made by test_pipeline.py's worker in about 9 minutes) come
# next, so they reach a worker about when it is ready rather than holding one idle from the start;
# then the medium ones, then the short ones fill in.
LONGEST = ("test_pipeline.py", "test_cluster.py", "test_every_op.py", "test_offline.py", "test_cuda_pipeline.py")
MEDIUM = ("test_pipeline_images.py", "test_pipeline_units.py", "test_pipeline_installs.py", "test_root_builds.py",
          "test_system_torch.py", "test_torch_builds.py", "test_aarch64.py", "test_grace_cuda.py")  # fmt: skip


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
