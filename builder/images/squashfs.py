"""The Slurm container image: a proven OCI image's root filesystem as one squashfs, in Enroot's layout.

GPU clusters run containers through Slurm with NVIDIA's Enroot and Pyxis (`srun
--container-image=FILE.sqsh`). An Enroot image is a squashfs of the container's root filesystem
holding the files Enroot reads at start: `/etc/environment` (the image's Env), `/etc/rc` (its
entrypoint and command), `/etc/rc.local` and `/etc/fstab` (its volumes), written as `enroot import`
writes them (NVIDIA/enroot, src/docker.sh: docker::configure).

It is made from the OCI archive's own bytes (the image that passed its smoke checks): the layers are
applied in order into an empty folder (OCI whiteouts honoured, device files left out as Enroot
leaves them out), then `mksquashfs` writes every file owned by root, with no extended attributes,
every time SOURCE_DATE_EPOCH, in its reproducible order: the same archive gives the same bytes.
"""

from __future__ import annotations

import os
import shlex
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from builder import cmd
from builder.errors import ImageError, ToolError
from builder.files import LinkOnTheWay, write_inside
from builder.wheelhouse.archive import _DIGEST, SQUASHFS_MAGIC, ArchiveError, _json, _member

# zstd: about a third of the root filesystem's size, and quick to read; Linux 4.14+ and squashfuse read it.
MKSQUASHFS_OPTIONS = ("-noappend", "-all-root", "-no-xattrs", "-comp", "zstd", "-no-progress")


@dataclass(frozen=True)
class ImageConfig:
    """What Enroot reads of an image's config (the OCI image config's `config` object)."""

    env: tuple[str, ...] = ()
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    workdir: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    volumes: tuple[str, ...] = ()


def parse_config(data: dict[str, Any]) -> ImageConfig:
    """The parts of an OCI image config Enroot uses (pure)."""
    c = data.get("config") or {}
    if not isinstance(c, dict):
        raise ArchiveError("its image config's `config` is not an object")

    def strings(key: str) -> tuple[str, ...]:
        value = c.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ArchiveError(f"its image config's {key} is not a list of strings")
        return tuple(value)

    labels = c.get("Labels") or {}
    volumes = c.get("Volumes") or {}
    if not isinstance(labels, dict) or not isinstance(volumes, dict):
        raise ArchiveError("its image config's Labels or Volumes is not an object")
    return ImageConfig(strings("Env"), strings("Entrypoint"), strings("Cmd"), str(c.get("WorkingDir") or ""),
                       tuple(sorted((str(k), str(v)) for k, v in labels.items())),
                       tuple(sorted(str(v) for v in volumes)))  # fmt: skip


def enroot_files(config: ImageConfig, provenance: str) -> dict[str, str]:
    """etc/environment, etc/fstab, etc/rc and etc/rc.local as `enroot import` writes them (pure)."""
    workdir = config.workdir or "/"
    command = config.cmd if config.entrypoint or config.cmd else ("/bin/sh",)
    entry = " ".join(shlex.quote(a) for a in config.entrypoint)
    default = " ".join(x for x in (entry, " ".join(shlex.quote(a) for a in command)) if x)
    volumes = [f"${{ENROOT_ROOTFS}}{v} {v} none x-create=dir,bind,rw,nosuid,nodev\n" for v in config.volumes]
    rc = [f"# enroot-provenance: {provenance}"]
    rc += [f"# {key} {value.replace(chr(10), ' ')}" for key, value in config.labels]
    rc += ["", f'mkdir -p "{workdir}" 2> /dev/null', f'cd "{workdir}" && unset OLDPWD || exit 1', "",
           "if [ -s /etc/rc.local ]; then", "    . /etc/rc.local", "fi", "",
           "if [ $# -gt 0 ]; then", f'    exec {entry + " " if entry else ""}"$@"', "else",
           f"    exec {default}", "fi"]  # fmt: skip
    return {
        "etc/environment": "".join(f"{line}\n" for line in config.env),
        "etc/fstab": "".join(volumes),
        "etc/rc": "\n".join(rc) + "\n",
        "etc/rc.local": "# This file is sourced by /etc/rc when the container starts.\n"
        "# It can be used to manipulate the entrypoint or the command of the container.\n",
    }


def _read(tar: tarfile.TarFile, name: str) -> dict[str, Any]:
    return _json(_member(tar, name), name)


def _blob(digest: object) -> str:
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        raise ArchiveError(f"it names a blob {str(digest)[:80]!r} that is not sha256:<hex>")
    return f"blobs/sha256/{digest[7:]}"


def _relative(name: str) -> str:
    """A layer member's path inside the root filesystem; ArchiveError for one that could leave it."""
    while name.startswith("./"):
        name = name[2:]
    name = name.rstrip("/")
    parts = name.split("/")
    if name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ArchiveError(f"a layer holds the path {name[:120]!r}, which does not stay inside the image")
    return name


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.is_symlink() or path.exists():
        path.unlink()


