"""A matrix on Slurm: one job array for the builds, then one collect job that publishes.

Each array task builds and smokes one target with `build-wheel --matrix FILE --target NAME` in its
own work folder and log; the collect job (`--dependency=afterany` on the array) is the single
writer of the wheelhouse: it reads every target's coverage record (files another job wrote: each
is checked before it is believed), publishes the wheels whose smoke passed, and writes the run's
coverage report with Slurm job ids and log paths. The scripts are rendered by pure functions;
`submit`, `wait` and `collect` are the edges.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder import cmd, output
from builder.errors import BuilderError, ToolError
from builder.files import make_dirs, write_atomic
from builder.node import Fields, ManifestError, check_wheel_name
from builder.pipeline import STAGES, StageResult, TargetResult
from builder.targets import Target

RUN_FILE = "run.json"
_STATUSES = ("passed", "reused", "failed", "skipped")
_JOB_ID = re.compile(r"^\d{1,12}(_\d{1,6})?$")


@dataclass(frozen=True)
class SlurmOptions:
    partition: str | None = None
    account: str | None = None
    cpus: int = 8
    mem: str = "24G"
    time: str = "02:00:00"


def _sbatch_flags(opts: SlurmOptions) -> list[str]:
    flags = [f"--cpus-per-task={opts.cpus}", f"--mem={opts.mem}", f"--time={opts.time}"]
    if opts.partition:
        flags.append(f"--partition={opts.partition}")
    if opts.account:
        flags.append(f"--account={opts.account}")
    return flags


def build_script(targets: Sequence[Target], matrix: Path, run: Path, python: str) -> str:
    """The array job: task i builds and smokes targets[i] in run/targets/<name> (pure)."""
    names = " ".join(shlex.quote(t.name) for t in targets)
    return f"""#!/bin/bash
# ds-wheel-builder: one matrix target per array task (build + smoke; the collect job publishes).
set -u
names=({names})
name=${{names[$SLURM_ARRAY_TASK_ID]}}
exec {shlex.quote(python)} -m builder build-wheel --matrix {shlex.quote(str(matrix))} --target "$name" \\
    --work-dir {shlex.quote(str(run / "targets"))}/"$name" --no-publish --jobs 1
"""


def collect_script(run: Path, wheelhouse: Path, python: str) -> str:
    return f"""#!/bin/bash
