"""bench: this toolkit against the plain DeepSpeed command, in one run, as ratios.

For one recipe it times, side by side on the same machine and build environment:
1. a cold build: `build-wheel` (empty ccache, no cached wheel) vs DeepSpeed's own
   `python setup.py build_ext -j<cores> bdist_wheel` with the same DS_BUILD_* and arch list;
2. an unchanged rebuild (the build key finds the wheel) vs cold;
3. a rebuild after adding one op, with ccache warm from the cold build, vs cold;
4. the wheel's size vs the plain command's wheel;
5. a fresh node: installing the wheel and loading its first op, vs `pip install deepspeed` from the
   sdist and the JIT compile its first use triggers (both into a venv that already has torch);
6. making an environment with the recipe's torch: uv (what the toolkit does) vs venv + pip;
7. smoke of the same wheel with uv environments vs venv + pip ones;
8. a fresh clone to a published wheel, the README's main command (`nox -s build-wheel`) with uv vs
   the same pipeline with pip environments (nox's virtualenv backend, BUILDER_ENV_BACKEND=pip);
   both compile cold, both find their package caches warm. Measured in the first run only (minutes).
With --full-ops RECIPE (an ops = "all" recipe), the same run then times that recipe as `--all-ops`
does (cold as op units vs plain DeepSpeed building the same ops, then one op added) into the same
bench.md. Each figure is the median of --runs runs; the ratios are what count on a noisy machine.

The other benches are modules of their own: slurm, all_ops, image, cluster."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import shutil
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from builder import cmd, envs, node, output
from builder.bench.all_ops import bench_all_ops, render_all_ops
from builder.bench.common import EXTRA_OPS, _report, _timed
from builder.build import build_wheel, prepare, toolchain_env
from builder.errors import BuilderError, ToolError
from builder.files import write_atomic
from builder.glibc import HOST
from builder.machines import machine_of
from builder.recipe import Recipe
from builder.units import pch
from builder.units.cache import UNIT_CACHE_ENV
from builder.units.cache import cache_folder as unit_cache
from builder.wheelbuild import ops, source
from builder.wheelbuild.ccache import CACHE_DIR_ENV
from builder.wheelbuild.plan import plan_build
from builder.workspace import Workspace

FIRST_OP = {
    "cpu_adam": "from deepspeed.ops.adam import DeepSpeedCPUAdam as O; import torch; "
    "O([torch.nn.Parameter(torch.zeros(4))])",
    "fused_adam": "from deepspeed.ops.op_builder import FusedAdamBuilder as B; B().load()",
}


def plain_build(recipe: Recipe, ws: Workspace, out: Path, log: Path) -> tuple[float, int]:
    """DeepSpeed's own command in a fresh source tree: seconds and wheel bytes."""
    src_root = out / "plain"
    sdist = source.fetch(recipe.deepspeed, source.sdist_folder(ws.cache, os.environ), log)
    src = source.unpack(sdist, src_root)
    _, python = prepare(recipe, ws, log)
    env, machine, _ = toolchain_env(on_the_host(recipe), python, ws)  # what a user runs: the host's compilers
    kit = next((t for t in machine.toolkits if t.root == machine.chosen_toolkit), None)
    from builder.wheelbuild.plan import resolve_archs

    archs = resolve_archs(recipe, machine.arch_list, kit.archs if kit else (), kit.version if kit else "-")
    plan = plan_build(recipe, ops.probe(python, src, env, log, archs), archs)
    keep = {
        k: v
        for k, v in plan.env.items()
        if k.startswith("DS_BUILD_") or k in ("DS_ACCELERATOR", "TORCH_CUDA_ARCH_LIST")
    }
    env.update(keep)
    env.pop("DS_BUILD_STRING", None)
    env["TORCH_NO_COMPILER_WRAPPER"] = "1"  # plain: no ccache
    cores = str(os.cpu_count() or 1)
    seconds, _ = _timed(lambda: cmd.run(
        [python, "setup.py", "build_ext", f"-j{cores}", "bdist_wheel", "-d", src_root / "dist"],
        env=env, cwd=src, log=log,
    ))  # fmt: skip
    (wheel,) = (src_root / "dist").glob("*.whl")
    size = wheel.stat().st_size
    shutil.rmtree(src_root)
    return seconds, size


