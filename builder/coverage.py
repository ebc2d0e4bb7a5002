"""The coverage report of a matrix run: target x stage x status, with the reason of every
failure and skip, as JSON (for tools) and Markdown (for people and CI summaries).

Rendering is pure; `write` is the edge, through the one atomic write; `load` reads a report
back (another job may have written it), checked field by field.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.files import make_dirs, write_atomic
from builder.node import STAMP_RE, Fields, ManifestError, is_wheel_name, read_bounded
from builder.results import STAGES, StageResult, TargetResult

SCHEMA = 1
STATUSES = ("passed", "reused", "failed", "skipped")
TARGET_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,100}$")
_MARK = {"passed": "passed", "reused": "reused", "failed": "FAILED", "skipped": "skipped"}


OpRows = Mapping[str, Sequence[Mapping[str, str]]]  # target -> its op table (node.op_rows)


def to_json(
    results: Sequence[TargetResult], matrix: str | None, finished_at: str, ops: OpRows | None = None
) -> dict[str, Any]:
    tables = ops or {}
    rows = [{**r.to_json(), **({"ops": list(tables[r.target])} if r.target in tables else {})} for r in results]
    return {
        "schema": SCHEMA,
        "matrix": matrix,
        "finished_at": finished_at,
        "targets": rows,
        "failed": [r.target for r in results if not r.ok],
    }


def op_sections(ops: OpRows) -> list[str]:
    """One Markdown table per target's wheel: op, built, archs held, loaded and checked, and why not."""
    lines: list[str] = []
    for target, rows in ops.items():
        lines += [
            "",
            f"Ops of {target}:",
            "",
            "| op | built | archs | loaded | checked | note |",
            "|---|---|---|---|---|---|",
        ]
        lines += [f"| {r['op']} | {r['built']} | {r['archs']} | {r['loaded']} | {r['checked']} | "
                  f"{_cell(r['why'])} |" for r in rows]  # fmt: skip
    return lines


def _cell(text: str, limit: int = 200) -> str:
    one = " ".join(text.split()).replace("|", "/")
    return one if len(one) <= limit else one[: limit - 3] + "..."


def wheel_ops(wheel: Path) -> list[dict[str, str]]:
    """A built wheel's op table, from its embedded build manifest and the smoke report beside it
    (when that report is for these bytes); [] for a wheel whose manifest does not load."""
    from builder.contracts import BuildManifest
    from builder.errors import SmokeError
    from builder.files import sha256_of
    from builder.node import host_ops_of, op_rows
    from builder.smoke import load_report

    try:
        manifest = BuildManifest.from_wheel(wheel)
    except ManifestError:
        return []
    try:
        report = load_report(wheel)
    except SmokeError:
        report = None
    checks = report.summary_checks() if report and report.sha256 == sha256_of(wheel) else {}
    return op_rows(manifest.ops, manifest.missing_ops, manifest.archs, manifest.narrowed_ops, checks,
                   host_ops_of(manifest.data) or ())  # fmt: skip


SLURM_KEYS = ("job", "node", "units_on", "smoke_on")  # a target's Slurm columns, in order


def table(results: Sequence[TargetResult]) -> list[str]:
    """The Markdown table, one row per target, one column per stage."""
    slurm = any(r.slurm for r in results)
    job = " slurm job | node | op units on | smoked on |" if slurm else ""
    rows = [
        f"| target | python | {' | '.join(STAGES)} | wheel |{job}",
        "|---|---|" + "---|" * (len(STAGES) + 1 + 4 * slurm),
    ]
    for r in results:
        cells = []
        for stage in STAGES:
            s = r.stages[stage]
            cells.append(_MARK[s.status] + (f" {s.seconds:.0f}s" if s.seconds >= 1 else ""))
        where = r.slurm or {}
        tail = "".join(f" {where.get(k) or '-'} |" for k in SLURM_KEYS) if slurm else ""
        rows.append(
            f"| {r.target} | {r.python} | " + " | ".join(cells) + f" | {r.wheel.name if r.wheel else '-'} |{tail}"
        )
    return rows


def reasons(results: Sequence[TargetResult]) -> list[str]:
    """Every failure and skip with its reason, and every pass that comes with a note (where a
    CUDA target was smoked: on which GPU partition, or on CPU for want of one), one line each."""
    return [
        f"- {r.target} {stage}: {_MARK[s.status]}: {s.reason}"
        for r in results
        for stage in STAGES
        if (s := r.stages[stage]).status in ("failed", "skipped", "passed") and s.reason
    ]


