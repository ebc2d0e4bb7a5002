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
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder import cmd, output
from builder.coverage import TARGET_NAME, parse_stages
from builder.coverage import load as load_coverage
from builder.errors import BuilderError, MatrixError, RecipeError, ToolError
from builder.files import make_dirs, write_atomic
from builder.node import OP_RE, Fields, ManifestError, check_wheel_name, read_bounded
from builder.recipe import SLURM_WORD
from builder.results import StageResult, TargetResult
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
    """The GPU partitions a target is smoked on: one per GPU type its archs run on (pure)."""
    from builder.archs import gpu_of

    if target.recipe.accelerator != "cuda":
        return []
    out: dict[str, tuple[str, GpuSmoke]] = {}
    for arch in target.recipe.archs:
        where = gpu.get(gpu_of(arch))
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


def submit(
    targets: Sequence[Target], matrix: Path, run: Path, work: Path, wheelhouse: Path, opts: SlurmOptions,
    gpu: Mapping[str, GpuSmoke], cache: Path, sdists: Path,
) -> dict[str, Any]:  # fmt: skip
    """Write the scripts and the run record, submit the array, the smoke jobs and the collect job."""
    make_dirs(run / "logs")
    make_dirs(run / "results")
    python = sys.executable
    times = recorded_times(read_unit_records(unit_cache_of(work)))
    record = plan_record(targets, matrix.resolve(), run, work, wheelhouse.resolve(), cache, sdists, gpu, opts, times)

    def save() -> None:
        write_atomic(run / RUN_FILE, json.dumps(record, indent=2) + "\n")

    save()  # before the first job can start: every job reads it
    submitted: list[str] = []
    try:
        _submit_jobs(record, run, wheelhouse, opts, python, save, submitted)
    except BuilderError as exc:  # no half-submitted run: what went in is cancelled
        if submitted:
            cmd.ask(["scancel", *submitted])
        exc.message += f" (cancelled the {len(submitted)} jobs already submitted)" if submitted else ""
        raise
    return record


def _submit_jobs(
    record: dict[str, Any], run: Path, wheelhouse: Path, opts: SlurmOptions, python: str, save: Any,
    submitted: list[str],
) -> None:  # fmt: skip
    for i, units_plan in enumerate(record["unit_arrays"]):
        tasks = [(name, group, of) for name, group, of in units_plan["tasks"]]
        script = write_atomic(run / f"units-{i}.sh", units_script(tasks, run, python), mode=0o755)
        units_plan["job"] = _sbatch(
            # --no-requeue: a unit task whose node dies is not run again by Slurm; the build task,
            # which waits for every unit task to end, compiles what it left, on a live node.
            [*_sbatch_flags(SlurmOptions(**units_plan["size"])), f"--array=0-{len(tasks) - 1}", "--no-requeue",
             "--job-name=ds-units", f"--output={run / 'logs'}/units-%A_%a.log", str(script)]
        )  # fmt: skip
        submitted.append(units_plan["job"])
    save()
    # Every unit task has ended (built, failed or not) before a build task assembles: what a unit task
    # could not build, the build task builds itself, or names.
    units_done = f"--dependency=afterany:{':'.join(u['job'] for u in record['unit_arrays'])}"
    for i, array_plan in enumerate(record["arrays"]):
        build = write_atomic(run / f"build-{i}.sh", build_script(array_plan["targets"], run, python), mode=0o755)
        array = _sbatch(
            [*_sbatch_flags(SlurmOptions(**array_plan["size"])), f"--array=0-{len(array_plan['targets']) - 1}",
             units_done, "--job-name=ds-build", f"--output={run / 'logs'}/build-%A_%a.log", str(build)]
        )  # fmt: skip
        submitted.append(array)
        array_plan["job"] = array
    for item in record["targets"]:
        array = record["arrays"][item["array"]]["job"]
        item["job"] = f"{array}_{item['task']}"
        item["log"] = str(run / "logs" / f"build-{array}_{item['task']}.log")
    save()
    after = [a["job"] for a in record["arrays"]]
    for item in record["targets"]:
        for smoke in item["smoke"]:
            part = smoke["partition"]
            script = write_atomic(run / f"smoke-{item['name']}-{part}.sh",
                                  smoke_script(item["name"], part, run, python), mode=0o755)  # fmt: skip
            sized = SlurmOptions(part, opts.account, cpus=min(opts.cpus, 8), mem=opts.mem,
                                 time=smoke["time"])  # fmt: skip
            job = _sbatch(
                [*_sbatch_flags(sized), f"--gres={smoke['gres']}", f"--job-name=ds-smoke-{part}",
                 f"--dependency=afterok:{item['job']}", "--kill-on-invalid-dep=yes",
                 f"--output={run / 'logs'}/smoke-{item['name']}-{part}-%j.log", str(script)]
            )  # fmt: skip
            submitted.append(job)
            smoke.update(job=job, log=str(run / "logs" / f"smoke-{item['name']}-{part}-{job}.log"))
            after.append(job)
        save()
    collect = write_atomic(run / "collect.sh", collect_script(run, wheelhouse.resolve(), python), mode=0o755)
    placement = _sbatch_flags(SlurmOptions(opts.partition, opts.account, cpus=1, mem="2G", time=opts.time))
    record["collect_job"] = _sbatch(
        [*placement, "--job-name=ds-collect", f"--dependency=afterany:{':'.join(after)}",
         f"--output={run / 'logs'}/collect-%j.log", str(collect)]
    )  # fmt: skip
    submitted.append(record["collect_job"])
    save()


