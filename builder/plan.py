"""Plan a build with pure functions: what to set, what version to stamp, what must come out.

Nothing here touches the disk or runs a program, so every rule is unit-tested anywhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from packaging.version import Version

from builder.archs import label as arch_label
from builder.archs import normalize_all
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
    archs: tuple[str, ...] = ()

    @property
    def local_label(self) -> str:
        return self.version.partition("+")[2]


# DeepSpeed compiles CPU ops with -march=native and a SIMD macro from the build host's flags;
# the source patch (source.patch_cpu_target) lets these variables pin both to a portable level.
CPU_TARGET_FLAGS = {
    "x86-64": ("-march=x86-64", "-D__SCALAR__"),
    "x86-64-v2": ("-march=x86-64-v2", "-D__SCALAR__"),
    "x86-64-v3": ("-march=x86-64-v3", "-D__AVX256__"),
    "x86-64-v4": ("-march=x86-64-v4", "-D__AVX512__"),
}


def cpu_target_env(target: str) -> dict[str, str]:
    if target == "native":
        return {}
    march, simd = CPU_TARGET_FLAGS[target]
    return {"DS_BUILDER_CPU_ARCH": march, "DS_BUILDER_SIMD_WIDTH": simd}


def local_label(accelerator: str, torch_version: str, torch_cuda: str | None, archs: tuple[str, ...] = ()) -> str:
    """The local version label that says what a wheel was built for: cpu.torch2.13, cu130.torch2.14.sm90."""
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
    return f"cu{major}{minor}.{torch_part}.{arch_label(archs)}"


def max_jobs(cores: int) -> int:
    """Parallel compile jobs for ninja: one per core, at least one."""
    return max(1, cores)


def resolve_archs(recipe: Recipe, gpu_archs: list[str], nvcc_archs: tuple[str, ...], nvcc: str) -> tuple[str, ...]:
    """The recipe's archs (or, for "auto", the GPUs'), each checked against what nvcc can target."""
    if recipe.accelerator != "cuda":
        return ()
    archs = recipe.archs
    if recipe.auto_arch:
        if not gpu_archs:
            raise BuildError(
                'arch = "auto" but no GPU is visible on this machine',
                'list the cluster\'s archs in the recipe (e.g. arch = ["9.0"]), or run on a GPU node',
            )
        archs = normalize_all(gpu_archs)
    if nvcc_archs:
        cannot = [a for a in archs if a.split("+")[0].rstrip("af") not in nvcc_archs]
        if cannot:
            raise BuildError(
                f"nvcc {nvcc} cannot target {', '.join(cannot)} (it lists {', '.join(nvcc_archs)})",
                "use a CUDA toolkit that supports those GPUs, or drop them from arch",
            )
    return archs


def plan_build(recipe: Recipe, probe: ProbeReport, cores: int, archs: tuple[str, ...] = ()) -> BuildPlan:
    """Decide the build environment and expected result from the recipe and DeepSpeed's op probe."""
    have = Version(probe.torch.version)
    if not recipe.torch.system and Version(have.public) != Version(recipe.torch.version):
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
    label = local_label(recipe.accelerator, probe.torch.version, probe.torch.cuda, archs)
    env = {
        "DS_ACCELERATOR": recipe.accelerator,
        "DS_BUILD_OPS": "0",  # only what the recipe names; every other op stays JIT
        "DS_BUILD_STRING": f"+{label}",
        "DS_ENABLE_NINJA": "1",
        "MAX_JOBS": str(max_jobs(cores)),
        **cpu_target_env(recipe.cpu_target),
        **{op.build_var: "1" for op in ops},
    }
    if archs:
        env["TORCH_CUDA_ARCH_LIST"] = ";".join(archs)
    return BuildPlan(
        recipe=recipe,
        version=f"{recipe.deepspeed.version}+{label}",
        ops=ops,
        env=env,
        torch_version=probe.torch.version,
        torch_cuda=probe.torch.cuda,
        python_tag=probe.python_tag,
        archs=archs,
    )