class _Layer:
    """One layer applied onto the folder: members in tar order, whiteouts of lower layers' files."""

    def __init__(self, rootfs: Path) -> None:
        self.rootfs = rootfs
        self.added: set[str] = set()

    def _no_link_on_the_way(self, name: str) -> None:
        path = self.rootfs
        for part in name.split("/")[:-1]:
            path = path / part
            if path.is_symlink():
                raise ArchiveError(f"a layer writes {name[:120]!r} through the link {path.relative_to(self.rootfs)}")

    def apply(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        if member.name.strip("./") == "":
            return
        name = _relative(member.name)
        parent, base = name.rpartition("/")[0], name.rpartition("/")[2]
        if name.startswith("dev/") or member.ischr() or member.isblk() or member.isfifo():
            return  # devices come from the runtime, as Enroot's import leaves them out
        self._no_link_on_the_way(name)
        folder = self.rootfs / parent
        if base == ".wh..wh..opq":  # an opaque folder: what lower layers had there is hidden
            if folder.is_dir() and not folder.is_symlink():
                for child in folder.iterdir():
                    if f"{parent}/{child.name}".lstrip("/") not in self.added:
                        _remove(child)
            return
        if base.startswith(".wh."):
            hidden = base[4:]
            if hidden in ("", ".", "..") or "/" in hidden:
                raise ArchiveError(f"a layer's whiteout {name[:120]!r} names {hidden!r}, which is no file of the image")
            _remove(folder / hidden)
            return
        target = self.rootfs / name
        if not (member.isdir() and target.is_dir() and not target.is_symlink()):
            _remove(target)
        self.added.add(name)
        if member.islnk():
            source = _relative(member.linkname)
            self._no_link_on_the_way(source)
            os.link(self.rootfs / source, target)
            return
        member.name = name
        tar.extract(member, self.rootfs, set_attrs=True, numeric_owner=True, **TRUSTED)


# This member was judged above, link by link: extracted as it is. `filter=` came in Python 3.11.4 (Debian
# 12's 3.11.2 has none) and 3.14 defaults to the "data" filter, which would drop an image's owners.
TRUSTED: dict[str, Any] = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}


def flatten(archive: Path, rootfs: Path) -> ImageConfig:
    """Apply the image's layers, in order, into the empty folder `rootfs`; its config."""
    try:
        with tarfile.open(archive, "r:") as outer:
            index = _read(outer, "index.json")
            manifests = index.get("manifests")
            if not isinstance(manifests, list) or len(manifests) != 1 or not isinstance(manifests[0], dict):
                raise ArchiveError("its index.json does not name exactly one image")
            manifest = _read(outer, _blob(manifests[0].get("digest")))
            config_ref, layers = manifest.get("config"), manifest.get("layers")
            if not isinstance(config_ref, dict) or not isinstance(layers, list):
                raise ArchiveError("its image manifest has no config or layers")
            config = parse_config(_read(outer, _blob(config_ref.get("digest"))))
            for layer in layers:
                if not isinstance(layer, dict):
                    raise ArchiveError("its image manifest lists a layer that is not an object")
                blob: IO[bytes] | None = outer.extractfile(_blob(layer.get("digest")))
                if blob is None:
                    raise ArchiveError(f"its layer {layer.get('digest')} is not a file")
                applied = _Layer(rootfs)
                with tarfile.open(fileobj=blob, mode="r|*") as tar:
                    for member in tar:
                        applied.apply(tar, member)
            return config
    except (tarfile.TarError, KeyError) as exc:
        raise ArchiveError(f"it is not a readable OCI archive ({exc})") from exc


def make_squashfs(archive: Path, out: Path, scratch: Path, provenance: str, epoch: int, log: Path) -> ImageConfig:
    """The archive's root filesystem with Enroot's files, as the squashfs `out`; the image config.
    The unpacked folder (in `scratch`) is removed whatever happens."""
    if shutil.which("mksquashfs") is None:
        raise ImageError("mksquashfs is not installed: the Slurm container image is a squashfs",
                         "apt-get install squashfs-tools (RHEL: dnf install squashfs-tools)")  # fmt: skip
    rootfs = scratch / "rootfs"
    _remove(rootfs)
    rootfs.mkdir(mode=0o755)
    try:
        try:
            config = flatten(archive, rootfs)
        except ArchiveError as exc:
            raise ImageError(f"the image archive {archive.name} cannot be unpacked: {exc}", f"read {log}") from exc
        for rel, text in enroot_files(config, provenance).items():
            if (rootfs / rel).is_dir() and not (rootfs / rel).is_symlink():
                _remove(rootfs / rel)
            try:
                write_inside(rootfs, rel, text.encode("utf-8"), 0o755 if rel == "etc/rc" else 0o644)
            except LinkOnTheWay as exc:
                raise ImageError(f"the image archive {archive.name} makes {exc}: Enroot's /{rel} would be written "
                                 "through it, outside the image", "build the image from a base whose /etc is a "
                                 "folder") from exc  # fmt: skip
        try:
            cmd.run(["mksquashfs", rootfs, out, *MKSQUASHFS_OPTIONS, "-mkfs-time", str(epoch), "-all-time",
                     str(epoch), "-processors", str(os.cpu_count() or 1)], log=log)  # fmt: skip
        except ToolError as exc:
            out.unlink(missing_ok=True)
            said = " | ".join(exc.message.strip().splitlines()[-2:])[-400:]
            raise ImageError(f"mksquashfs could not write {out}: {said}",
                             f"check the free space of {out.parent} (df -h); read {log}") from exc  # fmt: skip
    finally:
        _remove(rootfs)
    with out.open("rb") as f:
        if f.read(4) != SQUASHFS_MAGIC:
            raise ImageError(f"mksquashfs wrote {out}, which is not a squashfs", f"read {log}")
    return config
