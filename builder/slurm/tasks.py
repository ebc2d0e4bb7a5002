"""What Slurm's jobs run on their nodes: a unit group, a target's build, a GPU smoke."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import time
from pathlib import Path
from typing import Any

from builder.errors import MatrixError, RecipeError
from builder.files import make_dirs, write_atomic
from builder.node import ManifestError
from builder.results import TargetResult
from builder.slurm.plan import unit_cache_of
from builder.slurm.results import (
    SmokeResult,
    _earlier_smoke,
    _write_smoke,
    entry,
    load_run,
    read_build,
    results_dir,
    saw_no_gpu,
)
from builder.targets import Target


def _job_env() -> tuple[str, str]:
    return os.environ.get("SLURM_JOB_ID", ""), socket.gethostname().split(".")[0]


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


def _gpu_facts(python: Path, env: dict[str, str]) -> list[Any]:
    """The GPUs a smoke's checks saw, for its proof; none (said) where there is nothing to prove on."""
    from builder import output, proof
    from builder.errors import BuilderError

    try:
        return [proof.gpu_facts(python, env)]
    except BuilderError as exc:
        output.warn(f"no GPU proof from this smoke: {exc.message}")
        return []


def run_smoke(run: Path, name: str, partition: str) -> SmokeResult:
    """The GPU smoke job of one target: the full smoke on this node's GPUs, then the result."""
    from builder import proof
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
        seen: list[Any] = []  # the node's GPUs as the checks saw them, for the proof
        started = proof.now()
        try:
            report = smoke(wheel, Workspace(run / "smoke" / f"{name}-{partition}"),
                           on_venv=lambda python, env: seen.extend(_gpu_facts(python, env)))  # fmt: skip
            details = [c.detail for c in report.checks]
        except SmokeError as exc:
            status, reason = "failed", exc.message
            failed = load_report(wheel)
            details = [c.detail for c in failed.checks] if failed else []
        done = load_report(wheel)
        if seen and done is not None:  # a GPU smoke is the GPU checks `prove` runs: it writes the same proof
            made = proof.proof_of_smoke(wheel, done.checks, seen[0], started, round(time.monotonic() - start, 1),
                                        f"slurm run {run}")  # fmt: skip
            written = write_atomic(results_dir(run) / f"{name}.proof.{partition}.json", made.to_json())
            proof.sign_proof(written)  # the job's user's prover key: the collect job trusts its own
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
