"""What ops need from outside DeepSpeed: what this toolkit supplies, and what it refuses up front.

DeepSpeed's op builders expect a full system CUDA toolkit and a few system packages. With torch's
own pip CUDA libraries most of what they need is already on disk under another name or folder:
`nccl.h` in site-packages/nvidia/nccl/include (dc), `libcurand.so.10` and `libcufile.so.0` without
the unversioned names the linker looks for (`-lcurand`: transformer, random_ltd, evoformer_attn;
`-lcufile`: gds). CUTLASS (evoformer_attn) is a PyPI package. libaio (async_io, gds) is Debian's
libaio-dev on the build host; its runtime library is carried inside the wheel (see build.graft).

Some needs DeepSpeed's own compatibility check lets through, and the build then fails after
minutes, or with a traceback: those ops are refused here, before anything compiles, with the
reason and the way out. `refusals` and `link_names` are pure; `provide` is the edge.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock
from packaging.version import Version

from builder import cmd, envs, output
from builder.errors import ToolError
from builder.files import link_atomic, make_dirs
from builder.wheelbuild.ops import OpInfo, ProbeReport

# The CPU accelerator's placeholder for ops it lacks: not an op to build.
NOT_OPS = ("deepspeed_not_implemented",)
CUTLASS_REQUIREMENT = "nvidia-cutlass==4.2.0.0"  # headers only are used (--no-deps); DeepSpeed wants >= 3.1
CUTLASS_OPS = ("evoformer_attn",)
STUB_VERSION = "libcuda-stub-2"  # every cuda.h function (1 was empty: gds lost libcuda.so.1 and cuGetErrorName)
# DeepSpeed versions whose fp_quantizer was measured not to compile with nvcc 13.0 (csrc/fp_quantizer/
# fp_quantize_impl.cu(234): template parameter "q_exponent_bits" may not be redeclared in this scope).
FP_QUANTIZER_NVCC13_BROKEN = ("0.19.8",)


@dataclass(frozen=True)
class Refusal:
    """An op left out before compiling: why, and what would let it build."""

    op: str
    reason: str
    fix: str

    def describe(self) -> str:
        return f"{self.op}: {self.reason} ({self.fix})"


def candidates(report: ProbeReport) -> tuple[str, ...]:
    """Every op DeepSpeed offers for the accelerator, in name order."""
    return tuple(sorted(op for op in report.ops if op not in NOT_OPS))


def refusals(
    ops: Sequence[OpInfo],
    report: ProbeReport,
    deepspeed: str,
    nvcc: str | None,
    env: Mapping[str, str],
) -> dict[str, Refusal]:
    """The ops of `ops` that cannot build here, each with its reason (pure)."""
    out: dict[str, Refusal] = {}
    for info in ops:
        refusal = _refusal(info, report, deepspeed, nvcc, env)
        if refusal:
            out[info.name] = refusal
    return out


def _refusal(
    info: OpInfo, report: ProbeReport, deepspeed: str, nvcc: str | None, env: Mapping[str, str]
) -> Refusal | None:
    name = info.name
    if name in ("cutlass_ops", "ragged_device_ops") and not report.modules.get("dskernels", False):
        return Refusal(
            name,
            "its builder imports the deepspeed-kernels package (dskernels) while building, and the build "
            "environment has none (DeepSpeed's compatibility check does not look for it; setup.py stops with "
            "\"No module named 'dskernels'\")",
            "PyPI has only a 2023 development release of deepspeed-kernels, built for sm_80 and CUDA 12: leave the "
            'op out (ops_except = ["' + name + '"]) or install a deepspeed-kernels built for your CUDA and torch into '
            "the build environment",
        )
    if (
        name == "fp_quantizer"
        and nvcc
        and Version(nvcc).major >= 13
        and Version(deepspeed).public in FP_QUANTIZER_NVCC13_BROKEN
    ):
        return Refusal(
            name,
            f"DeepSpeed {deepspeed}'s fp_quantizer does not compile with nvcc {nvcc} (fp_quantize_impl.cu: "
            'template parameter "q_exponent_bits" may not be redeclared in this scope)',
            "build it with a CUDA 12 toolkit and torch, or leave it out",
        )
    if name == "deepspeed_ccl_comm" and not env.get("CCL_ROOT"):
        return Refusal(
            name,
            "it links Intel oneCCL and CCL_ROOT is not set (DeepSpeed's builder would stop with a traceback)",
            "install oneCCL and set CCL_ROOT to it (source its vars.sh), or leave the op out",
        )
    if not info.compatible:
        why = info.why or "DeepSpeed reports it incompatible"
        return Refusal(name, f"DeepSpeed reports it cannot build here: {why}", _fix_for(name))
    return None


def _fix_for(op: str) -> str:
    if op in ("async_io", "gds"):
        return "install libaio-dev on the build host (apt-get install libaio-dev; the wheel carries libaio itself)"
    if op in CUTLASS_OPS:
        return f"the toolkit installs {CUTLASS_REQUIREMENT} for it; set CUTLASS_PATH to a CUTLASS >= 3.1 checkout"
    return "install what it names, or leave the op out"


def wants_cutlass(recipe_ops: Sequence[str], all_ops: bool, excluded: Sequence[str]) -> bool:
    """Whether the recipe may build an op that needs CUTLASS headers (installed before the probe)."""
    wanted = set(CUTLASS_OPS) - set(excluded) if all_ops else set(CUTLASS_OPS) & set(recipe_ops)
    return bool(wanted)


def link_names(lib_dirs: Sequence[Path], listing: Mapping[Path, Sequence[str]]) -> dict[str, Path]:
    """`libX.so` -> the versioned library it should name, for every `libX.so.N` in `lib_dirs` that
    has no unversioned name beside it (the first folder and the shortest version win; pure)."""
    links: dict[str, Path] = {}
    for folder in lib_dirs:
        names = set(listing.get(folder, ()))
        for name in sorted(names, key=lambda n: (len(n), n)):
            base, sep, _ = name.partition(".so.")
            if not sep or not base.startswith("lib") or f"{base}.so" in names or f"{base}.so" in links:
                continue
            links[f"{base}.so"] = folder / name
    return links


def nvidia_lib_dirs(python: Path) -> tuple[list[Path], list[Path]]:
    """(lib folders, include folders) of torch's pip CUDA packages seen by `python`."""
    script = (
        "import json\ntry:\n import nvidia\n print(json.dumps(list(nvidia.__path__)))\n"
        "except ImportError:\n print('[]')"
    )
    said = cmd.query([str(python), "-c", script])
    lines = said.strip().splitlines()
    roots = [Path(p) for p in json.loads(lines[-1])] if lines else []
    libs = sorted({p for r in roots for p in r.glob("*/lib") if p.is_dir()})
    includes = sorted({p for r in roots for p in r.glob("*/include") if p.is_dir()})
    return libs, includes


