"""A matrix on Slurm, planned (pure but for reading recorded unit times): the run record, each job's
sizing and script."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.node import ManifestError, read_bounded
from builder.targets import GpuSmoke, Target

RUN_FILE = "run.json"


SCHEMA = 2


_JOB_ID = re.compile(r"^\d{1,12}(_\d{1,6})?$")


_SHA = re.compile(r"^[0-9a-f]{64}$")


_NODE = re.compile(r"^[A-Za-z0-9._-]{0,128}$")


_GPUS = re.compile(r"^[A-Za-z0-9,:_-]{0,200}$")


@dataclass(frozen=True)
class SlurmOptions:
    partition: str | None = None
    account: str | None = None
    cpus: int = 8
    mem: str = "24G"
    time: str = "02:00:00"
    unit_tasks: int = 8  # unit tasks of an ops = "all" target (a recipe naming N ops gets N at most)


def unit_tasks(target: Target, cap: int) -> int:
    """How many unit tasks share a target's ops: one per named op, `cap` for ops = "all" (pure)."""
    return max(1, cap if target.recipe.all_ops else min(len(target.recipe.ops), cap))


def recorded_times(records: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """op -> the build time its newest unit record holds (unit.json files of the unit cache), for
    sharing units out between tasks (pure)."""
    newest: dict[str, tuple[str, float]] = {}
    for r in records:
        op, at, seconds = r.get("op"), str(r.get("built_at", "")), r.get("seconds")
        if isinstance(op, str) and isinstance(seconds, int | float) and (op not in newest or at > newest[op][0]):
            newest[op] = (at, float(seconds))
    return {op: seconds for op, (_, seconds) in sorted(newest.items())}


def read_unit_records(cache: Path) -> list[dict[str, Any]]:
    """The unit.json of every unit in the cache that reads as JSON (times only: nothing is reused from them)."""
    out = []
    for path in sorted(cache.glob("*/unit.json")):
        try:
            data = json.loads(read_bounded(path, "report"))
        except (OSError, ValueError, ManifestError):
            continue
        if isinstance(data, dict):
            out.append(data)
    return out


def _sbatch_flags(opts: SlurmOptions) -> list[str]:
    flags = [f"--cpus-per-task={opts.cpus}", f"--mem={opts.mem}", f"--time={opts.time}"]
    if opts.partition:
        flags.append(f"--partition={opts.partition}")
    if opts.account:
        flags.append(f"--account={opts.account}")
    return flags


def smoke_partitions(target: Target, gpu: Mapping[str, GpuSmoke]) -> list[tuple[str, GpuSmoke]]:
    """The GPU partitions a target is smoked on: one per GPU type its archs run on, on nodes of the
    target's machine (pure)."""
    from builder.archs import gpu_of
    from builder.targets import gpu_key

    if target.recipe.accelerator != "cuda":
        return []
    out: dict[str, tuple[str, GpuSmoke]] = {}
    for arch in target.recipe.archs:
        where = gpu.get(gpu_key(target.recipe.machine, gpu_of(arch)))
        if where is not None and where.partition not in out:
            out[where.partition] = (gpu_of(arch), where)
    return list(out.values())


def build_script(targets: Sequence[str], run: Path, python: str) -> str:
    """An array job: task i builds the target named targets[i] (pure)."""
    names = " ".join(shlex.quote(t) for t in targets)
    return f"""#!/bin/bash
# ds-wheel-builder: one matrix target per array task (build, and smoke when no GPU job smokes it).
set -u
names=({names})
exec {shlex.quote(python)} -m builder slurm-task {shlex.quote(str(run))} --target "${{names[$SLURM_ARRAY_TASK_ID]}}"
"""


def units_script(tasks: Sequence[tuple[str, int, int]], run: Path, python: str) -> str:
    """An array job: task i builds group tasks[i][1] of tasks[i][2] of target tasks[i][0]'s op units (pure)."""
    names = " ".join(shlex.quote(t) for t, _, _ in tasks)
    groups = " ".join(f"{g}/{n}" for _, g, n in tasks)
    return f"""#!/bin/bash
# ds-wheel-builder: one share of a matrix target's op units per array task, into the shared unit cache.
set -u
names=({names})
groups=({groups})
share="${{groups[$SLURM_ARRAY_TASK_ID]}}"
exec {shlex.quote(python)} -m builder slurm-units {shlex.quote(str(run))} --target "${{names[$SLURM_ARRAY_TASK_ID]}}" \\
    --group "${{share%/*}}" --of "${{share#*/}}"
"""


def smoke_script(target: str, partition: str, run: Path, python: str) -> str:
    return f"""#!/bin/bash
# ds-wheel-builder: smoke {target} on the GPUs of partition {partition} (FusedAdam, bitsandbytes, NCCL).
set -u
exec {shlex.quote(python)} -m builder slurm-smoke {shlex.quote(str(run))} --target {shlex.quote(target)} \\
    --partition {shlex.quote(partition)}
"""


def collect_script(run: Path, wheelhouse: Path, python: str) -> str:
    return f"""#!/bin/bash
# ds-wheel-builder: after every build and smoke job (afterany), publish what passed and write the coverage.
set -u
exec {shlex.quote(python)} -m builder slurm-collect {shlex.quote(str(run))} --wheelhouse {shlex.quote(str(wheelhouse))}
"""


def sizing(target: Target, opts: SlurmOptions) -> SlurmOptions:
    """A target's build task: the matrix's [slurm] sizes, overridden by its recipe's [slurm] (pure)."""
    return dataclasses.replace(opts, **dict(target.recipe.slurm))  # type: ignore[arg-type]


def plan_record(
    targets: Sequence[Target], matrix: Path, run: Path, work: Path, wheelhouse: Path, cache: Path,
    sdists: Path, gpu: Mapping[str, GpuSmoke], opts: SlurmOptions = SlurmOptions(),
    unit_times: Mapping[str, float] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The run record every job reads back (pure): one job array per build-task size (an array's
    tasks share one size) and one of unit tasks beside each, targets with their array and task,
    their folders and smoke jobs, and the unit build times the unit tasks share units out by."""
    sizes: list[SlurmOptions] = []
    place: list[tuple[int, int]] = []
    for t in targets:
        size = sizing(t, opts)
        if size not in sizes:
            sizes.append(size)
        group = sizes.index(size)
        place.append((group, sum(1 for g, _ in place if g == group)))
    arrays = [{"size": dataclasses.asdict(size), "targets": [t.name for t, (g, _) in zip(targets, place, strict=True)
                                                             if g == i]} for i, size in enumerate(sizes)]  # fmt: skip
    unit_arrays = [
        {"size": array["size"],
         "tasks": [[t.name, g, n] for t in targets if t.name in array["targets"]
                   for n in [unit_tasks(t, opts.unit_tasks)] for g in range(n)]}
        for array in arrays
    ]  # fmt: skip
    return {
        "schema": SCHEMA,
        "matrix": str(matrix),
        "wheelhouse": str(wheelhouse),
        "work": str(work),
        "compiler_cache": str(cache),
        "sdists": str(sdists),
        "arrays": arrays,
        "unit_arrays": unit_arrays,
        "unit_times": dict(unit_times or {}),
        "targets": [
            {
                "name": t.name,
                "recipe": t.recipe.name,
                "python": t.python.version,
                "accelerator": t.recipe.accelerator,
                "archs": list(t.recipe.archs),
                "array": place[i][0],
                "task": place[i][1],
                "folder": str(work / t.name),
                "smoke": [{"gpu": arch, **dataclasses.asdict(g)} for arch, g in smoke_partitions(t, gpu)],
            }
            for i, t in enumerate(targets)
        ],
    }


def unit_cache_of(work: Path) -> Path:
    """The unit cache every job of a run shares (and builds in the submitter's work folder reuse)."""
    from builder.units.cache import cache_folder

    return cache_folder(work / "cache", os.environ)
