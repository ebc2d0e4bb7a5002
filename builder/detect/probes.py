"""Probes: the one place each external fact is asked for (a command, a file, a library call).

Each returns data through a parser beside it; the runner is passed in, so tests hand in
captured outputs and fake toolkits for what this machine lacks.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from builder.detect.model import (
    NEEDED_HEADERS,
    Compiler,
    Cpu,
    Gpu,
    Libraries,
    Runner,
    Toolkit,
    TorchFacts,
)
from builder.detect.parsers import (
    cgroup_limit_gb,
    cgroup_memory_files,
    cgroup_room_gb,
    host_range_fallback,
    parse_compiler_version,
    parse_gpu_archs,
    parse_host_config,
    parse_meminfo,
    parse_nvcc_version,
    parse_smi,
    parse_smi_cuda,
    slurm_memory_gb,
)
from builder.files import is_file_here
from builder.resources import resource

# ---------------------------------------------------------------- probes


def probe_gpus(run: Runner, torch_gpus: Sequence[Gpu] = ()) -> tuple[list[Gpu], str, str | None, str | None]:
    """GPUs, their source, driver version and driver CUDA: NVML, then nvidia-smi, then torch."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            gpus = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
                name = pynvml.nvmlDeviceGetName(h)
                mem = pynvml.nvmlDeviceGetMemoryInfo(h).total // (1 << 20)
                gpus.append(Gpu(i, name if isinstance(name, str) else name.decode(), f"{major}.{minor}", int(mem)))
            driver = pynvml.nvmlSystemGetDriverVersion()
            cuda = pynvml.nvmlSystemGetCudaDriverVersion()
            return gpus, "nvml", str(driver), f"{cuda // 1000}.{cuda % 1000 // 10}"
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no library, no driver, no GPU: try the next source
        pass
    query = "index,name,compute_cap,memory.total,driver_version"
    smi = run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"])
    gpus, driver = parse_smi(smi)
    if gpus:
        return gpus, "nvidia-smi", driver, parse_smi_cuda(run(["nvidia-smi"]))
    if torch_gpus:
        return list(torch_gpus), "torch", None, None
    return [], "none", None, None


TORCH_PROBE = resource("torch_probe.py")


def probe_torch(python: str, run: Runner) -> tuple[TorchFacts, list[Gpu]]:
    text = run([python, str(TORCH_PROBE)]).strip()
    return parse_torch_probe(python, text.splitlines()[-1] if text else "")


