"""The one output module: every line the toolkit shows a person goes through here.

Steps (`==> ...`), notes (indented), warnings, the `+ command` echo and progress go to stderr;
`--quiet` keeps only warnings and errors. Results that scripts read (a table, JSON) go to stdout
through `result`, so `--json` output is never mixed with progress.
"""

from __future__ import annotations

import sys
from typing import TextIO

_quiet = False


def set_quiet(quiet: bool) -> None:
    global _quiet
    _quiet = quiet


# Control characters (ESC, NUL, ...) a hostile recipe name, path or file can carry are shown as
# escapes, never sent to the terminal: they could rewrite what the person reads.
_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F] if chr(c) not in "\n\t"}


def shown(text: str) -> str:
    """`text` with its control characters (but newlines and tabs) written as \\xNN."""
    return text.translate(_CONTROL)


def _emit(text: str, stream: TextIO | None = None) -> None:
    print(shown(text), file=stream or sys.stderr, flush=True)


def step(message: str) -> None:
    """A stage starting or finishing: `==> message`."""
    if not _quiet:
        _emit(f"==> {message}")


def note(message: str) -> None:
    """A detail of the current step, indented under it."""
    if not _quiet:
        _emit(f"  {message}")


def warn(message: str) -> None:
    """Something the person should know even with --quiet."""
    _emit(f"warning: {message}")


def error(message: str) -> None:
    _emit(f"error: {message}")


def command(quoted: str) -> None:
    """The `+ cmd` echo of a program about to run."""
    if not _quiet:
        _emit(f"+ {quoted}")


def raw(text: str) -> None:
    """Lines a child process printed, streamed as they come (--verbose)."""
    if not _quiet:
        sys.stderr.write(shown(text))
        sys.stderr.flush()


def result(text: str) -> None:
    """What the command answers, for people or scripts: stdout, never silenced."""
    print(shown(text), end="" if text.endswith("\n") else "\n", file=sys.stdout, flush=True)
