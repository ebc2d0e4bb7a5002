"""The one way the toolkit writes a file that someone else reads: atomically, and readable by all.

`write_atomic` writes to a temporary file in the target's folder, fsyncs it, sets its mode (0644
by default), renames it into place and fsyncs the folder: a reader sees the old file or the new
one, never half of one, and a wheelhouse on shared storage is readable by every user. Temporary
names are `.<name>.<random>.tmp`, so leftovers of a killed process are recognisable
(`is_temp_name`) and can be reported and cleaned.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import shutil
import socket
import stat
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from builder import node, output
from builder.errors import FolderError

FILE_MODE = 0o644
DIR_MODE = 0o755
_TEMP = re.compile(r"^\..+\.[A-Za-z0-9_]{6,}\.tmp$")


def sha256_of(path: Path) -> str:
    """The file's sha256, read in 1 MiB blocks (wheels, sdists, images: every handoff is tied to one)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def is_temp_name(name: str) -> bool:
    """Whether `name` is one of write_atomic's temporary names."""
    return bool(_TEMP.match(name))


def is_file_here(path: Path) -> bool:
    """Path.is_file that answers False where a folder on the way cannot be searched (a PATH entry
    the user may not read raises PermissionError from pathlib's own is_file and exists)."""
    try:
        return path.is_file()
    except OSError:
        return False


SHARE_FIX = "or a setgid folder of a group you share with the other builders (chmod 2775, chgrp GROUP; docs/trust.md)"


def checked_folder(path: Path, label: str, what: str, fix: str) -> Path:
    """`path` as the trust boundary judges a folder the toolkit writes `what` into or runs code from
    (node.folder_problem: every component and every hop of every link this user's or root's,
    written by no one else, not a system folder), else FolderError (exit 10) naming it, with `fix`."""
    why = node.folder_problem(str(path))
    if why:
        raise FolderError(f"{label} cannot hold {what}: {why}", fix)
    return path


def env_folder(env: Mapping[str, str], name: str, what: str) -> Path | None:
    """The folder an environment variable names (None where unset), checked by the trust boundary
    (checked_folder): DS_BUILDER_ROOTS=/opt once made roots in /opt; a cache of another user's, or
    one others can write, decides what a build runs or ships."""
    value = env.get(name)
    if not value:
        return None
    return checked_folder(Path(value), f"{name}={node.shown(value)}", what,
                          f"point {name} at a folder of your own that only you (or root) can write, {SHARE_FIX}, "
                          "or unset it for the default")  # fmt: skip


def dest_folder(folder: Path, what: str, example: str) -> None:
    """A --dest the toolkit writes `what` into, made and checked before anything else runs (FolderError,
    exit 10): the trust boundary's folder check, then a folder (not a file) this user can write."""
    checked_folder(folder, f"--dest {node.shown(str(folder))}", what, f"give a folder of its own, e.g. {example}")
    try:
        make_dirs(folder)
        if not folder.is_dir():
            raise NotADirectoryError(20, "it is a file, not a folder")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise PermissionError(13, "this user cannot write it")
    except OSError as exc:
        raise FolderError(f"cannot make --dest {node.shown(str(folder))}: {exc.strerror or exc}",
                          "give a folder you can write (not a file, not on a read-only mount)") from exc  # fmt: skip


def tree_checked(
    top: Path, what: str, fix: str, absolute_inside: bool = False, links_out_to: tuple[str, ...] = ()
) -> Path:
    """A tree whose files run or are compiled (an environment, a compiler cache, a root), judged
    entry by entry by the trust boundary (node.tree_problem, stamped: an unchanged tree is not walked
    file by file again), else FolderError (exit 10) naming the entry, with `fix`."""
    why = node.tree_problem(str(top), absolute_inside=absolute_inside, stamp=True, links_out_to=links_out_to)
    if why:
        raise FolderError(f"{what} {node.shown(str(top))} is not trusted: {why}, so what runs from it may not be "
                          "this toolkit's", fix)  # fmt: skip
    return top


def group_shared(folder: Path) -> bool:
    """Whether `folder` (or, where it is not made yet, the nearest folder above it) is a setgid folder of a
    group this user is in: the documented way builders share a cache (docs/trust.md), where what one
    member makes the others may replace."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return node.is_group_shared(probe.stat())
    except OSError:
        return False


def folder_mode(parent: Path) -> int:
    """The mode of a folder the toolkit makes in `parent`: 0755, or 2775 in a group-shared cache (a
    member who rebuilds a unit must be able to replace the entry another member made)."""
    return 0o2775 if group_shared(parent) else DIR_MODE


def lock(path: Path) -> Any:
    """A FileLock on `path`, its file 0664 in a group-shared folder (a member must be able to open the
    lock another made: root's 0644 lock once made a second user's build exit 10), else as the umask says."""
    from filelock import FileLock  # here: the node's install path imports only the standard library

    return FileLock(str(path), mode=0o664) if group_shared(path.parent) else FileLock(str(path))


HOLDER = ".holder"  # beside a lock file: who holds it, for whoever waits


@contextlib.contextmanager
def held(path: Path, what: str) -> Iterator[None]:
    """The lock at `path`, taken at once where it is free; else one line saying what is waited for and who
    holds it (the holder writes its PID, host, command and start beside the lock), then waited for. The
    first build on a machine once sat 8.5 minutes silent while another process held the root's lock."""
    from filelock import Timeout

    taken = lock(path)
    try:
        taken.acquire(timeout=0)
    except Timeout:
        output.note(waiting_line(path, what))
        taken.acquire()
    try:
        mark_holder(path)
        yield
    finally:
        Path(f"{path}{HOLDER}").unlink(missing_ok=True)
        taken.release()


