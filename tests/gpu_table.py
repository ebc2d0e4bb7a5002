"""The rows the GPU tier measured (tests/test_gpu.py adds them; conftest prints them as one table)."""

from __future__ import annotations

ROWS: list[tuple[str, str, str]] = []  # (what ran, what it measured, more)


def render(rows: list[tuple[str, str, str]]) -> list[str]:
    """The table `nox -s gpu` prints at its end (pure)."""
    if not rows:
        return []
    width = max(len(r[0]) for r in rows)
    return ["GPU tier:", *(f"  {what:{width}}  {measured:>10}  {more}".rstrip() for what, measured, more in rows)]
