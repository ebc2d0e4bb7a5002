"""Where a wheelhouse keeps what, its manifest's one reader and one writer, and its lock.

wheelhouse/<wheel> with <wheel>.metadata (PEP 658) and <wheel>.smoke.json; the dependency wheels;
simple/ (PEP 503); tools/ds-node-install.py; locks/; manifest.json (builder.node's contract).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock

from builder import node
from builder.errors import WheelhouseError
from builder.files import write_atomic
from builder.node import (
    IMAGES,
    LOCK_NAME_RE,
    MANIFEST_FILE,
    ManifestError,
    WheelhouseManifest,
)

MANIFEST = MANIFEST_FILE

LOCK = ".publish.lock"

JOURNAL = ".publish-journal.json"

INTERRUPTED = "left by an interrupted publish (run `python -m builder repair` to remove it)"

DOCS = ("README.md",)  # files a person may keep in the wheelhouse folder

LOCKS = "locks"

# The folder a publish downloads DeepSpeed's dependencies into, inside the wheelhouse (same file
# system): `.deps.<random>.tmp`, and `.deps-<random>` as older versions named it. A killed publish
# leaves it behind; the next publish and repair remove it.
DEPS_PREFIX, DEPS_SUFFIX = ".deps.", ".tmp"
_DEPS_FOLDER = re.compile(r"^\.deps[-.][A-Za-z0-9_]{8}(\.tmp)?$")


def is_deps_folder(name: str) -> bool:
    return bool(_DEPS_FOLDER.match(name))


# Nodes have torch (and recipes pin it); everything else DeepSpeed needs goes into the wheelhouse.
NOT_BUNDLED = ("torch",)


def load_manifest(wheelhouse: Path) -> WheelhouseManifest:
    """The wheelhouse's validated manifest (empty when there is none yet)."""
    path = wheelhouse / MANIFEST
    try:
        with open(path, "rb") as f:
            text = node.read_limited(f, "manifest", str(path))
    except FileNotFoundError:
        return WheelhouseManifest()
    except OSError as exc:
        raise WheelhouseError(f"cannot read {path}: {exc.strerror}", "check the wheelhouse's permissions") from exc
    except ManifestError as exc:
        raise WheelhouseError(exc.message, exc.fix) from exc
    try:
        return node.parse_manifest(text, str(path))
    except ManifestError as exc:
        raise WheelhouseError(
            exc.message, "restore manifest.json from a backup, or publish into a new wheelhouse"
        ) from exc


def _companions(wheelhouse: Path, name: str) -> list[Path]:
    return [wheelhouse / f"{name}.metadata", wheelhouse / f"{name}.smoke.json"]


def write_manifest(wheelhouse: Path, manifest: WheelhouseManifest) -> None:
    """The one writer of manifest.json; what it writes must pass the loader every reader uses."""
    text = manifest.to_json()
    node.parse_manifest(text, "the manifest about to be written")
    write_atomic(wheelhouse / MANIFEST, text)


def symlinked_folders(wheelhouse: Path) -> list[str]:
    """Folders inside the wheelhouse that are symlinks: writing through them would write elsewhere."""
    found = []
    for rel in ("simple", "tools", LOCKS, IMAGES, LOCK, JOURNAL, MANIFEST, "index.html", *node.REPORTS):
        if (wheelhouse / rel).is_symlink():
            found.append(rel)
    simple = wheelhouse / "simple"
    if simple.is_dir() and not simple.is_symlink():
        found += [f"simple/{p.name}" for p in simple.iterdir() if p.is_symlink()]
    return found


@contextlib.contextmanager
def locked(wheelhouse: Path) -> Iterator[None]:
    """The wheelhouse's publish lock, after checking that nothing it writes through is a symlink.

    A lock file or folder that is a symlink would make the toolkit open, truncate or write files
    outside the wheelhouse (as root: any file); such a wheelhouse is refused.
    """
    links = symlinked_folders(wheelhouse)
    if links:
        raise WheelhouseError(
            f"{wheelhouse} holds symlinks where the toolkit writes: {', '.join(links)}",
            "replace them with real files and folders (the toolkit never writes through a link)",
        )
    with FileLock(str(wheelhouse / LOCK)):
        yield


def lock_headers(wheelhouse: Path) -> dict[str, str]:
    """locks/<name>.lock -> the wheel it was written for (its first line), for every lock file
    that is a regular file with a lock's name and a wheel's name in its header."""
    found: dict[str, str] = {}
    folder = wheelhouse / LOCKS
    if not folder.is_dir() or folder.is_symlink():
        return found
    for path in sorted(folder.glob("*.lock")):
        rel = f"{LOCKS}/{path.name}"
        if path.is_symlink() or not path.is_file() or not LOCK_NAME_RE.match(rel):
            continue
        with open(path, "rb") as f:
            first = f.read(4096).decode("utf-8", errors="replace").partition("\n")[0]
        wheel = first.removeprefix("# Lock for ").split(",")[0]
        if first.startswith("# Lock for ") and node.is_wheel_name(wheel):
            found[rel] = wheel
    return found
