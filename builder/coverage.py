"""The coverage report of a matrix run: target x stage x status, with the reason of every
failure and skip, as JSON (for tools) and Markdown (for people and CI summaries).

Rendering is pure; `write` is the edge, through the one atomic write.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from builder.files import make_dirs, write_atomic
from builder.pipeline import STAGES, TargetResult

SCHEMA = 1
_MARK = {"passed": "passed", "reused": "reused", "failed": "FAILED", "skipped": "skipped"}


def to_json(results: Sequence[TargetResult], matrix: str | None, finished_at: str) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "matrix": matrix,
        "finished_at": finished_at,
        "targets": [r.to_json() for r in results],
        "failed": [r.target for r in results if not r.ok],
    }


def table(results: Sequence[TargetResult]) -> list[str]:
    """The Markdown table, one row per target, one column per stage."""
    slurm = any(r.slurm for r in results)
    job = " slurm job | node | smoked on |" if slurm else ""
    rows = [
        f"| target | python | {' | '.join(STAGES)} | wheel |{job}",
        "|---|---|" + "---|" * (len(STAGES) + 1 + 3 * slurm),
    ]
    for r in results:
        cells = []
        for stage in STAGES:
            s = r.stages[stage]
            cells.append(_MARK[s.status] + (f" {s.seconds:.0f}s" if s.seconds >= 1 else ""))
        where = r.slurm or {}
        tail = "".join(f" {where.get(k) or '-'} |" for k in ("job", "node", "smoke_on")) if slurm else ""
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


def to_markdown(results: Sequence[TargetResult], matrix: str | None, finished_at: str) -> str:
    failed = [r.target for r in results if not r.ok]
    head = f"# Coverage: {matrix or 'build-wheel'} ({finished_at})"
    summary = f"{len(results) - len(failed)} of {len(results)} targets passed every stage they ran"
    why = reasons(results)
    tail = ["", "Reasons and notes:", *why] if why else []
    return "\n".join([head, "", summary + ".", "", *table(results), *tail]) + "\n"


def write(results: Sequence[TargetResult], folder: Path, matrix: str | None) -> tuple[Path, Path]:
    """coverage.json and coverage.md in `folder`; returns their paths."""
    finished = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    make_dirs(folder)
    js = write_atomic(folder / "coverage.json", json.dumps(to_json(results, matrix, finished), indent=2) + "\n")
    md = write_atomic(folder / "coverage.md", to_markdown(results, matrix, finished))
    return js, md
