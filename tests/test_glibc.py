"""The glibc floor: symbol versions read from real .so files, the manylinux tag they allow, the
WHEEL file retagged, and the node's own check."""

from __future__ import annotations

import _ctypes
import os
import shutil
import sys
from pathlib import Path

import pytest

from builder.glibc import needed_versions, newest, platform_tags, retag
from builder.node import Node, glibc_floor, glibc_mismatch

# What the cpu recipe's .so files need when built on this Debian 12 host with gcc 12 (read with
# auditwheel show): GLIBC_2.34 and GLIBCXX_3.4.30 are newer than manylinux_2_28 allows.
DEBIAN12_BUILD = {
    "libc.so.6": {"GLIBC_2.2.5", "GLIBC_2.14", "GLIBC_2.17", "GLIBC_2.32", "GLIBC_2.34"},
    "libm.so.6": {"GLIBC_2.2.5", "GLIBC_2.29"},
    "libstdc++.so.6": {"GLIBCXX_3.4", "GLIBCXX_3.4.30", "CXXABI_1.3", "CXXABI_1.3.9"},
    "libgcc_s.so.1": {"GCC_3.0"},
}


def test_symbol_versions_give_the_manylinux_floor() -> None:
    assert platform_tags(DEBIAN12_BUILD) == ("manylinux_2_35_x86_64",)
    assert newest(DEBIAN12_BUILD) == {"GLIBC": "2.34", "GLIBCXX": "3.4.30", "CXXABI": "1.3.9"}
    old = {"libc.so.6": {"GLIBC_2.2.5", "GLIBC_2.14"}, "libstdc++.so.6": {"GLIBCXX_3.4.11"}}
    assert platform_tags(old) == ("manylinux2014_x86_64", "manylinux_2_17_x86_64")
    assert platform_tags({"libc.so.6": {"GLIBC_9.99"}}) == ("linux_x86_64",)  # nothing covers it


def test_a_real_shared_object_is_read(tmp_path: Path) -> None:
    shutil.copy(_ctypes.__file__, tmp_path / "x.so")
    needs = needed_versions(tmp_path)
    assert any(v.startswith("GLIBC_") for v in needs["libc.so.6"])
    (tag,) = [t for t in platform_tags(needs) if t.startswith("manylinux_")]
    floor = glibc_floor(tag)
    host = tuple(int(x) for x in os.confstr("CS_GNU_LIBC_VERSION").split()[-1].split("."))  # type: ignore[union-attr]
    assert floor is not None and floor <= host  # built here, so it runs here


def test_retag_rewrites_every_tag_line(tmp_path: Path) -> None:
    info = tmp_path / "deepspeed-0.19.8.dist-info"
    info.mkdir()
    # As setuptools writes it: a blank line after the headers (a Tag line after it would be body).
    (info / "WHEEL").write_text("Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp311-cp311-linux_x86_64\n\n")
    retag(tmp_path, ("manylinux2014_x86_64", "manylinux_2_17_x86_64"))
    assert (info / "WHEEL").read_text().splitlines() == [
        "Wheel-Version: 1.0",
        "Root-Is-Purelib: false",
        "Tag: cp311-cp311-manylinux2014_x86_64",
        "Tag: cp311-cp311-manylinux_2_17_x86_64",
    ]


def test_the_node_checks_the_floor() -> None:
    assert glibc_floor("manylinux_2_35_x86_64") == (2, 35)
    assert glibc_floor("manylinux2014_x86_64.manylinux_2_17_x86_64") == (2, 17)
    assert glibc_floor("linux_x86_64") is None
    name = "deepspeed-0.19.8+cpu.torch2.13-cp311-cp311-manylinux_2_35_x86_64.whl"
    rocky8 = Node("cp311", "2.13.0+cpu", None, (), frozenset(), glibc="2.28")
    assert glibc_mismatch(name, rocky8) == (
        "needs glibc 2.35 or newer: RHEL 10+, Debian 12+, Ubuntu 22.04+ (built on a newer OS), node has glibc 2.28"
    )
    assert glibc_mismatch(name, Node("cp311", None, None, glibc="2.36")) is None
    assert glibc_mismatch(name, Node("cp311", None, None, glibc="2.100")) is None  # compared as numbers
    assert glibc_mismatch(name.replace("manylinux_2_35", "linux"), rocky8) is None


def test_the_node_probe_reports_its_glibc_and_a_bad_value_is_refused() -> None:
    from builder.node import InstallError, parse_node_probe

    good = '{"python_tag": "cp311", "torch": null, "cuda": null, "gpus": [], "glibc": "2.36"}'
    assert parse_node_probe(good, frozenset()).glibc == "2.36"
    musl = '{"python_tag": "cp311", "torch": null, "cuda": null, "gpus": [], "glibc": null}'
    assert parse_node_probe(musl, frozenset()).glibc is None  # not glibc: pip's own tag check decides
    for bad in ('"2.36; rm -rf /"', '"glibc 2.36"', "236"):
        hostile = '{"python_tag": "cp311", "torch": null, "cuda": null, "gpus": [], "glibc": ' + bad + "}"
        with pytest.raises(InstallError, match="glibc"):
            parse_node_probe(hostile, frozenset())


@pytest.mark.spawns
def test_this_nodes_probe_finds_its_glibc() -> None:
    from builder.node import probe_node

    node = probe_node(sys.executable)
    assert node.glibc == os.confstr("CS_GNU_LIBC_VERSION").split()[-1]  # type: ignore[union-attr]


@pytest.mark.spawns
def test_the_node_probe_reads_a_cpu_torch_without_importing_it_and_asks_a_gpu_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FAKE torch packages holding only what the probe reads, put first on the path: a CPU build's
    version.py answers alone (its __init__ would stop the probe if it were imported: importing torch
    cost every node and every test probing the toolkit's Python 2.5 s); a CUDA build is imported and
    asked for its GPUs, as before."""
    from builder.node import probe_node

    cpu = tmp_path / "cpu" / "torch"
    cpu.mkdir(parents=True)
    (cpu / "__init__.py").write_text("raise SystemExit('torch was imported')\n")
    (cpu / "version.py").write_text("from typing import Optional\n__version__ = '2.13.0+cpu'\n"
                                    "cuda: Optional[str] = None\nhip: Optional[str] = None\n")  # fmt: skip
    gpu = tmp_path / "gpu" / "torch"
    gpu.mkdir(parents=True)
    (gpu / "version.py").write_text("__version__ = '2.14.1+cu130'\ncuda = '13.0'\nhip = None\n")
    (gpu / "__init__.py").write_text(
        "from torch import version\n__version__ = version.__version__\n\n\nclass cuda:\n"
        "    is_available = staticmethod(lambda: True)\n    device_count = staticmethod(lambda: 2)\n"
        "    get_device_capability = staticmethod(lambda i: (9, 0) if i == 0 else (8, 0))\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(cpu.parent))
    node = probe_node(sys.executable)
    assert (node.torch, node.cuda, node.gpus) == ("2.13.0+cpu", None, ())
    monkeypatch.setenv("PYTHONPATH", str(gpu.parent))
    node = probe_node(sys.executable)
    assert (node.torch, node.cuda, node.gpus) == ("2.14.1+cu130", "13.0", ("9.0", "8.0"))