def on_the_host(recipe: Recipe) -> Recipe:
    """The recipe compiled with the build host's own compilers (platform = "host"), as a user would."""
    return dataclasses.replace(recipe, platform=HOST, root=None)


def cross_costs(recipe: Recipe, out: Path, op: str = "cpu_adam") -> dict[str, float]:
    """Seconds to build one op cold (empty unit cache and ccache, the roots and torch's aarch64 files
    already made) for this machine and for aarch64, one after the other: cross-compiling is the same
    compiler work, so the ratio should be near 1 (goal <= 1.2)."""
    spent = {}
    for machine in ("x86_64", "aarch64"):
        one = dataclasses.replace(recipe, name=f"bench-{machine.replace('_', '-')}", machine=machine, ops=(op,),
                                  cpu_target=machine_of(machine).default_cpu_target, configs=(), config_files=(),
                                  known_failures=(), torch=dataclasses.replace(recipe.torch, variant=None)
                                  if machine != "x86_64" else recipe.torch)  # fmt: skip
        folder = out / "cross" / machine
        shutil.rmtree(folder, ignore_errors=True)
        with _env_var(UNIT_CACHE_ENV, str(folder / "units")), _env_var(CACHE_DIR_ENV, str(folder / "ccache")):
            spent[machine] = build_wheel(one, Workspace(folder / "work")).seconds
        shutil.rmtree(folder, ignore_errors=True)
    return spent


def root_making(out: Path) -> float:
    """Seconds to make the toolkit's build root from nothing (in a folder of the bench's own, then
    removed); nan where this user cannot make one (debootstrap takes root)."""
    from builder.buildroot import make, spec
    from builder.debian import host_mirror

    if os.geteuid() != 0:
        return float("nan")
    roots = out / "roots"
    shutil.rmtree(roots, ignore_errors=True)
    start = time.monotonic()
    make.ensure_debian(spec.default_spec(host_mirror()), roots)
    seconds = time.monotonic() - start
    shutil.rmtree(roots, ignore_errors=True)
    return seconds


