"""bench: this toolkit against the plain DeepSpeed command, in one run, as ratios.

For one recipe it times, side by side on the same machine and build environment:
1. a cold build: `build-wheel` (empty ccache, no cached wheel) vs DeepSpeed's own
   `python setup.py build_ext -j<cores> bdist_wheel` with the same DS_BUILD_* and arch list;
2. an unchanged rebuild (the build key finds the wheel) vs cold;
3. a rebuild after adding one op, with ccache warm from the cold build, vs cold;
4. the wheel's size vs the plain command's wheel;
5. a fresh node: installing the wheel and loading its first op, vs `pip install deepspeed` from the
   sdist and the JIT compile its first use triggers (both into a venv that already has torch).
Each figure is the median of --runs runs; the ratios are what count on a noisy machine.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from builder import cmd, envs, output
from builder.build import ops, source
from builder.build.plan import plan_build
from builder.build.wheel import build_wheel, prepare, toolchain_env
from builder.recipe import Recipe
from builder.workspace import Workspace

FIRST_OP = {
    "cpu_adam": "from deepspeed.ops.adam import DeepSpeedCPUAdam as O; import torch; "
    "O([torch.nn.Parameter(torch.zeros(4))])",
    "fused_adam": "from deepspeed.ops.op_builder import FusedAdamBuilder as B; B().load()",
}
# The op each recipe adds for the one-op rebuild, in order of preference.
EXTRA_OPS = ("deepspeed_shm_comm", "cpu_lion", "cpu_adagrad", "fused_lion", "fused_lamb")


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.monotonic()
    result = fn()
    return time.monotonic() - start, result


def plain_build(recipe: Recipe, ws: Workspace, out: Path, log: Path) -> tuple[float, int]:
    """DeepSpeed's own command in a fresh source tree: seconds and wheel bytes."""
    src_root = out / "plain"
    sdist = source.fetch(recipe.deepspeed, ws.cache, log)
    src = source.unpack(sdist, src_root)
    _, python = prepare(recipe, ws, log)
    env, machine, _ = toolchain_env(recipe, python, ws)
    kit = next((t for t in machine.toolkits if t.root == machine.chosen_toolkit), None)
    from builder.build.plan import resolve_archs

    archs = resolve_archs(recipe, machine.arch_list, kit.archs if kit else (), kit.version if kit else "-")
    plan = plan_build(recipe, ops.probe(python, src, env, log), os.cpu_count() or 1, archs)
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


def fresh_node(recipe: Recipe, wheel: Path, out: Path, log: Path) -> tuple[float, float]:
    """Seconds to a usable first op: installing our wheel vs pip's sdist install plus the JIT."""
    op = next((o for o in recipe.ops if o in FIRST_OP), None)
    if op is None:
        return float("nan"), float("nan")
    results = []
    for kind in ("wheel", "jit"):
        venv = out / f"node-{kind}"
        deps = [f"torch=={recipe.torch.version}", "hjson", "msgpack", "numpy", "packaging", "psutil", "py-cpuinfo",
                "pydantic>=2", "tqdm", "einops", "ninja", "setuptools", "wheel"]  # fmt: skip
        envs.create(venv, deps, log)  # not timed: both nodes start with torch and DeepSpeed's needs
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


def bench(recipe: Recipe, out: Path, runs: int) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    ws = Workspace(out / "work")
    log = out / "bench.log"
    extra = next((o for o in EXTRA_OPS if o not in recipe.ops), None)
    samples: dict[str, list[float]] = {
        k: [] for k in ("plain", "cold", "unchanged", "one_op", "node_wheel", "node_jit")
    }
    sizes: dict[str, int] = {}
    for run in range(runs):
        output.step(f"bench run {run + 1}/{runs}: recipe {recipe.name}")
        plain_s, sizes["plain"] = plain_build(recipe, ws, out, log)
        samples["plain"].append(plain_s)
        shutil.rmtree(ws.dist, ignore_errors=True)
        shutil.rmtree(ws.cache / "ccache", ignore_errors=True)
        cold = build_wheel(recipe, ws)
        samples["cold"].append(cold.seconds)
        sizes["toolkit"] = cold.wheel.stat().st_size
        samples["unchanged"].append(build_wheel(recipe, ws).seconds)
        if extra:
            samples["one_op"].append(build_wheel(dataclasses.replace(recipe, ops=(*recipe.ops, extra)), ws).seconds)
        node_wheel, node_jit = fresh_node(recipe, cold.wheel, out, log)
        samples["node_wheel"].append(node_wheel)
        samples["node_jit"].append(node_jit)
    med = {k: statistics.median(v) if v else float("nan") for k, v in samples.items()}
    result = {
        "recipe": recipe.name,
        "runs": runs,
        "cores": os.cpu_count(),
        "extra_op": extra,
        "samples_s": samples,
        "median_s": med,
        "wheel_bytes": sizes,
        "ratios": {
            "cold_vs_plain": med["cold"] / med["plain"],
            "unchanged_vs_cold": med["unchanged"] / med["cold"],
            "one_op_vs_cold": med["one_op"] / med["cold"],
            "wheel_vs_plain": sizes["toolkit"] / sizes["plain"],
            "node_vs_jit": med["node_wheel"] / med["node_jit"],
        },
    }
    (out / "bench.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    (out / "bench.md").write_text(render_table(result), encoding="utf-8")
    output.result(render_table(result))
    return result


TARGETS = {
    "cold_vs_plain": ("cold build vs plain `setup.py build_ext -j bdist_wheel`", 0.8),
    "unchanged_vs_cold": ("unchanged rebuild (build key hit) vs cold", None),
    "one_op_vs_cold": ("rebuild after adding one op (ccache) vs cold", 0.4),
    "wheel_vs_plain": ("wheel size vs plain wheel", 0.3),
    "node_vs_jit": ("fresh node: install + first op vs pip sdist + JIT", 0.2),
}


def render_table(result: dict[str, Any]) -> str:
    """The Markdown table README.md carries."""
    med, sizes, ratios = result["median_s"], result["wheel_bytes"], result["ratios"]
    absolute = {
        "cold_vs_plain": f"{med['cold']:.0f} s vs {med['plain']:.0f} s",
        "unchanged_vs_cold": f"{med['unchanged']:.1f} s vs {med['cold']:.0f} s",
        "one_op_vs_cold": f"{med['one_op']:.0f} s vs {med['cold']:.0f} s (+{result['extra_op']})",
        "wheel_vs_plain": f"{sizes['toolkit'] / 1e6:.1f} MB vs {sizes['plain'] / 1e6:.1f} MB",
        "node_vs_jit": f"{med['node_wheel']:.0f} s vs {med['node_jit']:.0f} s",
    }
    lines = [
        f"Recipe `{result['recipe']}`, {result['cores']} cores, median of {result['runs']} run(s):",
        "",
        "| measure | this toolkit vs plain | ratio | target |",
        "|---|---|---|---|",
    ]
    for key, (label, target) in TARGETS.items():
        goal = "< 2 s for the build step" if key == "unchanged_vs_cold" else f"<= {target}"
        lines.append(f"| {label} | {absolute[key]} | {ratios[key]:.2f} | {goal} |")
    return "\n".join(lines) + "\n"
