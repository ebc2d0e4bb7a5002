"""Which units a build needs and what each is keyed on (pure: nothing here touches the disk)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from builder.machines import CPU_TARGET_FLAGS, OP_TARGETS, op_target
from builder.wheelbuild.ops import OpInfo
from builder.wheelbuild.plan import BuildPlan, job_memory, max_jobs

UNIT_SCHEMA = 1
# Build-key inputs that name or fill the assembled wheel but do not change one op's unit: the site's
# configs and its known failures go into the wheel's manifest and its smoke, not into any op's .so (a
# known failure in the key made listing one compile every op again).
RECIPE_ONLY = ("recipe", "ops", "narrow_ops", "on_op_failure", "configs", "known_failures", "label")
# Environment that changes how fast a unit builds, never what it holds.
SPEED_ONLY = ("MAX_JOBS", "DS_BUILDER_PARALLEL")


@dataclass(frozen=True)
class Unit:
    op: OpInfo
    key: str
    env: Mapping[str, str]  # the build plan's environment for this op alone
    inputs: Mapping[str, Any]  # what the key hashes (recorded with the unit)


# Ops whose setup.py run builds pin_memory beside them (DeepSpeed adds it: they load it at run time).
WITH_PIN_MEMORY = ("async_io", "gds")


def unit_env(plan: BuildPlan, op: OpInfo, jobs: int) -> dict[str, str]:
    """The plan's environment with only `op` enabled (DS_BUILD_OPS=0 keeps every other op out)."""
    others = {o.build_var for o in plan.ops if o.name != op.name}
    env = {k: v for k, v in plan.env.items() if k not in others and k not in SPEED_ONLY}
    env[op.build_var] = "1"
    env["MAX_JOBS"] = str(jobs)
    if (own := op_target(plan.recipe.cpu_target, op.name)) in OP_TARGETS:  # SVE: CPU Adam's alone
        env["DS_BUILDER_CPU_ARCH"], env["DS_BUILDER_SIMD_WIDTH"] = CPU_TARGET_FLAGS[own]
    if op.name in WITH_PIN_MEMORY:  # two extensions in one run: built at once, each in its own folder
        env["DS_BUILDER_PARALLEL"] = "2"
    return env


def schedule_units(n_units: int, cores: int, mem_gb: float | None, job_gb: float) -> tuple[int, int]:
    """(units built at once, ninja jobs in each).

    Each unit spends its first seconds in Python (pip, setup.py, torch and DeepSpeed's op
    builders: 9 s here) with one core busy, then compiles. One unit more than the cores memory
    allows keeps every core compiling through the others' start-up, and each unit may run up to
    twice its share of the cores in jobs, so a unit with several files uses the cores another
    leaves idle; the jobs alive at once never need more than the free memory.
    """
    total = max_jobs(cores, mem_gb, job_gb)
    parallel = max(1, min(n_units, total + 1 if total > 1 else 1))
    share = -(-2 * cores // parallel)  # ceil(2 * cores / parallel)
    return parallel, max(1, min(share, max_jobs(cores, None if mem_gb is None else mem_gb / parallel, job_gb)))


def unit_key(inputs: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:24]


def plan_units(
    plan: BuildPlan, build_inputs: Mapping[str, Any], cores: int, mem_gb: float | None
) -> tuple[list[Unit], int]:
    """One unit per op of the plan, and how many to build at once."""
    parallel, jobs = schedule_units(len(plan.ops), cores, mem_gb, job_memory(plan.archs))
    shared = {k: v for k, v in build_inputs.items() if k not in RECIPE_ONLY}
    units = []
    for op in plan.ops:
        env = unit_env(plan, op, jobs)
        # the target this unit is built for: a variant's units built for the portable target key as its own
        build = {**shared, "cpu_target": op_target(shared["cpu_target"], op.name)} if "cpu_target" in shared else shared
        inputs = {"unit_schema": UNIT_SCHEMA, "op": op.name, "build": build,
                  "env": {k: v for k, v in sorted(env.items()) if k not in SPEED_ONLY}}  # fmt: skip
        units.append(Unit(op, unit_key(inputs), env, inputs))
    return units, parallel


def describe(units: Sequence[Unit], parallel: int) -> str:
    jobs = units[0].env["MAX_JOBS"] if units else "-"
    return f"{len(units)} op units, {parallel} at once, MAX_JOBS={jobs} each"


# What an op never built before is taken to cost when units are shared out between tasks: about the
# longest unit measured on 2 cores (inference_core_ops, evoformer_attn take minutes; most ops under one).
UNKNOWN_SECONDS = 600.0


def group_units(units: Sequence[Unit], groups: int, seconds: Mapping[str, float]) -> list[list[Unit]]:
    """Units shared out between `groups` tasks so that each task's recorded build time is about the
    same (longest first, each to the least loaded task); the same inputs give the same groups, so
    every task of a Slurm array computes the same split independently."""
    loads = [0.0] * max(1, groups)
    out: list[list[Unit]] = [[] for _ in loads]
    for unit in sorted(units, key=lambda u: (-seconds.get(u.op.name, UNKNOWN_SECONDS), u.op.name)):
        i = min(range(len(loads)), key=lambda k: (loads[k], k))
        out[i].append(unit)
        loads[i] += seconds.get(unit.op.name, UNKNOWN_SECONDS)
    return out
