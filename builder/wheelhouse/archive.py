"""What an OCI archive says of the image it holds, read from the tar without unpacking it.

index.json names the image manifest by digest and its reference; that manifest names the config,
whose digest is the image ID `podman images` and `docker images` show after a load. verify reads
both back to check the manifest entry against the archive's own bytes.
"""

from __future__ import annotations

import hashlib
import json
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SQUASHFS_MAGIC = b"hsqs"  # the first bytes of a squashfs (images/<name>.sqsh)

SMALL = 1 << 20  # index.json and an image manifest are a few hundred bytes
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


class ArchiveError(Exception):
    pass


@dataclass(frozen=True)
class ArchiveFacts:
    digest: str  # sha256:<hex> of the image manifest
    image_id: str  # hex of the config digest
    ref: str | None


def _member(tar: tarfile.TarFile, name: str) -> bytes:
    try:
        info = tar.getmember(name)
    except KeyError as exc:
        raise ArchiveError(f"it has no {name}") from exc
    if not info.isfile() or info.size > SMALL:
        raise ArchiveError(f"its {name} is not a small regular file")
    f = tar.extractfile(info)
    if f is None:
        raise ArchiveError(f"its {name} cannot be read")
    return f.read()


def _json(data: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ArchiveError(f"its {what} is not JSON") from exc
    if not isinstance(value, dict):
        raise ArchiveError(f"its {what} is not a JSON object")
    return value


def read_facts(path: Path) -> ArchiveFacts:
    """The archive's one image: manifest digest (checked against the manifest's bytes), config
    digest and reference. ArchiveError says what is wrong."""
    try:
        with tarfile.open(path, "r:") as tar:
            index = _json(_member(tar, "index.json"), "index.json")
            manifests = index.get("manifests")
            if not isinstance(manifests, list) or len(manifests) != 1 or not isinstance(manifests[0], dict):
                raise ArchiveError("its index.json does not name exactly one image")
            digest = manifests[0].get("digest")
            if not isinstance(digest, str) or not _DIGEST.match(digest):
                raise ArchiveError("its index.json names no sha256 manifest digest")
            blob = _member(tar, f"blobs/sha256/{digest[7:]}")
            if hashlib.sha256(blob).hexdigest() != digest[7:]:
                raise ArchiveError("its image manifest does not have the digest index.json names")
            config = _json(blob, "image manifest").get("config")
            config_digest = config.get("digest") if isinstance(config, dict) else None
            if not isinstance(config_digest, str) or not _DIGEST.match(config_digest):
                raise ArchiveError("its image manifest names no sha256 config")
            annotations = manifests[0].get("annotations")
            ref = annotations.get("org.opencontainers.image.ref.name") if isinstance(annotations, dict) else None
            return ArchiveFacts(digest, config_digest[7:], ref if isinstance(ref, str) else None)
    except (OSError, tarfile.TarError) as exc:
        raise ArchiveError(f"it is not a readable tar ({exc})") from exc


def make_reproducible(path: Path, mtime: int) -> None:
    """Rewrite the archive podman saved so that the same image gives the same bytes: its members
    sorted, every time `mtime` (SOURCE_DATE_EPOCH), owners root and unnamed, modes 0644/0755. podman
    stamps the save time into the tar, so two saves of one image differed in sha256 while their
    image ID and digest agreed; the manifest lists the archive's sha256, which must be reproducible too."""
    tmp = path.with_name(f".{path.name}.repack.tmp")
    try:
        with tarfile.open(path, "r:") as src, tarfile.open(tmp, "w:", format=tarfile.USTAR_FORMAT) as dst:
            for info in sorted(src.getmembers(), key=lambda m: m.name):
                if not (info.isfile() or info.isdir()):
                    raise ArchiveError(f"it holds {info.name}, neither a file nor a folder")
                clean = tarfile.TarInfo(info.name)
                clean.type, clean.size, clean.mtime = info.type, info.size, mtime
                clean.mode = 0o755 if info.isdir() else 0o644
                clean.uid = clean.gid = 0
                clean.uname = clean.gname = ""
                dst.addfile(clean, src.extractfile(info) if info.isfile() else None)
        tmp.replace(path)
    except (OSError, tarfile.TarError) as exc:
        tmp.unlink(missing_ok=True)
        raise ArchiveError(f"it cannot be rewritten reproducibly ({exc})") from exc
