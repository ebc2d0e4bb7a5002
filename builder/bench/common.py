"""What every bench of the toolkit shares: timing a step, writing its report and table."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from builder import output
from builder.files import write_atomic

# The op each recipe adds for the one-op rebuild, in order of preference.
EXTRA_OPS = ("deepspeed_shm_comm", "pin_memory", "cpu_lion", "cpu_adagrad", "fused_lion", "fused_lamb")


def _report(stem: Path, result: dict[str, Any], table: str) -> dict[str, Any]:
    """STEM.json and STEM.md (the table docs/benchmarks.md carries), and the table on stdout."""
    write_atomic(stem.with_suffix(".json"), json.dumps(result, indent=2) + "\n")
    write_atomic(stem.with_suffix(".md"), table)
    output.result(table)
    return result


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.monotonic()
    result = fn()
    return time.monotonic() - start, result
