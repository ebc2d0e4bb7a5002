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
"""

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
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from builder import cmd, envs, output
from builder.build import build_wheel, prepare, toolchain_env
from builder.errors import ToolError
from builder.files import write_atomic
from builder.glibc import HOST
from builder.recipe import Recipe
from builder.units import pch
from builder.units.cache import cache_folder as unit_cache
from builder.wheelbuild import ops, source
from builder.wheelbuild.plan import plan_build
from builder.workspace import Workspace

FIRST_OP = {
    "cpu_adam": "from deepspeed.ops.adam import DeepSpeedCPUAdam as O; import torch; "
    "O([torch.nn.Parameter(torch.zeros(4))])",
    "fused_adam": "from deepspeed.ops.op_builder import FusedAdamBuilder as B; B().load()",
}
# The op each recipe adds for the one-op rebuild, in order of preference.
EXTRA_OPS = ("deepspeed_shm_comm", "pin_memory", "cpu_lion", "cpu_adagrad", "fused_lion", "fused_lamb")


def _report(stem: Path, result: dict[str, Any], table: str) -> dict[str, Any]:
    """STEM.json and STEM.md (the table docs/benchmarks.md carries), and the table on stdout."""
    write_atomic(stem.with_suffix(".json"), json.dumps(result, indent=2) + "\n")
    write_atomic(stem.with_suffix(".md"), table)
    output.result(table)
    return result


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.monotonic()
    result = fn()
    return time.monotonic() - start, result


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
        shutil.rmtree(venv, ignore_errors=True)
    return seconds


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
    from builder.resources import config_runner
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
        setting = {**env, config_runner.START_ENV: "spawn", "PYTHONDONTWRITEBYTECODE": "1"}
        image = {k: v for k, v in setting.items() if k != "PYTHONPYCACHEPREFIX"}  # as the image runs them
        once = {**setting, **WRITE_BYTECODE}  # the toolkit's: compiled once into the run's own folder
        spawn_plain, _ = _timed(lambda: configs.run(python, spawned, manifest.accelerator, env=image, cwd=tmp, log=log))
        spawn_once, _ = _timed(lambda: configs.run(python, spawned, manifest.accelerator, env=once, cwd=tmp, log=log))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"matrix": matrix, "each": statistics.mean(each) * len(cases), "count": float(len(cases)),
            "spawn_plain": spawn_plain, "spawn_once": spawn_once, "spawn_count": float(len(spawned))}  # fmt: skip


REPO = Path(__file__).resolve().parents[1]
_OUTPUTS = {"build", ".nox", ".git", "wheelhouse", "provision", ".mypy_cache", ".ruff_cache", ".pytest_cache"}


def _not_in_a_clone(folder: str, names: list[str]) -> set[str]:
    """What a fresh clone lacks: the repository's outputs and caches (top level), and bytecode."""
    top = {n for n in names if n in _OUTPUTS} if Path(folder) == REPO else set()
    return top | {n for n in names if n == "__pycache__" or n.endswith(".egg-info")}


def fresh_clone(out: Path, log: Path) -> dict[str, float]:
    """Seconds from a fresh copy of this repository to a published wheel: `nox -s build-wheel`, uv vs pip."""
    seconds = {}
    for name, nox_backend in (("uv", "uv"), ("pip", "virtualenv")):
        clone = out / f"clone-{name}"
        shutil.rmtree(clone, ignore_errors=True)
        shutil.copytree(REPO, clone, ignore=_not_in_a_clone)
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
            "cold_host",
            "root_make",
            "cold_no_header",
            "header_make",
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
                record(f"env_{name}", seconds)
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
            sizes["spawned"] = int(costs["spawn_count"])
            if run == 0:
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
            "root_vs_host": ratio(med["cold"], med["cold_host"]),
            "header_vs_none": ratio(med["cold"], med["cold_no_header"]),
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
    "root_vs_host": ('cold build compiled in the Debian 11 root vs the same on the host (`platform = "host"`)', 1.1),
}
# Absolute targets on 2 cores (seconds), for the rows that have one.
ABSOLUTE_TARGETS = {"unchanged_vs_cold": "< 2 s for the build step", "smoke_uv_vs_pip": "smoke <= 50 s",
                    "clone_uv_vs_pip": "<= 150 s", "env_uv_vs_pip": "-", "configs_vs_each": "-",
                    "header_vs_none": "-", "bytecode_once_vs_each": "-"}  # fmt: skip


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