def waiting_line(path: Path, what: str) -> str:
    """What a wait for the lock at `path` says: what is waited for, and who holds it where it is known."""
    try:
        holder = Path(f"{path}{HOLDER}").read_text(encoding="utf-8", errors="replace").strip()[:300]
    except OSError:
        holder = ""
    return f"waiting for {what}: {node.shown(holder) if holder else 'another process holds it'} (lock {path})"


def mark_holder(path: Path) -> None:
    """Who holds the lock at `path`, written beside it for whoever waits (only said, never needed)."""
    said = f"held by PID {os.getpid()} on {socket.gethostname()} since {time.strftime('%H:%M:%S')} "
    said += f"({' '.join(sys.argv[:4])[:160]})\n"
    try:
        write_atomic(Path(f"{path}{HOLDER}"), said, mode=0o664 if group_shared(path.parent) else FILE_MODE)
    except OSError:
        pass


def settle_modes(top: Path) -> None:
    """Every entry of a tree the toolkit made writable by its owner alone, whatever the umask it was made
    under (what tree_checked requires); in a group-shared cache, its folders 2775 for the group."""
    shared = group_shared(top.parent) or node.is_group_shared(top.lstat())
    mask = ~0o002 if shared else ~0o022
    for folder, dirs, names in os.walk(top):
        for name in [*dirs, *names, ""]:
            path = os.path.join(folder, name) if name else folder
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                continue
            mode = stat.S_IMODE(st.st_mode) & mask
            if shared and stat.S_ISDIR(st.st_mode):
                mode |= 0o2070
            if mode != stat.S_IMODE(st.st_mode):
                os.chmod(path, mode)


def path_error(exc: OSError) -> FolderError:
    """A path the system refused (too long, a file where a folder is, no permission) as one FolderError
    line (exit 10), the path shown escaped and, where it is long, shortened."""
    name = node.printable(str(exc.filename))
    shown = name if len(name) <= 200 else f"{name[:120]}...{name[-60:]} ({len(name)} characters)"
    return FolderError(f"cannot use {shown}: {exc.strerror or exc}",
                       "check the path given (its length, that its folders are folders) and the "
                       "permissions")  # fmt: skip


def scratch_folder(parent: Path, prefix: str) -> Path:
    """A temporary folder named for this process (`<prefix><pid>-<random>`), so a later run can tell
    one a killed process left (sweep_dead) from one a live run still uses."""
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent))


def sweep_dead(parent: Path, prefix: str) -> list[Path]:
    """Remove what scratch_folder made for processes that are gone (killed with SIGKILL, a node that
    rebooted); folders of live processes are left alone. The folders removed."""
    gone: list[Path] = []
    if not parent.is_dir():
        return gone
    for path in parent.iterdir():
        pid = path.name[len(prefix) :].partition("-")[0] if path.name.startswith(prefix) else ""
        if not pid.isdigit() or path.is_symlink() or not path.is_dir():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # its process is alive
        except ProcessLookupError:
            pass
        except PermissionError:
            continue  # alive, another user's
        shutil.rmtree(path, ignore_errors=True)
        gone.append(path)
    return gone


class LinkOnTheWay(Exception):
    """A path inside a tree another made passes through a link (write_inside refuses to follow it)."""


NO_LINK_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def descend(top: int, folders: list[str], where: str) -> int:
    """A new descriptor of the folder `folders` below the open folder `top`, each opened from the one
    above it with O_NOFOLLOW and made 0755 where missing: nothing is reached through a link (the one
    way the toolkit writes into a tree it did not make: an image's layers, a root, an archive's members).
    LinkOnTheWay names the part that is a link or not a folder; `top` stays open, the caller's."""
    fd = os.dup(top)
    for i, part in enumerate(folders):
        try:
            os.mkdir(part, 0o755, dir_fd=fd)
        except FileExistsError:
            pass
        try:
            below = os.open(part, NO_LINK_FOLDER, dir_fd=fd)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise LinkOnTheWay(f"{'/'.join(folders[: i + 1])} in {where} is a link or not a folder") from exc
            raise
        os.close(fd)
        fd = below
    return fd


