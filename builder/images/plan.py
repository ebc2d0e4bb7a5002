"""What a CI image is made of, decided before podman runs (pure): the lock's files as the
wheelhouse holds them, the Containerfile, the image's name and its archive's name.

The Containerfile installs with pip's hash-checking mode from a folder bind-mounted for that one
step (no layer of wheels is left in the image) with no index and no network; SOURCE_DATE_EPOCH
makes pip's byte-compiled files hash-based instead of time-stamped, and podman's --timestamp fixes
every file time and the image's creation date, so the same lock, wheels and base give the same
image digest.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from builder.errors import ImageError
from builder.node import IMAGES, WheelEntry, WheelhouseManifest
from builder.wheelhouse import lockfile
from builder.wheelhouse.lockfile import (  # the Containerfile is a lock's twin, written by `lock`
    DEFAULT_EPOCH,
    IMAGE_LOCK,
    SEARCH_PATH,
    VENV,
    python_version,
    render_containerfile,
)

__all__ = ["DEFAULT_EPOCH", "IMAGE_LOCK", "SEARCH_PATH", "VENV", "python_version", "render_containerfile"]


@dataclass(frozen=True)
class LockedFile:
    requirement: str  # name==version as the lock says
    sha256: str
    name: str  # the wheelhouse file with these bytes


@dataclass(frozen=True)
class ImagePlan:
    wheel: WheelEntry
    lock: str  # locks/<recipe>.lock
    lock_sha256: str
    files: tuple[LockedFile, ...]
    base: str
    ref: str  # localhost/deepspeed-<recipe>:<version>-<python tag>
    epoch: int

    def containerfile(self) -> str:
        return render_containerfile(self.base, self.lock, self.wheel.name, self.epoch)


def parse_lock(text: str, where: str) -> tuple[str, dict[str, str]]:
    """The wheel a lock was written for (its first line) and its pins: requirement -> sha256."""
    try:
        return lockfile.parse_lock(text, where)
    except lockfile.LockFileError as exc:
        raise ImageError(str(exc), "write the lock again: python -m builder lock --wheel NAME") from exc


def locked_files(pins: Mapping[str, str], manifest: WheelhouseManifest, lock: str) -> tuple[LockedFile, ...]:
    """Each pinned file as the wheelhouse lists it (by sha256); a pin it lacks is an error naming it."""
    by_digest = {e.sha256: n for n, e in manifest.wheels.items()}
    by_digest |= {e.sha256: n for n, e in manifest.dependencies.items()}
    missing = [f"{req} (sha256 {digest[:12]}...)" for req, digest in pins.items() if digest not in by_digest]
    if missing:
        raise ImageError(
            f"{lock} pins {len(missing)} file(s) the wheelhouse lacks: {', '.join(missing[:5])}",
            "write the lock again (python -m builder lock --wheel NAME copies every file it pins into the "
            "wheelhouse), then build the image",
        )
    return tuple(LockedFile(req, digest, by_digest[digest]) for req, digest in sorted(pins.items()))


def image_ref(wheel: WheelEntry) -> str:
    """The name the image is tagged with: localhost/deepspeed-<recipe>:<version>-<python tag>."""
    return f"localhost/deepspeed-{wheel.recipe}:{wheel.version.replace('+', '-')}-{wheel.python_tag}"


def archive_name(wheel: WheelEntry, image_id: str) -> str:
    """images/<recipe>-<version>-<python tag>-<image id, 12>.oci.tar: one file per image content."""
    return f"{IMAGES}/{wheel.recipe}-{wheel.version}-{wheel.python_tag}-{image_id[:12]}.oci.tar"