def _copy_matrix(matrix: Path, dest: Path) -> tuple[Path, list[Path]]:
    """The matrix file and its recipes copied into `dest`, so one recipe can change for the second run."""
    import re
    import tomllib

    dest.mkdir(parents=True, exist_ok=True)
    text = matrix.read_text(encoding="utf-8")
    copies = []
    for i, rel in enumerate(tomllib.loads(text)["recipes"]):
        copy = dest / f"{i}-{Path(rel).name}"
        source = (matrix.parent / rel).resolve()
        recipe = source.read_text(encoding="utf-8")
        configs = tomllib.loads(recipe).get("configs")
        if configs:  # the configs go beside the copy (a recipe reads configs from its own folder only)
            for c in configs:
                (dest / f"{i}-configs" / c).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source.parent / c, dest / f"{i}-configs" / c)
            named = "configs = [" + ", ".join(json.dumps(f"{i}-configs/{c}") for c in configs) + "]"
            found = re.search(r"(?ms)^configs\s*=\s*\[.*?\]", recipe)
            if found:
                recipe = recipe[: found.start()] + named + recipe[found.end() :]
        copy.write_text(recipe, encoding="utf-8")
        copies.append(copy)
    listed = "recipes = [" + ", ".join(json.dumps(c.name) for c in copies) + "]"
    text = re.sub(r"(?ms)^recipes\s*=\s*\[.*?\]", lambda _: listed, text, count=1)
    (dest / "matrix.toml").write_text(text, encoding="utf-8")
    return dest / "matrix.toml", copies


def _add_op(recipe_file: Path, op: str) -> None:
    import re

    text = recipe_file.read_text(encoding="utf-8")
    changed = re.sub(r"(?m)^(ops\s*=\s*\[)", lambda m: f'{m.group(1)}"{op}", ', text, count=1)
    recipe_file.write_text(changed, encoding="utf-8")


def _matrix_run(args: list[str], work: Path, house: Path, log: Path) -> tuple[float, str]:
    """Seconds for one `build-wheel --matrix` run (exit 0 or 11: a failed target is part of the matrix)."""
    argv = [sys.executable, "-m", "builder", "build-wheel", *args, "--work-dir", str(work), "--wheelhouse", str(house)]
    start = time.monotonic()
    done = cmd.ask(argv, timeout=4 * 3600)
    seconds = time.monotonic() - start
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"+ {cmd.quote(argv)}\n{done.stdout}{done.stderr}# exit {done.returncode} after {seconds:.0f} s\n")
    if done.returncode not in (0, 11):
        raise ToolError(f"the matrix run failed (exit {done.returncode}): {done.stderr.strip()[-600:]}", f"read {log}")
    return seconds, done.stderr


def _hits(text: str) -> tuple[int, int]:
    import re

    found = re.findall(r"ccache: (\d+) hits, (\d+) misses", text)
    return sum(int(h) for h, _ in found), sum(int(m) for _, m in found)


