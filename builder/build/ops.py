"""DeepSpeed's op list for an accelerator, as DeepSpeed itself reports it, and checks against it.

`probe` runs `ds_probe.py` in the build environment; everything else here is pure.
"""

from __future__ import annotations

from builder.resources import resource

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from builder import cmd
from builder.errors import BuildError, RecipeError
from builder.recipe import did_you_mean

PROBE_SCRIPT = resource("ds_probe.py")
MARKER = "==== ds_probe json ===="


@dataclass(frozen=True)
class OpInfo:
    name: str
    build_var: str
    module: str  # dotted name of the extension module, e.g. deepspeed.ops.adam.cpu_adam_op
    compatible: bool
    why: str = ""
    device_code: bool = False  # has .cu sources, so its .so must hold code for every requested arch
    sources: tuple[str, ...] = ()  # as DeepSpeed's builder lists them (csrc/adam/cpu_adam.cpp)

    @property
    def so_prefix(self) -> str:
        """Path prefix of the op's shared object inside the wheel."""
        return self.module.replace(".", "/") + "."


@dataclass(frozen=True)
class TorchInfo:
    version: str
    cuda: str | None
    cxx11_abi: bool


@dataclass(frozen=True)
class ProbeReport:
    accelerator: str
    torch: TorchInfo
    python_tag: str
    ops: Mapping[str, OpInfo]


def parse_probe(output: str) -> ProbeReport:
    """Read the JSON that ds_probe.py prints after its marker line."""
    _, sep, payload = output.rpartition(MARKER)
    if not sep:
        raise BuildError("DeepSpeed's op probe printed no report", "rerun with --verbose and read its output")
    data = json.loads(payload)
    return ProbeReport(
        accelerator=data["accelerator"],
        torch=TorchInfo(**data["torch"]),
        python_tag=data["python_tag"],
        ops={
            name: OpInfo(name=name, **{**info, "sources": tuple(info.get("sources", ()))})
            for name, info in data["ops"].items()
        },
    )


def probe(python: Path, source: Path, env: Mapping[str, str], log: Path) -> ProbeReport:
    """Ask DeepSpeed (at `source`, under the build env's `python`) for its op list."""
    return parse_probe(cmd.run([python, PROBE_SCRIPT], env=env, cwd=source, log=log))


def check_requested(requested: tuple[str, ...], report: ProbeReport) -> tuple[OpInfo, ...]:
    """The OpInfo of every requested op; fails for ops DeepSpeed lacks or cannot build here.

    DeepSpeed's setup.py silently skips a requested op that is not compatible, so the reason is
    surfaced before a build rather than discovered as a missing .so afterwards.
    """
    known = sorted(report.ops)
    for op in requested:
        if op not in report.ops:
            raise RecipeError(
                f'unknown op "{op}" for the {report.accelerator} accelerator{did_you_mean(op, known)}',
                f"DeepSpeed {report.accelerator} ops are: {', '.join(known)}",
            )
    infos = tuple(report.ops[op] for op in requested)
    broken = [info for info in infos if not info.compatible]
    if broken:
        reasons = "; ".join(f"{i.name}: {i.why or 'DeepSpeed reports it incompatible'}" for i in broken)
        raise BuildError(
            f"DeepSpeed cannot build {', '.join(i.name for i in broken)} on this machine ({reasons})",
            "install what is missing, or drop the op from the recipe",
        )
    return infos
