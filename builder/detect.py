"""detect: what this machine has for building and running DeepSpeed ops.

Each external fact comes from one small probe (a command, a file, a library call) and is turned
into data by a pure parser beside it, tested against captured outputs. `detect()` takes the world
as arguments (environment, command runner, filesystem roots) so tests can hand it fake toolkits
and fake nvidia-smi output for GPUs this machine lacks.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import Version

from builder.cmd import query

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
    cpu: Mapping[str, Any]
    libraries: Mapping[str, Any]
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


def arch_list(gpus: Sequence[Gpu]) -> list[str]:
    """The deduplicated, sorted arch list that covers every GPU."""
    return sorted({g.capability for g in gpus}, key=lambda cc: tuple(int(x) for x in cc.split(".")))


def cuda_major_minor(version: str | None) -> str | None:
    if not version:
        return None
    v = Version(version)
    return f"{v.major}.{v.minor}"


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


_TORCH_PROBE = r"""
import json, sys, sysconfig
try:
    import torch
except Exception as exc:
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}"})); sys.exit()
import glob, os
site = sysconfig.get_paths()["purelib"]
out = {"version": torch.__version__, "cuda": torch.version.cuda,
       "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI), "site_packages": site,
       "arch_list": [], "nccl": None, "gpus": [],
       "pip_cuda_include": sorted(glob.glob(os.path.join(site, "nvidia", "*", "include")))}
