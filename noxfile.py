"""Thin sessions: install the builder, call `python -m builder`, pass *session.posargs through.

Sessions are made by uv where it is installed (`pip install 'nox[uv]'`), else by virtualenv. uv
reads no pip configuration, so pip's find-links and indexes are handed to it here, as the
builder does for the environments it makes itself (builder/envs.py).
"""

import os
import subprocess
import sys

import nox

nox.options.sessions = ["lint", "unit"]  # plain `nox`: seconds; `nox -s tests` runs everything
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True
nox.options.default_venv_backend = "uv|virtualenv"


def _hand_pip_sources_to_uv() -> None:
    said = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    found: dict[str, list[str]] = {}
    for line in said.splitlines():
        key, _, value = line.partition("=")
        found.setdefault(key.rsplit(".", 1)[-1], []).extend(value.strip("'\"").split())
    pairs = {"UV_INDEX_URL": found.get("index-url", [])[-1:], "UV_EXTRA_INDEX_URL": found.get("extra-index-url", []),
             "UV_FIND_LINKS": found.get("find-links", [])}  # fmt: skip
    for var, values in pairs.items():
        if values and var not in os.environ:
            os.environ[var] = ("," if var == "UV_FIND_LINKS" else " ").join(dict.fromkeys(values))
    os.environ.setdefault("UV_INDEX_STRATEGY", "unsafe-best-match")  # pip's rule: the best version anywhere


_hand_pip_sources_to_uv()


@nox.session(name="build-wheel", tags=["pipeline"])
def build_wheel(session: nox.Session) -> None:
    """Build, verify, smoke-test and publish a recipe (default recipes/cpu.toml): -- --recipe PATH."""
    session.install(".")
    session.run("python", "-m", "builder", "build-wheel", *session.posargs)


@nox.session(name="slurm-matrix", tags=["pipeline"])
def slurm_matrix(session: nox.Session) -> None:
    """Submit a matrix to Slurm (build array, GPU smoke jobs, one publishing job): -- --matrix FILE [--wait]."""
    session.install(".")
    args = session.posargs or ["--matrix", "recipes/matrices/example.toml"]
    session.run("python", "-m", "builder", "build-wheel", "--slurm", *args)


@nox.session(tags=["pipeline"])
def smoke(session: nox.Session) -> None:
    """Smoke-test a built wheel in a fresh venv: -- [WHEEL ...]."""
    session.install(".")
    session.run("python", "-m", "builder", "smoke", *session.posargs)


@nox.session(venv_backend="none", default=False, tags=["gpu"])
def prove(session: nox.Session) -> None:
    """On a GPU node, in the node's own Python and torch (no venv is made): prove the CUDA wheel a wheelhouse
    has for this node and write its proof: -- --wheelhouse PATH_OR_URL [--dest DIR] [--offline DIR]."""
    session.run("python", "-m", "builder", "prove", *session.posargs)


@nox.session(tags=["pipeline"])
def publish(session: nox.Session) -> None:
    """Publish smoke-passed wheels to wheelhouse/ with a PEP 503 index: -- [WHEEL ...]."""
    session.install(".")
    session.run("python", "-m", "builder", "publish", *session.posargs)


@nox.session(tags=["pipeline"])
def detect(session: nox.Session) -> None:
    """Report GPUs, CUDA toolkits, torch, compilers, CPU and libraries: -- [--json] [--python PY | --recipe R]."""
    session.install(".")
    session.run("python", "-m", "builder", "detect", *(session.posargs or ["--recipe", "recipes/cpu.toml"]))


@nox.session(tags=["pipeline"])
def toolchain(session: nox.Session) -> None:
    """Prepare host compiler symlinks and print the build environment: -- [--dry-run] [--python PY]."""
    session.install(".")
    session.run("python", "-m", "builder", "toolchain", *session.posargs)


@nox.session(tags=["wheelhouse"])
def verify(session: nox.Session) -> None:
    """Recheck every wheel's hash, the index and the manifest of wheelhouse/: -- [--wheelhouse PATH]."""
    session.install(".")
    session.run("python", "-m", "builder", "verify", *session.posargs)


@nox.session(tags=["wheelhouse"])
def repair(session: nox.Session) -> None:
    """Remove what interrupted publishes left in wheelhouse/ and rewrite its index: -- [--wheelhouse PATH]."""
    session.install(".")
    session.run("python", "-m", "builder", "repair", *session.posargs)


@nox.session(tags=["wheelhouse"])
def serve(session: nox.Session) -> None:
    """Serve wheelhouse/ over HTTP for nodes: -- [--bind ADDR] [--port N]."""
    session.install(".")
    session.run("python", "-m", "builder", "serve", *session.posargs)


@nox.session(tags=["wheelhouse"])
def lock(session: nox.Session) -> None:
    """Write wheelhouse/locks/<recipe>.lock (sha256-pinned) and a Containerfile: -- [--wheel NAME]."""
    session.install(".")
    session.run("python", "-m", "builder", "lock", *session.posargs)


