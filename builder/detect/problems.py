"""Judgement (pure): which toolkit fits torch, and the known bad combinations with their fixes."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from packaging.version import Version

from builder.detect.model import (
    INT8_MIN_CC,
    Compiler,
    Cpu,
    Gpu,
    Problem,
    Toolkit,
    TorchFacts,
)
from builder.detect.parsers import (
    cuda_major_minor,
    parse_nvcc_version,
)

# ---------------------------------------------------------------- judgement (pure)


def choose_toolkit(toolkits: Sequence[Toolkit], torch_cuda: str | None) -> Toolkit | None:
    """The toolkit for torch's CUDA: same major.minor if present, else same major (newest)."""
    if not toolkits:
        return None
    if not torch_cuda:
        return max(toolkits, key=lambda t: Version(t.version))
    want = Version(torch_cuda)
    same_major = [t for t in toolkits if Version(t.version).major == want.major]
    exact = [t for t in same_major if cuda_major_minor(t.version) == cuda_major_minor(torch_cuda)]
    pool = exact or same_major
    return max(pool, key=lambda t: Version(t.version)) if pool else None


def find_problems(
    gpus: Sequence[Gpu],
    toolkits: Sequence[Toolkit],
    chosen: Toolkit | None,
    torch: TorchFacts,
    compilers: Sequence[Compiler],
    default_gcc: str | None,
    driver_cuda: str | None,
    wanted_archs: Sequence[str] = (),
) -> list[Problem]:
    """Known bad combinations, each with its fix."""
    out: list[Problem] = []
    for g in gpus:
        if tuple(int(x) for x in g.capability.split(".")) < INT8_MIN_CC:
            out.append(Problem(
                "warning",
                f"GPU {g.index} ({g.name}, compute capability {g.capability}) cannot run bitsandbytes int8 matmul "
                "(igemmlt needs 7.5+)",
                "use 4-bit (nf4/fp4) quantization or a Turing-or-newer GPU for 8-bit",
            ))  # fmt: skip
    if torch.cuda and toolkits and chosen is None:
        have = ", ".join(f"{t.version} ({t.root})" for t in toolkits)
        out.append(Problem(
            "error",
            f"torch was built with CUDA {torch.cuda} but no CUDA {Version(torch.cuda).major}.x toolkit is here "
            f"(found {have})",
            f"install CUDA {cuda_major_minor(torch.cuda)} and set CUDA_HOME, "
            "or use a torch built for a toolkit you have",
        ))  # fmt: skip
    if torch.cuda and not toolkits:
        out.append(
            Problem(
                "error",
                f"torch uses CUDA {torch.cuda} but no nvcc was found",
                f"install the CUDA {cuda_major_minor(torch.cuda)} toolkit (nvcc) and set CUDA_HOME",
            )
        )
    if chosen and chosen.missing_headers and torch.cuda:
        provided = {h for d in torch.pip_cuda_include for h in chosen.missing_headers if (Path(d) / h).is_file()}
        lacking = [h for h in chosen.missing_headers if h not in provided]
        if lacking:
            out.append(Problem(
                "error",
                f"CUDA {chosen.version} at {chosen.root} lacks {', '.join(lacking)} and torch's pip nvidia "
                "packages do not provide them: CUDA ops cannot compile",
                "install the CUDA math libraries' headers (e.g. the toolkit's cublas/cusparse dev packages), "
                "or use a torch whose pip nvidia-* packages carry include/ folders",
            ))  # fmt: skip
    if chosen and chosen.archs:
        for arch in wanted_archs:
            if arch.split("+")[0].rstrip("af") not in chosen.archs:
                out.append(
                    Problem(
                        "error",
                        f"nvcc {chosen.version} cannot compile for compute capability {arch}",
                        f"use a CUDA toolkit that lists compute_{arch.replace('.', '')}, or drop the arch",
                    )
                )
    if chosen and chosen.host_range and default_gcc:
        major = int(default_gcc.split(".")[0])
        if not chosen.host_range.accepts("gcc", major):
            good = [c for c in compilers if c.kind == "gcc" and c.is_cxx and chosen.host_range.accepts("gcc", c.major)]
            fix = (
                f"the toolchain step points nvcc at {good[-1].name} {good[-1].version}"
                if good
                else f"install a gcc nvcc {chosen.version} accepts (<= {chosen.host_range.gcc_max})"
            )
            out.append(
                Problem(
                    "warning" if good else "error",
                    f"default gcc {default_gcc} is outside what nvcc {chosen.version} accepts "
                    f"(gcc {chosen.host_range.gcc_min or ''}..{chosen.host_range.gcc_max})",
                    fix,
                )
            )
    if torch.cuda and driver_cuda and Version(driver_cuda) < Version(cuda_major_minor(torch.cuda) or "0"):
        out.append(
            Problem(
                "warning",
                f"the driver supports CUDA {driver_cuda}, torch needs {torch.cuda}",
                "update the NVIDIA driver on nodes that will run this torch",
            )
        )
    if not torch.version:
        out.append(
            Problem(
                "warning",
                f"no torch in {torch.python}: {torch.error}",
                "pass --python with the interpreter whose torch the wheel is for",
            )
        )
    return out


def cpu_problems(cpu: Cpu) -> list[Problem]:
    if "avx512f" in cpu.simd:
        return [Problem(
            "warning",
            "this CPU has AVX-512 and DeepSpeed compiles CPU ops with -march=native: a wheel built here "
            "can crash with 'illegal instruction' on nodes without AVX-512",
            "build CPU ops on the oldest CPU of the cluster, or for a portable x86-64 target",
        )]  # fmt: skip
    return []


def cuda_setup_problems(
    env: Mapping[str, str], is_toolkit: Callable[[Path], bool], first_nvcc: str | None, nvcc_said: str
) -> list[Problem]:
    """A broken CUDA set-up in the environment: torch's JIT and DeepSpeed's op builder use CUDA_HOME
    (else CUDA_PATH) and the first nvcc on PATH exactly as they are, so each is checked as they use it."""
    out = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        value = env.get(var)
        if not value:
            continue
        folder = Path(value)
        if not folder.is_dir():
            why = "does not exist" if not folder.exists() else "is not a folder"
        elif not is_toolkit(folder):
            why = "is not a CUDA toolkit (no bin/nvcc with its include/ headers)"
        else:
            continue
        out.append(Problem(
            "error",
            f"{var}={value} {why}: torch's JIT and DeepSpeed's op builder take the toolkit from it",
            f"point {var} at a CUDA toolkit folder (the one holding bin/nvcc), or unset it",
        ))  # fmt: skip
    if first_nvcc and not parse_nvcc_version(nvcc_said):
        first = next((line.strip() for line in nvcc_said.splitlines() if line.strip()), "")
        said = f"printed {first[:80]!r}" if first else "did not run or printed nothing"
        out.append(Problem(
            "error",
            f"the first nvcc on PATH ({first_nvcc}) gives no CUDA version: `nvcc --version` {said}",
            "fix or remove it from PATH (or put a working toolkit's bin/ before it): torch's JIT and DeepSpeed "
            "call the first nvcc on PATH",
        ))  # fmt: skip
    return out
