"""Plan a build with pure functions: what to set, what version to stamp, what must come out.

Nothing here touches the disk or runs a program, so every rule is unit-tested anywhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from packaging.version import Version

from builder.errors import BuildError
from builder.ops import OpInfo, ProbeReport, check_requested
from builder.recipe import Recipe


@dataclass(frozen=True)
class BuildPlan:
    recipe: Recipe
    version: str  # full wheel version, e.g. 0.19.8+cpu.torch2.13
    ops: tuple[OpInfo, ...]
    env: Mapping[str, str]  # variables added to the build environment
    torch_version: str
    torch_cuda: str | None
    python_tag: str

    @property
    def local_label(self) -> str:
        return self.version.partition("+")[2]


def local_label(accelerator: str, torch_version: str, torch_cuda: str | None) -> str:
    """The local version label that says what a wheel was built for: cpu.torch2.13, cu130.torch2.14."""
    v = Version(torch_version)
    torch_part = f"torch{v.major}.{v.minor}"
    if accelerator == "cpu":
        return f"cpu.{torch_part}"
    if not torch_cuda:
        raise BuildError(
            "the recipe targets CUDA but the torch in the build environment has no CUDA",
            "pin a CUDA build of torch in the recipe's [torch] table",
        )
    major, minor = torch_cuda.split(".")[:2]
    return f"cu{major}{minor}.{torch_part}"


def max_jobs(cores: int) -> int:
    """Parallel compile jobs for ninja: one per core, at least one."""
    return max(1, cores)


def plan_build(recipe: Recipe, probe: ProbeReport, cores: int) -> BuildPlan:
    """Decide the build environment and expected result from the recipe and DeepSpeed's op probe."""
    want = Version(recipe.torch.version)
    have = Version(probe.torch.version)
    if Version(have.public) != want:
        raise BuildError(
            f"the build environment has torch {probe.torch.version} but the recipe pins {recipe.torch.version}",
            "delete the build environment folder so it is made again, or fix [torch] version",
        )
    if probe.accelerator != recipe.accelerator:
        raise BuildError(
            f"DeepSpeed chose the {probe.accelerator} accelerator, the recipe asks for {recipe.accelerator}",
            "check DS_ACCELERATOR in your environment",
        )
    ops = check_requested(recipe.ops, probe)
    label = local_label(recipe.accelerator, probe.torch.version, probe.torch.cuda)
    env = {
        "DS_ACCELERATOR": recipe.accelerator,
        "DS_BUILD_OPS": "0",  # only what the recipe names; every other op stays JIT
        "DS_BUILD_STRING": f"+{label}",
        "DS_ENABLE_NINJA": "1",
        "MAX_JOBS": str(max_jobs(cores)),
        **{op.build_var: "1" for op in ops},
    }
    return BuildPlan(
        recipe=recipe,
        version=f"{recipe.deepspeed.version}+{label}",
        ops=ops,
        env=env,
        torch_version=probe.torch.version,
        torch_cuda=probe.torch.cuda,
        python_tag=probe.python_tag,
    )
