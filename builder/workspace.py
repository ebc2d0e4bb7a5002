"""Where the toolkit keeps its files, so every step agrees on the layout of the work folder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from builder.recipe import Recipe


@dataclass(frozen=True)
class Workspace:
    """cache/ (sdists, build envs), recipes/<name>/ (sources), logs/, dist/ (built wheels), tmp/."""

    root: Path

    @property
    def cache(self) -> Path:
        return self.root / "cache"

    @property
    def dist(self) -> Path:
        return self.root / "dist"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def scratch(self) -> Path:
        return self.root / "tmp"

    def recipe_dir(self, recipe: Recipe) -> Path:
        return self.root / "recipes" / recipe.name