def bench_slurm(matrix: Path, out: Path) -> dict[str, Any]:
    """The same matrix built here one target after another and as a job array on Slurm, both
    cold; then one recipe gains an op and both run again (Slurm's build tasks with their shared
    compiler cache and their target folders of the first run)."""
    from builder.targets import load_matrix

    first = load_matrix(matrix).recipes[0]
    extra = next(o for o in EXTRA_OPS if o not in first.ops)
    root = out / "slurm-bench"
    shutil.rmtree(root, ignore_errors=True)
    copy, recipes = _copy_matrix(matrix, root / "matrix")
    log = out / "bench-slurm.log"
    log.unlink(missing_ok=True)
    env_cache = os.environ.pop("DS_BUILDER_CCACHE_DIR", None)  # each side's cache starts empty, in its work folder
    try:
        seconds: dict[str, float] = {}
        for side, args in (("local", ["--matrix", str(copy), "--jobs", "1"]),
                           ("slurm", ["--matrix", str(copy), "--slurm", "--wait"])):  # fmt: skip
            output.step(f"bench: the matrix {side}, cold")
            seconds[f"{side}_cold"], _ = _matrix_run(args, root / side, root / f"house-{side}", log)
        _add_op(recipes[0], extra)
        said = {}
        for side, args in (("local", ["--matrix", str(copy), "--jobs", "1"]),
                           ("slurm", ["--matrix", str(copy), "--slurm", "--wait"])):  # fmt: skip
            output.step(f"bench: the matrix {side}, after adding {extra} to {first.name}")
            # Another wheelhouse: the changed recipe's wheel keeps its file name, which publish refuses
            # to replace with other bytes in the first one.
            house = root / f"house-{side}-changed"
            seconds[f"{side}_second"], said[side] = _matrix_run(args, root / side, house, log)
    finally:
        if env_cache is not None:
            os.environ["DS_BUILDER_CCACHE_DIR"] = env_cache
    run_logs = sorted((root / "slurm" / "slurm").glob("run-*"), key=lambda p: p.stat().st_mtime)[-1] / "logs"
    hits, misses = _hits("".join(p.read_text(errors="replace") for p in run_logs.glob("build-*.log")))
    nodes = cmd.ask(["sinfo", "-h", "-o", "%D %c"]).stdout.split()
    result = {
        "matrix": str(matrix),
        "targets": len(load_matrix(copy).recipes),
        "changed": {"recipe": first.name, "added_op": extra},
        "slurm_nodes": " ".join(nodes),
        "seconds": seconds,
        "second_slurm_ccache": {"hits": hits, "misses": misses},
        "ratios": {
            "slurm_vs_local_cold": seconds["slurm_cold"] / seconds["local_cold"],
            "slurm_second_vs_cold": seconds["slurm_second"] / seconds["slurm_cold"],
            "slurm_vs_local_second": seconds["slurm_second"] / seconds["local_second"],
        },
    }
    return _report(out / "bench-slurm", result, render_slurm(result))


def render_slurm(result: dict[str, Any]) -> str:
    s, r, cc = result["seconds"], result["ratios"], result["second_slurm_ccache"]
    change = f"+{result['changed']['added_op']} in {result['changed']['recipe']}"
    return "\n".join([
        f"Matrix `{result['matrix']}` ({result['targets']} targets), Slurm nodes x cpus: {result['slurm_nodes']}:",
        "",
        "| measure | seconds | ratio |",
        "|---|---|---|",
        f"| cold: Slurm job array vs here one after another | {s['slurm_cold']:.0f} s vs {s['local_cold']:.0f} s "
        f"| {r['slurm_vs_local_cold']:.2f} |",
        f"| second run ({change}): Slurm, shared compiler cache, vs Slurm cold | {s['slurm_second']:.0f} s vs "
        f"{s['slurm_cold']:.0f} s | {r['slurm_second_vs_cold']:.2f} |",
        f"| second run: Slurm vs here | {s['slurm_second']:.0f} s vs {s['local_second']:.0f} s "
        f"| {r['slurm_vs_local_second']:.2f} |",
        f"| compiler cache in the second Slurm run | {cc['hits']} hits, {cc['misses']} misses | |",
        "",
    ])  # fmt: skip


# ---------------------------------------------------------------- every op, as units vs one plain run


