"""Plan a build with pure functions: what to set, what version to stamp, what must come out.

Nothing here touches the disk or runs a program, so every rule is unit-tested anywhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from packaging.version import Version

from builder.archs import label as arch_label
from builder.archs import normalize_all
from builder.errors import BuildError
from builder.machines import CPU_TARGET_FLAGS, OP_TARGETS
from builder.node import torch_variant
from builder.recipe import PYTORCH_INDEX, Recipe
from builder.wheelbuild import needs
from builder.wheelbuild.ops import OpInfo, ProbeReport, check_archs, check_requested


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
    op_archs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # device-code op -> archs it must hold
    missing: Mapping[str, str] = field(default_factory=dict)  # op the recipe asked for -> why it is not built

    def without(self, dropped: Mapping[str, str]) -> BuildPlan:
        """The plan less ops that failed to build (on_op_failure = "drop"), each with why."""
        gone = {o.build_var for o in self.ops if o.name in dropped}
        return replace(
            self,
            ops=tuple(o for o in self.ops if o.name not in dropped),
            env={k: v for k, v in self.env.items() if k not in gone},
            op_archs={k: v for k, v in self.op_archs.items() if k not in dropped},
            missing={**self.missing, **dropped},
        )

    def archs_of(self, op: str) -> tuple[str, ...]:
        """The archs an op's .so must hold: all requested, or fewer where narrow_ops allowed it."""
        return tuple(self.op_archs.get(op, self.archs))

    @property
    def narrowed(self) -> dict[str, list[str]]:
        """Ops that hold fewer archs than requested, with the archs they hold."""
        return {op: list(held) for op, held in self.op_archs.items() if tuple(held) != self.archs}

    @property
    def local_label(self) -> str:
        return self.version.partition("+")[2]


def cpu_target_env(target: str) -> dict[str, str]:
    """The build's -march and SIMD macro for `target`; where only some ops are built for it
    (machines.OP_TARGETS), the portable target's (units.plan.unit_env gives those ops their own)."""
    if target == "native":
        return {}
    march, simd = CPU_TARGET_FLAGS[OP_TARGETS.get(target, (target, ()))[0]]
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
    return f"{torch_variant(torch_cuda)}.{torch_part}.{arch_label(archs)}"


def check_torch_build(recipe: Recipe, version: str | None, cuda: str | None) -> None:
    """The torch the build environment got is the build the recipe asks for: an index serves its
    own default build of a version (PyPI's torch 2.15.0 is CUDA 13.0, 15 nvidia packages), which a
    CPU recipe would otherwise be labelled `+cpu` against, and the reverse."""
    if recipe.torch.system or version is None:
        return
    got, named = torch_variant(cuda), recipe.torch.variant
    if recipe.accelerator == "cpu":
        want = "cpu"
    elif named:
        want = named
    else:
        want = got if cuda else "cu130"  # any CUDA build fits a CUDA recipe that names none
    if got == want:
        return
    build = f"CUDA {cuda}" if cuda else "CPU"
    source = f"from {recipe.torch.index}" if recipe.torch.index else "from pip's sources"
    if recipe.torch.index:
        fix = f"point [torch] index at the {want} build of torch {recipe.torch.version} ({PYTORCH_INDEX}/{want})"
    else:
        fix = (f'name the build in the recipe\'s [torch] table: variant = "{want}" (PyTorch\'s index '
               f"{PYTORCH_INDEX}/{want}; or index = your mirror of it)")  # fmt: skip
    raise BuildError(
        f"recipe {recipe.name} is a {recipe.accelerator} recipe{f' naming {named}' if named else ''}, but its build "
        f"environment got torch {version}, the {build} build ({source})",
        fix + "; the build environment is made again for the changed recipe",
    )


# Peak memory of one compile job, GB, with headroom: g++ on cpu_adam.cpp with torch's headers
# peaked at 1.6 GB here; for nvcc (cicc and ptxas on DeepSpeed's kernels) 3 GB is an estimate.
JOB_GB = {"cpu": 2.0, "cuda": 3.0}


def job_memory(archs: tuple[str, ...]) -> float:
    """GB one compile job may take: a g++ job, or nvcc with one thread (a compile in memory) per arch, up to 4."""
    return JOB_GB["cuda"] * nvcc_threads(archs) if archs else JOB_GB["cpu"]


