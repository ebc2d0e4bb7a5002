"""Memory for compile jobs, shared by every builder on this machine.

A unit asks the free memory before it starts (runner.room_for), but its compilers take their
memory seconds later (pip, setup.py and torch's imports come first), so builders starting
together all see the same free memory and all start: the test run's builders and the Slurm
tasks of its namespace nodes ran 18 compilers at once on this 24 GB machine (1.5 GB left), and
in CI, busier, the machine stalled for minutes (its slurmd went unanswered, its nodes were marked
down and their jobs killed). The machine's memory is a pool of 1 GB tokens, each a lock file in
one folder per user: a unit holds the tokens its compile jobs need while it builds. Locks are the
kernel's, so a builder that dies (killed, out of memory) frees its tokens with it; nothing is
ever left to clean up, and no builder waits on one that is gone.
"""

from __future__ import annotations

import errno
import fcntl
import math
import os
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

from builder import output
from builder.detect import total_memory_gb
from builder.files import env_folder

# The share of the machine's memory compile jobs may hold at once; the rest is for everything
# else (the builders' Pythons, smoke runs, the page cache the compilers read their headers from).
SHARE = 0.75
POOL_ENV = "DS_BUILDER_MEMORY_POOL"  # the pool's folder, where builders share no /dev/shm


class Claim:
    """Tokens held (open, locked files); released by `release` or when the process ends."""

    def __init__(self, fds: list[int]) -> None:
        self.fds = fds

    def __len__(self) -> int:
        return len(self.fds)

    def keep(self, n: int) -> None:
        """Hand back all but `n` tokens."""
        for fd in self.fds[n:]:
            os.close(fd)
        del self.fds[n:]

    def release(self) -> None:
        self.keep(0)


class Pool:
    """`size` tokens in `folder`, each a file locked (flock) by the builder holding it."""

    def __init__(self, folder: Path, size: int) -> None:
        self.folder, self.size = folder, max(1, size)

    def take(self, most: int, least: int) -> Claim | None:
        """Up to `most` free tokens, or None (and nothing held) when fewer than `least` are free."""
        most, least = min(most, self.size), min(least, self.size)
        fds: list[int] = []
        for i in range(self.size):
            if len(fds) == most:
                break
            fd = os.open(self.folder / f"{i}", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
                continue
            fds.append(fd)
        if len(fds) < least:
            Claim(fds).release()
            return None
        return Claim(fds)


def pool_folder(env: Mapping[str, str] | None = None) -> Path:
    """DS_BUILDER_MEMORY_POOL (a system folder refused, exit 10, as for every folder the environment
    names), else one folder per user in /dev/shm (every builder of the machine sees it, the
    namespace nodes' too), else in the temporary folder."""
    named = env_folder(os.environ if env is None else env, POOL_ENV, "the compile memory pool's lock files")
    if named is not None:
        return named
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    return base / f"ds-builder-memory-{os.getuid()}"


def machine_pool(folder: Path | None = None, total_gb: float | None = None) -> Pool | None:
    """This machine's pool, its folder made private to this user. None (with a note) where its
    folder is not this user's own: another user's folder, or a link, is never used; the free
    memory asked before each unit is then the only guard, as before."""
    folder = folder or pool_folder()
    total = total_memory_gb() if total_gb is None else total_gb
    if total is None:
        return None
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        info = folder.lstat()
    except OSError as exc:
        output.note(f"compile memory: {folder} cannot be made ({exc.strerror}): each build sizes itself alone")
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        output.note(f"compile memory: {folder} is not a private folder of this user: not used, each build "
                    "sizes itself alone")  # fmt: skip
        return None
    return Pool(folder, math.floor(total * SHARE))


def tokens(job_gb: float) -> int:
    """Tokens one compile job holds."""
    return max(1, math.ceil(job_gb))
