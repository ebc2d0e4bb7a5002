"""prune: remove wheels of recipes that no longer exist; index and manifest first, files after."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from builder.errors import RecipeError, WheelhouseError
from builder.wheelhouse.layout import (
    MANIFEST,
    _companions,
    load_manifest,
    locked,
)
from builder.wheelhouse.publish import commit, sync_variants


def prune(
    wheelhouse: Path, recipe_names: Iterable[str], keep: Iterable[str], dry_run: bool = False, remove_all: bool = False
) -> list[str]:
    """Remove wheels built from no current recipe and pinned by no lock; returns their names.

    Only names from the validated manifest are ever joined to the wheelhouse path. Removing every
    wheel is what a prune run from the wrong folder does: it needs `remove_all`.
    """
    recipes, pinned = set(recipe_names), set(keep)
    if not (wheelhouse / MANIFEST).is_file():
        raise WheelhouseError(f"{wheelhouse} has no {MANIFEST}", "pass --wheelhouse with a published wheelhouse")
    with locked(wheelhouse):
        manifest = load_manifest(wheelhouse)
        doomed = [n for n, e in sorted(manifest.wheels.items()) if e.recipe not in recipes and n not in pinned]
        if doomed and len(doomed) == len(manifest.wheels) and not remove_all:
            raise RecipeError(
                f"prune would remove every wheel of {wheelhouse} ({len(doomed)}): none was built from the recipes "
                f"given ({', '.join(sorted(recipes)) or 'none'}); recipes of the wheels: "
                + ", ".join(sorted({e.recipe for e in manifest.wheels.values()})),
                "pass --recipes-dir with the folder of the recipes they were built from, or --all to empty it",
            )
        if dry_run or not doomed:
            return doomed
        old = dict(manifest.wheels)
        kept = {n: e for n, e in manifest.wheels.items() if n not in doomed}
        gone = {n: e for n, e in sorted(manifest.images.items()) if e.wheel in doomed}  # they hold a doomed wheel
        images = [f for n, e in gone.items() for f in (n, e.squashfs) if f]  # an archive and its squashfs
        manifest = replace(manifest, wheels=kept, images={n: e for n, e in manifest.images.items() if n not in gone})
        stale: list[Path] = []
        if manifest.variants:  # the variants of pruned wheels go; a new fallback is made if needed
            manifest, stale = sync_variants(wheelhouse, manifest)
        # Index and manifest first, files after: a wheel is never linked while it is missing.
        commit(wheelhouse, manifest)
        for path in stale:
            path.unlink(missing_ok=True)
        for name in doomed:
            for path in (wheelhouse / name, *_companions(wheelhouse, name, old.get(name))):
                path.unlink(missing_ok=True)
        for name in images:
            (wheelhouse / name).unlink(missing_ok=True)
    return doomed + images + [p.name for p in stale]
