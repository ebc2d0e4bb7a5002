"""Where a wheelhouse keeps what, its manifest's one reader and one writer, and its lock.

wheelhouse/<wheel> with <wheel>.metadata (PEP 658) and <wheel>.smoke.json; the dependency wheels;
simple/ (PEP 503); tools/ds-node-install.py; locks/; manifest.json (builder.node's contract).
"""

from __future__ import annotations

from pathlib import Path

from builder import node, output
from builder.errors import WheelhouseError
from builder.files import write_atomic
from builder.node import (
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

# Nodes have torch (and recipes pin it); everything else DeepSpeed needs goes into the wheelhouse.
NOT_BUNDLED = ("torch",)


def load_manifest(wheelhouse: Path) -> WheelhouseManifest:
    """The wheelhouse's validated manifest (empty when there is none yet)."""
    path = wheelhouse / MANIFEST
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return WheelhouseManifest()
    except OSError as exc:
        raise WheelhouseError(f"cannot read {path}: {exc.strerror}", "check the wheelhouse's permissions") from exc
    try:
        return node.parse_manifest(text, str(path))
    except ManifestError as exc:
        raise WheelhouseError(
            exc.message, "restore manifest.json from a backup, or publish into a new wheelhouse"
        ) from exc


def _companions(wheelhouse: Path, name: str) -> list[Path]:
    return [wheelhouse / f"{name}.metadata", wheelhouse / f"{name}.smoke.json"]


def _say(message: str) -> None:
    output.note(message.removeprefix("  "))


def write_manifest(wheelhouse: Path, manifest: WheelhouseManifest) -> None:
    """The one writer of manifest.json; what it writes must pass the loader every reader uses."""
    text = manifest.to_json()
    node.parse_manifest(text, "the manifest about to be written")
    write_atomic(wheelhouse / MANIFEST, text)
