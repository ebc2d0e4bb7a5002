"""A matrix on Slurm, its results: the run record and each job's result file read back and checked, the
coverage the collect job publishes."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder import output
from builder.coverage import TARGET_NAME, parse_stages
from builder.errors import BuilderError, MatrixError, RecipeError
from builder.files import make_dirs, write_atomic
from builder.node import OP_RE, Fields, ManifestError, check_wheel_name, read_bounded
from builder.recipe import SLURM_WORD
from builder.results import StageResult, TargetResult
from builder.slurm.plan import _GPUS, _JOB_ID, _NODE, _SHA, RUN_FILE, SCHEMA


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
                stage = StageResult("passed", _take_proofs(run, item["name"], wheelhouse), time.monotonic() - start)
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


def _take_proofs(run: Path, name: str, wheelhouse: Path) -> str:
    """The GPU proofs the target's GPU smoke jobs wrote, taken into the wheelhouse: what the publish
    stage says of them ("" where no GPU smoke saw a GPU)."""
    from builder.wheelhouse.publish import take_in_proofs

    taken, refused = 0, []
    for path in sorted(results_dir(run).glob(f"{name}.proof.*.json")):  # each alone: one refused keeps no other out
        try:
            taken += len(take_in_proofs(wheelhouse, [path]))
        except BuilderError as exc:
            refused.append(f"GPU proof refused: {exc.message}")
    return "; ".join(([f"proven on the GPUs of {taken} smoke job(s)"] if taken else []) + refused)


# ---------------------------------------------------------------- following a run


def saw_no_gpu(details: Sequence[str]) -> bool:
    """Whether the smoke found no GPU: its torch check and GPU checks say "no GPU visible" (pure)."""
    return any("no GPU visible" in d for d in details)


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