def projection(seconds: Sequence[float], nodes: int) -> float:
    """Wall time of units with these build times spread over `nodes` nodes, one unit at a time on
    each, longest first to the least loaded node (pure); never less than the longest unit."""
    loads = [0.0] * max(1, nodes)
    for s in sorted(seconds, reverse=True):
        i = min(range(len(loads)), key=lambda k: loads[k])
        loads[i] += s
    return max(loads) if seconds else 0.0


class PeakMemory:
    """The most memory the machine had in use (MemTotal - MemAvailable) above what it had at the
    start, sampled every second while the block runs."""

    def __init__(self) -> None:
        import threading

        self.peak_gb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    @staticmethod
    def used_gb() -> float:
        info = {}
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                info[key] = int(value.split()[0])
        return (info["MemTotal"] - info["MemAvailable"]) / 1024**2

    def _sample(self) -> None:
        while not self._stop.wait(1.0):
            self.peak_gb = max(self.peak_gb, self.used_gb() - self.base)

    def __enter__(self) -> PeakMemory:
        self.base = self.used_gb()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def plain_all_ops(recipe: Recipe, ws: Workspace, out: Path, log: Path, op_names: Sequence[str]) -> tuple[float, int]:
    """DeepSpeed's own build of exactly these ops, in its fastest form: one setup.py run with
    DS_BUILD_<OP>=1 each, DS_ENABLE_NINJA=1 and MAX_JOBS = cores, in the environment the toolkit's
    own planning makes (toolchain and supplied needs: it cannot build them otherwise), with no
    compiler cache. Seconds and wheel bytes."""
    from builder.build import plan_target
    from builder.targets import Target, this_interpreter
    from builder.wheelbuild import buildkey

    src_root = ws.root / "plain-all"  # inside the work folder: a build root sees that folder alone of the bench's
    shutil.rmtree(src_root, ignore_errors=True)
    target = Target(recipe, this_interpreter())
    inputs = buildkey.key_inputs(recipe, buildkey.gather(recipe, os.environ), os.environ)
    planned = plan_target(target, ws, log, inputs, force=True, src_dir=src_root / "src")
    ops_by_name = {o.name: o for o in planned.plan.ops}
    env = {**planned.env, "DS_BUILD_OPS": "0", "DS_ENABLE_NINJA": "1", "MAX_JOBS": str(os.cpu_count() or 1),
           "TORCH_NO_COMPILER_WRAPPER": "1", **{ops_by_name[o].build_var: "1" for o in op_names}}  # fmt: skip
    if planned.plan.archs:
        env["TORCH_CUDA_ARCH_LIST"] = ";".join(planned.plan.archs)
    seconds, _ = _timed(lambda: cmd.run([planned.python, "setup.py", "bdist_wheel", "-d", src_root / "dist"],
                                        env=env, cwd=planned.src, log=log))  # fmt: skip
    (wheel,) = (src_root / "dist").glob("*.whl")
    size = wheel.stat().st_size
    shutil.rmtree(src_root)
    return seconds, size


# The op the full-op bench leaves out of its cold build and then adds, per accelerator: one every
# machine of it can build (utils is CUDA's alone; the CPU accelerator has no such op).
ALL_OPS_EXTRA = {"cuda": "utils", "cpu": "pin_memory"}