def _sbatch(args: list[str]) -> str:
    """Submit; the job id (sbatch's own message, e.g. a node configuration no partition has, on failure)."""
    said = cmd.run(["sbatch", "--parsable", *args],
                   fix="check the partition, the account, the gres and the [slurm] sizes against `sinfo`")  # fmt: skip
    ids = [line.split(";")[0] for line in said.splitlines() if _JOB_ID.match(line.split(";")[0].strip())]
    if not ids:
        raise ToolError(f"sbatch printed no job id: {said[-300:]!r}", "check the partition and account")
    return ids[-1].strip()


def jobs_of(record: Mapping[str, Any]) -> list[str]:
    smokes = [s["job"] for t in record["targets"] for s in t["smoke"] if s.get("job")]
    arrays = [a.get("job") for a in [*record.get("unit_arrays", []), *record["arrays"]]]
    return [j for j in [*arrays, *smokes, record.get("collect_job")] if j]


# ---------------------------------------------------------------- reading back what jobs wrote


def load_run(run: Path) -> dict[str, Any]:
    """The run record `submit` wrote, checked (every job reads it from shared storage)."""
    where = str(run / RUN_FILE)
    try:
        data = json.loads(read_bounded(run / RUN_FILE, "report"))
    except (OSError, ValueError) as exc:
        raise RecipeError(f"{where}: cannot be read as JSON ({exc})",
                          "pass the run folder build-wheel --slurm printed")  from exc  # fmt: skip
    try:
        f = Fields(data, where)
        if f.get("schema", int) != SCHEMA:
            raise f.fail("schema", f"is not {SCHEMA} (a run of another builder version)")
        for key in ("matrix", "wheelhouse", "work", "compiler_cache", "sdists"):
            if not Path(f.text(key)).is_absolute():
                raise f.fail(key, "is not an absolute path")
        f.text("collect_job", _JOB_ID, optional=True)
        work = Path(f.data["work"])
        arrays = []
        for i, array in enumerate(f.get("arrays", list)):
            a = Fields(array, f"{where}: arrays[{i}]")
            a.text("job", _JOB_ID, optional=True)
            arrays.append(a.texts("targets", TARGET_NAME))
        names = {Fields(item, where).text("name", TARGET_NAME) for item in f.get("targets", list)}
        for i, array in enumerate(f.get("unit_arrays", list, optional=True) or []):
            a = Fields(array, f"{where}: unit_arrays[{i}]")
            a.text("job", _JOB_ID, optional=True)
            for task in a.get("tasks", list):
                ok = isinstance(task, list) and len(task) == 3 and task[0] in names
                if not ok or not all(isinstance(n, int) and not isinstance(n, bool) for n in task[1:]):
                    raise a.fail("tasks", f"holds {str(task)[:80]!r}, not [target, task, tasks]")
                if not 0 <= task[1] < task[2] <= 1000:
                    raise a.fail("tasks", f"holds task {task[1]} of {task[2]}")
        times = f.get("unit_times", dict, optional=True) or {}
        if not all(OP_RE.match(str(op)) and isinstance(v, int | float) and v >= 0 for op, v in times.items()):
            raise f.fail("unit_times", "is not {op: seconds}")
        for i, item in enumerate(f.get("targets", list)):
            t = Fields(item, f"{where}: targets[{i}]")
            name = t.text("name", TARGET_NAME)
            group, task = t.get("array", int), t.get("task", int)
            if not (0 <= group < len(arrays) and 0 <= task < len(arrays[group]) and arrays[group][task] == name):
                raise t.fail("task", f"is not {name}'s place in its job array")
            if t.text("folder") != str(work / name):
                raise t.fail("folder", f"is not {work / name}")  # builds only ever in the run's own work folder
            t.text("job", _JOB_ID, optional=True)
            for j, smoke in enumerate(t.get("smoke", list)):
                s = Fields(smoke, f"{t.where}.smoke[{j}]")
                s.text("partition", SLURM_WORD)
                s.text("gres", SLURM_WORD)
                s.get("require_gpu", bool)
                s.text("time", SLURM_WORD)
                s.text("job", _JOB_ID, optional=True)
    except ManifestError as exc:
        raise RecipeError(exc.message, "the run folder was edited: submit the matrix again") from exc
    return f.data


