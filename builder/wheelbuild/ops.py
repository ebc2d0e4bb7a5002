"""DeepSpeed's op list for an accelerator, as DeepSpeed itself reports it, and checks against it.

`probe` runs `ds_probe.py` in the build environment; everything else here is pure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from builder import cmd
from builder.errors import BuildError, RecipeError
from builder.recipe import did_you_mean
from builder.resources import resource

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
    accepted_archs: tuple[str, ...] | None = None  # of the requested archs, those its filter_ccs keeps
    cxx_args: tuple[str, ...] = ()  # the C++ flags its builder adds: ops alike here share a precompiled header
    include_paths: tuple[str, ...] = ()  # the -I folders its builder adds (csrc/aio/common): where its headers are

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
    modules: Mapping[str, bool] = field(default_factory=dict)  # build-time packages found (dskernels)


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
            name: OpInfo(
                name=name,
                **{
                    **info,
                    "sources": tuple(info.get("sources", ())),
                    "cxx_args": tuple(info.get("cxx_args", ())),
                    "include_paths": tuple(info.get("include_paths", ())),
                    "accepted_archs": None if info.get("accepted_archs") is None else tuple(info["accepted_archs"]),
                },
            )
            for name, info in data["ops"].items()
        },
        modules={str(k): bool(v) for k, v in data.get("modules", {}).items()},
    )


def probe(python: Path, source: Path, env: Mapping[str, str], log: Path, archs: tuple[str, ...] = ()) -> ProbeReport:
    """Ask DeepSpeed (at `source`, under the build env's `python`) for its op list, and each op
    which of `archs` it accepts."""
    return parse_probe(cmd.run([python, PROBE_SCRIPT, ";".join(archs)], env=env, cwd=source, log=log))


def check_archs(
    infos: tuple[OpInfo, ...], archs: tuple[str, ...], narrow_ops: tuple[str, ...]
) -> dict[str, tuple[str, ...]]:
    """The archs each device-code op will hold; an op that would drop a requested arch is an error
    before compiling unless the recipe lets it narrow (narrow_ops)."""
    held: dict[str, tuple[str, ...]] = {}
    for info in infos:
        if not info.device_code or not archs:
            continue
        kept = archs if info.accepted_archs is None else info.accepted_archs
        dropped = [a for a in archs if a not in kept]
        if dropped and info.name not in narrow_ops:
            raise RecipeError(
                f"op {info.name} does not build for arch {', '.join(dropped)}: DeepSpeed's {info.name} builder "
                f"keeps only {', '.join(kept) or 'none'} of {', '.join(archs)}",
                f"drop {', '.join(dropped)} from arch, drop {info.name} from ops, or allow it to build for fewer "
                f'archs with narrow_ops = ["{info.name}"] (recorded per op in the build manifest)',
            )
        if not kept:
            raise RecipeError(
                f"op {info.name} builds for none of {', '.join(archs)}", f"drop {info.name} from ops or add its archs"
            )
        held[info.name] = tuple(kept)
    return held


def check_requested(requested: tuple[str, ...], report: ProbeReport) -> tuple[OpInfo, ...]:
    """The OpInfo of every requested op; an op DeepSpeed lacks for this accelerator is a recipe
    error naming the near miss. Whether each can build here is build.needs' to say (DeepSpeed's
    setup.py would skip an incompatible op silently, leaving a missing .so to find afterwards)."""
    known = sorted(report.ops)
    for op in requested:
        if op not in report.ops:
            raise RecipeError(
                f'unknown op "{op}" for the {report.accelerator} accelerator{did_you_mean(op, known)}',
                f"DeepSpeed {report.accelerator} ops are: {', '.join(known)}",
            )
    return tuple(report.ops[op] for op in requested)
