"""A matrix on Slurm, watched: the queue's states, each job's, until the collect job is done."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from builder import cmd, output
from builder.coverage import load as load_coverage
from builder.errors import ToolError
from builder.node import ManifestError, shown
from builder.slurm.results import read_build, read_smoke
from builder.slurm.submit import jobs_of

ACTIVE = "PENDING,RUNNING,CONFIGURING,COMPLETING,SUSPENDED,REQUEUED,RESIZING"


def queue(jobs: Sequence[str], patience: float = 600.0, poll: float = 2.0) -> dict[str, str]:
    """Slurm's state of each job still queued or running ({} when none is). Slurm forgets
    finished jobs (MinJobAge): "Invalid job id" then means done. Any other failure of squeue
    (the controller restarting, unreachable, too busy to answer in a minute) is retried for
    `patience` seconds, then reported, never taken for the end: jobs go on running while the
    controller is busy, and wait in its saved state while it restarts."""
    deadline = time.monotonic() + patience
    said = False
    while True:
        try:
            done = cmd.ask(["squeue", "-h", "-r", "-j", ",".join(jobs), "-t", ACTIVE, "-o", "%i %T"])
        except cmd.NoAnswer as exc:
            why = exc.message
        else:
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
            output.note(f"squeue failed ({why}); asking again for up to {patience:.0f} s (slurmctld busy, restarting?)")
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
                output.note(f"{shown(name)}: {shown(line, 400)}")  # read back from files jobs wrote
                seen[name] = line
        if not active:
            return
        time.sleep(poll)
