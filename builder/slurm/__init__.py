"""A matrix on Slurm: a job array of op units, a job array of builds, a GPU smoke job per GPU
type, one collect job.

Each unit task (`slurm-units`) builds a share of one target's op units into the unit cache every
job shares: the ops of a target are spread over as many tasks (a recipe's named ops, one task
each; ops = "all", [slurm] unit_tasks of them), balanced by the build times earlier runs
recorded, so a full-op target compiles on several nodes at once. Each build task (afterany on the
unit arrays) builds one target (`slurm-task`) in a folder that is the same for every run and
every node (WORK/slurm/targets/<name>), with one compiler cache for all tasks, so a re-run reuses
unchanged targets by build key and a changed one compiles from the cache whichever node it lands
on. A CUDA target whose archs map to a GPU partition ([slurm.gpu]) is smoked there by its own job
(`slurm-smoke`, afterok on its build task); the others smoke on CPU inside the build task. The
collect job (afterany on all of them) is the single writer of the wheelhouse: it reads every
result another job wrote, checks it before believing it, publishes what passed and writes the
coverage report with job ids, nodes and logs. Scripts and states are rendered by pure functions;
`submit`, `wait`, `run_task`, `run_smoke` and `collect` are the edges.

Its rooms: plan (the record, sizing and scripts), submit, tasks (what the jobs run), results (read
back and checked), watch (the queue until the collect job is done)."""

from __future__ import annotations

from builder.slurm.plan import (
    RUN_FILE,
    SCHEMA,
    SlurmOptions,
    build_script,
    collect_script,
    plan_record,
    read_unit_records,
    recorded_times,
    sizing,
    smoke_partitions,
    smoke_script,
    unit_cache_of,
    unit_tasks,
    units_script,
)
from builder.slurm.results import (
    SmokeResult,
    collect,
    entry,
    load_run,
    read_build,
    read_smoke,
    results_dir,
    saw_no_gpu,
    target_result,
    units_on,
)
from builder.slurm.submit import jobs_of, submit
from builder.slurm.tasks import run_smoke, run_task, run_units_task
from builder.slurm.watch import ACTIVE, queue, states, wait

__all__ = [
    "ACTIVE",
    "RUN_FILE",
    "SCHEMA",
    "SlurmOptions",
    "SmokeResult",
    "build_script",
    "collect",
    "collect_script",
    "entry",
    "jobs_of",
    "load_run",
    "plan_record",
    "queue",
    "read_build",
    "read_smoke",
    "read_unit_records",
    "recorded_times",
    "results_dir",
    "run_smoke",
    "run_task",
    "run_units_task",
    "saw_no_gpu",
    "sizing",
    "smoke_partitions",
    "smoke_script",
    "states",
    "submit",
    "target_result",
    "unit_cache_of",
    "unit_tasks",
    "units_on",
    "units_script",
    "wait",
]
