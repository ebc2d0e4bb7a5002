"""Where nvcc comes from: the machine's toolkit, or pip's nvcc wheels matched to torch's CUDA."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.detect import Cpu, HostRange, Libraries, Report, Toolkit, TorchFacts
from builder.errors import ToolError
from builder.wheelbuild.cudakit import DEFAULT_SEARCH, pip_version_for, search_roots


def kit(version: str, root: str) -> Toolkit:
    return Toolkit(root, f"{root}/bin/nvcc", version, ("PATH",), HostRange(None, 15, 3, 20, "t"), ())


def report(torch_cuda: str | None, *kits: Toolkit) -> Report:
    torch = TorchFacts("python", "2.14.1", torch_cuda, True)
    chosen = kits[0].root if kits else None
    return Report((), "none", None, None, kits, chosen, torch, (), None, Cpu(), Libraries())


def test_auto_uses_an_exact_toolkit_and_installs_nvcc_where_there_is_none() -> None:
    cuda130 = kit("13.0", "/usr/local/cuda-13.0")
    assert pip_version_for("auto", report("13.0", cuda130)) is None
    assert pip_version_for("auto", report("13.0")) == "13.0"  # nothing here: nvcc 13.0 from pip
    assert pip_version_for("auto", report("13.1", cuda130)) == "13.1"  # same major is not enough
    assert pip_version_for("pip", report("13.0", cuda130)) == "13.0"  # the recipe asks for it
    assert pip_version_for("system", report("13.1", cuda130)) is None  # the toolchain step decides
    assert pip_version_for("auto", report(None, cuda130)) is None  # a torch without CUDA


def test_cuda_12_has_no_nvcc_on_pypi_so_the_error_names_the_toolkit() -> None:
    with pytest.raises(ToolError) as err:
        pip_version_for("auto", report("12.8"))
    assert "torch was built with CUDA 12.8 and no CUDA 12.8 toolkit is on this machine" in err.value.message
    assert "nvidia-cuda-nvcc-cu12 holds only ptxas and libnvvm" in err.value.message
    assert "install the CUDA 12.8 toolkit" in err.value.fix and "cuda-toolkit-12-8" in err.value.fix
    with pytest.raises(ToolError, match="PyPI has no nvcc for CUDA 12"):
        pip_version_for("pip", report("12.8", kit("12.8", "/usr/local/cuda-12.8")))
    # A CUDA 12.4 toolkit for a 12.8 torch: torch accepts a same-major toolkit, as before.
    assert pip_version_for("auto", report("12.8", kit("12.4", "/usr/local/cuda-12.4"))) is None


def test_search_roots_can_hide_the_systems_toolkits() -> None:
    assert search_roots({}) == DEFAULT_SEARCH
    assert search_roots({"DS_BUILDER_CUDA_SEARCH": ""}) == ()
    assert search_roots({"DS_BUILDER_CUDA_SEARCH": "/a:/b"}) == (Path("/a"), Path("/b"))