def entry(record: Mapping[str, Any], name: str) -> dict[str, Any]:
    for item in record["targets"]:
        if item["name"] == name:
            return dict(item)
    names = ", ".join(t["name"] for t in record["targets"])
    raise MatrixError(f'the run has no target "{name}"', f"its targets: {names}")


def results_dir(run: Path) -> Path:
    return run / "results"


def _read(path: Path) -> Any:
    """A JSON file another job wrote; None when it is absent (the job did not get that far)."""
    try:
        return json.loads(read_bounded(path, "report"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ManifestError(f"{path}: cannot be read as JSON ({exc})", "the job's result was damaged") from exc


def read_build(run: Path, item: Mapping[str, Any]) -> tuple[TargetResult, str | None] | None:
    """A build task's result, checked: this target, known statuses, a wheel only inside the target's
    own folder and the sha256 it had. None when the task wrote none."""
    path = results_dir(run) / f"{item['name']}.build.json"
    data = _read(path)
    if data is None:
        return None
    f = Fields(data, str(path))
    row = Fields(f.get("result", dict), f"{path}: result")
    if row.text("target") != item["name"]:
        raise row.fail("target", f"is not {item['name']}")
    stages = parse_stages(row.get("stages", dict), f"{row.where}.stages")
    wheel, sha = None, None
    if written := row.get("wheel", str, optional=True):
        file_name = Path(written).name
        check_wheel_name(file_name, f"{row.where}.wheel")
        wheel = Path(item["folder"]) / "dist" / file_name  # only ever inside the target's own folder
        sha = f.text("sha256", _SHA)
    slurm = {"job": str(item.get("job", "")), "log": str(item.get("log", "")), "node": f.text("node", _NODE)}
    return TargetResult(item["name"], item["recipe"], item["python"], wheel, stages, slurm=slurm), sha


def units_on(run: Path, name: str) -> str:
    """Which node compiled which op unit of a target ("cpu_adam (node2), ..."), from what its unit
    tasks wrote: each task's result, or, for a task that started (its marker names its node and
    units) and wrote none, that it died there. Checked like every file a job wrote: a damaged one
    is left out, never believed."""
    placed = []
    found = results_dir(run).glob(f"{name}.units-*.json")
    for stem in sorted({p.name.removesuffix(".json").removesuffix(".started") for p in found}):
        result, marker = results_dir(run) / f"{stem}.json", results_dir(run) / f"{stem}.started.json"
        path = result if result.exists() else marker
        try:
            data = _read(path)
            if data is None:
                continue
            f = Fields(data, str(path))
            node = f.text("node", _NODE)
            if path is result:
                units = f.get("units", list)
                placed += [
                    f"{Fields(u, f'{path}: units[{i}]').text('op', OP_RE)} ({node})" for i, u in enumerate(units)
                ]
            else:  # it started and wrote no result: its node died (or it was killed) while it compiled
                job = f.text("job", _JOB_ID)
                placed += [f"{op} (its unit task {job} died on {node}: built by the build task)"
                           for op in f.texts("ops", OP_RE)]  # fmt: skip
        except ManifestError as exc:
            output.warn(f"{exc.message}: not shown")
    return ", ".join(placed)


@dataclass(frozen=True)
class SmokeResult:
    partition: str
    status: str
    reason: str
    node: str
    gpus: str
    saw_gpu: bool
    seconds: float
    sha256: str


def read_smoke(run: Path, name: str, partition: str) -> SmokeResult | None:
    return _smoke_file(results_dir(run) / f"{name}.smoke.{partition}.json", name, partition)


def _smoke_file(path: Path, name: str, partition: str) -> SmokeResult | None:
    data = _read(path)
    if data is None:
        return None
    f = Fields(data, str(path))
    if f.text("target") != name:
        raise f.fail("target", f"is not {name}")
    if f.text("partition") != partition:
        raise f.fail("partition", f"is not {partition}")
    return SmokeResult(
        partition, f.choice("status", ("passed", "reused", "failed")), f.get("reason", str)[:2000],
        f.text("node", _NODE), f.text("gpus", _GPUS), f.get("saw_gpu", bool), float(f.get("seconds", (int, float))),
        f.text("sha256", _SHA),
    )  # fmt: skip


# ---------------------------------------------------------------- inside the jobs


def _job_env() -> tuple[str, str]:
    return os.environ.get("SLURM_JOB_ID", ""), socket.gethostname().split(".")[0]


def unit_cache_of(work: Path) -> Path:
    """The unit cache every job of a run shares (and builds in the submitter's work folder reuse)."""
    from builder.units.cache import cache_folder

    return cache_folder(work / "cache", os.environ)


def _task_target(run: Path, name: str) -> tuple[dict[str, Any], dict[str, Any], Target]:
    """The run record, the target's entry and the Target, with the shared caches put in the environment."""
    from builder.targets import load_matrix, select, targets_for
    from builder.units.cache import UNIT_CACHE_ENV
    from builder.wheelbuild.ccache import CACHE_DIR_ENV
    from builder.wheelbuild.source import SDIST_CACHE_ENV

    record = load_run(run)
    item = entry(record, name)
    matrix = load_matrix(Path(record["matrix"]))
    try:
        target = select(targets_for(matrix.recipes, matrix.python), name, f"{record['matrix']} (changed since submit?)")
    except RecipeError as exc:
        raise MatrixError(exc.message, "submit the matrix again") from exc
    os.environ[CACHE_DIR_ENV] = record["compiler_cache"]
    os.environ.setdefault(SDIST_CACHE_ENV, record["sdists"])
    # Op units are shared by every task and by builds in the submitter's work folder: a unit any of
    # them built (same inputs) is never compiled again.
    os.environ.setdefault(UNIT_CACHE_ENV, str(unit_cache_of(Path(record["work"]))))
    return record, item, target


def _cores() -> int:
    return int(os.environ.get("SLURM_CPUS_PER_TASK", "0")) or len(os.sched_getaffinity(0))


def run_units_task(run: Path, name: str, group: int, groups: int) -> list[dict[str, Any]]:
    """A unit task: build its share of the target's op units into the shared unit cache (in the
    target's folder, beside the other tasks of that target) and write what became of each."""
    from builder.build import build_unit_group
    from builder.workspace import Workspace

    record, item, target = _task_target(run, name)
    if not 0 <= group < groups:
        raise MatrixError(f"unit task {group} of {groups} does not exist", "submit the matrix again")
    folder = Path(item["folder"])
    make_dirs(folder)
    times = {k: float(v) for k, v in record.get("unit_times", {}).items() if isinstance(v, int | float)}
    job, node = _job_env()

    def started(ops: list[str]) -> None:
        write_atomic(results_dir(run) / f"{name}.units-{group}.started.json",
                     json.dumps({"schema": 1, "ops": ops, "job": job, "node": node}) + "\n")  # fmt: skip

    results = build_unit_group(target, Workspace(folder), group, groups, times, _cores(), started=started)
    rows = [{"op": r.unit.op.name, "key": r.unit.key, "status": r.status, "seconds": round(r.seconds, 1),
             "failure": r.failure[:2000]} for r in results]  # fmt: skip
    write_atomic(results_dir(run) / f"{name}.units-{group}.json",
                 json.dumps({"schema": 1, "units": rows, "job": job, "node": node}, indent=2) + "\n")  # fmt: skip
    return rows


def run_task(run: Path, name: str) -> TargetResult:
    """The build task of one target: build (and smoke on CPU when no GPU job smokes it) in the
    target's own stable folder, under its lock; the result goes to the run's results folder."""
    from filelock import FileLock

    from builder import pipeline
    from builder.files import sha256_of
    from builder.workspace import Workspace

    _, item, target = _task_target(run, name)
    folder = Path(item["folder"])
    make_dirs(folder)
    cores = _cores()
    stages = pipeline.Stages(smoke=not item["smoke"], publish=False)
    with FileLock(str(folder) + ".lock"):  # another run building the same target waits here
        (result,) = pipeline.run([target], Workspace(folder), run / "unused", stages, keep_going=True, cores=cores)
        sha = sha256_of(result.wheel) if result.wheel else None
    job, node = _job_env()
    write_atomic(results_dir(run) / f"{name}.build.json",
                 json.dumps({"schema": 1, "result": result.to_json(), "sha256": sha, "job": job, "node": node},
                            indent=2) + "\n")  # fmt: skip
    return result


def saw_no_gpu(details: Sequence[str]) -> bool:
    """Whether the smoke found no GPU: its torch check and GPU checks say "no GPU visible" (pure)."""
    return any("no GPU visible" in d for d in details)


def run_smoke(run: Path, name: str, partition: str) -> SmokeResult:
    """The GPU smoke job of one target: the full smoke on this node's GPUs, then the result."""
    from builder.errors import SmokeError
    from builder.files import sha256_of
    from builder.smoke import load_report, smoke
    from builder.workspace import Workspace

    record = load_run(run)
    item = entry(record, name)
    wanted = [s for s in item["smoke"] if s["partition"] == partition]
    if not wanted:
        raise MatrixError(f"{name} has no smoke job on partition {partition}", "submit the matrix again")
    try:
        built = read_build(run, item)
    except ManifestError as exc:
        raise MatrixError(exc.message, "build the target again") from exc
    if built is None or built[0].wheel is None:
        raise MatrixError(f"{name} has no built wheel to smoke", "read its build log")
    wheel, sha = built[0].wheel, built[1]
    job, node = _job_env()
    gpus = re.sub(r"[^A-Za-z0-9,:_-]", "", os.environ.get("CUDA_VISIBLE_DEVICES", ""))[:200]
    start = time.monotonic()
    status, reason, details = "passed", "", []
    earlier = _earlier_smoke(Path(item["folder"]), name, partition, sha or "", wanted[0]["require_gpu"])
    if sha256_of(wheel) != sha:
        status, reason = "failed", f"{wheel} changed after its build task (another run rebuilt it?)"
    elif earlier is not None:  # these bytes already passed on this partition: no second smoke
        result = dataclasses.replace(earlier, status="reused", seconds=0.0,
                                     reason=f"passed on {earlier.node} in an earlier run, for these bytes")  # fmt: skip
        _write_smoke(results_dir(run) / f"{name}.smoke.{partition}.json", name, job, result)
        return result
    else:
        try:
            report = smoke(wheel, Workspace(run / "smoke" / f"{name}-{partition}"))
            details = [c.detail for c in report.checks]
        except SmokeError as exc:
            status, reason = "failed", exc.message
            failed = load_report(wheel)
            details = [c.detail for c in failed.checks] if failed else []
    saw = bool(details) and not saw_no_gpu(details)
    if status == "passed" and not saw:
        why = f"saw no GPU on {node} (CUDA_VISIBLE_DEVICES={gpus or 'unset'}): the GPU checks were skipped"
        if wanted[0]["require_gpu"]:
            status, reason = "failed", f"{why}; check the partition's GPUs and driver"
        else:
            reason = f"{why} (require_gpu = false: fake GPUs)"
    result = SmokeResult(partition, status, reason, node, gpus, saw, round(time.monotonic() - start, 1), sha or "")
    _write_smoke(results_dir(run) / f"{name}.smoke.{partition}.json", name, job, result)
    if status == "passed":  # kept with the target, for the next run of the same bytes
        _write_smoke(Path(item["folder"]) / "gpu-smoke" / f"{partition}.json", name, job, result)
    return result


def _write_smoke(path: Path, name: str, job: str, result: SmokeResult) -> None:
    data = {"schema": 1, "target": name, "job": job, **dataclasses.asdict(result)}
    make_dirs(path.parent)
    write_atomic(path, json.dumps(data, indent=2) + "\n")


def _earlier_smoke(folder: Path, name: str, partition: str, sha: str, require_gpu: bool) -> SmokeResult | None:
    """A passing GPU smoke of exactly these bytes on this partition from an earlier run, if one is kept."""
    try:
        earlier = _smoke_file(folder / "gpu-smoke" / f"{partition}.json", name, partition)
    except ManifestError:
        return None  # damaged: smoke again
    if earlier is None or earlier.sha256 != sha or earlier.status != "passed":
        return None
    return earlier if earlier.saw_gpu or not require_gpu else None


# ---------------------------------------------------------------- the collect job


def target_result(run: Path, item: Mapping[str, Any]) -> TargetResult:
    """One target's outcome from what its jobs wrote; a job that wrote nothing (killed, out of
    memory, node failure) or wrote something that does not check out fails the target, with the
    reason and its log."""
    return _outcome(run, item)[0]


def _outcome(run: Path, item: Mapping[str, Any]) -> tuple[TargetResult, str | None]:
    """target_result, and the sha256 the build task recorded for its wheel."""
    skipped = StageResult("skipped", "the build failed")
    slurm = {"job": str(item.get("job", "")), "log": str(item.get("log", "")), "node": ""}
    try:
        built = read_build(run, item)
    except ManifestError as exc:
        built, bad = None, StageResult("failed", f"{exc.message}: not believed")
    else:
        bad = StageResult("failed", f"the build task wrote no result: read its Slurm log {slurm['log']}")
    if built is None:
        return TargetResult(item["name"], item["recipe"], item["python"], None,
                            {"build": bad, "smoke": skipped, "publish": skipped}, slurm=slurm), None  # fmt: skip
    result, sha = built
    slurm = dict(result.slurm or {})
    if placed := units_on(run, item["name"]):
        slurm["units_on"] = placed
    stages = dict(result.stages)
    if result.wheel is None:
        stages["smoke"] = skipped
    elif item["smoke"]:
        stages["smoke"] = _gpu_smoke(run, item, sha)
        slurm["smoke_on"] = ", ".join(f"{s['partition']} ({s.get('job', '?')})" for s in item["smoke"])
    else:
        slurm["smoke_on"] = "cpu"
        if item["accelerator"] == "cuda" and stages["smoke"].status == "passed":
            why = f"on CPU: no [slurm.gpu] partition for archs {', '.join(item['archs'])}"
            stages["smoke"] = dataclasses.replace(stages["smoke"], reason=why)
    return dataclasses.replace(result, stages=stages, slurm=slurm), sha


def _gpu_smoke(run: Path, item: Mapping[str, Any], sha: str | None) -> StageResult:
    """Every GPU smoke job of a target merged: passed only if each passed on that wheel's bytes."""
    failed, notes, seconds, reused = [], [], 0.0, 0
    for s in item["smoke"]:
        try:
            got = read_smoke(run, item["name"], s["partition"])
        except ManifestError as exc:
            failed.append(f"{exc.message}: not believed")
            continue
        if got is None:
            failed.append(f"the smoke job on {s['partition']} wrote no result: read {s.get('log', 'its log')}")
        elif got.sha256 != sha:
            failed.append(f"the smoke job on {s['partition']} smoked other bytes than the build task built")
        elif got.status == "failed":
            failed.append(f"on {s['partition']} ({got.node}): {got.reason}")
        else:
            reused += got.status == "reused"
            seconds = max(seconds, got.seconds)
            note = f"on {s['partition']} ({got.node}, GPUs {got.gpus or 'none'})"
            notes.append(note + (f": {got.reason}" if got.reason else ""))
    if failed:
        return StageResult("failed", "; ".join(failed), seconds)
    return StageResult("reused" if reused == len(item["smoke"]) else "passed", "; ".join(notes), seconds)


def collect(run: Path, wheelhouse: Path) -> list[TargetResult]:
    """Publish every target whose smoke passed (this job is the wheelhouse's single writer)."""
    from builder import pipeline
    from builder.files import sha256_of
    from builder.workspace import Workspace

    record = load_run(run)
    results = []
    for item in record["targets"]:
        result, sha = _outcome(run, item)
        if result.wheel is not None and result.ok and result.stages["smoke"].status in ("passed", "reused"):
            start = time.monotonic()
            try:
                if sha256_of(result.wheel) != sha:
                    raise MatrixError(f"{result.wheel} changed after its build task", "run the matrix again")
                (published,) = pipeline.publish([result.wheel], wheelhouse, Workspace(run / "collect"))
                stage = StageResult("passed", "", time.monotonic() - start)
            except (BuilderError, OSError) as exc:
                published = None
                stage = StageResult("failed", exc.message if isinstance(exc, BuilderError) else str(exc))
            result = dataclasses.replace(
                result, stages={**result.stages, "publish": stage}, published=published,
                install_command=pipeline.install_command(wheelhouse, published) if published else None,
            )  # fmt: skip
        else:
            why = "the build failed" if result.wheel is None else "the smoke failed"
            result = dataclasses.replace(result, stages={**result.stages, "publish": StageResult("skipped", why)})
        results.append(result)
    return results


# ---------------------------------------------------------------- following a run


ACTIVE = "PENDING,RUNNING,CONFIGURING,COMPLETING,SUSPENDED,REQUEUED,RESIZING"


def queue(jobs: Sequence[str], patience: float = 180.0, poll: float = 2.0) -> dict[str, str]:
    """Slurm's state of each job still queued or running ({} when none is). Slurm forgets
    finished jobs (MinJobAge): "Invalid job id" then means done. Any other failure of squeue
    (the controller restarting, unreachable) is retried for `patience` seconds, then reported,
    never taken for the end: jobs wait in the controller's saved state while it restarts."""
    deadline = time.monotonic() + patience
    said = False
    while True:
        done = cmd.ask(["squeue", "-h", "-r", "-j", ",".join(jobs), "-t", ACTIVE, "-o", "%i %T"])
        if done.returncode == 0:
            if said:
                output.note("squeue answers again")
            return dict(line.split(maxsplit=1) for line in done.stdout.splitlines() if len(line.split()) == 2)
        if "Invalid job id" in done.stderr:
            return {}
        why = (done.stderr.strip().splitlines() or ["no output"])[-1][-300:]
        if time.monotonic() >= deadline:
            raise ToolError(f"squeue failed for {patience:.0f} s: {why}",
                            f"the jobs may still run: squeue -j {','.join(jobs)}")  # fmt: skip
        if not said:
            output.note(f"squeue failed ({why}); asking again for up to {patience:.0f} s (is slurmctld restarting?)")
            said = True
        time.sleep(poll)


def states(run: Path, record: Mapping[str, Any], active: Mapping[str, str]) -> dict[str, str]:
    """Each target's state, one line: from the coverage report once the collect job wrote it,
    else from the results jobs wrote and Slurm's queue."""
    try:
        report = load_coverage(run / "coverage")
    except ManifestError:
        report = None  # not believed: the jobs' own results say more
    out = {}
    for item in record["targets"]:
        name = item["name"]
        if report is not None and name in report.stages:
            out[name] = ", ".join(f"{stage} {s.status}" for stage, s in report.stages[name].items())
            continue
        job = item.get("job", "")
        try:
            built = read_build(run, item)
        except ManifestError as exc:
            out[name] = f"build result not believed: {exc.message}"
            continue
        if built is None:
            out[name] = f"build {active.get(job, 'ended without a result').lower()} (job {job})"
            continue
        result = built[0]
        line = f"build {result.stages['build'].status}"
        for s in item["smoke"]:
            got = None
            try:
                got = read_smoke(run, name, s["partition"])
            except ManifestError:
                pass
            state = got.status if got else active.get(s.get("job", ""), "ended without a result").lower()
            line += f", smoke on {s['partition']} {state} (job {s.get('job', '?')})"
        if not item["smoke"]:
            line += f", smoke {result.stages['smoke'].status}"
        out[name] = line + ", publish waits for the collect job"
    return out


def wait(run: Path, record: Mapping[str, Any], poll: float = 3.0) -> None:
    """Follow the jobs until none is queued or running, with a line per target when its state changes."""
    jobs = jobs_of(record)
    seen: dict[str, str] = {}
    while True:
        active = queue(jobs)
        for name, line in states(run, record, active).items():
            if seen.get(name) != line:
                output.note(f"{name}: {line}")
                seen[name] = line
        if not active:
            return
        time.sleep(poll)
