"""What every smoke check shares: the report's marker, how a check's outcome is recorded
(passed, failed with why, skipped with why), and the empty TORCH_EXTENSIONS_DIR that proves no op
was compiled at first use.
"""

from __future__ import annotations

import os
import socket
import traceback
from collections.abc import Callable

MARKER = "==== smoke json ===="
# fp32 optimizer steps on the same inputs: vectorised C++ vs torch's reference differ only by
# rounding (measured ~5e-7), so 1e-5 catches a wrong update while tolerating SIMD reordering.
TOLERANCE = 1e-5
STEPS = 5


def record(results: list[dict[str, str]], name: str, fn: Callable[[], str | None]) -> None:
    try:
        detail = fn()
        results.append({"name": name, "status": "passed", "detail": detail or ""})
    except Skip as skip:
        results.append({"name": name, "status": "skipped", "detail": str(skip)})
    except Exception as exc:  # every failure is reported, the suite goes on
        tb = traceback.format_exc(limit=3)
        results.append({"name": name, "status": "failed", "detail": f"{type(exc).__name__}: {exc}\n{tb}"})


class Skip(Exception):
    pass


def ext_dir_files() -> list[str]:
    root = os.environ["TORCH_EXTENSIONS_DIR"]
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
