"""What else a wheelhouse carries beside its wheels, each listed with its sha256 in the signed manifest under
the publish lock and its journal: lock files, CI images and their squashfs, a matrix run's coverage report."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path

from builder import node, output
from builder.coverage import parse_report
from builder.errors import PublishError
from builder.files import copy_atomic, make_dirs, write_atomic
from builder.node import (
    FileEntry,
    ImageEntry,
    ManifestError,
    check_image_name,
)
from builder.wheelhouse.layout import (
    JOURNAL,
    LOCKS,
    MANIFEST,
    load_manifest,
    locked,
)
from builder.wheelhouse.page import write_page
from builder.wheelhouse.publish import _clean, _journal, _now, _undo, _writable, commit


def publish_locks(wheelhouse: Path, texts: Mapping[str, str]) -> None:
    """Write the files `lock` made (locks/...) and list each with its sha256 in the signed manifest,
    under the publish lock and its journal: a node or an image reads no file the signature does not
    cover. A file there that the manifest does not list is replaced only where `lock` wrote it (its
    first line says so, as before locks were signed); anything else is not ours."""
    digests = {rel: hashlib.sha256(text.encode()).hexdigest() for rel, text in texts.items()}
    _writable(wheelhouse)
    with locked(wheelhouse):
        manifest = load_manifest(wheelhouse)
        _clean(wheelhouse, manifest)
        for rel in texts:
            path = wheelhouse / rel
            if path.is_symlink() or (path.exists() and rel not in manifest.locks and not _written_by_lock(path)):
                raise PublishError(f"{path} exists and is not a file `lock` wrote", "move it away; it is not ours")
        _journal(wheelhouse, digests)
        try:
            make_dirs(wheelhouse / LOCKS)
            for rel, text in texts.items():
                write_atomic(wheelhouse / rel, text)
            locks = {**manifest.locks, **{rel: FileEntry(rel, digest) for rel, digest in digests.items()}}
            commit(wheelhouse, dataclasses.replace(manifest, locks=locks))  # the page lists the locks
        except BaseException as exc:
            _undo(wheelhouse, exc)
            raise
        (wheelhouse / JOURNAL).unlink(missing_ok=True)


def _written_by_lock(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            first = f.read(200)
    except OSError:
        return False
    return path.is_file() and b", written by ds-wheel-builder" in first.partition(b"\n")[0]


def publish_image(wheelhouse: Path, archive: Path, entry: ImageEntry, squashfs: Path | None = None) -> Path:
    """Copy an image's OCI archive (and its squashfs) to images/ and list them in the manifest,
    under the publish lock and its journal (a kill leaves no half file: the next publish or repair
    removes it)."""
    _writable(wheelhouse)
    target = wheelhouse / check_image_name(entry.name, "image")
    files = {entry.name: (archive, entry.sha256)}
    if squashfs is not None:
        files[node.check_image_file(entry.squashfs, "image")] = (squashfs, entry.squashfs_sha256)
    with locked(wheelhouse):
        manifest = load_manifest(wheelhouse)
        _clean(wheelhouse, manifest)
        if entry.wheel not in manifest.wheels:
            raise PublishError(f"{entry.wheel} is not published in {wheelhouse}", "publish the wheel before its image")
        known = manifest.images.get(entry.name)
        done = known is not None and known.image_id == entry.image_id and target.is_file()
        if done and known is not None and (squashfs is None or known.squashfs_sha256 == entry.squashfs_sha256):
            output.note(f"{entry.name} is already published (image {entry.image_id[:12]})")
            return target
        ours = node.image_files(manifest)
        for rel in files:
            if rel not in ours and (wheelhouse / rel).exists():
                raise PublishError(f"{wheelhouse / rel} exists and is not listed in {MANIFEST}",
                                   "move it away; it is not ours")  # fmt: skip
        _journal(wheelhouse, {rel: digest for rel, (_, digest) in files.items()})
        try:
            make_dirs(target.parent)
            for rel, (source, _) in files.items():
                copy_atomic(source, wheelhouse / rel)
            images = {**manifest.images, entry.name: dataclasses.replace(entry, published_at=_now())}
            commit(wheelhouse, dataclasses.replace(manifest, images=images))  # the page lists the image
        except BaseException as exc:
            _undo(wheelhouse, exc)
            raise
        (wheelhouse / JOURNAL).unlink(missing_ok=True)
    output.note(f"published {target}")
    return target


def publish_coverage(wheelhouse: Path, report: Path) -> Path | None:
    """Put a matrix run's coverage.json into the wheelhouse (listed in the manifest, shown on the
    page), replacing the previous run's; None where nothing was ever published there."""
    data = report.read_bytes()
    try:
        parse_report(json.loads(data), str(report))  # what the page will read back must load
    except (ValueError, ManifestError) as exc:
        raise PublishError(f"{report} is not a coverage report: {exc}", "run the matrix again") from exc
    if not (wheelhouse / MANIFEST).is_file():
        return None
    name = node.REPORTS[0]
    with locked(wheelhouse):
        manifest = load_manifest(wheelhouse)
        target = wheelhouse / name
        if target.is_symlink() or (target.exists() and name not in manifest.reports):
            raise PublishError(f"{target} exists and is not the report a publish wrote", "move it away; it is not ours")
        write_atomic(target, data)
        reports = {**manifest.reports, name: FileEntry(name, hashlib.sha256(data).hexdigest())}
        commit(wheelhouse, dataclasses.replace(manifest, reports=reports))
    return target


def refresh_page(wheelhouse: Path) -> None:
    """Rewrite index.html from the manifest, under the publish lock (after a lock file changed)."""
    with locked(wheelhouse):
        write_page(wheelhouse, load_manifest(wheelhouse))