@dataclass(frozen=True)
class Supplied:
    """Where the supplied needs are: folders added to CPATH and LIBRARY_PATH, CUTLASS's root."""

    include: tuple[str, ...] = ()
    lib: tuple[str, ...] = ()
    cutlass: str | None = None
    # What was supplied, without paths (the same on every machine): it goes into the op units' keys,
    # so a unit built against other link names, another stub or another CUTLASS is built again.
    fingerprint: str = ""

    def apply(self, env: Mapping[str, str]) -> dict[str, str]:
        """`env` with the folders put before what it already names (pure)."""
        out = dict(env)
        for var, extra in (("CPATH", self.include), ("LIBRARY_PATH", self.lib)):
            if extra:
                out[var] = os.pathsep.join([*extra, *filter(None, env.get(var, "").split(os.pathsep))])
        if self.cutlass and not env.get("CUTLASS_PATH"):
            out["CUTLASS_PATH"] = self.cutlass
        return out

    def describe(self) -> str:
        parts = [f"CPATH += {', '.join(self.include)}" if self.include else "",
                 f"LIBRARY_PATH += {', '.join(self.lib)}" if self.lib else "",
                 f"CUTLASS_PATH = {self.cutlass}" if self.cutlass else ""]  # fmt: skip
        return "; ".join(p for p in parts if p) or "nothing"


