"""build-wheel: from a recipe to a verified wheel in the work folder's dist/.

The steps are: fetch and verify the sdist, make (or reuse) the build environment with the
recipe's torch, ask DeepSpeed for its op list, plan, build without isolation, prove every op is in
the wheel, then pin torch and embed the build manifest. A failed step leaves no wheel in dist/.
"""

from __future__ import annotations

import datetime
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from builder import __version__, cmd, envs, ops, source
from builder.detect import Report, detect
from builder.errors import BuildError
from builder.plan import BuildPlan, plan_build
from builder.recipe import Recipe
from builder.toolchain import ToolchainPlan, apply, compose_env, plan_toolchain
from builder.wheelfile import finish, verify
from builder.workspace import Workspace

BUILD_TOOLS = ("setuptools", "wheel", "ninja")
_EXTENSION = re.compile(r"building '([\w.]+)' extension")
_NINJA_STEP = re.compile(r"^\s*\[(\d+/\d+)\] .* -c (\S+) ")


@dataclass(frozen=True)
class BuildResult:
    wheel: Path
    plan: BuildPlan
    seconds: float
    log: Path


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
    wanted = [recipe.torch.requirement, *BUILD_TOOLS, *(r for r in ds_reqs if not r.startswith("torch"))]
    return list(dict.fromkeys(wanted))


def prepare(recipe: Recipe, ws: Workspace, log: Path, verbose: bool = False) -> tuple[Path, Path]:
    """The verified, freshly unpacked source and the (cached) build environment's Python."""
    sdist = source.fetch(recipe.deepspeed, ws.cache, log, verbose)
    src = source.unpack(sdist, ws.recipe_dir(recipe) / "src")
    venv = envs.cached(ws.cache / "envs", build_requirements(recipe, src), log, verbose)
    return src, envs.python_in(venv)


def toolchain_env(
    recipe: Recipe, python: Path, ws: Workspace, dry_run: bool = False
) -> tuple[dict[str, str], Report, ToolchainPlan]:
    """Detect the machine for the build env's torch and compose the environment the build runs in."""
    report = detect(os.environ, str(python))
    plan = plan_toolchain(report, ws.root / "toolchain" / "bin", need_cuda=recipe.accelerator == "cuda")
    for action in apply(plan, dry_run):
        print(f"  toolchain: {action}", file=sys.stderr)
    for note in plan.notes:
        print(f"  toolchain: {note}", file=sys.stderr)
    env = compose_env(envs.venv_environ(python.parent.parent), plan)
    env["DS_ACCELERATOR"] = recipe.accelerator
    return env, report, plan


def build_wheel(recipe: Recipe, ws: Workspace, verbose: bool = False) -> BuildResult:
    start = time.monotonic()
    ws.logs.mkdir(parents=True, exist_ok=True)
    log = ws.logs / f"{recipe.name}-build.log"
    log.unlink(missing_ok=True)
    print(f"==> build-wheel: recipe {recipe.name} ({recipe.path}); full log: {log}", file=sys.stderr)

    src, python = prepare(recipe, ws, log, verbose)
    env, machine, toolchain = toolchain_env(recipe, python, ws)
    (ws.logs / f"{recipe.name}-detect.json").write_text(machine.to_json(), encoding="utf-8")
    report = ops.probe(python, src, env, log)
    plan = plan_build(recipe, report, os.cpu_count() or 1)
    env.update(plan.env)
    print(
        f"  version {plan.version}; ops {', '.join(o.name for o in plan.ops)}; MAX_JOBS={plan.env['MAX_JOBS']}",
        file=sys.stderr,
    )

    work = ws.recipe_dir(recipe)
    ws.dist.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work, prefix="wheel-") as tmp:
        raw_dir = Path(tmp)
        cmd.run(
            [python, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-v", "-w", raw_dir, src],
            env=env,
            log=log,
            verbose=verbose,
            progress=build_progress,
            fix=f"read the log {log}",
        )
        raw = _single_wheel(raw_dir)
        contents = verify(raw, plan.ops, plan.version)
        seconds = time.monotonic() - start
        manifest = build_manifest(plan, seconds, dict(contents.shared_objects), machine, toolchain)
        wheel = finish(raw, python, manifest, f"=={Version(plan.torch_version).public}", log, ws.dist)
    shutil.rmtree(src, ignore_errors=True)
    seconds = time.monotonic() - start
    _summary(wheel, plan, seconds, log)
    return BuildResult(wheel=wheel, plan=plan, seconds=seconds, log=log)


def build_manifest(
    plan: BuildPlan, seconds: float, so_sizes: dict[str, int], machine: Report, toolchain: ToolchainPlan
) -> dict[str, object]:
    recipe = plan.recipe
    return {
        "schema": 1,
        "builder_version": __version__,
        "built_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "build_seconds": round(seconds, 1),
        "version": plan.version,
        "recipe": {
            "name": recipe.name,
            "path": str(recipe.path) if recipe.path else None,
            "accelerator": recipe.accelerator,
            "ops": list(recipe.ops),
            "deepspeed": {"version": recipe.deepspeed.version, "sha256": recipe.deepspeed.sha256},
            "torch": recipe.torch.version,
        },
        "source": {"file": f"deepspeed-{recipe.deepspeed.version}.tar.gz", "sha256": recipe.deepspeed.sha256},
        "toolchain": {
            "nvcc": toolchain.toolkit.version if toolchain.toolkit else None,
            "cuda_home": toolchain.toolkit.root if toolchain.toolkit else None,
            "gcc": machine.default_gcc,
            "host_compiler": dict(toolchain.links).get("g++"),
            "cxx11_abi": machine.torch.cxx11_abi,
        },
        "torch": {"version": plan.torch_version, "cuda": plan.torch_cuda},
        "python_tag": plan.python_tag,
        "accelerator": recipe.accelerator,
        "archs": [],
        "ops": [op.name for op in plan.ops],
        "env": dict(plan.env),
        "shared_objects": so_sizes,
    }


def _single_wheel(folder: Path) -> Path:
    wheels = sorted(folder.glob("*.whl"))
    if len(wheels) != 1:
        raise BuildError(f"the build produced {len(wheels)} wheels, expected one", "read the build log")
    return wheels[0]


def _summary(wheel: Path, plan: BuildPlan, seconds: float, log: Path) -> None:
    size = wheel.stat().st_size / 1e6
    print(
        f"==> built {wheel.name} in {seconds:.0f}s\n"
        f"    wheel: {wheel} ({size:.1f} MB)\n"
        f"    ops:   {', '.join(op.name for op in plan.ops)}\n"
        f"    log:   {log}",
        file=sys.stderr,
    )
