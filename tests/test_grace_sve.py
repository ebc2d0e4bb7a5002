"""Issue 63: the Grace variant, cpu-aarch64's ops built for SVE CPUs (armv8.2-a+sve), cross-built here and
smoked on an emulated aarch64 node shown a Neoverse V2 CPU (Grace's core: a labelled fake description;
qemu-user's default CPU runs SVE code). Its CPU Adam takes DeepSpeed's SVE path, and the smoke checks it
computes what torch computes; how fast it is only a Grace node shows.
"""

from __future__ import annotations

import json
import re
import struct
import zipfile
from pathlib import Path

import pytest
from test_aarch64 import _emulation_ready, build_and_smoke

from builder.machines import HOST

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(HOST != "x86_64", reason="the toolkit cross-builds from an x86_64 host only")


def sve_counts(so: Path) -> int:
    """How many SVE `cntw` instructions (svcntw(): sve.h's vector width) an AArch64 object holds: every
    4-byte word (A64 instructions are aligned) whose encoding is CNTW Xd, with any register and pattern."""
    data = so.read_bytes()
    words = struct.unpack(f"<{len(data) // 4}I", data[: len(data) // 4 * 4])
    return sum(1 for w in words if w & 0xFFF0FC00 == 0x04A0E000 and (w >> 10) & 0x3F == 0x38)


def test_the_cntw_matcher_knows_the_instruction() -> None:
    """cntw x0 (all) is 0x04a0e3e0; cntw x5, mul #2 is 0x04a1e3e5; neither NEON's nor another SVE count."""
    assert [w & 0xFFF0FC00 == 0x04A0E000 and (w >> 10) & 0x3F == 0x38 for w in
            (0x04A0E3E0, 0x04A1E3E5, 0x0420E3E0, 0x4E20D400)] == [True, True, False, False]  # fmt: skip


@pytest.mark.integration
@pytest.mark.skipif(_emulation_ready() is not None, reason=str(_emulation_ready()))
def test_the_sve_variant_is_built_and_its_adam_computes_what_torch_computes_on_an_sve_node(
    workspace: Path, tmp_path: Path
) -> None:
    wheel, _, said = build_and_smoke("cpu-aarch64-sve.toml", workspace, tmp_path)
    assert "shown a neoverse-v2 CPU" in said, said[-3000:]
    for check in ("numerics:cpu_adam", "numerics:cpu_adagrad", "numerics:cpu_lion", "engine:zero2-offload"):
        assert re.search(rf"passed\s+{re.escape(check)}\s", said), check
    assert wheel.name == "deepspeed-0.19.8+cpu.torch2.13.sve-cp311-cp311-manylinux_2_28_aarch64.whl"
    tree = tmp_path / "tree"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(tree)
    (adam,) = tree.glob("deepspeed/ops/adam/cpu_adam_op.*.so")
    assert sve_counts(adam) > 0  # DeepSpeed's SVE path (sve.h) is in it
    (info,) = tree.glob("*.dist-info")
    built = json.loads((info / "ds_builder.json").read_text())
    assert built["cpu_target"] == "armv8.2-a+sve" and built["platform"]["tags"] == ["manylinux_2_28_aarch64"]