def to_markdown(
    results: Sequence[TargetResult], matrix: str | None, finished_at: str, ops: OpRows | None = None
) -> str:
    failed = [r.target for r in results if not r.ok]
    head = f"# Coverage: {matrix or 'build-wheel'} ({finished_at})"
    summary = f"{len(results) - len(failed)} of {len(results)} targets passed every stage they ran"
    why = reasons(results)
    tail = ["", "Reasons and notes:", *why] if why else []
    return "\n".join([head, "", summary + ".", "", *table(results), *tail, *op_sections(ops or {})]) + "\n"


def write(results: Sequence[TargetResult], folder: Path, matrix: str | None) -> tuple[Path, Path]:
    """coverage.json and coverage.md in `folder`; returns their paths."""
    finished = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    make_dirs(folder)
    ops = {r.target: rows for r in results if r.wheel and r.wheel.is_file() and (rows := wheel_ops(r.wheel))}
    js = write_atomic(folder / "coverage.json", json.dumps(to_json(results, matrix, finished, ops), indent=2) + "\n")
    md = write_atomic(folder / "coverage.md", to_markdown(results, matrix, finished, ops))
    return js, md


# ---------------------------------------------------------------- reading a report back


def parse_stages(data: object, where: str) -> dict[str, StageResult]:
    """A target's {stage: {status, reason, seconds}} as written by TargetResult.to_json, checked."""
    table = Fields(data, where)
    out = {}
    for stage in STAGES:
        s = Fields(table.get(stage, dict), f"{where}.{stage}")
        out[stage] = StageResult(s.choice("status", STATUSES), s.get("reason", str)[:2000],
                                 float(s.get("seconds", (int, float))))  # fmt: skip
    return out


@dataclass(frozen=True)
class Row:
    """One target of a report as people read it: where it ran and what it made (file name only)."""

    target: str
    python: str
    wheel: str | None
    job: str | None  # Slurm job id, node and the GPU partition it was smoked on, when it ran there
    node: str | None
    smoke_on: str | None
    units_on: str | None = None  # which node compiled which op unit: "cpu_adam (node2), ..."


@dataclass(frozen=True)
class Report:
    stages: Mapping[str, Mapping[str, StageResult]]  # target -> stage -> result
    failed: tuple[str, ...]
    matrix: str | None = None
    finished_at: str = ""
    rows: tuple[Row, ...] = ()


def load(folder: Path) -> Report | None:
    """The coverage.json in `folder`, checked (ManifestError); None when there is none yet."""
    path = folder / "coverage.json"
    try:
        data = json.loads(read_bounded(path, "report"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ManifestError(f"{path}: cannot be read as JSON ({exc})", "run the matrix again") from exc
    return parse_report(data, str(path))


_PYTHON = re.compile(r"^[0-9A-Za-z._/+-]{1,200}$")
_SLURM_VALUE = re.compile(r"^[A-Za-z0-9._:+,()\[\] -]{0,2000}$")  # job ids, node names, "h100 (1234), cpu"


def parse_report(data: object, where: str) -> Report:
    """A coverage report's JSON, every field the readers use checked (ManifestError)."""
    f = Fields(data, where)
    if f.get("schema", int) != SCHEMA:
        raise f.fail("schema", f"is not {SCHEMA}")
    stages = {}
    rows = []
    for i, row in enumerate(f.get("targets", list)):
        r = Fields(row, f"{where}: targets[{i}]")
        target = r.text("target", TARGET_NAME)
        stages[target] = parse_stages(r.get("stages", dict), f"{r.where}.stages")
        wheel = r.get("wheel", str, optional=True)
        if wheel is not None and not is_wheel_name(Path(wheel).name):
            raise r.fail("wheel", f"is not the path of a wheel: {wheel[:80]!r}")
        slurm = Fields(r.get("slurm", dict, optional=True) or {}, f"{r.where}.slurm")
        found = {k: slurm.text(k, _SLURM_VALUE, optional=True) or None for k in SLURM_KEYS}
        rows.append(Row(target, r.text("python", _PYTHON), Path(wheel).name if wheel else None,
                        found["job"], found["node"], found["smoke_on"], found["units_on"]))  # fmt: skip
    matrix = f.get("matrix", str, optional=True)
    return Report(stages, f.texts("failed", TARGET_NAME), matrix, f.text("finished_at", STAMP_RE), tuple(rows))