def provide(
    python: Path,
    toolchain: Path,
    cache: Path,
    toolkit_root: str | None,
    cutlass: bool,
    log: Path,
    env: Mapping[str, str] | None = None,
) -> Supplied:
    """Make what CUDA ops need: link names for torch's pip CUDA libraries (and a link stub for the
    driver's libcuda.so where the toolkit has none, compiled with `env`'s cc: the build's host
    compiler), nccl.h's folder, and CUTLASS when asked."""
    libs, includes = nvidia_lib_dirs(python)
    listing = {d: sorted(os.listdir(d)) for d in libs}
    links = link_names(libs, listing)
    nccl_dirs = [d.name for d in includes if (d / "nccl.h").is_file()]
    what = [STUB_VERSION, sorted((k, v.name) for k, v in links.items()), nccl_dirs, cutlass and CUTLASS_REQUIREMENT]
    fingerprint = hashlib.sha256(json.dumps(what).encode()).hexdigest()[:16]
    digest = hashlib.sha256(json.dumps([fingerprint, sorted((k, str(v)) for k, v in links.items())]).encode())
    folder = toolchain / "lib" / digest.hexdigest()[:12]
    make_dirs(folder)
    for name, target in links.items():
        path = folder / name
        if not (path.is_symlink() and os.readlink(path) == str(target)):
            link_atomic(path, target)
    lib_path = [str(folder)]
    stub = Path(toolkit_root or "/nonexistent") / "lib64" / "stubs"
    if (stub / "libcuda.so").is_file():
        lib_path.append(str(stub))
    else:
        kit_include = [Path(toolkit_root) / "include"] if toolkit_root else []
        _driver_stub(folder / "libcuda.so", [*kit_include, *includes], log, env)
    nccl = [str(d) for d in includes if (d / "nccl.h").is_file()][:1]
    return Supplied(tuple(nccl), tuple(lib_path), str(install_cutlass(cache, log)) if cutlass else None, fingerprint)


_DRIVER_FUNCTION = re.compile(r"\b(cu[A-Z][A-Za-z0-9_]*)\s*\(")


def driver_functions(preprocessed: str) -> list[str]:
    """The driver API's function names as cuda.h declares them after its macros (cuMemAlloc_v2;
    pure): what NVIDIA's libcuda.so link stub exports."""
    return sorted(set(_DRIVER_FUNCTION.findall(preprocessed)))


def _driver_stub(path: Path, include_dirs: Sequence[Path], log: Path, env: Mapping[str, str] | None = None) -> None:
    """A link stub for `-lcuda` (async_io and gds link it), as the stubs/ folder of NVIDIA's full
    toolkit holds: a library named libcuda.so.1 exporting every function cuda.h declares, so an op
    that calls the driver (gds: cuGetErrorName) keeps libcuda.so.1 as a dependency, which the
    node's driver provides at run time; an op that calls none does not (the linker drops it)."""
    if path.is_file():
        return
    header = next((d for d in include_dirs if (d / "cuda.h").is_file()), None)
    if header is None:
        raise ToolError(
            "no cuda.h in the toolkit or torch's CUDA packages: cannot make the libcuda link stub async_io and "
            "gds need",
            "use a CUDA toolkit that has include/cuda.h (its lib64/stubs/libcuda.so is then used)",
        )
    source = path.with_name(f".libcuda-stub.{os.getpid()}.c")
    expanded = path.with_name(f".libcuda-stub.{os.getpid()}.i")
    tmp = path.with_name(f".libcuda.so.{os.getpid()}.tmp")
    try:
        source.write_text("#include <cuda.h>\n", encoding="utf-8")
        cmd.run(["cc", "-E", "-P", "-I", header, "-o", expanded, source], log=log, env=env)
        names = driver_functions(expanded.read_text(encoding="utf-8", errors="replace"))
        source.write_text("".join(f"void {n}(void) {{}}\n" for n in names), encoding="utf-8")
        cmd.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", tmp, source], log=log, env=env)
        tmp.replace(path)
    finally:
        for leftover in (source, expanded, tmp):
            leftover.unlink(missing_ok=True)


def install_cutlass(cache: Path, log: Path) -> Path:
    """CUTLASS's headers from PyPI (nvidia-cutlass), cached; the folder DeepSpeed's CUTLASS_PATH takes."""
    folder = cache / "cutlass" / CUTLASS_REQUIREMENT.replace("==", "-")
    root = folder / "cutlass_library" / "source"
    if (folder / envs.COMPLETE).is_file():
        return root
    make_dirs(folder.parent)
    with FileLock(str(folder) + ".lock"):  # builders sharing the cache: one installs, the others wait
        if (folder / envs.COMPLETE).is_file():
            return root
        output.step(f"needs: installing CUTLASS headers from pip ({CUTLASS_REQUIREMENT}) for evoformer_attn")
        _install_cutlass(folder, log)
    return root


def _install_cutlass(folder: Path, log: Path) -> None:
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    envs.install_into(tmp, [CUTLASS_REQUIREMENT], log, deps=False)
    if not (tmp / "cutlass_library" / "source" / "include" / "cutlass" / "cutlass.h").is_file():
        raise ToolError(f"{CUTLASS_REQUIREMENT} holds no include/cutlass/cutlass.h", "set CUTLASS_PATH yourself")
    (tmp / envs.COMPLETE).write_text(CUTLASS_REQUIREMENT + "\n", encoding="utf-8")
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
