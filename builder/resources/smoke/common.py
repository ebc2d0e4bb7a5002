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
SLOWDOWN_ENV = "DS_BUILDER_SLOWDOWN"  # how many times slower than a native node this Python runs (emulated: 10)


def slowdown(said: str | None) -> float:
    """DS_BUILDER_SLOWDOWN's factor: 1 to 100, and 1 for anything that is not a number in that range."""
    try:
        factor = float(said or 1)
    except ValueError:
        return 1.0
    return min(factor, 100.0) if factor >= 1.0 else 1.0  # NaN compares false: 1


def seconds(limit: float) -> float:
    """A time limit written for a native node, for this one: an emulated aarch64 node (qemu-user) imports
    torch in 18.6 s where a native one takes 1.9, and a busy build machine is slower still."""
    return limit * slowdown(os.environ.get(SLOWDOWN_ENV))


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
