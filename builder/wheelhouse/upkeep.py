"""Keeping a published wheelhouse whole: repair what interrupted publishes left, sign it again (next serial,
new expiry), adopt one an older toolkit published unsigned."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from builder import output
from builder.errors import WheelhouseError
from builder.files import sha256_of
from builder.node import (
    WheelhouseManifest,
)
from builder.wheelhouse.index import (
    write_index,
)
from builder.wheelhouse.layout import (
    MANIFEST,
    SIGNATURE,
    check_signed,
    load_manifest,
    locked,
    publish_traces,
    read_manifest,
)
from builder.wheelhouse.page import PAGE
from builder.wheelhouse.publish import _clean, _remove, commit, sync_variants, tool_sources


def repair(wheelhouse: Path) -> list[str]:
    """Remove what interrupted publishes left and rewrite the index from the manifest; what was removed.

    A wheelhouse whose first publish was killed has no manifest yet, only what that publish left
    (its journal, lock, temporary files): it is cleaned the same way, against an empty manifest.
    Everything is decided under the publish lock: a publish still running is waited for, never
    taken for a killed one.
    """
    if not wheelhouse.is_dir() or not (publish_traces(wheelhouse) or (wheelhouse / MANIFEST).is_file()):
        raise WheelhouseError(f"{wheelhouse} has no {MANIFEST} and nothing a publish left",
                              "pass --wheelhouse with a published wheelhouse")  # fmt: skip
    with locked(wheelhouse):
        has_manifest = (wheelhouse / MANIFEST).is_file()
        manifest = load_manifest(wheelhouse)
        removed = _clean(wheelhouse, manifest)
        for name, ours in tool_sources().items():
            tool = wheelhouse / name
            if not has_manifest and tool.is_file() and not tool.is_symlink() and tool.read_bytes() == ours:
                tool.unlink()  # a tool the killed first publish wrote (these exact bytes): ours
                removed.append(name)
        manifest, unlisted = _unlist_lost_proofs(wheelhouse, manifest)
        removed += unlisted
        stale: list[Path] = []
        if manifest.variants:  # derived files: made again from the wheels, whatever a kill left
            manifest, stale = sync_variants(wheelhouse, manifest)
            commit(wheelhouse, manifest)
        elif has_manifest or (wheelhouse / "simple").is_dir():
            write_index(wheelhouse, manifest)
        _remove(stale)
        removed += [p.name for p in stale]
    return removed


def _unlist_lost_proofs(wheelhouse: Path, manifest: WheelhouseManifest) -> tuple[WheelhouseManifest, list[str]]:
    """A GPU proof the manifest lists whose file is gone, or is no longer the file it lists (repair was
    silent about it): its listing is removed and said, the wheel no longer counted as proven by it. The
    file itself, where something is in its place, is never touched."""
    wheels = dict(manifest.wheels)
    lost: list[str] = []
    for name, entry in manifest.wheels.items():
        kept = []
        for proof in entry.proofs:
            path = wheelhouse / proof.name
            intact = path.is_file() and not path.is_symlink() and sha256_of(path) == proof.sha256
            if intact:
                kept.append(proof)
                continue
            lost.append(f"{proof.name} (listing)")
            output.warn(f"{proof.name}: listed in {MANIFEST}, but its file is gone or changed: the listing is removed, "
                        f"and {name} is no longer proven on {', '.join(proof.capabilities)} by it (prove it again "
                        "and take the proof in)")  # fmt: skip
        if len(kept) != len(entry.proofs):
            wheels[name] = dataclasses.replace(entry, proofs=tuple(kept))
    if not lost:
        return manifest, []
    return commit(wheelhouse, dataclasses.replace(manifest, wheels=wheels)), lost


def resign(wheelhouse: Path, days: int | None = None, adopt: bool = False, new_id: bool = False) -> WheelhouseManifest:
    """Sign the manifest again, unchanged but for its statement (next serial, new expiry). With
    `adopt`, a manifest that has no signature (an older toolkit published it), or whose good
    signature is older than this host's record (going back on purpose), is signed once every file
    checks out against it. A signature that fails is never adopted: it is what a forgery looks like."""
    from builder.wheelhouse.verify import verify

    if not (wheelhouse / MANIFEST).is_file():
        raise WheelhouseError(f"{wheelhouse} has no {MANIFEST}", "pass --wheelhouse with a published wheelhouse")
    with locked(wheelhouse):
        if new_id:  # a copy made a wheelhouse of its own: signed as it is, under a new id
            found = read_manifest(wheelhouse)
            assert found is not None
            check_signed(wheelhouse, *found, rollback=True)
            return commit(wheelhouse, dataclasses.replace(found[1], wheelhouse_id=""), days)
        if not adopt:
            return commit(wheelhouse, load_manifest(wheelhouse), days)
        found = read_manifest(wheelhouse)
        assert found is not None
        signature = wheelhouse / SIGNATURE
        if signature.exists() or signature.is_symlink():
            try:
                check_signed(wheelhouse, *found, rollback=True)
            except WheelhouseError as exc:
                raise WheelhouseError(
                    f"{wheelhouse / MANIFEST} is signed, and its signature does not check out here ({exc.message}); "
                    "--adopt signs only a manifest that has no signature, never one whose signature fails",
                    "restore the wheelhouse from the build host that signed it, or publish the wheels again into a "
                    "new wheelhouse; if this host's key was rotated, `python -m builder key trust` the key that "
                    "signed it, then `python -m builder sign`",
                ) from exc
        _clean(wheelhouse, found[1])
        problems = verify(wheelhouse, signature=False)
        # The page is a view of the manifest, rendered again by the commit below: one an older toolkit
        # rendered is no reason to refuse (repair refuses an unsigned wheelhouse: they sent users in a loop).
        page = [p for p in problems if p.startswith(f"{PAGE}:")]
        problems = [p for p in problems if p not in page]
        if page:
            output.note(f"{PAGE} is not what this toolkit renders (an older one wrote it): written again")
        if problems:
            raise WheelhouseError(f"{wheelhouse} does not check out against its manifest, so it is not signed:\n    "
                                  + "\n    ".join(problems), "re-publish the wheels into a new wheelhouse")  # fmt: skip
        manifest = found[1]
        output.note(f"adopting {MANIFEST} as it is, every file checked against it:")
        for name, entry in sorted(manifest.wheels.items()):
            output.note(f"    {name}  sha256 {entry.sha256[:16]}...")
        counts = [(manifest.dependencies, "dependency wheels"), (manifest.locks, "lock files"),
                  (manifest.images, "images"), (manifest.variants, "variant wheels")]  # fmt: skip
        output.note("    " + ", ".join(f"{len(table)} {what}" for table, what in counts))
        return commit(wheelhouse, manifest, days)