def bench_all_ops(recipe: Recipe, out: Path, extra: str | None = None) -> dict[str, Any]:
    """A full-op recipe (ops = "all"): built cold as units less one op, then with that op added
    (every other unit cached), against plain DeepSpeed building the same ops in one run; the peak
    memory of the cold build; and a projection of the cold build over 1 to 64 nodes from the unit
    times it recorded."""
    if not recipe.all_ops:
        raise ToolError(f'recipe {recipe.name} does not say ops = "all"', "pass an all-ops recipe with --all-ops")
    extra = extra or ALL_OPS_EXTRA.get(recipe.accelerator, "utils")
    out.mkdir(parents=True, exist_ok=True)
    ws = Workspace(out / "work-all")
    log = out / "bench-all.log"
    for folder in (ws.cache / "ccache", ws.cache / "units", ws.dist, ws.root / "units"):
        shutil.rmtree(folder, ignore_errors=True)
    less = dataclasses.replace(recipe, ops_except=(*recipe.ops_except, extra))
    output.step(f"bench: {recipe.name} less {extra}, cold, as op units")
    with PeakMemory() as memory:
        cold = build_wheel(less, ws)
    record = json.loads((cold.wheel.parent / f"{cold.wheel.name}.build.json").read_text(encoding="utf-8"))
    unit_seconds = {op: u["seconds"] for op, u in record["units"].items()}
    from builder.contracts import BuildManifest

    built_ops = list(BuildManifest.from_wheel(cold.wheel).ops)
    cold_size = cold.wheel.stat().st_size
    output.step(f"bench: {recipe.name} (+{extra}), every other unit cached")
    one_op = build_wheel(recipe, ws)  # another build key (the op list), the same recipe file
    output.step(f"bench: plain DeepSpeed, the same {len(built_ops)} ops in one run")
    plain_s, plain_size = plain_all_ops(less, ws, out, log, built_ops)
    result = {
        "recipe": recipe.name,
        "cores": os.cpu_count(),
        "ops": built_ops,
        "extra_op": extra,
        "seconds": {"units_cold": cold.seconds, "plain": plain_s, "one_op": one_op.seconds},
        "wheel_bytes": {"units": cold_size, "plain": plain_size},
        "peak_memory_gb": round(memory.peak_gb, 1),
        "unit_seconds": unit_seconds,
        "projection_s": {n: round(projection(list(unit_seconds.values()), n)) for n in (1, 4, 16, 64)},
        "ratios": {"units_vs_plain": cold.seconds / plain_s, "one_op_vs_cold": one_op.seconds / cold.seconds},
    }
    return _report(out / "bench-all", result, render_all_ops(result))


def render_all_ops(result: dict[str, Any]) -> str:
    s, r, w, p = result["seconds"], result["ratios"], result["wheel_bytes"], result["projection_s"]
    longest = max(result["unit_seconds"].items(), key=lambda kv: kv[1])
    return "\n".join([
        f"Recipe `{result['recipe']}` ({len(result['ops'])} ops built), {result['cores']} cores:",
        "",
        "| measure | seconds | ratio | target |",
        "|---|---|---|---|",
        f"| cold, op units vs plain DeepSpeed (DS_BUILD_<OP>=1, ninja, MAX_JOBS={result['cores']}) | "
        f"{s['units_cold']:.0f} s vs {s['plain']:.0f} s | {r['units_vs_plain']:.2f} | <= 0.6 |",
        f"| adding one op (+{result['extra_op']}) to the built recipe vs its cold build | {s['one_op']:.0f} s vs "
        f"{s['units_cold']:.0f} s | {r['one_op_vs_cold']:.2f} | <= 0.1 |",
        f"| wheel size, units vs plain | {w['units'] / 1e6:.1f} MB vs {w['plain'] / 1e6:.1f} MB | "
        f"{w['units'] / w['plain']:.2f} | |",
        f"| peak memory of the cold build | {result['peak_memory_gb']} GB | | |",
        "",
        f"Projected wall time of the cold compile on 1 / 4 / 16 / 64 nodes (recorded unit times, one unit at a "
        f"time per node; the longest unit, {longest[0]} {longest[1]:.0f} s, bounds it): "
        f"{p[1]} s / {p[4]} s / {p[16]} s / {p[64]} s.",
        "",
    ])  # fmt: skip