def write_inside(root: Path, rel: str, data: bytes, mode: int = FILE_MODE) -> None:
    """Write `root/rel` without following a link anywhere on the way: each folder is opened from the
    one above it with O_NOFOLLOW (made where missing) and the file is created fresh. For trees the
    toolkit did not make (an image's layers, a root): `etc` made a link to a host folder there sent
    Enroot's files into that host folder (as root: the build host's /etc). LinkOnTheWay names the link."""
    parts = [p for p in rel.split("/") if p]
    if not parts or any(p in (".", "..") for p in parts):
        raise LinkOnTheWay(f"{rel!r} is not a path inside {root}")
    top = os.open(root, NO_LINK_FOLDER)
    try:
        fd = descend(top, parts[:-1], str(root))
    finally:
        os.close(top)
    try:
        try:
            os.unlink(parts[-1], dir_fd=fd)  # a link or a file there: replaced, never followed
        except FileNotFoundError:
            pass
        except IsADirectoryError as exc:
            raise LinkOnTheWay(f"{rel} in {root} is a folder") from exc
        out = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                      dir_fd=fd)  # fmt: skip
        try:
            os.write(out, data)
            os.fchmod(out, mode)
        finally:
            os.close(out)
    finally:
        os.close(fd)


def is_system_folder(resolved: Path) -> bool:
    """Whether a resolved path is a system folder, inside a system tree, or the user's home itself."""
    return node.is_system_folder(str(resolved))


class Sweeper:
    """Folders deleted beside the work instead of in its way, waited for when the `with` block ends.

    A folder is renamed aside at once (`.gone-<random>` beside it, one rename) and deleted by a
    thread. Deleting an op unit's finished source tree (2,800 files) took 8 s here while the other
    units compiled and a 799 MB header was being written out, against 0.2 s on a quiet disk; the unit
    held its slot, and the next unit waited, for all of it. `sweep_leftovers` deletes what a killed
    process left aside."""

    PREFIX = ".gone-"

    def __init__(self) -> None:
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def discard(self, path: Path) -> None:
        if not path.exists():
            return
        aside = path.with_name(f"{self.PREFIX}{uuid.uuid4().hex[:12]}")
        try:
            path.rename(aside)
        except OSError:  # another file system's mount point, or no rights on the folder: in the way, then
            shutil.rmtree(path, ignore_errors=True)
            return
        self._delete(aside)

    def sweep_leftovers(self, folder: Path) -> None:
        for aside in folder.glob(f"{self.PREFIX}*"):
            self._delete(aside)

    def _delete(self, path: Path) -> None:
        thread = threading.Thread(target=shutil.rmtree, args=(path,), kwargs={"ignore_errors": True},
                                  name=f"sweep-{path.name}", daemon=True)  # fmt: skip
        thread.start()
        with self._lock:
            self._threads.append(thread)

    def __enter__(self) -> Sweeper:
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            threads, self._threads = self._threads, []
        for thread in threads:
            thread.join()


def make_dirs(path: Path, mode: int = DIR_MODE) -> None:
    """mkdir -p, giving every folder it creates `mode` whatever the umask."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for folder in reversed(missing):
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        os.chmod(folder, folder_mode(folder.parent) if mode == DIR_MODE else mode)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _replace(target: Path, fill: Callable[[BinaryIO], object], mode: int) -> Path:
    """The guarantee itself: a temporary file beside `target`, filled, fsynced, chmodded, renamed. A
    full disk, a quota or a read-only mount is one message (FolderError, exit 10), not a traceback."""
    try:
        return _replace_file(target, fill, mode)
    except OSError as exc:
        if exc.errno not in NO_ROOM:
            raise
        raise no_room(target, exc) from exc


NO_ROOM = node.NO_ROOM


def no_room(target: Path, exc: OSError) -> Exception:
    """The one message for a write that found no room: a full disk, a quota, a read-only mount."""
    from builder.errors import FolderError

    where = target.parent
    if exc.errno == errno.EROFS:
        fix = f"{where} is on a read-only mount: write somewhere writable (--work-dir, --wheelhouse, --prefix)"
    else:
        fix = (f"free space on the filesystem holding {where} (df -h {where}) or raise the quota, then run the "
               "command again")  # fmt: skip
    return FolderError(f"cannot write {target}: {exc.strerror or exc}; nothing half-written was left there",
                       fix)  # fmt: skip


def _replace_file(target: Path, fill: Callable[[BinaryIO], object], mode: int) -> Path:
    make_dirs(target.parent)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            fill(f)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(target.parent)
    return target


def write_atomic(path: Path, data: bytes | str, mode: int = FILE_MODE) -> Path:
    """Replace `path` with `data` in one rename; the temporary file never outlives a failure."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    return _replace(path, lambda f: f.write(payload), mode)


def link_atomic(link: Path, target: Path | str) -> Path:
    """Point `link` at `target` in one step (a new link renamed over any old one), so builders
    sharing a folder never see it missing or half-made, and neither fails on the other's."""
    tmp = link.with_name(f".{link.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    tmp.replace(link)
    return link


def copy_atomic(source: Path, target: Path, mode: int = FILE_MODE) -> Path:
    """Copy `source` to `target` with write_atomic's guarantee, without reading it all into memory."""

    def fill(f: BinaryIO) -> None:
        with open(source, "rb") as src:
            shutil.copyfileobj(src, f, 1 << 20)

    return _replace(target, fill, mode)