if torch.version.cuda:
    out["arch_list"] = torch.cuda.get_arch_list() if torch.cuda.is_available() else []
    try:
        v = torch.cuda.nccl.version()
        out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception:
        pass
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            out["gpus"].append([i, p.name, f"{p.major}.{p.minor}", p.total_memory // (1 << 20)])
print(json.dumps(out))
"""


def probe_torch(python: str, run: Runner) -> tuple[TorchFacts, list[Gpu]]:
    text = run([python, "-c", _TORCH_PROBE]).strip()
    return parse_torch_probe(python, text.splitlines()[-1] if text else "")


def parse_torch_probe(python: str, line: str) -> tuple[TorchFacts, list[Gpu]]:
    if not line:
        return TorchFacts(python=python, version=None, error=f"{python} could not be run"), []
    data = json.loads(line)
    if "error" in data:
        return TorchFacts(python=python, version=None, error=data["error"]), []
    gpus = [Gpu(*g) for g in data.pop("gpus")]
    facts = TorchFacts(
        python=python,
        version=data["version"],
        cuda=data["cuda"],
        cxx11_abi=data["cxx11_abi"],
        arch_list=tuple(data["arch_list"]),
        nccl=data["nccl"],
        site_packages=data["site_packages"],
        pip_cuda_include=tuple(data["pip_cuda_include"]),
    )
    return facts, gpus


def _is_toolkit(root: Path) -> bool:
    """nvcc plus the toolkit's headers: /usr/local (holding only a wrapper bin/nvcc) is not one."""
    inc = root / "include"
    return (root / "bin" / "nvcc").is_file() and (
        (inc / "crt" / "host_config.h").is_file() or (inc / "cuda_runtime.h").is_file()
    )


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
        if d and nvcc.is_file():
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
        if not d or not os.path.isdir(d):
            continue
        for name in sorted(os.listdir(d)):
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


def probe_cpu() -> dict[str, Any]:
    import cpuinfo

    info = cpuinfo.get_cpu_info()
    flags = set(info.get("flags", []))
    simd = [f for f in ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "amx_tile") if f in flags]
    return {"brand": info.get("brand_raw", ""), "arch": info.get("arch", ""), "simd": simd}


def probe_libraries(toolkit_root: str | None, site_packages: str | None) -> dict[str, Any]:
    aio = bool(ctypes.util.find_library("aio")) and Path("/usr/include/libaio.h").is_file()
    bases = [Path(toolkit_root) / "lib64"] if toolkit_root else []
    bases += [Path(site_packages) / "nvidia"] if site_packages else []
    cufile = next((str(p) for base in bases if base.is_dir() for p in base.rglob("libcufile.so*")), None)
    return {"libaio": aio, "cufile": cufile}


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


def cpu_problems(cpu: Mapping[str, Any]) -> list[Problem]:
    if "avx512f" in cpu.get("simd", []):
        return [Problem(
            "warning",
            "this CPU has AVX-512 and DeepSpeed compiles CPU ops with -march=native: a wheel built here "
            "can crash with 'illegal instruction' on nodes without AVX-512",
            "build CPU ops on the oldest CPU of the cluster, or for a portable x86-64 target",
        )]  # fmt: skip
    return []


# ---------------------------------------------------------------- entry point


def detect(
    env: Mapping[str, str],
    python: str,
    run: Runner = query,
    search: Sequence[Path] = (Path("/usr/local"), Path("/opt")),
    wanted_archs: Sequence[str] = (),
) -> Report:
    torch, torch_gpus = probe_torch(python, run)
    cpu = probe_cpu()
    gpus, gpu_source, driver, driver_cuda = probe_gpus(run, torch_gpus)
    toolkits = probe_toolkits(env, run, search, torch.site_packages)
    chosen = choose_toolkit(toolkits, torch.cuda)
    compilers, default_gcc = probe_compilers(env, run)
    return Report(
        gpus=tuple(gpus),
        gpu_source=gpu_source,
        driver=driver,
        driver_cuda=driver_cuda,
        toolkits=tuple(toolkits),
        chosen_toolkit=chosen.root if chosen else None,
        torch=torch,
        compilers=tuple(compilers),
        default_gcc=default_gcc,
        cpu=cpu,
        libraries={**probe_libraries(chosen.root if chosen else None, torch.site_packages), "nccl": torch.nccl},
        problems=tuple(
            find_problems(gpus, toolkits, chosen, torch, compilers, default_gcc, driver_cuda, wanted_archs)
            + cpu_problems(cpu)
        ),
    )


def render_table(report: Report) -> str:
    """The human-readable report."""
    rows: list[tuple[str, str]] = []
    if report.gpus:
        for g in report.gpus:
            rows.append((f"GPU {g.index}", f"{g.name}, compute capability {g.capability}, {g.memory_mib} MiB"))
        rows.append(("arch list", ";".join(report.arch_list)))
    else:
        rows.append(("GPUs", "none visible"))
    rows.append(("GPU source", report.gpu_source))
    rows.append(("driver", f"{report.driver or '-'} (CUDA {report.driver_cuda or '-'})"))
    for t in report.toolkits:
        mark = "*" if t.root == report.chosen_toolkit else " "
        host = t.host_range
        limits = f"gcc <= {host.gcc_max}, clang <= {host.clang_max} ({host.source})" if host else "unknown"
        rows.append((f"{mark}CUDA {t.version}", f"{t.root} via {', '.join(t.found_by)}; host {limits}"))
        if t.missing_headers:
            rows.append(("  lacks", ", ".join(t.missing_headers)))
    if not report.toolkits:
        rows.append(("CUDA toolkits", "none found"))
    tf = report.torch
    if tf.version:
        rows.append(("torch", f"{tf.version} (CUDA {tf.cuda or 'none'}, C++11 ABI {tf.cxx11_abi}) in {tf.python}"))
        if tf.pip_cuda_include:
            rows.append(("pip CUDA headers", ", ".join(tf.pip_cuda_include)))
    else:
        rows.append(("torch", f"not usable in {tf.python}: {tf.error}"))
    for c in report.compilers:
        rows.append((c.name, f"{c.version} ({c.path})"))
    rows.append(("CPU", f"{report.cpu.get('brand', '')}; SIMD {' '.join(report.cpu.get('simd', []))}"))
    libs = report.libraries
    rows.append(("libraries", f"libaio {'yes' if libs.get('libaio') else 'no'}, cufile {libs.get('cufile') or 'no'}, "
                              f"NCCL {libs.get('nccl') or 'no'}"))  # fmt: skip
    if report.deepspeed_ops:
        good = [n for n, o in sorted(report.deepspeed_ops.items()) if o["compatible"]]
        rows.append(("DeepSpeed ops", f"buildable here: {', '.join(good)}"))
        for name, op in sorted(report.deepspeed_ops.items()):
            if not op["compatible"]:
                rows.append((f"  {name}", f"not buildable: {op['why'][:160] or 'DeepSpeed says incompatible'}"))
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    for p in report.problems:
        lines.append(f"{p.severity.upper()}: {p.message}\n  fix: {p.fix}")
    return "\n".join(lines) + "\n"


def parse_meminfo(text: str) -> float | None:
    """MemAvailable from /proc/meminfo, in GB (None when absent)."""
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024**2
    return None


def available_memory_gb() -> float | None:
    """Memory free for compile jobs now; None where /proc/meminfo cannot be read."""
    try:
        return parse_meminfo(Path("/proc/meminfo").read_text(encoding="utf-8"))
    except OSError:
        return None