def fresh_node(recipe: Recipe, wheel: Path, out: Path, log: Path) -> tuple[float, float]:
    """Seconds to a usable first op: installing our wheel vs pip's sdist install plus the JIT."""
    op = next((o for o in recipe.ops if o in FIRST_OP), None)
    if op is None:
        return float("nan"), float("nan")
    results = []
    for kind in ("wheel", "jit"):
        venv = out / f"node-{kind}"
        deps = [
            recipe.torch.requirement,
            "hjson",
            "msgpack",
            "numpy",
            "packaging",
            "psutil",
            "py-cpuinfo",
            "pydantic>=2",
            "tqdm",
            "einops",
            "ninja",
            "setuptools",
            "wheel",
            "pip",
        ]  # fmt: skip  (nodes use pip)
        with env_backend("pip"):  # as a node has them: pip-installed, bytecode compiled (uv compiles none)
            # not timed: both nodes start with torch and DeepSpeed's needs
            envs.create(venv, deps, log, index=envs.torch_index(recipe.torch))
        ext = out / f"ext-{kind}"
        shutil.rmtree(ext, ignore_errors=True)
        ext.mkdir()
        env = envs.venv_environ(venv)
        env.update({"TORCH_EXTENSIONS_DIR": str(ext), "DS_ACCELERATOR": recipe.accelerator,
                    "TORCH_NO_COMPILER_WRAPPER": "1"})  # fmt: skip
        python = envs.python_in(venv)
        target = str(wheel) if kind == "wheel" else recipe.deepspeed.requirement
        install = [python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", target]

        def run(install: list[Any] = install, env: dict[str, str] = env, python: Path = python) -> None:
            cmd.run(install, env=env, log=log)
            cmd.run([python, "-c", FIRST_OP[op]], env=env, log=log)

        seconds, _ = _timed(run)
        results.append(seconds)
        shutil.rmtree(venv)
    return results[0], results[1]


@contextlib.contextmanager
def _env_var(name: str, value: str) -> Iterator[None]:
    """The builds inside the block see `name` set to `value` (the toolkit reads these from os.environ)."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def env_backend(name: str) -> contextlib.AbstractContextManager[None]:
    """Make the toolkit's environments with `name` (uv or pip) inside the block."""
    return _env_var("BUILDER_ENV_BACKEND", name)


def env_creation(recipe: Recipe, out: Path, log: Path) -> dict[str, float]:
    """Seconds to a new venv holding the recipe's torch, with uv and with venv + pip."""
    seconds = {}
    for name in envs.BACKENDS:
        venv = out / f"env-{name}"
        with env_backend(name):
            seconds[name], _ = _timed(
                functools.partial(
                    envs.create, venv, [recipe.torch.requirement], log, index=envs.torch_index(recipe.torch)
                )
            )
        if name == "uv":  # the trust boundary's tree check of an environment of torch's size: walked, then stamped
            seconds.update(trust_costs(venv))
        shutil.rmtree(venv, ignore_errors=True)
    return seconds


def trust_costs(venv: Path, tries: int = 7) -> dict[str, float]:
    """The trust boundary's check of `venv`'s whole tree, every entry walked (its stamp removed first) and
    its stamp read: the fastest of `tries` each, as both take tens of milliseconds on a warm page cache
    and one try is mostly the machine's noise."""
    walked, stamped = [], []
    for _ in range(tries):
        (venv / node.STAMP).unlink(missing_ok=True)
        walked.append(_timed(functools.partial(node.tree_problem, str(venv), stamp=True))[0])
        stamped.append(_timed(functools.partial(node.tree_problem, str(venv), stamp=True))[0])
    return {"trust_full": min(walked), "trust_stamped": min(stamped)}


def smoke_times(wheel: Path, ws: Workspace) -> dict[str, float]:
    """Seconds for the full smoke of one wheel, with uv environments and with venv + pip."""
    from builder.smoke import smoke

    seconds = {}
    for name in envs.BACKENDS:
        with env_backend(name):
            seconds[name], _ = _timed(lambda: smoke(wheel, ws))
    return seconds


CONFIG_SAMPLE = 6  # configs run one process each, as a user runs them, to scale to the whole matrix


SPAWN_SAMPLE = 12  # configs run with spawned processes, without and with the bytecode folder


def config_costs(wheel: Path, ws: Workspace, log: Path) -> dict[str, float]:
    """Seconds for the smoke's config matrix in one runner (forked after one import of DeepSpeed)
    and for the same configs each in a process of its own, as a user runs them one `python train.py`
    at a time (a sample of CONFIG_SAMPLE, every sixth, scaled to the matrix: the whole takes minutes).
    Then the GPU node's setting on CPU: every config's processes spawned (as CUDA needs), torch with
    no .pyc and PYTHONDONTWRITEBYTECODE=1, against the same with the run's bytecode folder
    (smoke.run_folders: compiled once, read by every process); a sample of SPAWN_SAMPLE each."""
    import tempfile

    from builder import configs
    from builder.contracts import BuildManifest
    from builder.resources.config_check.pool import START_ENV
    from builder.smoke import WRITE_BYTECODE, config_cases, no_compiler, wheel_env

    manifest = BuildManifest.from_wheel(wheel)
    cases = config_cases(manifest)
    ws.scratch.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-configs-", dir=ws.scratch))
    try:
        venv, env = wheel_env(wheel, manifest, tmp, log, False)
        python = envs.python_in(venv)
        env = no_compiler(env, python)
        run = functools.partial(configs.run, python, accelerator=manifest.accelerator, env=env, cwd=tmp, log=log)
        matrix, _ = _timed(functools.partial(run, cases))
        sample = cases[:: max(1, len(cases) // CONFIG_SAMPLE)][:CONFIG_SAMPLE]
        each = [_timed(functools.partial(run, [c]))[0] for c in sample]
        spawned = cases[:: max(1, len(cases) // SPAWN_SAMPLE)][:SPAWN_SAMPLE]
        setting = {**env, START_ENV: "spawn", "PYTHONDONTWRITEBYTECODE": "1"}
        image = {k: v for k, v in setting.items() if k != "PYTHONPYCACHEPREFIX"}  # as the image runs them
        once = {**setting, **WRITE_BYTECODE}  # the toolkit's: compiled once into the run's own folder
        spawn_plain, _ = _timed(lambda: configs.run(python, spawned, manifest.accelerator, env=image, cwd=tmp, log=log))
        spawn_once, _ = _timed(lambda: configs.run(python, spawned, manifest.accelerator, env=once, cwd=tmp, log=log))
        served = {**once, START_ENV: "forkserver"}  # the GPU node's way now: forked from a server that imported all
        server, _ = _timed(lambda: configs.run(python, spawned, manifest.accelerator, env=served, cwd=tmp, log=log))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"matrix": matrix, "each": statistics.mean(each) * len(cases), "count": float(len(cases)),
            "spawn_plain": spawn_plain, "spawn_once": spawn_once, "spawn_count": float(len(spawned)),
            "server": server}  # fmt: skip


def repository() -> Path:
    """The checkout the bench runs in (nox runs its sessions in the noxfile's folder): what the fresh clone
    row copies. Not this module's folder: the bench session installs the toolkit into its environment, so
    the module lies in site-packages there (the row once copied that, and nox found no noxfile)."""
    here = Path.cwd()
    if not (here / "noxfile.py").is_file() or not (here / "builder").is_dir():
        raise BuilderError(f"the bench's fresh clone row copies the checkout it runs in, and {here} is not one "
                           "(no noxfile.py and builder/)",
                           "run the bench from the repository's top: nox -s bench")  # fmt: skip
    return here


_OUTPUTS = {"build", ".nox", ".git", "wheelhouse", "provision", ".mypy_cache", ".ruff_cache", ".pytest_cache"}


def _not_in_a_clone(folder: str, names: list[str]) -> set[str]:
    """What a fresh clone lacks: the repository's outputs and caches (top level), and bytecode."""
    top = {n for n in names if n in _OUTPUTS} if Path(folder) == repository() else set()
    return top | {n for n in names if n == "__pycache__" or n.endswith(".egg-info")}


def fresh_clone(out: Path, log: Path) -> dict[str, float]:
    """Seconds from a fresh copy of this repository to a published wheel: `nox -s build-wheel`, uv vs pip."""
    seconds = {}
    for name, nox_backend in (("uv", "uv"), ("pip", "virtualenv")):
        clone = out / f"clone-{name}"
        shutil.rmtree(clone, ignore_errors=True)
        shutil.copytree(repository(), clone, ignore=_not_in_a_clone)
        env = {**os.environ, "BUILDER_ENV_BACKEND": name}
        run = functools.partial(
            cmd.run,
            [sys.executable, "-m", "nox", "-s", "build-wheel", "--force-venv-backend", nox_backend],
            env=env, cwd=clone, log=log, fix="the bench session installs nox[uv]; run it with nox -s bench",
        )  # fmt: skip
        seconds[name], _ = _timed(run)
        shutil.rmtree(clone, ignore_errors=True)
    return seconds


def bench(recipe: Recipe, out: Path, runs: int, full_ops: Recipe | None = None) -> dict[str, Any]:
    """The rows of the module's list for `recipe`, `runs` times (medians); with `full_ops` (an ops =
    "all" recipe) its rows too (bench_all_ops), in the same run and the same bench.md."""
    if full_ops is not None and not full_ops.all_ops:  # said now, not after the half hour before it
        raise ToolError(f'recipe {full_ops.name} does not say ops = "all"', "pass an all-ops recipe with --full-ops")
    out.mkdir(parents=True, exist_ok=True)
    ws = Workspace(out / "work")
    log = out / "bench.log"
    extra = next((o for o in EXTRA_OPS if o not in recipe.ops), None)
    samples: dict[str, list[float]] = {
        k: []
        for k in (
            "plain",
            "cold",
            "unchanged",
            "one_op",
            "node_wheel",
            "node_jit",
            "env_uv",
            "env_pip",
            "smoke_uv",
            "smoke_pip",
            "clone_uv",
            "clone_pip",
            "configs_matrix",
            "configs_each",
            "configs_spawn_plain",
            "configs_spawn_once",
            "configs_server",
            "cold_host",
            "root_make",
            "cold_no_header",
            "header_make",
            "trust_full",
            "trust_stamped",
            "cross_native",
            "cross_aarch64",
        )
    }
    sizes: dict[str, int] = {}
    stem, at = out / "bench", {"step": "the start"}

    def record(key: str, value: float) -> None:
        """A measurement, written with every row so far as soon as it is taken."""
        samples[key].append(value)
        _write_partial(stem, _result(recipe.name, runs, extra, samples, sizes))

    try:
        for run in range(runs):
            output.step(f"bench run {run + 1}/{runs}: recipe {recipe.name}")
            n = f" (run {run + 1})"
            at["step"] = "plain DeepSpeed build" + n
            plain_s, sizes["plain"] = plain_build(recipe, ws, out, log)
            record("plain", plain_s)
            if run == 0:
                at["step"] = "making the build root"
                record("root_make", root_making(out))
            shutil.rmtree(ws.dist, ignore_errors=True)
            for cached in (ws.cache / "ccache", unit_cache(ws.cache, os.environ)):
                shutil.rmtree(cached, ignore_errors=True)
            at["step"] = "cold build" + n
            cold = build_wheel(recipe, ws)
            sizes["toolkit"] = cold.wheel.stat().st_size
            record("cold", cold.seconds)
            # The same build with the host's compilers, from empty caches; the root build's caches are
            # put aside and back, so the rows after it (unchanged, one op added) start from them.
            caches = (ws.cache / "ccache", unit_cache(ws.cache, os.environ))
            aside = out / "caches-aside"
            shutil.rmtree(aside, ignore_errors=True)
            for i, cached in enumerate(caches):
                if cached.exists():
                    aside.mkdir(parents=True, exist_ok=True)
                    shutil.move(cached, aside / str(i))
            for header in _headers_made(cold.wheel):
                record("header_make", header["seconds"])
                sizes["header"] = header["bytes"]
            at["step"] = "cold build on the host" + n
            record("cold_host", build_wheel(on_the_host(recipe), ws).seconds)
            at["step"] = "cold build without the precompiled header" + n
            for cached in caches:
                shutil.rmtree(cached, ignore_errors=True)
            with _env_var(pch.PCH_ENV, "0"):  # no precompiled torch header
                record("cold_no_header", build_wheel(recipe, ws, force=True).seconds)  # the same build key
            for i, cached in enumerate(caches):
                shutil.rmtree(cached, ignore_errors=True)
                if (aside / str(i)).exists():
                    shutil.move(aside / str(i), cached)
            at["step"] = "unchanged rebuild" + n
            record("unchanged", build_wheel(recipe, ws).seconds)
            if extra:
                at["step"] = f"rebuild with {extra} added" + n
                record("one_op", build_wheel(dataclasses.replace(recipe, ops=(*recipe.ops, extra)), ws).seconds)
            at["step"] = "fresh node" + n
            node_wheel, node_jit = fresh_node(recipe, cold.wheel, out, log)
            record("node_wheel", node_wheel)
            record("node_jit", node_jit)
            at["step"] = "environments" + n
            for name, seconds in env_creation(recipe, out, log).items():
                record(name if name.startswith("trust_") else f"env_{name}", seconds)
            at["step"] = "smoke" + n
            for name, seconds in smoke_times(cold.wheel, ws).items():
                record(f"smoke_{name}", seconds)
            at["step"] = "config matrix" + n
            costs = config_costs(cold.wheel, ws, log)
            sizes["configs"] = int(costs["count"])
            record("configs_matrix", costs["matrix"])
            record("configs_each", costs["each"])
            record("configs_spawn_plain", costs["spawn_plain"])
            record("configs_spawn_once", costs["spawn_once"])
            record("configs_server", costs["server"])
            sizes["spawned"] = int(costs["spawn_count"])
            if run == 0:
                at["step"] = "one op built for x86_64 and for aarch64"
                crossed = cross_costs(recipe, out)
                record("cross_native", crossed["x86_64"])
                record("cross_aarch64", crossed["aarch64"])
                at["step"] = "fresh clone"
                for name, seconds in fresh_clone(out, log).items():
                    record(f"clone_{name}", seconds)
    except BaseException as exc:
        result = {**_result(recipe.name, runs, extra, samples, sizes), "failed": f"{at['step']}: {exc}"}
        _write_partial(stem, result, f"\nStopped at {at['step']}: {str(exc).splitlines()[0][:300]}\n")
        output.error(f"the bench stopped at {at['step']}; every row measured before it is in {stem}.md")
        raise
    result = _result(recipe.name, runs, extra, samples, sizes)
    table = render_table(result)
    if full_ops is not None:
        _write_partial(stem, result)
        output.step(f"bench: the full-op recipe {full_ops.name}, in the same run")
        result["full_ops"] = bench_all_ops(full_ops, out)
        table += "\n" + render_all_ops(result["full_ops"])
    return _report(stem, result, table)


def _headers_made(wheel: Path) -> list[dict[str, Any]]:
    """The precompiled headers a build made, from its build record ([] where it has none)."""
    try:
        record = json.loads(wheel.with_name(wheel.name + ".build.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    made = (record.get("precompiled_header") or {}).get("made", [])
    return made if isinstance(made, list) else []


def _write_partial(stem: Path, result: dict[str, Any], tail: str = "") -> None:
    """The rows measured so far (nan where a side is not measured yet), without printing them."""
    write_atomic(stem.with_suffix(".json"), json.dumps(result, indent=2) + "\n")
    write_atomic(stem.with_suffix(".md"), render_table(result) + tail)


def _result(name: str, runs: int, extra: str | None, samples: dict[str, list[float]],
            sizes: dict[str, int]) -> dict[str, Any]:  # fmt: skip
    """Medians and ratios of what was measured; a ratio whose sides are not both measured is nan."""
    med = {k: statistics.median(v) if v else float("nan") for k, v in samples.items()}

    def ratio(a: float, b: float) -> float:
        return a / b if b and not math.isnan(a) and not math.isnan(b) else float("nan")

    toolkit, plain = sizes.get("toolkit", float("nan")), sizes.get("plain", float("nan"))
    return {
        "recipe": name,
        "runs": runs,
        "cores": os.cpu_count(),
        "extra_op": extra,
        "samples_s": samples,
        "median_s": med,
        "wheel_bytes": sizes,
        "ratios": {
            "cold_vs_plain": ratio(med["cold"], med["plain"]),
            "unchanged_vs_cold": ratio(med["unchanged"], med["cold"]),
            "one_op_vs_cold": ratio(med["one_op"], med["cold"]),
            "wheel_vs_plain": ratio(toolkit, plain),
            "node_vs_jit": ratio(med["node_wheel"], med["node_jit"]),
            "env_uv_vs_pip": ratio(med["env_uv"], med["env_pip"]),
            "smoke_uv_vs_pip": ratio(med["smoke_uv"], med["smoke_pip"]),
            "clone_uv_vs_pip": ratio(med["clone_uv"], med["clone_pip"]),
            "configs_vs_each": ratio(med["configs_matrix"], med["configs_each"]),
            "bytecode_once_vs_each": ratio(med["configs_spawn_once"], med["configs_spawn_plain"]),
            "server_vs_spawn": ratio(med["configs_server"], med["configs_spawn_once"]),
            "root_vs_host": ratio(med["cold"], med["cold_host"]),
            "header_vs_none": ratio(med["cold"], med["cold_no_header"]),
            "trust_stamped_vs_full": ratio(med["trust_stamped"], med["trust_full"]),
            "cross_vs_native": ratio(med["cross_aarch64"], med["cross_native"]),
        },
    }


TARGETS = {
    "cold_vs_plain": ("cold build vs plain `setup.py build_ext -j bdist_wheel`", 0.5),
    "header_vs_none": ("cold build with the precompiled torch header (made in it) vs without", None),
    "unchanged_vs_cold": ("unchanged rebuild (build key hit) vs cold", None),
    "one_op_vs_cold": ("rebuild after adding one op (ccache) vs cold", 0.2),
    "wheel_vs_plain": ("wheel size vs plain wheel", 0.3),
    "node_vs_jit": ("fresh node: install + first op vs pip sdist + JIT", 0.2),
    "env_uv_vs_pip": ("environment with the recipe's torch: uv vs venv + pip", None),
    "smoke_uv_vs_pip": ("smoke, uv environments vs venv + pip", None),
    "clone_uv_vs_pip": ("fresh clone -> published wheel (`nox -s build-wheel`): uv vs pip environments", None),
    "configs_vs_each": ("the smoke's DeepSpeed config matrix: one forked runner vs a process per config", None),
    "bytecode_once_vs_each": (
        "configs spawned as on a GPU node, torch without .pyc and PYTHONDONTWRITEBYTECODE=1: "
        "bytecode compiled once into the run's folder vs in every process",
        None,
    ),
    "server_vs_spawn": (
        "configs as on a GPU node (a CUDA context cannot be forked): forked from a server that imported torch and "
        "DeepSpeed vs a new Python spawned per config (the bytecode folder in both)",
        None,
    ),
    "root_vs_host": ('cold build compiled in the Debian 11 root vs the same on the host (`platform = "host"`)', 1.1),
    "trust_stamped_vs_full": (
        "the trust boundary's tree check of an environment of torch's size: its stamp read vs every entry walked",
        None,
    ),
    "cross_vs_native": ("one op (cpu_adam) built cold for aarch64 (cross compiler in the root) vs for x86_64", 1.2),
}


# Absolute targets on 2 cores (seconds), for the rows that have one.
ABSOLUTE_TARGETS = {"unchanged_vs_cold": "< 2 s for the build step", "smoke_uv_vs_pip": "smoke <= 50 s",
                    "clone_uv_vs_pip": "<= 150 s", "env_uv_vs_pip": "-", "configs_vs_each": "-",
                    "header_vs_none": "-", "bytecode_once_vs_each": "-",
                    "server_vs_spawn": "GPU matrix <= 60 s",
                    "trust_stamped_vs_full": "walk well under 1 s"}  # fmt: skip


def render_table(result: dict[str, Any]) -> str:
    """The Markdown table docs/benchmarks.md carries."""
    med, sizes, ratios = result["median_s"], result["wheel_bytes"], result["ratios"]
    absolute = {
        "cold_vs_plain": f"{med['cold']:.0f} s vs {med['plain']:.0f} s",
        "unchanged_vs_cold": f"{med['unchanged']:.1f} s vs {med['cold']:.0f} s",
        "one_op_vs_cold": f"{med['one_op']:.0f} s vs {med['cold']:.0f} s (+{result['extra_op']})",
        "wheel_vs_plain": f"{sizes.get('toolkit', float('nan')) / 1e6:.1f} MB vs "
        f"{sizes.get('plain', float('nan')) / 1e6:.1f} MB",
        "node_vs_jit": f"{med['node_wheel']:.0f} s vs {med['node_jit']:.0f} s",
        "env_uv_vs_pip": f"{med['env_uv']:.1f} s vs {med['env_pip']:.1f} s",
        "smoke_uv_vs_pip": f"{med['smoke_uv']:.0f} s vs {med['smoke_pip']:.0f} s",
        "clone_uv_vs_pip": f"{med['clone_uv']:.0f} s vs {med['clone_pip']:.0f} s",
        "configs_vs_each": f"{med['configs_matrix']:.0f} s vs {med['configs_each']:.0f} s "
        f"({sizes.get('configs', '?')} configs)",
        "root_vs_host": f"{med['cold']:.0f} s vs {med['cold_host']:.0f} s",
        "bytecode_once_vs_each": f"{med.get('configs_spawn_once', float('nan')):.0f} s vs "
        f"{med.get('configs_spawn_plain', float('nan')):.0f} s ({sizes.get('spawned', '?')} configs)",
        "header_vs_none": f"{med['cold']:.0f} s vs {med.get('cold_no_header', float('nan')):.0f} s",
        "server_vs_spawn": f"{med.get('configs_server', float('nan')):.0f} s vs "
        f"{med.get('configs_spawn_once', float('nan')):.0f} s ({sizes.get('spawned', '?')} configs)",
        "trust_stamped_vs_full": f"{med.get('trust_stamped', float('nan')):.3f} s vs "
        f"{med.get('trust_full', float('nan')):.3f} s",
        "cross_vs_native": f"{med.get('cross_aarch64', float('nan')):.0f} s vs "
        f"{med.get('cross_native', float('nan')):.0f} s",
    }
    lines = [
        f"Recipe `{result['recipe']}`, {result['cores']} cores, median of {result['runs']} run(s):",
        "",
        "| measure | this toolkit vs plain | ratio | target |",
        "|---|---|---|---|",
    ]
    for key, (label, target) in TARGETS.items():
        goal = ABSOLUTE_TARGETS.get(key) or f"<= {target}"
        lines.append(f"| {label} | {absolute[key]} | {ratios.get(key, float('nan')):.2f} | {goal} |")
    made = med.get("root_make", float("nan"))
    lines += ["", f"Making the build root (Debian 11, once per machine): {made:.0f} s."]
    header, size = med.get("header_make", float("nan")), sizes.get("header", float("nan"))
    lines += [f"Making the precompiled torch header (once per flag set, in the cold build): {header:.0f} s, "
              f"{size / 1e6:.0f} MB."]  # fmt: skip
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- a matrix on Slurm