def nvcc_threads(archs: tuple[str, ...]) -> int:
    """nvcc compiles a file's archs one after another unless told --threads."""
    return min(len(archs), 4)


def max_jobs(cores: int, mem_gb: float | None = None, job_gb: float = JOB_GB["cpu"]) -> int:
    """Parallel compile jobs for ninja: one per core, fewer where free memory cannot hold them."""
    jobs = max(1, cores)
    if mem_gb is not None:
        jobs = min(jobs, int(mem_gb // job_gb))
    return max(1, jobs)


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


def select_ops(
    recipe: Recipe, probe: ProbeReport, nvcc: str | None = None, env: Mapping[str, str] | None = None
) -> tuple[tuple[OpInfo, ...], dict[str, str]]:
    """(ops to build, ops left out with why). ops = "all" takes every op DeepSpeed offers less
    ops_except, and leaves out with its reason each one that cannot build here; a named op that
    cannot build is an error, unless on_op_failure = "drop"."""
    known = needs.candidates(probe)
    if recipe.all_ops:
        check_requested(tuple(op for op in recipe.ops_except if op not in needs.NOT_OPS), probe)
        wanted = tuple(op for op in known if op not in recipe.ops_except)
    else:
        wanted = recipe.ops
    infos = check_requested(wanted, probe)
    refused = needs.refusals(infos, probe, recipe.deepspeed.version, nvcc, env or {})
    if refused and not recipe.all_ops and recipe.on_op_failure != "drop":
        raise BuildError(
            f"cannot build {', '.join(refused)} here: " + "; ".join(r.describe() for r in refused.values()),
            f'drop {", ".join(refused)} from the recipe, supply what is missing, or set on_op_failure = "drop" '
            "to ship the wheel without it",
        )
    missing = {op: f"refused: {r.reason} ({r.fix})" for op, r in refused.items()}
    built = tuple(i for i in infos if i.name not in refused)
    if not built:
        raise BuildError(
            f"no op of recipe {recipe.name} can build here: " + "; ".join(r.describe() for r in refused.values()),
            "supply what the ops need, or choose other ops",
        )
    return built, missing


def plan_build(
    recipe: Recipe,
    probe: ProbeReport,
    archs: tuple[str, ...] = (),
    nvcc: str | None = None,
    env: Mapping[str, str] | None = None,
) -> BuildPlan:
    """Decide the build environment and expected result from the recipe and DeepSpeed's op probe.

    How many compile jobs run, and how many ops at once, is the op units' plan (units.plan)."""
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
    ops, missing = select_ops(recipe, probe, nvcc, env)
    op_archs = check_archs(ops, archs, recipe.narrow_ops)
    label = local_label(recipe.accelerator, probe.torch.version, probe.torch.cuda, archs)
    if recipe.label:  # another op set of the same target: its own file name
        label += f".{recipe.label}"
    threads = nvcc_threads(archs)
    env = {
        "DS_ACCELERATOR": recipe.accelerator,
        "DS_BUILD_OPS": "0",  # only what the recipe names; every other op stays JIT
        "DS_BUILD_STRING": f"+{label}",
        "DS_ENABLE_NINJA": "1",
        **cpu_target_env(recipe.cpu_target),
        **({"DS_BUILDER_CPU_LINK": "1"} if recipe.accelerator == "cpu" else {}),  # async_io's -laio
        **({"DS_BUILDER_NO_DEBUG": "1"} if recipe.strip else {}),  # no -g: it would be stripped
        **{op.build_var: "1" for op in ops},
    }
    if archs:
        env["TORCH_CUDA_ARCH_LIST"] = ";".join(archs)
        env["DS_BUILDER_ARCH_LIST"] = env["TORCH_CUDA_ARCH_LIST"]  # an op's filtering stays its own
    nvcc_flags = [f"--threads {threads}"] if threads > 1 else []
    if archs and recipe.compress_device_code:
        nvcc_flags.append("-Xfatbin -compress-all")  # as PyTorch's own wheels: smaller .so files
    if nvcc_flags:
        env["NVCC_APPEND_FLAGS"] = " ".join(nvcc_flags)
    return BuildPlan(
        recipe=recipe,
        version=f"{recipe.deepspeed.version}+{label}",
        ops=ops,
        env=env,
        torch_version=probe.torch.version,
        torch_cuda=probe.torch.cuda,
        python_tag=probe.python_tag,
        archs=archs,
        op_archs=op_archs,
        missing=missing,
    )
