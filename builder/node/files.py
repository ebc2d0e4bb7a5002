"""Reading what a wheelhouse serves within its limits (regular files only, never past the size a
file may have) and the node's scratch folders; `say`, the node's one output, escapes what a
terminal would act on.
"""

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import IO

from builder.node.contract import LIMITS, InstallError, ManifestError


def printable(text: str) -> str:
    """`text` with every character a terminal would act on (ESC, BEL, NUL, C1, DEL, bidi controls)
    shown escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] if ord(c) < 0xA0 else f"\\u{ord(c):04x}"
                   if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}" for c in text)  # fmt: skip


def shown(text: str, limit: int = 200) -> str:
    """The one way a name from outside is printed: escaped (printable), and where it is long, cut
    with its length said, so a 3 MB value is one readable line."""
    escaped = printable(text)
    if len(escaped) <= limit:
        return escaped
    return f"{escaped[: limit * 2 // 3]}...{escaped[-(limit // 4) :]} ({len(text)} characters)"


def too_big(what: str, where: str) -> "ManifestError":
    limit = LIMITS[what]
    shown = f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit >> 10} KiB"
    return ManifestError(
        f"{where} is larger than the {shown} limit for a {what}: no real wheelhouse has one that large",
        "the file is damaged or hostile: run `python -m builder verify` on the wheelhouse and re-publish it",
    )


def read_limited(stream: "IO[bytes]", what: str, where: str) -> bytes:
    """All of `stream`, or ManifestError once it passes the limit for `what` (nothing more is read)."""
    data = stream.read(LIMITS[what] + 1)
    if len(data) > LIMITS[what]:
        raise too_big(what, where)
    return data


class TooLarge(ValueError):
    """A file past its limit (LIMITS); a ValueError, as unreadable JSON is, wherever files are parsed."""


class NotAFile(OSError):
    """A path that is not a regular file (a FIFO would block a reader forever, /dev/zero never ends)."""


def open_regular(path: "str | Path") -> "IO[bytes]":
    """`path` opened for reading, only if it is a regular file: opened without blocking (a FIFO with
    no writer would hang), checked with fstat, then read as usual. NotAFile names what it is."""
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a folder" if stat.S_ISDIR(mode) else "a device"
                    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else
                    "not a regular file")  # fmt: skip
            raise NotAFile(f"{path} is {kind}, not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bounded(path: "Path", what: str) -> bytes:
    """A local file another machine or job wrote, a regular file, up to the limit for `what`
    (TooLarge past it; NotAFile for a FIFO, a folder or a device)."""
    with open_regular(path) as f:
        try:
            return read_limited(f, what, str(path))
        except ManifestError as exc:
            raise TooLarge(exc.message) from exc


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def scratch_dir(prefix: str, parent: "str | None" = None) -> str:
    """A temporary folder named for this process (<prefix><pid>-...), after removing this user's
    folders of that prefix whose process is gone: a kill -9 runs no cleanup, the next run does."""
    try:
        parent = parent or tempfile.gettempdir()
    except OSError as exc:  # no writable temporary folder anywhere Python looks
        raise InstallError(f"no writable temporary folder ({exc.strerror or exc})",
                           "set TMPDIR to a folder this user can write") from exc  # fmt: skip
    try:
        names = os.listdir(parent)
    except OSError:
        names = []
    for name in names:
        pid = name[len(prefix) :].split("-", 1)[0] if name.startswith(prefix) else ""
        path = os.path.join(parent, name)
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if st.st_uid == os.getuid() and not os.path.islink(path) and os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
    try:
        return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent)
    except OSError as exc:
        raise InstallError(f"cannot make a temporary folder in {parent}: {exc.strerror or exc}",
                           "set TMPDIR to a folder this user can write") from exc  # fmt: skip


_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F] if chr(c) not in "\n\t"}


def say(message: str) -> None:
    """Progress for the person at the node (stdout is kept for --json); control characters a path,
    an op name or a server's words may carry are shown escaped, never sent to the terminal."""
    print(str(message).translate(_CONTROL), file=sys.stderr, flush=True)
