"""A made root as one file, for a node that cannot make it: no Debian mirror, no debootstrap, no apt.

`gather` (a connected machine) packs the toolkit's root this machine made, once per machine, into the
roots folder beside it (`<name>.tar.xz` and its record `<name>.pack.json`) and copies both into the
gathered folder's root/; on the node, `--offline DIR` names that folder (PACKED_ENV), and the first
build unpacks the root from it instead of running debootstrap. The record carries the root's facts
(its identity: the package list), so units built on either machine have the same keys. What no
compiler reads (documentation, manual pages, translations, apt's lists and caches, device nodes: /dev
is the host's, bound in) is left out of the file.
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from builder import cmd, output
from builder.buildroot.spec import RootFacts, RootSpec
from builder.errors import RootError
from builder.files import make_dirs, sha256_of, write_atomic
from builder.node import shown

PACKED_ENV = "DS_BUILDER_PACKED_ROOTS"  # a folder of packed roots (an offline folder's root/)
PACK_SCHEMA = 1
# Left out of the file: what no compile or link of an op reads. Documentation and translations; apt's
# lists and caches; /dev, /proc and /sys (the host's are bound in); perl (dpkg's, 45 MB); the LTO dump
# tool (24 MB); the sanitizers' runtimes (30 MB: ops are not built with -fsanitize); time zones.
LEFT_OUT = ("./dev/*", "./proc/*", "./sys/*", "./tmp/*", "./usr/share/doc/*", "./usr/share/man/*", "./usr/share/info/*",
            "./usr/share/locale/*", "./usr/share/lintian/*", "./usr/share/zoneinfo/*", "./var/cache/*",
            "./var/lib/apt/lists/*", "./var/log/*", "./usr/share/perl/*", "./usr/lib/x86_64-linux-gnu/perl/*",
            "./usr/lib/x86_64-linux-gnu/perl-base/*", "./usr/lib/x86_64-linux-gnu/libperl.so*", "*lto-dump*",
            "./usr/lib/x86_64-linux-gnu/lib[altu]san.so*", "./usr/lib/gcc/*/*/lib[altu]san*")  # fmt: skip
MAX_MEMBERS = 200_000  # a Debian 11 buildd root holds about 20,000 files


@dataclass(frozen=True)
class PackedRoot:
    """A packed root's record: what it was made of (to match a spec), its facts, its file's size and sha256."""

    name: str
    suite: str
    variant: str
    packages: tuple[str, ...]
    facts: RootFacts
    file: str
    size: int
    sha256: str

    def matches(self, spec: RootSpec) -> bool:
        """The same root as `spec` asks for; the mirror it came from is not its content."""
        return (spec.kind == "debian" and (self.suite, self.variant) == (spec.suite, spec.variant)
                and sorted(self.packages) == sorted(spec.packages))  # fmt: skip

    def to_json(self) -> dict[str, object]:
        facts = {k: v for k, v in self.facts.to_json().items() if k != "path"}
        return {"schema": PACK_SCHEMA, "name": self.name, "suite": self.suite, "variant": self.variant,
                "packages": list(self.packages), "facts": facts, "file": self.file, "size": self.size,
                "sha256": self.sha256}  # fmt: skip


def record_path(folder: Path, name: str) -> Path:
    return folder / f"{name}.pack.json"


def read_record(path: Path) -> PackedRoot:
    """A packed root's record, every field checked; RootError naming the file otherwise."""
    try:
        if path.stat().st_size > 1 << 20:
            raise ValueError("larger than 1 MB")
        data = json.loads(path.read_text(encoding="utf-8"))
        facts = data["facts"]
        if data["schema"] != PACK_SCHEMA:
            raise ValueError(f"schema {data['schema']!r}, not {PACK_SCHEMA}")
        texts = [data["name"], data["suite"], data["variant"], data["file"], data["sha256"],
                 *(facts[k] for k in ("identity", "glibc", "gcc", "describe", "cc", "cxx"))]  # fmt: skip
        if not all(isinstance(t, str) and t and "\n" not in t for t in texts) or not isinstance(data["size"], int):
            raise ValueError("a field is not what pack writes")
        if "/" in data["file"] or data["file"].startswith(".") or not data["file"].endswith(".tar.xz"):
            raise ValueError(f"file {data['file'][:80]!r} is not a file name of this folder")
        packages = tuple(data["packages"])
        if not all(isinstance(p, str) for p in packages):
            raise ValueError("packages is not a list of names")
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise RootError(f"{path} is not a packed root's record ({exc})",
                        "gather the folder again on a connected machine") from exc  # fmt: skip
    return PackedRoot(data["name"], data["suite"], data["variant"], packages,
                      RootFacts(Path("/"), facts["identity"], facts["glibc"], facts["gcc"], facts["describe"],
                                facts["cc"], facts["cxx"]), data["file"], data["size"], data["sha256"])  # fmt: skip


