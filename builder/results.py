"""The result of each stage of each target: the contract pipeline writes and the coverage
report, the Slurm jobs and the wheelhouse page read. It lives below all of them, so none of
those rooms imports another to read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class StageResult:
    """One stage of one target: passed, reused (an identical result was found), failed or skipped,
    with the reason of every failure and skip."""

    status: str  # passed | reused | failed | skipped
    reason: str = ""
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "reason": self.reason, "seconds": round(self.seconds, 1)}


STAGES = ("build", "smoke", "publish")


@dataclass(frozen=True)
class TargetResult:
    """What happened to one target: the `build-wheel --json` record and a coverage report row."""

    target: str
    recipe: str
    python: str
    wheel: Path | None
    stages: Mapping[str, StageResult]
    published: Path | None = None
    install_command: str | None = None
    slurm: Mapping[str, str] | None = None  # job id and log path, when the target ran on Slurm

    @property
    def ok(self) -> bool:
        return not any(r.status == "failed" for r in self.stages.values())

    @property
    def reused(self) -> bool:
        return self.stages["build"].status == "reused"

    @property
    def smoke(self) -> str:
        """passed | already-passed | not-run (the older --json field)."""
        status = self.stages["smoke"].status
        return {"passed": "passed", "reused": "already-passed"}.get(status, "not-run")

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "recipe": self.recipe,
            "python": self.python,
            "wheel": str(self.wheel) if self.wheel else None,
            "reused": self.reused,
            "smoke": self.smoke,
            "published": str(self.published) if self.published else None,
            "install_command": self.install_command,
            "stages": {name: r.to_json() for name, r in self.stages.items()},
            **({"slurm": dict(self.slurm)} if self.slurm else {}),
        }
