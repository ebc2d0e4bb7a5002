from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from builder.archs import (
    FatbinCode,
    label,
    missing_archs,
    normalize,
    normalize_all,
    parse_fatbin,
    so_archs,
    so_compressed,
)
from builder.errors import RecipeError

DATA = Path(__file__).with_name("data")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("9.0", ("9.0",)),
        ("sm_90", ("9.0",)),
        ("90", ("9.0",)),
        ("compute_90", ("9.0",)),
        ("9.0+PTX", ("9.0+PTX",)),
        ("9.0+ptx", ("9.0+PTX",)),
        ("9.0a", ("9.0a",)),
        ("sm_90a", ("9.0a",)),
        ("sm_100", ("10.0",)),
        ("12.0", ("12.0",)),
        ("Hopper", ("9.0+PTX",)),
        ("ampere", ("8.0", "8.6+PTX")),
    ],
)
def test_normalize(text: str, expected: tuple[str, ...]) -> None:
    assert normalize(text) == expected


@pytest.mark.parametrize(
    "bad", ["", "9", "sm_9", "99.0", "1.0", "hoper", "9.0+SASS", "9.0b", "sm90x", "sm_99", "9.9", "8.1"]
)
def test_nonsense_is_rejected(bad: str) -> None:
    with pytest.raises(RecipeError, match="is not a CUDA architecture"):
        normalize(bad)


@pytest.mark.parametrize(
    ("bad", "why"), [("8.0a", "no a-variant for compute capability 8.0"), ("9.0f", "no f-variant")]
)
def test_arch_specific_variants_only_where_nvcc_has_them(bad: str, why: str) -> None:
    with pytest.raises(RecipeError, match=why):
        normalize(bad)


def test_normalize_all_dedupes_and_sorts() -> None:
    assert normalize_all(["sm_90", "8.0", "90", "10.0", "Ampere"]) == ("8.0", "8.6+PTX", "9.0", "10.0")


def test_label() -> None:
    assert label(["9.0"]) == "sm90"
    assert label(["8.0", "9.0+PTX", "9.0a"]) == "sm80.sm90ptx.sm90a"


def test_fatbin_captured_from_nvcc_13() -> None:
    # .nv_fatbin of a .so built by nvcc 13.0 with sm_80, sm_90 + compute_90 PTX, and sm_90a.
    codes = parse_fatbin((DATA / "fatbin" / "nvcc13-sm80-sm90-ptx90-sm90a.nv_fatbin").read_bytes())
    assert codes == {FatbinCode("sass", 80), FatbinCode("sass", 90), FatbinCode("ptx", 90)}
    assert missing_archs(codes, ["8.0", "9.0+PTX", "9.0a"]) == []
    assert missing_archs(codes, ["8.0+PTX", "8.6", "10.0"]) == ["8.0+PTX", "8.6", "10.0"]
    assert parse_fatbin(b"\x00" * 64) == set()


@pytest.mark.spawns
@pytest.mark.skipif(not Path("/usr/local/cuda/bin/nvcc").exists(), reason="needs nvcc at /usr/local/cuda")
def test_so_archs_reads_a_real_shared_object(tmp_path: Path) -> None:
    cu = tmp_path / "k.cu"
    cu.write_text("__global__ void k(float* x) { x[threadIdx.x] += 1.0f; }\n")

    def nvcc(name: str, *flags: str) -> Path:
        so = tmp_path / name
        subprocess.run(["/usr/local/cuda/bin/nvcc", "-shared", "-Xcompiler", "-fPIC", *flags, str(cu), "-o", str(so)],
                       check=True)  # fmt: skip
        return so

    so = nvcc("k.so", "-gencode", "arch=compute_75,code=sm_75", "-gencode", "arch=compute_90,code=compute_90")
    assert so_archs(so) == {FatbinCode("sass", 75), FatbinCode("ptx", 90)}
    assert not so_compressed(so)
    packed = nvcc("kc.so", "-gencode", "arch=compute_90,code=sm_90", "-Xfatbin", "-compress-all")
    assert so_compressed(packed) and so_archs(packed) == {FatbinCode("sass", 90)}  # archs still read
    host_only = tmp_path / "h.so"
    (tmp_path / "h.c").write_text("int f(void) { return 1; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", str(tmp_path / "h.c"), "-o", str(host_only)], check=True)
    assert so_archs(host_only) == set()