# ds-wheel-builder: after every build task (afterany), publish what passed and write the coverage.
set -u
exec {shlex.quote(python)} -m builder slurm-collect {shlex.quote(str(run))} --wheelhouse {shlex.quote(str(wheelhouse))}
"""


def submit(targets: Sequence[Target], matrix: Path, run: Path, wheelhouse: Path, opts: SlurmOptions) -> dict[str, Any]:
    """Write the scripts and the run record, submit the array and the collect job; their ids."""
    make_dirs(run / "logs")
    python = sys.executable
    build = write_atomic(run / "build.sh", build_script(targets, matrix.resolve(), run, python), mode=0o755)
    collect = write_atomic(run / "collect.sh", collect_script(run, wheelhouse.resolve(), python), mode=0o755)
    array = _sbatch(
        [*_sbatch_flags(opts), f"--array=0-{len(targets) - 1}", "--job-name=ds-build",
         f"--output={run / 'logs'}/build-%A_%a.log", str(build)]
    )  # fmt: skip
    record = {
        "schema": 1,
        "matrix": str(matrix.resolve()),
        "wheelhouse": str(wheelhouse.resolve()),
        "array_job": array,
        "targets": [
            {
                "name": t.name,
                "recipe": t.recipe.name,
                "python": t.python.version,
                "task": i,
                "job": f"{array}_{i}",
                "log": str(run / "logs" / f"build-{array}_{i}.log"),
            }
            for i, t in enumerate(targets)
        ],
    }
    write_atomic(run / RUN_FILE, json.dumps(record, indent=2) + "\n")
    placement = _sbatch_flags(SlurmOptions(opts.partition, opts.account, cpus=1, mem="2G", time=opts.time))
    collect_job = _sbatch(
        [*placement, "--job-name=ds-collect", f"--dependency=afterany:{array}",
         f"--output={run / 'logs'}/collect-%j.log", str(collect)]
    )  # fmt: skip
    record["collect_job"] = collect_job
    write_atomic(run / RUN_FILE, json.dumps(record, indent=2) + "\n")
    return record


def _sbatch(args: list[str]) -> str:
    """Submit; the job id (sbatch's own message, e.g. a node configuration no partition has, on failure)."""
    said = cmd.run(["sbatch", "--parsable", *args],
                   fix="check the partition, the account and the [slurm] sizes against `sinfo`")  # fmt: skip
    ids = [line.split(";")[0] for line in said.splitlines() if _JOB_ID.match(line.split(";")[0].strip())]
    if not ids:
        raise ToolError(f"sbatch printed no job id: {said[-300:]!r}", "check the partition and account")
    return ids[-1].strip()


ACTIVE = "PENDING,RUNNING,CONFIGURING,COMPLETING,SUSPENDED,REQUEUED,RESIZING"


def wait(record: Mapping[str, Any], poll: float = 2.0, tries: int = 5) -> None:
    """Follow the jobs until none is queued or running, printing each change of state.

    Slurm forgets finished jobs (MinJobAge): "Invalid job id" then means done. Any other failure
    of squeue (controller unreachable) is retried, then reported, never taken for the end.
    """
    jobs = [record["array_job"], record["collect_job"]]
    seen: dict[str, str] = {}
    failures = 0
    while True:
        done = cmd.ask(["squeue", "-h", "-j", ",".join(jobs), "-t", ACTIVE, "-o", "%i %T"])
        if done.returncode != 0 and "Invalid job id" not in done.stderr:
            failures += 1
            if failures >= tries:
                raise ToolError(f"squeue failed {tries} times: {done.stderr.strip()[-300:]}",
                                f"the jobs may still run: squeue -j {','.join(jobs)}")  # fmt: skip
            time.sleep(poll)
            continue
        failures = 0
        said = done.stdout if done.returncode == 0 else ""
        states = dict(line.split(maxsplit=1) for line in said.splitlines() if len(line.split()) == 2)
        for job, state in sorted(states.items()):
            if seen.get(job) != state:
                output.note(f"job {job}: {state.lower()}")
                seen[job] = state
        if not states:
            return
        time.sleep(poll)


def load_run(run: Path) -> dict[str, Any]:
    """The run record `submit` wrote, checked (the collect job reads it from shared storage)."""
    where = str(run / RUN_FILE)
    try:
        data = json.loads((run / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ManifestError(f"{where}: cannot be read as JSON ({exc})", "submit the matrix again") from exc
    f = Fields(data, where)
    if f.get("schema", int) != 1:
        raise f.fail("schema", "is not 1")
    f.text("array_job", _JOB_ID)
    for i, item in enumerate(f.get("targets", list)):
        t = Fields(item, f"{where}: targets[{i}]")
        t.text("name", re.compile(r"^[a-z0-9][a-z0-9._-]{0,100}$"))
        if t.get("task", int) != i:
            raise t.fail("task", f"is not {i}")
        t.text("job", _JOB_ID)
    return f.data


def target_result(run: Path, item: Mapping[str, Any]) -> TargetResult:
    """One array task's outcome, from the coverage record its build wrote in its own work folder.

    A task that died before writing one (killed, out of memory, node failure) is a failed build
    whose reason points at its Slurm log.
    """
    name = item["name"]
    folder = run / "targets" / name
    path = folder / "coverage" / "coverage.json"
    log = item.get("log", "")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        died = StageResult("failed", f"the build task wrote no result: read its Slurm log {log}")
        skipped = StageResult("skipped", "the build failed")
        return TargetResult(name, item.get("recipe", "?"), item.get("python", "?"), None,
                            {"build": died, "smoke": skipped, "publish": skipped},
                            slurm={"job": load_job(item), "log": str(log)})  # fmt: skip
    f = Fields(data, str(path))
    rows = f.get("targets", list)
    if len(rows) != 1:
        raise f.fail("targets", "does not hold exactly this target")
    row = Fields(rows[0], f"{path}: targets[0]")
    if row.text("target") != name:
        raise row.fail("target", f"is not {name}")
    stages: dict[str, StageResult] = {}
    table = Fields(row.get("stages", dict), f"{row.where}.stages")
    for stage in STAGES:
        s = Fields(table.get(stage, dict), f"{table.where}.{stage}")
        stages[stage] = StageResult(s.choice("status", _STATUSES), s.get("reason", str)[:2000],
                                    float(s.get("seconds", (int, float))))  # fmt: skip
    wheel = None
    if written := row.get("wheel", str, optional=True):
        file_name = Path(written).name
        check_wheel_name(file_name, f"{row.where}.wheel")
        wheel = folder / "dist" / file_name  # only ever inside the task's own folder, whatever it wrote
    slurm = {"job": f"{load_job(item)}", "log": str(log)}
    return TargetResult(name, row.text("recipe"), row.text("python"), wheel, stages, slurm=slurm)


def load_job(item: Mapping[str, Any]) -> str:
    return str(item.get("job", ""))


def collect(run: Path, wheelhouse: Path) -> list[TargetResult]:
    """Publish every target whose smoke passed (this job is the wheelhouse's single writer)."""
    from builder import pipeline
    from builder.workspace import Workspace

    record = load_run(run)
    results = []
    for item in record["targets"]:
        result = target_result(run, item)
        if result.wheel is not None and result.stages["smoke"].status in ("passed", "reused"):
            start = time.monotonic()
            try:
                (published,) = pipeline.publish([result.wheel], wheelhouse, Workspace(run / "collect"))
                stage = StageResult("passed", "", time.monotonic() - start)
            except BuilderError as exc:
                published, stage = None, StageResult("failed", exc.message)
            result = dataclasses.replace(
                result, stages={**result.stages, "publish": stage}, published=published,
                install_command=pipeline.install_command(wheelhouse, published) if published else None,
            )  # fmt: skip
        results.append(result)
    return results