def parse_torch_probe(python: str, line: str) -> tuple[TorchFacts, list[Gpu]]:
    if not line:
        return TorchFacts(python=python, version=None, error=f"{python} could not be run"), []
    try:  # another interpreter's output: anything at all (a wrapper's banner, bytes that are not UTF-8)
        data = json.loads(line)
        if "error" in data:
            return TorchFacts(python=python, version=None, error=str(data["error"])), []
        gpus = [Gpu(*g) for g in data.pop("gpus")]
        facts = TorchFacts(
            python=python,
            version=str(data["version"]),
            cuda=data["cuda"],
            cxx11_abi=data["cxx11_abi"],
            arch_list=tuple(data["arch_list"]),
            nccl=data["nccl"],
            site_packages=data["site_packages"],
            pip_cuda_include=tuple(data["pip_cuda_include"]),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return TorchFacts(python=python, version=None, error=f"{python} printed no torch report: {line[:120]!r}"), []
    return facts, gpus


def _is_toolkit(root: Path) -> bool:
    """nvcc plus the toolkit's headers: /usr/local (holding only a wrapper bin/nvcc) is not one."""
    inc = root / "include"
    return is_file_here(root / "bin" / "nvcc") and (
        is_file_here(inc / "crt" / "host_config.h") or is_file_here(inc / "cuda_runtime.h")
    )


def is_toolkit(root: Path) -> bool:
    """Whether `root` is a CUDA toolkit folder (bin/nvcc and its headers)."""
    return _is_toolkit(root)


def toolkit_roots(env: Mapping[str, str], search: Sequence[Path], site_packages: str | None) -> dict[Path, list[str]]:
    """Candidate toolkit folders (resolved) and what pointed at each."""
    found: dict[Path, list[str]] = {}

    def add(path: Path | None, how: str) -> None:
        if path and _is_toolkit(path):
            hows = found.setdefault(path.resolve(), [])
            if how not in hows:
                hows.append(how)

    for var in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(var):
            add(Path(env[var]), var)
    for d in env.get("PATH", "").split(os.pathsep):
        nvcc = Path(d) / "nvcc"
        if d and is_file_here(nvcc):
            add(nvcc.resolve().parent.parent, "PATH")
            # A wrapper script (`exec /usr/local/cuda-13.0/bin/nvcc "$@"`) names its toolkit.
            try:
                m = re.search(r"(/\S+)/bin/nvcc\b", nvcc.read_text(errors="ignore")[:4096])
            except OSError:
                m = None
            if m:
                add(Path(m.group(1)), "PATH")
    for root in search:
        for cand in sorted(root.glob("cuda*")) if root.is_dir() else []:
            add(cand, str(root / "cuda*"))
    if site_packages:
        for cand in sorted(Path(site_packages).glob("nvidia/*")):
            add(cand, "pip nvidia package")
    return found


def probe_toolkits(
    env: Mapping[str, str], run: Runner, search: Sequence[Path], site_packages: str | None
) -> list[Toolkit]:
    toolkits = []
    for root, how in toolkit_roots(env, search, site_packages).items():
        nvcc = root / "bin" / "nvcc"
        version = parse_nvcc_version(run([str(nvcc), "--version"]))
        if not version:
            continue
        header = root / "include" / "crt" / "host_config.h"
        host = parse_host_config(header.read_text(errors="ignore")) if header.is_file() else None
        missing = tuple(h for h in NEEDED_HEADERS if not (root / "include" / h).is_file())
        archs = parse_gpu_archs(run([str(nvcc), "--list-gpu-arch"]))
        toolkits.append(
            Toolkit(str(root), str(nvcc), version, tuple(how), host or host_range_fallback(version), missing, archs)
        )
    return toolkits


def probe_compilers(env: Mapping[str, str], run: Runner) -> tuple[list[Compiler], str | None]:
    """gcc/g++/clang/clang++ and every -N variant on PATH, first hit per name; and the default gcc."""
    pattern = re.compile(r"^(gcc|g\+\+|clang|clang\+\+)(-\d+)?$")
    seen: dict[str, Compiler] = {}
    for d in env.get("PATH", "").split(os.pathsep):
        try:
            names = sorted(os.listdir(d)) if d else []
        except OSError:  # a folder that is not there, or that this user may not read: nothing found in it
            continue
        for name in names:
            path = os.path.join(d, name)
            if name in seen or not pattern.match(name) or not os.access(path, os.X_OK):
                continue
            kind = "clang" if name.startswith("clang") else "gcc"
            text = run([path, "--version"] if kind == "clang" else [path, "-dumpfullversion", "-dumpversion"])
            version = parse_compiler_version(text)
            if version:
                seen[name] = Compiler(kind, name, path, version)
    default = seen.get("gcc")
    return sorted(seen.values(), key=lambda c: c.name), default.version if default else None


def probe_cpu() -> Cpu:
    import cpuinfo

    info = cpuinfo.get_cpu_info()
    flags = set(info.get("flags", []))
    simd = [f for f in ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "amx_tile") if f in flags]
    return Cpu(brand=info.get("brand_raw", ""), arch=info.get("arch", ""), simd=tuple(simd))


def probe_libraries(toolkit_root: str | None, site_packages: str | None, nccl: str | None) -> Libraries:
    aio = bool(ctypes.util.find_library("aio")) and Path("/usr/include/libaio.h").is_file()
    bases = [Path(toolkit_root) / "lib64"] if toolkit_root else []
    bases += [Path(site_packages) / "nvidia"] if site_packages else []
    cufile = next((str(p) for base in bases if base.is_dir() for p in base.rglob("libcufile.so*")), None)
    return Libraries(libaio=aio, cufile=cufile, nccl=nccl)


def total_memory_gb(root: Path = Path("/")) -> float | None:
    """The memory this process's builds may ever have: the machine's MemTotal, or its cgroup's
    limit where lower. What units.memory shares out between builders; None where nothing can be read."""
    found = [parse_meminfo(_read(root, "proc/meminfo") or "", "MemTotal")]
    for limit_file, _ in cgroup_memory_files(_read(root, "proc/self/cgroup") or ""):
        found.append(cgroup_limit_gb(_read(root, f"sys/fs/cgroup/{limit_file}") or ""))
    known = [gb for gb in found if gb is not None]
    return min(known) if known else None


def _read(root: Path, rel: str) -> str | None:
    try:
        return (root / rel).read_text(encoding="utf-8")
    except OSError:
        return None


def available_memory_gb(env: Mapping[str, str] | None = None, root: Path = Path("/")) -> float | None:
    """Memory free for compile jobs now: the least of the machine's MemAvailable, what this process's
    cgroup (v2) memory limit leaves, and a Slurm job's memory. A login node other builds share, or a
    Slurm job confined to its allocation, gets its own room, not the machine's. None where nothing
    can be read. Asked again before each unit starts (units.runner), not only once."""

    found = []
    meminfo = _read(root, "proc/meminfo")
    if meminfo is not None:
        found.append(parse_meminfo(meminfo))
    for limit_file, usage_file in cgroup_memory_files(_read(root, "proc/self/cgroup") or ""):
        limit, current = _read(root, f"sys/fs/cgroup/{limit_file}"), _read(root, f"sys/fs/cgroup/{usage_file}")
        if limit is not None and current is not None:
            found.append(cgroup_room_gb(limit, current))
    found.append(slurm_memory_gb(os.environ if env is None else env))
    known = [gb for gb in found if gb is not None]
    return min(known) if known else None
