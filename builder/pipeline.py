"""The stage order, in one place: build -> smoke -> publish, for each recipe of a run.

Every recipe is validated and every output folder checked before the first build, so a bad
recipe or an unwritable wheelhouse fails in a second, not after minutes of compiling. A stage is
skipped only when its result is already proven for the same bytes (build key, smoke report).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder import output
from builder.errors import PublishError
from builder.recipe import Recipe
from builder.workspace import Workspace, check_writable


@dataclass(frozen=True)
class Stages:
    smoke: bool = True
    publish: bool = True
    force: bool = False
    use_ccache: bool = True
    verbose: bool = False


@dataclass(frozen=True)
class TargetResult:
    """What happened to one recipe: the `build-wheel --json` record."""

    recipe: str
    wheel: Path
    reused: bool  # the build key found an identical build; nothing was compiled
    smoke: str  # passed | already-passed | not-run
    published: Path | None
    install_command: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe,
            "wheel": str(self.wheel),
            "reused": self.reused,
            "smoke": self.smoke,
            "published": str(self.published) if self.published else None,
            "install_command": self.install_command,
        }


def install_command(wheelhouse: Path, wheel: Path) -> str:
    """The one command a node runs to install `wheel` from the wheelhouse (torch already present)."""
    version = wheel.name.split("-")[1]
    return f"pip install --index-url {(wheelhouse / 'simple').resolve().as_uri()}/ deepspeed=={version}"


def smoke_passed(wheel: Path) -> bool:
    from builder.wheelhouse import passing_report

    try:
        passing_report(wheel)
        return True
    except PublishError:
        return False


def publish(wheels: Sequence[Path], wheelhouse: Path, ws: Workspace) -> list[Path]:
    from builder.wheelhouse import publish as publish_wheels

    published = publish_wheels(wheels, wheelhouse, log=ws.logs / "publish.log")
    for path in published:
        output.step(f"install it with: {install_command(wheelhouse, path)}")
    return published


def run(recipes: Sequence[Recipe], ws: Workspace, wheelhouse: Path, stages: Stages) -> list[TargetResult]:
    """Build, smoke and publish each recipe in turn; stops at the first failure (its own error)."""
    from builder.build.wheel import build_wheel
    from builder.smoke import smoke

    ws.check_writable()
    if stages.smoke and stages.publish:
        check_writable(wheelhouse, "--wheelhouse")  # before minutes of building, not after
    results = []
    for recipe in recipes:
        built = build_wheel(recipe, ws, stages.verbose, stages.force, use_ccache=stages.use_ccache)
        smoked, published = "not-run", None
        if stages.smoke:
            if built.reused and smoke_passed(built.wheel):
                output.note(f"{built.wheel.name} already passed its smoke tests")
                smoked = "already-passed"
            else:
                smoke(built.wheel, ws, stages.verbose)
                smoked = "passed"
            if stages.publish:
                (published,) = publish([built.wheel], wheelhouse, ws)
        results.append(
            TargetResult(
                recipe=recipe.name,
                wheel=built.wheel,
                reused=built.reused,
                smoke=smoked,
                published=published,
                install_command=install_command(wheelhouse, published) if published else None,
            )
        )
    return results