def pack(spec: RootSpec, facts: RootFacts, roots: Path, log: Path) -> PackedRoot:
    """The root at facts.path as `<name>.tar.xz` in the roots folder, made once per machine (a root is
    never changed once made) under the root's own lock; its record beside it."""
    name = facts.path.name
    record = record_path(roots, name)
    with FileLock(str(roots / f".{name}.lock")):
        if record.is_file():
            packed = read_record(record)
            if (roots / packed.file).is_file() and (roots / packed.file).stat().st_size == packed.size:
                return packed
        file = f"{name}.tar.xz"
        tmp = roots / f".{file}.tmp-{os.getpid()}"
        output.step(f"root: packing {facts.describe} ({facts.path}) into {roots / file}, once per machine")
        excludes = [f"--exclude={p}" for p in LEFT_OUT]
        try:
            cmd.run(["tar", "-C", facts.path, "--numeric-owner", "--sort=name", *excludes, "-I", "xz -T0 -6", "-cf",
                     tmp, "."], log=log, fix="check the disk space of the roots folder")  # fmt: skip
            os.chmod(tmp, 0o644)
            tmp.rename(roots / file)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        path = roots / file
        packed = PackedRoot(name, spec.suite, spec.variant, tuple(spec.packages), facts, file, path.stat().st_size,
                            sha256_of(path))  # fmt: skip
        write_atomic(record, json.dumps(packed.to_json(), indent=2, sort_keys=True) + "\n")
    return packed


def find(spec: RootSpec, env: Mapping[str, str]) -> tuple[Path, PackedRoot] | None:
    """A packed root matching `spec` in the folder PACKED_ENV names (an offline folder's root/), or None."""
    named = env.get(PACKED_ENV)
    if not named:
        return None
    folder = Path(named)
    for record in sorted(folder.glob("*.pack.json")):
        packed = read_record(record)
        if packed.matches(spec):
            return folder, packed
    return None


def unpack(folder: Path, packed: PackedRoot, tmp: Path) -> None:
    """The packed root's files into `tmp` (made here), its file's size and sha256 checked first; every
    member a plain file, folder or link inside the root (no device, no path out of it)."""
    path = folder / packed.file
    if not path.is_file() or path.stat().st_size != packed.size or sha256_of(path) != packed.sha256:
        raise RootError(f"{path} is not the packed root its record describes (size or sha256 differs, or missing)",
                        "copy the gathered folder again, or gather it again on a connected machine")  # fmt: skip
    if tmp.exists() or tmp.is_symlink():
        raise RootError(f"{tmp} is in the way of the root being unpacked", f"remove {tmp}")
    make_dirs(tmp)
    output.step(f"root: unpacking {packed.facts.describe} from {path} ({packed.size / 1e6:.0f} MB): no mirror needed")
    try:
        with tarfile.open(path, "r:xz") as tf:
            extract(tf, tmp, str(path))
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise RootError(f"cannot unpack {path}: {exc}", "copy the gathered folder again") from exc
    os.chmod(tmp, 0o755)


class Refused(tarfile.TarError):
    """A member a packed root must not hold (extract names it and why)."""


def _member_parts(name: str) -> list[str]:
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if name.startswith("/") or not parts or ".." in parts:
        raise Refused(f"member {shown(name)!r} is not a path inside the root")
    return parts


def extract(tf: tarfile.TarFile, dest: Path, where: str) -> int:
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
            if i >= MAX_MEMBERS:
                raise Refused(f"{where} holds over {MAX_MEMBERS} members: it is not a packed root")
            parts = _member_parts(member.name)
            name = "/".join(parts)
            if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
                continue  # a device, FIFO or socket is never made (the host's /dev is bound in)
            parent = _open_parents(top, parts[:-1], name)
            try:
                _make(tf, member, parent, parts[-1], name, files, top)
            finally:
                if parent != top:
                    os.close(parent)
            made += 1
    finally:
        os.close(top)
    os.chmod(dest, 0o755)
    return made


def _open_parents(top: int, folders: list[str], name: str) -> int:
    """The folder a member goes into, opened hop by hop from the top with O_NOFOLLOW (made 0755 where
    an archive lists a member before its folder)."""
    fd = top
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    for part in folders:
        try:
            os.mkdir(part, 0o755, dir_fd=fd)
        except FileExistsError:
            pass
        try:
            below = os.open(part, flags, dir_fd=fd)
        except OSError as exc:
            if fd != top:
                os.close(fd)
            raise Refused(f"member {shown(name)!r} goes through {shown(part)!r}, a link or a file") from exc
        if fd != top:
            os.close(fd)
        fd = below
    return fd


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


def copy_into(packed: PackedRoot, roots: Path, dest: Path) -> int:
    """The packed root and its record into `dest` (an offline folder's root/): a hard link where the
    filesystem allows, else a copy. Its size."""
    make_dirs(dest)
    for name in (packed.file, record_path(roots, packed.name).name):
        target = dest / name
        target.unlink(missing_ok=True)
        try:
            os.link(roots / name, target)
        except OSError:
            shutil.copy2(roots / name, target)
    return packed.size