@nox.session(tags=["wheelhouse"])
def image(session: nox.Session) -> None:
    """Build the CI image of a published wheel with podman, smoke it inside, publish it to images/:
    -- [--lock L | --wheel W] [--base IMAGE]."""
    session.install(".")
    session.run("python", "-m", "builder", "image", *session.posargs)


@nox.session(tags=["wheelhouse"])
def module(session: nox.Session) -> None:
    """Install a published wheel and its lock as an Lmod module on a shared software tree, once:
    -- --wheelhouse W --prefix /shared/software [--modulefiles DIR] [--python PY]."""
    session.install(".")
    session.run("python", "-m", "builder", "module", *session.posargs)


@nox.session(tags=["wheelhouse"])
def prune(session: nox.Session) -> None:
    """Remove wheels no recipe or lock refers to: -- [--dry-run]."""
    session.install(".")
    session.run("python", "-m", "builder", "prune", *session.posargs)


@nox.session(tags=["wheelhouse"])
def provision(session: nox.Session) -> None:
    """Install the right wheel on every host through pdsh: -- --hostfile FILE [--url URL] [--run]."""
    session.install(".")
    session.run("python", "-m", "builder", "provision", *session.posargs)


@nox.session(default=False, tags=["slow"])
def bench(session: nox.Session) -> None:
    """Toolkit vs plain DeepSpeed, uv vs pip, as ratios (about 15 minutes a run): -- [--recipe R] [--runs N]."""
    session.install(".", "nox[uv]")  # the fresh-clone row runs `nox -s build-wheel` itself
    session.run("python", "-m", "builder", "bench", *session.posargs)


@nox.session
def tests(session: nox.Session) -> None:
    """Unit tests and the integration tests that build, smoke and publish real wheels.

    Five pytest workers, one test file at a time each (a file's tests share its build; the default
    recipe's build is shared by four files, made once per run): most integration tests wait on
    processes (pip, podman, Slurm, torchrun) more than on the cores, so five keep two cores busy where
    three left them idle in the run's last third. The longest files start first, one a worker, in the
    order tests/conftest.py gives (xdist's own reorder, by number of tests, would start them last).
    Pass `-- -n 0` to run in one process.
    """
    session.install(".[test]")
    session.run("pytest", "-n", "5", "--dist", "loadfile", "--no-loadscope-reorder", "--durations=30",
                *session.posargs)  # fmt: skip


@nox.session(venv_backend="none", default=False, tags=["gpu"])
def gpu(session: nox.Session) -> None:
    """The GPU tier on a GPU node, in the node's own Python and torch (no venv is made; with --offline the
    toolkit and its dependencies are installed there from the folder first, as docs/pipeline.md tells a
    node: `pip install --no-index --find-links DIR/wheels .`): detect, the system recipe built and
    smoked with every op checked on the GPU, a manylinux_2_28 CUDA wheel built with no GPU visible run
    on it; one table at the end.
    -- [--offline DIR [--trust KEY]] (build from a `gather` folder: the node reaches nothing; KEY the gathering
    host's, which signed it) [--wheelhouse DIR] (prove the CUDA wheel a GPU-less build host published there;
    its proof is written to DS_GPU_PROOFS, else the run's folder)."""
    args = list(session.posargs)
    env = {}
    if "--trust" in args:
        at = args.index("--trust")
        env["DS_GPU_OFFLINE_TRUST"] = args[at + 1]
        del args[at : at + 2]
    if "--wheelhouse" in args:
        at = args.index("--wheelhouse")
        env["DS_GPU_WHEELHOUSE"] = os.path.abspath(args[at + 1])
        del args[at : at + 2]
    if "--offline" in args:
        at = args.index("--offline")
        env["DS_GPU_OFFLINE"] = os.path.abspath(args[at + 1])
        del args[at : at + 2]
        # The documented node step: the toolkit (and its dependencies) from the folder alone.
        wheels = os.path.join(env["DS_GPU_OFFLINE"], "wheels")
        session.run("python", "-m", "pip", "install", "--quiet", "--no-index", "--find-links", wheels, ".")
    session.run("python", "-m", "pytest", "-m", "gpu", "tests/test_gpu.py", "-p", "no:cacheprovider", *args, env=env)


@nox.session
def unit(session: nox.Session) -> None:
    """Unit tests only (no builds), two pytest-xdist workers per core: most of them wait on the processes
    they start (ssh-keygen, the node installer, pip, a login shell), so a second worker a core fills
    the wait. The hostile-input suite is among them. On 2 cores: 74 s from a clean clone (670 tests,
    125 CPU-seconds; 137 s before the node probe stopped importing a CPU torch and the bundles were
    built once a process)."""
    session.install(".[test]")
    workers = str(2 * (os.cpu_count() or 1))
    session.run("pytest", "-m", "not integration", "-n", workers, *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff and mypy (strict) over the package, tests and this file."""
    session.install(".[lint]", "pytest", "selenium")  # mypy reads the browser test's imports
    session.run("ruff", "check", "builder", "tests", "noxfile.py")
    session.run("ruff", "format", "--check", "builder", "tests", "noxfile.py")
    session.run("mypy")
