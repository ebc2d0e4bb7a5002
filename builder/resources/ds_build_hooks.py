"""Hooks DeepSpeed's own build calls, for what its build offers no setting for (ds-wheel-builder).

Copied into the unpacked source tree as `ds_builder_hooks.py`; the build tree's op_builder and
setup.py each get a one-line call into it at a checked anchor (builder/wheelbuild/source.py). Runs in
the build environment under DeepSpeed's setup.py: standard library only. Without the DS_BUILDER_*
variables every hook returns what DeepSpeed would have used.

- DS_BUILDER_CPU_ARCH / DS_BUILDER_SIMD_WIDTH replace -march=native and the build host's SIMD
  macro: a wheel compiled with -march=native on an AVX-512 host crashes on older nodes (DeepSpeed
  issues 1886, 7556).
- DS_BUILDER_CPU_ARCH_FLAGS spells DS_BUILDER_CPU_ARCH out for a compiler that does not know its
  name (gcc 10, the build root's, has no -march=x86-64-v3: the same instructions flag by flag).
- DS_BUILDER_NO_DEBUG drops -g when the wheel will be stripped anyway: generating debug info took
  a third of the compile time (cpu_adam.cpp 30.6 s with -g, 20.2 s without) and does not change
  GCC's code.
- DS_BUILDER_PARALLEL builds that many extensions at once (pip's PEP 517 build takes no build_ext
  options). torch's BuildExtension writes every extension's ninja file to the one
  build_temp/build.ninja, so extensions built at once would overwrite each other's (seen on the GPU
  machine: "ninja: premature end of file", then ld missing cpu_adam.o); each extension gets its own
  folder under build_temp, named from its sources so that it is the same on every build.
- DS_BUILDER_CPU_LINK gives a CPU accelerator op its own link flags: DeepSpeed 0.19.8's
  CPUOpBuilder.builder() drops extra_ldflags(), so its prebuilt async_io_op.so was linked without
  -laio and fails to load ("undefined symbol: io_submit", found by this toolkit's smoke; ds_report
  still says installed), and deepspeed_ccl_comm without oneCCL's -lccl.
- DS_BUILDER_TORCH_TREE and DS_BUILDER_PYTHON_INCLUDE: a wheel for another machine (aarch64) is
  compiled against that machine's torch (its wheel's headers and libraries, unpacked, never run) and
  Python headers (and, for CUDA ops, DS_BUILDER_CUDA_LIB: that machine's libcudart, where
  cpp_extension would link the one beside this machine's nvcc), while this machine's torch of the
  same version runs the build; set once, when this
  module is first imported (before any op's extension is made). SETUPTOOLS_EXT_SUFFIX (setuptools'
  own) names the .so for the target's interpreter.
- DS_BUILDER_ARCH_LIST is the recipe's full arch list. An op builder that filters archs
  (fp_quantizer keeps 8.0+) writes its narrowed list back to TORCH_CUDA_ARCH_LIST, and every op
  built after it gets the narrowed list too (DeepSpeed issues 7972/7974); the list is put back
  after each op, so only the op that filters loses archs.
"""

from __future__ import annotations

import hashlib
import os
import threading
from typing import Any


def _cross_build() -> None:
    """Point torch's cpp_extension and setuptools' build_ext at the target machine's files."""
    tree = os.environ.get("DS_BUILDER_TORCH_TREE")
    if tree:
        import torch.utils.cpp_extension as extension

        extension._TORCH_PATH = tree
        extension.TORCH_LIB_PATH = os.path.join(tree, "lib")
        cuda_lib = os.environ.get("DS_BUILDER_CUDA_LIB")
        if cuda_lib:  # the target's libcudart, not the one beside this machine's nvcc
            inner = extension.library_paths

            def library_paths(device_type: str = "cpu", *args: Any, **kwargs: Any) -> list[str]:
                paths = inner(device_type, *args, **kwargs)
                if device_type != "cuda":
                    return paths
                home = os.path.realpath(extension.CUDA_HOME or "/nonexistent")
                kept = [p for p in paths if os.path.commonpath([home, os.path.realpath(p)]) != home]
                return [*kept, cuda_lib]

            extension.library_paths = library_paths
    include = os.environ.get("DS_BUILDER_PYTHON_INCLUDE")
    if include:
        from distutils import sysconfig

        import setuptools  # type: ignore[import-untyped]  # noqa: F401  # its distutils, the one build_ext reads

        def get_python_inc(plat_specific: bool = False, prefix: str | None = None) -> str:
            return include

        sysconfig.get_python_inc = get_python_inc  # type: ignore[assignment]


_cross_build()


def cpu_arch() -> str | None:
    """The -march flag to use instead of DeepSpeed's -march=native, if one is set."""
    return os.environ.get("DS_BUILDER_CPU_ARCH") or None


def simd_width() -> str | None:
    """The SIMD macro (-D__AVX256__ ...) to use instead of the build host's, if one is set."""
    return os.environ.get("DS_BUILDER_SIMD_WIDTH") or None


def arch_list(narrowed: str) -> str:
    """What TORCH_CUDA_ARCH_LIST holds after an op filtered it: the recipe's list, if one is set."""
    return os.environ.get("DS_BUILDER_ARCH_LIST") or narrowed


def cpu_link_args(ext: Any, builder: Any) -> Any:
    """A CPU op's extension with the op's own link flags, which DeepSpeed's CPU builder leaves out."""
    if os.environ.get("DS_BUILDER_CPU_LINK"):
        ext.extra_link_args = [
            *getattr(ext, "extra_link_args", []),
            *builder.strip_empty_entries(builder.extra_ldflags()),
        ]
    return ext


def compile_args(args: list[str]) -> list[str]:
    """An op's compile flags, without -g when the wheel will be stripped, and with the -march level
    spelt out flag by flag where the compiler is older than its name (DS_BUILDER_CPU_ARCH_FLAGS: gcc 10
    in the build root does not know -march=x86-64-v3)."""
    if os.environ.get("DS_BUILDER_NO_DEBUG"):
        args = [a for a in args if a != "-g"]
    march, spelt = os.environ.get("DS_BUILDER_CPU_ARCH"), os.environ.get("DS_BUILDER_CPU_ARCH_FLAGS")
    if march and spelt:
        args = [flag for a in args for flag in (spelt.split() if a == march else [a])]
    return args


def parallel_build_ext(base: Any) -> Any:
    """DeepSpeed's build_ext command, building DS_BUILDER_PARALLEL extensions at once, each in its own folder."""
    jobs = int(os.environ.get("DS_BUILDER_PARALLEL") or 1)
    if jobs <= 1:
        return base

    class ParallelBuildExt(base):  # type: ignore[misc]
        _wrap_lock = threading.Lock()

        def finalize_options(self) -> None:
            super().finalize_options()
            self.parallel = jobs

        def build_extension(self, ext: Any) -> None:
            with self._wrap_lock:
                if not getattr(self.compiler, "_ds_own_temp", False):
                    inner = self.compiler.compile

                    def compile(sources: list[str], output_dir: str | None = None, *args: Any, **kwargs: Any) -> Any:
                        if output_dir:
                            key = hashlib.sha1("\0".join(sources).encode()).hexdigest()[:12]
                            output_dir = os.path.join(output_dir, key)
                        return inner(sources, output_dir, *args, **kwargs)

                    self.compiler.compile = compile
                    self.compiler._ds_own_temp = True
            super().build_extension(ext)

    return ParallelBuildExt
