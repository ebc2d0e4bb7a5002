"""The wheel's glibc floor: the newest of what its ops need and what torch's own wheel claims (the
target machine's torch for a wheel for another machine), checked against the recipe's platform."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from builder import glibc
from builder.buildroot import sandbox
from builder.cmd import query
from builder.errors import BuildError, RecipeError
from builder.node import describe_floor
from builder.recipe import Recipe
from builder.wheelbuild import cross


def torch_floor(python: Path) -> str | None:
    """The manylinux floor torch's own wheel claims in the build environment (its WHEEL file)."""
    return glibc.wheel_floor(
        query([str(python), "-c", "import importlib.metadata as m; print(m.distribution('torch').read_text('WHEEL'))"])
    )


def check_fits_torch(recipe: Recipe, python: Path, wheel_text: str | None = None) -> str | None:
    """torch's floor (from `wheel_text`, the target's torch's WHEEL, for a wheel for another machine);
    RecipeError where the recipe's floor is below it (a node that old cannot run torch)."""
    theirs = torch_floor(python) if wheel_text is None else glibc.wheel_floor(wheel_text)
    if theirs and glibc.floor_glibc(recipe.platform) < glibc.floor_glibc(theirs):
        raise RecipeError(
            f'recipe {recipe.name}: platform = "{recipe.platform}" is below the floor of the torch it builds '
            f"against ({theirs}, from torch's own wheel): a node with a glibc that old cannot run that torch",
            f'set platform = "{theirs}" (or newer) in the recipe',
        )
    return theirs


def tags(
    recipe: Recipe, tree: Path, versions: Mapping[str, set[str]], python: Path, cross_torch: str | None = None
) -> dict[str, Any]:
    """The wheel's platform tags and what the build manifest says of them. For a floor: every symbol
    checked against it (BuildError naming each symbol above it and the .so that needs it), the tag the
    newest of the ops' floor and torch's own (the target machine's torch for a cross build). For
    "host": whatever the symbols allow, as before."""
    needs = glibc.newest(versions)
    machine = recipe.machine
    if recipe.platform == glibc.HOST:
        return {"tags": list(glibc.platform_tags(versions)), "needs": needs, "floor": glibc.HOST}
    above = glibc.above_floor(glibc.needed_symbols(tree), recipe.platform, machine)
    if above:
        raise BuildError(
            f'the wheel\'s ops need symbols newer than platform = "{recipe.platform}" allows '
            f"({describe_floor(glibc.tag_for(recipe.platform, None, machine))}):\n{glibc.describe_above(above)}",
            "compile in a root with an older glibc and libstdc++ (the default [root] is Debian 11; a site's root "
            "must be as old as the floor), raise the floor "
            f'(platform = "{glibc.ops_floor(versions, machine) or "host"}"), '
            'or build for this machine\'s own OS only with platform = "host"',
        )
    ops = glibc.ops_floor(versions, machine)
    theirs = glibc.wheel_floor(cross.torch_wheel_text(Path(cross_torch))) if cross_torch else torch_floor(python)
    tag = glibc.tag_for(ops, theirs, machine)
    root = sandbox.resolve(recipe.root, os.environ, machine)
    return {"tags": [tag], "needs": needs, "floor": recipe.platform, "ops_floor": ops, "torch_floor": theirs,
            "root": {"describe": root.describe, "identity": root.identity, "gcc": root.gcc,
                     "glibc": root.glibc}}  # fmt: skip
