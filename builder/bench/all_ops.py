"""bench --all-ops: a recipe of every op, as op units against plain DeepSpeed building the same ops;
its peak memory and a projection over nodes."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from builder import cmd, output
from builder.bench.common import _report, _timed
from builder.build import build_wheel
from builder.errors import ToolError
from builder.recipe import Recipe
from builder.workspace import Workspace


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
