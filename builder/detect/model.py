"""The data detect reports: GPUs, toolkits, compilers, torch, problems, and the report itself.

Frozen dataclasses; `Report.to_json` is the versioned schema scripts read (`detect --json`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA_VERSION = 1
# Headers DeepSpeed's CUDA ops include (csrc/includes) that a minimal toolkit may lack.
NEEDED_HEADERS = ("cuda_runtime.h", "cublas_v2.h", "cusparse.h", "curand.h", "cusolverDn.h", "cuda_fp16.h")
# Used only when a toolkit's include/crt/host_config.h cannot be read: (gcc max, clang max).
KNOWN_HOST_LIMITS: dict[str, tuple[int, int]] = {
    "11.8": (11, 14), "12.0": (12, 14), "12.1": (12, 15), "12.2": (12, 15), "12.3": (12, 16),
    "12.4": (13, 17), "12.5": (13, 17), "12.6": (13, 18), "12.8": (14, 19), "12.9": (14, 19),
    "13.0": (15, 20),
}  # fmt: skip
INT8_MIN_CC = (7, 5)  # bitsandbytes' int8 matmul (igemmlt) needs Turing or newer

Runner = Callable[[Sequence[str]], str]


# ---------------------------------------------------------------- data


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    capability: str  # "9.0"
    memory_mib: int


@dataclass(frozen=True)
class HostRange:
    """Host compiler major versions nvcc accepts (None: no bound); `source` says where it came from."""

    gcc_min: int | None
    gcc_max: int | None
    clang_min: int | None
    clang_max: int | None
    source: str

    def accepts(self, kind: str, major: int) -> bool:
        low, high = (self.gcc_min, self.gcc_max) if kind == "gcc" else (self.clang_min, self.clang_max)
        return (low is None or major >= low) and (high is None or major <= high)


@dataclass(frozen=True)
class Toolkit:
    root: str
    nvcc: str
    version: str  # "13.0"
    found_by: tuple[str, ...]
    host_range: HostRange | None
    missing_headers: tuple[str, ...]
    archs: tuple[str, ...] = ()  # from nvcc --list-gpu-arch, e.g. ("7.5", "8.0", ...)


@dataclass(frozen=True)
class Compiler:
    kind: str  # gcc | clang
    name: str  # the command: gcc, g++-12, clang++-14
    path: str
    version: str

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    @property
    def is_cxx(self) -> bool:
        return self.name.startswith(("g++", "clang++"))


@dataclass(frozen=True)
class TorchFacts:
    python: str
    version: str | None
    cuda: str | None = None
    cxx11_abi: bool | None = None
    arch_list: tuple[str, ...] = ()
    nccl: str | None = None
    site_packages: str | None = None
    pip_cuda_include: tuple[str, ...] = ()  # include folders of pip's nvidia-* packages
    error: str = ""


@dataclass(frozen=True)
class Problem:
    severity: str  # error | warning
    message: str
    fix: str


@dataclass(frozen=True)
class Cpu:
    brand: str = ""
    arch: str = ""
    simd: tuple[str, ...] = ()  # the SIMD flags DeepSpeed's CPU ops care about


@dataclass(frozen=True)
class Libraries:
    libaio: bool = False  # library and header, as async_io needs
    cufile: str | None = None
    nccl: str | None = None  # torch's


@dataclass(frozen=True)
class Report:
    gpus: tuple[Gpu, ...]
    gpu_source: str
    driver: str | None
    driver_cuda: str | None
    toolkits: tuple[Toolkit, ...]
    chosen_toolkit: str | None
    torch: TorchFacts
    compilers: tuple[Compiler, ...]
    default_gcc: str | None
    cpu: Cpu
    libraries: Libraries
    problems: tuple[Problem, ...] = field(default=())
    # With a recipe: DeepSpeed's own answer, per op of its accelerator, {"compatible", "why"}.
    deepspeed_ops: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    schema: int = SCHEMA_VERSION

    @property
    def arch_list(self) -> list[str]:
        return arch_list(self.gpus)

    def to_json(self) -> str:
        data = asdict(self)
        data["arch_list"] = self.arch_list
        return json.dumps(data, indent=2, sort_keys=True) + "\n"


def arch_list(gpus: Sequence[Gpu]) -> list[str]:
    """The deduplicated, sorted arch list that covers every GPU."""
    return sorted({g.capability for g in gpus}, key=lambda cc: tuple(int(x) for x in cc.split(".")))