def bench_image(wheelhouse: Path, out: Path) -> dict[str, Any]:
    """The CI image of the wheelhouse's newest wheel for this Python: cold (the toolkit's own
    debootstrap base removed from podman first, so it is made again) and rebuilt with that base
    cached; each with its steps' times. Nothing is published."""
    from builder import podman
    from builder.debian import host_mirror
    from builder.images.base import debootstrap_ref
    from builder.images.build import build_image

    out.mkdir(parents=True, exist_ok=True)
    ws = Workspace(out / "work-image")
    podman.require()
    podman.remove_image(debootstrap_ref(host_mirror()))  # the toolkit's own base, nobody else's
    output.step("bench: CI image, cold (the debootstrap base made anew)")
    cold_s, cold = _timed(lambda: build_image(wheelhouse, ws, publish=False))
    output.step("bench: CI image again, the base cached")
    warm_s, warm = _timed(lambda: build_image(wheelhouse, ws, publish=False))
    info = podman.inspect(warm.ref) or {}
    result = {
        "ref": warm.ref,
        "image_id": warm.image_id,
        "same_image": cold.image_id == warm.image_id,
        "image_bytes": info.get("Size"),
        "archive_bytes": warm.size,
        "seconds": {"cold": cold_s, "warm": warm_s},
        "steps": {"cold": cold.seconds, "warm": warm.seconds},
        "ratios": {"warm_vs_cold": warm_s / cold_s},
    }
    return _report(out / "bench-image", result, render_image(result))


def render_image(result: dict[str, Any]) -> str:
    s, st = result["seconds"], result["steps"]

    def steps(which: str) -> str:
        return ", ".join(f"{k} {v:.0f} s" for k, v in st[which].items())

    size = result["image_bytes"]
    return "\n".join([
        f"CI image `{result['ref']}` (ID {result['image_id'][:12]}; the same ID both times: {result['same_image']}):",
        "",
        "| measure | seconds | ratio |",
        "|---|---|---|",
        f"| cold: debootstrap base made, image built, smoked inside, saved ({steps('cold')}) | {s['cold']:.0f} s | |",
        f"| rebuild with the base cached ({steps('warm')}) | {s['warm']:.0f} s | "
        f"{result['ratios']['warm_vs_cold']:.2f} of cold |",
        f"| image size in podman / OCI archive | {size / 1e6 if isinstance(size, int) else 0:.0f} MB / "
        f"{result['archive_bytes'] / 1e6:.0f} MB | |",
        "",
    ])  # fmt: skip


