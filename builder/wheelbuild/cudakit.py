"""The CUDA toolkit a build uses: the machine's, or nvcc installed from pip to match torch.

NVIDIA publishes the CUDA 13 compiler as wheels (`nvidia-cuda-nvcc` holds nvcc, cudafe++,
fatbinary, nvlink and ptxas under nvidia/cu13/, with `nvidia-cuda-crt`, `-cccl`, `-runtime` and
`nvidia-nvvm` beside it), so a build host needs no system toolkit to build for torch's exact CUDA.
The CUDA 12 wheels (`nvidia-cuda-nvcc-cu12` 12.9.86) hold only ptxas and libnvvm: no nvcc.

`pip_version_for` is pure; `install` is the only writer, into a folder of the work dir's cache,
made under a temporary name and renamed when complete, so a killed install is never used.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from builder import envs, output
from builder.cmd import query
from builder.detect import Report, Toolkit, cuda_major_minor, probe_toolkits
from builder.errors import ToolError

# The wheels that make a toolkit, each pinned to torch's CUDA major.minor (the nvcc wheel's own
# dependencies are unpinned and would bring the newest CUDA).
PIP_PACKAGES = ("nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-cuda-cccl", "nvidia-cuda-runtime", "nvidia-nvvm")
FIRST_PIP_MAJOR = 13  # the first CUDA whose nvcc is on PyPI
SEARCH_ENV = "DS_BUILDER_CUDA_SEARCH"  # folders searched for cuda* toolkits; default /usr/local:/opt
DEFAULT_SEARCH = (Path("/usr/local"), Path("/opt"))


def search_roots(env: Mapping[str, str]) -> tuple[Path, ...]:
    """Where detect looks for cuda* folders: DS_BUILDER_CUDA_SEARCH (":"-separated, empty for
    nowhere) or /usr/local and /opt."""
    if SEARCH_ENV not in env:
        return DEFAULT_SEARCH
    return tuple(Path(p) for p in env[SEARCH_ENV].split(os.pathsep) if p)


def pip_version_for(choice: str, report: Report) -> str | None:
    """The CUDA major.minor to install from pip, or None to use the machine's toolkit (pure).

    "auto" installs from pip only when no toolkit here has torch's CUDA major.minor; "pip" always;
    "system" never. Fails with the exact toolkit to install where pip has no nvcc for it.
    """
    want = cuda_major_minor(report.torch.cuda)
    if choice == "system" or want is None:
        return None
    exact = [t for t in report.toolkits if cuda_major_minor(t.version) == want]
    if choice == "auto" and exact:
        return None
    if int(want.split(".")[0]) >= FIRST_PIP_MAJOR:
        return want
    if choice == "auto" and report.chosen_toolkit:  # same major, other minor: torch accepts it
        return None
    raise ToolError(
        f"torch was built with CUDA {want} and no CUDA {want} toolkit is on this machine; "
        f"PyPI has no nvcc for CUDA {want.split('.')[0]} (nvidia-cuda-nvcc-cu12 holds only ptxas and libnvvm)",
        f"install the CUDA {want} toolkit (NVIDIA's runfile or cuda-toolkit-{want.replace('.', '-')} package) "
        "and set CUDA_HOME to it",
    )


def install(cuda: str, cache: Path, log: Path) -> Path:
    """A toolkit root for CUDA `cuda` (major.minor) made from pip's nvcc wheels, cached."""
    major = cuda.split(".")[0]
    folder = cache / f"cuda-{cuda}"
    root = folder / "nvidia" / f"cu{major}"
    if (folder / envs.COMPLETE).is_file():
        return root
    cache.mkdir(parents=True, exist_ok=True)
    output.step(f"toolkit: installing nvcc for CUDA {cuda} from pip ({', '.join(PIP_PACKAGES)})")
    tmp = Path(tempfile.mkdtemp(prefix=f".cuda-{cuda}-", dir=cache))
    try:
        envs.install_into(tmp, [f"{name}=={cuda}.*" for name in PIP_PACKAGES], log)
        staged = tmp / "nvidia" / f"cu{major}"
        if not (staged / "bin" / "nvcc").is_file():
            raise ToolError(
                f"the nvidia-cuda-nvcc wheels for CUDA {cuda} hold no bin/nvcc", "install a system toolkit instead"
            )
        _torch_layout(staged)
        (tmp / envs.COMPLETE).write_text("\n".join(PIP_PACKAGES) + "\n", encoding="utf-8")
        tmp.chmod(0o755)  # mkdtemp made it private; the cache is read like any toolkit
        shutil.rmtree(folder, ignore_errors=True)  # an incomplete one from a killed run
        tmp.rename(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def _torch_layout(root: Path) -> None:
    """What torch's cpp_extension expects of CUDA_HOME: lib64/ and an unversioned libcudart.so."""
    lib = root / "lib"
    if not (root / "lib64").exists():
        (root / "lib64").symlink_to("lib")
    versioned = sorted(lib.glob("libcudart.so.*"))
    if versioned and not (lib / "libcudart.so").exists():
        (lib / "libcudart.so").symlink_to(versioned[0].name)


def pip_toolkit(root: Path) -> Toolkit:
    """The installed pip toolkit as detect describes any toolkit, its origin recorded."""
    found = probe_toolkits({"CUDA_HOME": str(root)}, query, (), None)
    if not found:
        raise ToolError(f"{root} is not a working CUDA toolkit (nvcc --version failed)", f"delete {root.parents[1]}")
    versions = sorted(p.name for p in root.parents[1].glob("nvidia_cuda_nvcc-*.dist-info"))
    origin = versions[0].removesuffix(".dist-info").replace("nvidia_cuda_nvcc-", "pip nvidia-cuda-nvcc==")
    return dataclasses.replace(found[0], found_by=(origin,))
