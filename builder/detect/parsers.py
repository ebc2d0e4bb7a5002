"""Pure parsers: one per external fact, each tested against captured output."""

from __future__ import annotations

import re
from collections.abc import Mapping

from packaging.version import Version

from builder.detect.model import (
    KNOWN_HOST_LIMITS,
    Gpu,
    HostRange,
)

# ---------------------------------------------------------------- pure parsers


def parse_nvcc_version(text: str) -> str | None:
    m = re.search(r"release (\d+\.\d+)", text)
    return m.group(1) if m else None


def parse_gpu_archs(text: str) -> tuple[str, ...]:
    """`nvcc --list-gpu-arch` (compute_75 ...) as capabilities ("7.5", ...)."""
    found = {m.group(1) for m in re.finditer(r"compute_(\d+)", text)}
    return tuple(f"{int(n) // 10}.{int(n) % 10}" for n in sorted(found, key=int))


def parse_host_config(text: str) -> HostRange | None:
    """Host compiler limits from a toolkit's include/crt/host_config.h.

    The `#if` line right before each "unsupported GNU version" / "unsupported clang version" error
    holds the bounds (e.g. `#if __GNUC__ > 15`, `#if (__clang_major__ >= 21) || (__clang_major__ < 3) ...`).
    """
    lines = text.splitlines()
    gcc_min = gcc_max = clang_min = clang_max = None
    found = False
    for i, line in enumerate(lines):
        if not line.startswith("#error"):
            continue
        kind = "gcc" if "unsupported GNU version" in line else "clang" if "unsupported clang version" in line else None
        if kind is None:
            continue
        cond = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].startswith("#if")), "")
        var = "__GNUC__" if kind == "gcc" else "__clang_major__"
        high = [int(n) for n in re.findall(rf"{var}\s*>\s*(\d+)", cond)]
        high += [int(n) - 1 for n in re.findall(rf"{var}\s*>=\s*(\d+)", cond)]
        low = [int(n) for n in re.findall(rf"{var}\s*<\s*(\d+)", cond)]
        found = True
        if kind == "gcc":
            gcc_max, gcc_min = min(high, default=None), max(low, default=None)
        else:
            clang_max, clang_min = min(high, default=None), max(low, default=None)
    return HostRange(gcc_min, gcc_max, clang_min, clang_max, "host_config.h") if found else None


def host_range_fallback(version: str) -> HostRange | None:
    limits = KNOWN_HOST_LIMITS.get(version)
    return HostRange(None, limits[0], None, limits[1], "known-limits table") if limits else None


def parse_compiler_version(text: str) -> str | None:
    """`gcc -dumpfullversion` ("12.2.0") or `clang --version` ("Debian clang version 14.0.6")."""
    m = re.search(r"clang version (\d+(?:\.\d+)*)", text) or re.match(r"\s*(\d+(?:\.\d+)*)\s*$", text)
    return m.group(1) if m else None


def parse_smi(text: str) -> tuple[list[Gpu], str | None]:
    """`nvidia-smi --query-gpu=index,name,compute_cap,memory.total,driver_version --format=csv,noheader,nounits`."""
    gpus, driver = [], None
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 5 or not parts[0].isdigit():
            continue
        gpus.append(Gpu(int(parts[0]), parts[1], parts[2], int(float(parts[3]))))
        driver = parts[4]
    return gpus, driver


def parse_smi_cuda(text: str) -> str | None:
    """The highest CUDA the driver supports, from plain `nvidia-smi` ("CUDA Version: 13.0")."""
    m = re.search(r"CUDA Version:\s*(\d+\.\d+)", text)
    return m.group(1) if m else None


def cuda_major_minor(version: str | None) -> str | None:
    if not version:
        return None
    v = Version(version)
    return f"{v.major}.{v.minor}"


def parse_meminfo(text: str, field: str = "MemAvailable") -> float | None:
    """A field of /proc/meminfo (MemAvailable unless named: MemTotal), in GB (None when absent)."""
    for line in text.splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024**2
    return None


def cgroup_limit_gb(limit: str) -> float | None:
    """A cgroup memory limit in GB; None for no limit (v2 "max", v1's page-rounded 2**63)."""
    limit = limit.strip()
    if not limit.isdigit() or int(limit) >= 1 << 60:
        return None
    return int(limit) / 1024**3


def cgroup_memory_files(text: str) -> list[tuple[str, str]]:
    """(limit file, usage file) of this process's memory cgroup, from /proc/self/cgroup, relative to
    /sys/fs/cgroup: v1's memory controller ("4:memory:/slurm/uid_0/job_42") and v2's unified one
    ("0::/system.slice/x.scope")."""
    files = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        path = parts[2].strip().rstrip("/")
        if "memory" in parts[1].split(","):
            files.append((f"memory{path}/memory.limit_in_bytes", f"memory{path}/memory.usage_in_bytes"))
        elif parts[0] == "0" and not parts[1]:
            files.append(
                (f"{path.lstrip('/')}/memory.max".lstrip("/"), f"{path.lstrip('/')}/memory.current".lstrip("/"))
            )
    return files


def cgroup_room_gb(limit: str, current: str) -> float | None:
    """What a cgroup memory limit leaves (limit - usage), in GB; None for no limit (v2 "max", v1's
    page-rounded 2**63)."""
    gb, current = cgroup_limit_gb(limit), current.strip()
    if gb is None or not current.isdigit():
        return None
    return max(0.0, gb - int(current) / 1024**3)


def slurm_memory_gb(env: Mapping[str, str]) -> float | None:
    """A Slurm job's memory (SLURM_MEM_PER_NODE, or SLURM_MEM_PER_CPU x SLURM_CPUS_ON_NODE; MB), in GB."""
    per_node = env.get("SLURM_MEM_PER_NODE", "")
    if per_node.isdigit() and int(per_node) > 0:
        return int(per_node) / 1024
    per_cpu, cpus = env.get("SLURM_MEM_PER_CPU", ""), env.get("SLURM_CPUS_ON_NODE", "")
    if per_cpu.isdigit() and cpus.isdigit() and int(per_cpu) > 0:
        return int(per_cpu) * int(cpus) / 1024
    return None