def bench_cluster(folder: Path, out: Path, installs: int = 64, dry_runs: int | None = None) -> dict[str, Any]:
    """`installs` nodes' worth of installs at once from a test cluster's nodes (tests/cluster.py:
    FOLDER/cluster.json, its ssh config, the wheelhouse in its shared folder), against nginx on
    its web node and against `serve` on this host, one after the other in the same run: the node
    installer's dry run (`dry_runs` of them, default `installs`), then the downloads alone."""
    import socket
    import subprocess

    from builder import signing
    from builder.wheelhouse import fanout
    from builder.wheelhouse.layout import load_manifest

    state, nodes = _cluster_state(folder)
    house = folder / "shared" / "wheelhouse"
    load_manifest(house)  # its signature and form checked before anything is asked of it
    manifest = json.loads((house / "manifest.json").read_text(encoding="utf-8"))
    key = signing.keys().key().line()
    out.mkdir(parents=True, exist_ok=True)
    log = out / "bench-cluster.log"
    ssh = folder / "ssh" / "config"
    with socket.socket() as s:
        s.bind((state["host_addr"], 0))
        port = int(s.getsockname()[1])
    server = subprocess.Popen(
        [sys.executable, "-m", "builder", "serve", "--wheelhouse", str(house), "--bind", state["host_addr"],
         "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=log.open("a"),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while socket.socket().connect_ex((state["host_addr"], port)) != 0:
            if time.monotonic() > deadline or server.poll() is not None:
                raise ToolError(f"serve did not start on {state['host_addr']}:{port}", f"read {log}")
            time.sleep(0.2)
        urls = {"nginx": f"http://{state['web']}/wheelhouse", "serve": f"http://{state['host_addr']}:{port}"}
        runs = installs if dry_runs is None else dry_runs
        nginx = fanout.run(ssh, nodes, urls["nginx"], runs, key, manifest, log)
        served = fanout.run(ssh, nodes, urls["serve"], runs, key, manifest, log)
        # The same files without the installer's Python and torch start-up: the servers alone.
        files = nginx.files or served.files
        nginx_dl = fanout.run(ssh, nodes, urls["nginx"], installs, key, manifest, log, files)
        served_dl = fanout.run(ssh, nodes, urls["serve"], installs, key, manifest, log, files)
    finally:
        server.terminate()
        server.wait(timeout=30)
    result = {"installs": installs, "nodes": [n for n, _ in nodes], "nginx": nginx.to_json(),
              "serve": served.to_json(), "nginx_downloads": nginx_dl.to_json(), "serve_downloads": served_dl.to_json(),
              "ratios": {"serve_vs_nginx": served.seconds / max(nginx.seconds, 1e-9),
                         "serve_vs_nginx_downloads": served_dl.seconds / max(nginx_dl.seconds, 1e-9)}}  # fmt: skip
    return _report(out / "bench-cluster", result, render_cluster(result))


def _cluster_state(folder: Path) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """The test cluster's cluster.json, checked: its build-host address, web node and the nodes
    with torch (name, python) that installs run from (names go to ssh, the address to a bind)."""
    import ipaddress
    import re

    from builder.node import Fields, ManifestError

    where = folder / "cluster.json"
    try:
        f = Fields(json.loads(where.read_text(encoding="utf-8")), str(where))
        name, python = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$"), re.compile(r"^/[A-Za-z0-9._/+-]{1,200}$")
        addr = f.text("host_addr")
        ipaddress.ip_address(addr)
        state = {"host_addr": addr, "web": f.text("web", name)}
        nodes = []
        for node, entry in Fields(f.get("nodes", dict), f"{where}: nodes").data.items():
            n = Fields(entry, f"{where}: nodes.{node}")
            if not name.match(str(node)):
                raise n.fail("name", f"is not a node name: {str(node)[:40]!r}")
            if n.get("torch", bool, optional=True):
                nodes.append((str(node), n.text("python", python)))
    except (OSError, ValueError, ManifestError) as exc:
        raise ToolError(f"{where} is not a test cluster's state: {exc}",
                        "bring one up with `python tests/cluster.py up FOLDER`, pass that FOLDER") from exc  # fmt: skip
    if not nodes:
        raise ToolError(f"{where} lists no node with torch to install from", "use the cluster tests/cluster.py makes")
    return state, nodes


def render_cluster(result: dict[str, Any]) -> str:
    nodes = result["nodes"]
    files = result["nginx_downloads"]["files"]
    rows = [f"At once from {len(nodes)} nodes ({', '.join(nodes)}), against nginx (Debian's, the wheelhouse as a "
            "static folder) and `python -m builder serve`, in the same run:", "",
            "| what each does | server | all done in | one (median) | sha256 right | ratio |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    install = "the node installer's dry run (signature, manifest, wheel and dependencies fetched and checked)"
    download = f"download the {len(files)} files an install fetches and check each sha256"
    for key, what, ratio in (("", install, "serve_vs_nginx"), ("_downloads", download, "serve_vs_nginx_downloads")):
        for server in ("nginx", "serve"):
            r = result[server + key]
            mb = f", {r['megabytes']:.0f} MB" if r.get("megabytes") else ""
            tail = f"serve {result['ratios'][ratio]:.2f}x nginx" if server == "serve" else ""
            rows.append(f"| {what} | {server} | {r['seconds']:.1f} s{mb} | {r['median_install_s']:.1f} s | "
                        f"{r['ok']}/{r['installs']} | {tail} |")  # fmt: skip
    return "\n".join([*rows, ""])
