"""Unpacking an archive made elsewhere (a packed root from a gathered folder, a DeepSpeed sdist) by
the toolkit's own filter, the same on every Python 3.11 (tarfile's `filter=` came in 3.11.4, and its
"tar" filter let a hard link to a file outside, then a regular member of its name, overwrite it).
"""

from __future__ import annotations

import os
import shutil
import tarfile
from pathlib import Path

from builder.files import LinkOnTheWay, descend
from builder.node import shown


class Refused(tarfile.TarError):
    """A member a packed root must not hold (extract names it and why)."""


def _member_parts(name: str) -> list[str]:
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if name.startswith("/") or not parts or ".." in parts:
        raise Refused(f"member {shown(name)!r} is not a path inside the root")
    return parts


def extract(tf: tarfile.TarFile, dest: Path, where: str, max_members: int) -> int:
    """The archive's members into the fresh folder `dest`, by the toolkit's own filter, at least as
    strict as tarfile's "data" filter for what it writes (Python 3.11's "tar" filter let a hard-link
    member to a file outside, then a regular member of its name, overwrite that file as root):

    - every folder on a member's way is opened from the one above it without following a link, so
      nothing is written through one; a root's absolute links are kept as links, never followed here;
    - a name is made once (O_EXCL): a second member of a name already made is refused;
    - a hard link only to an earlier regular member, by its exact name;
    - no device, FIFO or socket is made; no setuid, setgid or sticky bit, no write for group or others;
    - owners are never taken from the archive: everything belongs to whoever unpacks it.

    Refused names the member; the number of members made."""
    files: set[str] = set()
    top = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    made = 0
    try:
        for i, member in enumerate(tf):
            if i >= max_members:
                raise Refused(f"{shown(where)} holds over {max_members} members: more than it can hold")
            if member.isdir() and not [p for p in member.name.split("/") if p not in ("", ".")]:
                continue  # "./", the top itself (tar -C root . lists it first): `dest`, made 0755 below
            parts = _member_parts(member.name)
            name = "/".join(parts)
            if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
                continue  # a device, FIFO or socket is never made (the host's /dev is bound in)
            parent = _open_parents(top, parts[:-1], name)
            try:
                _make(tf, member, parent, parts[-1], name, files, top)
            finally:
                os.close(parent)
            made += 1
    finally:
        os.close(top)
    os.chmod(dest, 0o755)
    return made


def _open_parents(top: int, folders: list[str], name: str) -> int:
    """The folder a member goes into, opened hop by hop from the top without following a link
    (files.descend; made 0755 where an archive lists a member before its folder)."""
    try:
        return descend(top, folders, "the archive")
    except LinkOnTheWay as exc:
        raise Refused(f"member {shown(name)!r} goes through a link or a file ({exc})") from exc


def _make(tf: tarfile.TarFile, member: tarfile.TarInfo, parent: int, leaf: str, name: str, files: set[str],
          top: int) -> None:  # fmt: skip
    mode = member.mode & 0o755
    try:
        if member.isdir():
            try:
                os.mkdir(leaf, 0o755, dir_fd=parent)
            except FileExistsError:
                pass  # listed after a member inside it, made then: opened below as a folder, never a link
            try:
                fd = os.open(leaf, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
            except OSError as exc:
                raise Refused(f"member {shown(name)!r} is a folder where the archive made a link or a file") from exc
            try:
                os.fchmod(fd, mode | 0o700)
            finally:
                os.close(fd)
        elif member.issym():
            os.symlink(member.linkname, leaf, dir_fd=parent)
        elif member.islnk():
            target = "/".join(p for p in member.linkname.split("/") if p not in ("", "."))
            if member.linkname.startswith("/") or target not in files:
                raise Refused(f"member {shown(name)!r} is a hard link to {shown(member.linkname)!r}, which is not an "
                              "earlier file of the archive")  # fmt: skip
            os.link(target, leaf, src_dir_fd=top, dst_dir_fd=parent, follow_symlinks=False)
        else:
            out = os.open(leaf, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                          dir_fd=parent)  # fmt: skip
            with os.fdopen(out, "wb") as f:
                source = tf.extractfile(member)
                assert source is not None
                shutil.copyfileobj(source, f, 1 << 20)
                os.fchmod(f.fileno(), mode)
                os.utime(f.fileno(), (member.mtime, member.mtime))
            files.add(name)
    except FileExistsError as exc:
        raise Refused(
            f"member {shown(name)!r} is listed twice (a second member of a name would replace the "
            "first, or what a link made there points to)"
        ) from exc
