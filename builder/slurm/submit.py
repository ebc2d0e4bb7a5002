"""A matrix on Slurm, submitted: sbatch for the unit, build, GPU smoke and collect jobs, chained by
their dependencies."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from builder import cmd
from builder.errors import BuilderError, ToolError
from builder.files import make_dirs, write_atomic
from builder.slurm.plan import (
    _JOB_ID,
    RUN_FILE,
    SlurmOptions,
    _sbatch_flags,
    build_script,
    collect_script,
    plan_record,
    read_unit_records,
    recorded_times,
    smoke_script,
    unit_cache_of,
    units_script,
)
from builder.targets import GpuSmoke, Target


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
