"""Every op: ops = "all", what the toolkit supplies for an op and what it refuses before compiling,
dropping a failed op, and the op table a node is shown (pure rules; the real builds are in
test_pipeline and test_cuda_pipeline)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from builder.build import dropped_reason
from builder.errors import BuildError, RecipeError
from builder.node import Fields, ManifestError, SmokeSummary, WheelEntry, op_table, reason_table
from builder.recipe import load_recipe, parse_recipe
from builder.wheelbuild import graft, needs
from builder.wheelbuild.ops import OpInfo, ProbeReport, parse_probe
from builder.wheelbuild.plan import plan_build, select_ops

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).with_name("data")
BASE: dict[str, Any] = {
    "name": "r",
    "accelerator": "cpu",
    "ops": "all",
    "deepspeed": {"version": "0.19.8", "sha256": "9e491abd0827ea5c389dd702e15e11e13d83d904bac4a20d6c2a4cb37207a9af"},
    "torch": {"version": "2.13.0"},
}


@pytest.fixture
def probe() -> ProbeReport:
    # Real output of ds_probe.py (DeepSpeed 0.19.8, torch 2.13.0+cpu, no libaio installed then).
    return parse_probe((DATA / "probe-cpu-0.19.8.txt").read_text())


def _op(name: str, compatible: bool = True, why: str = "") -> OpInfo:
    return OpInfo(name, f"DS_BUILD_{name.upper()}", f"deepspeed.ops.{name}_op", compatible, why)


def cuda_probe(probe: ProbeReport, dskernels: bool = False) -> ProbeReport:
    """A CUDA probe with the ops whose rules differ (FAKE: built from the CPU probe's shape; the op
    names and what DeepSpeed 0.19.8 says of them are as measured on the CUDA build env)."""
    names = ("cutlass_ops", "ragged_device_ops", "fp_quantizer", "fused_adam", "evoformer_attn", "dc")
    return dataclasses.replace(
        probe, accelerator="cuda", torch=dataclasses.replace(probe.torch, cuda="13.0"),
        ops={n: _op(n) for n in names}, modules={"dskernels": dskernels},
    )  # fmt: skip


def test_ops_all_and_its_exceptions_are_parsed() -> None:
    every = parse_recipe(BASE)
    assert every.all_ops and every.ops == () and every.ops_spec == {"all": []} and every.ops_text == "all"
    some = parse_recipe({**BASE, "ops_except": ["async_io"], "on_op_failure": "drop"})
    assert some.ops_except == ("async_io",) and some.on_op_failure == "drop" and some.ops_text == "all except async_io"
    named = parse_recipe({**BASE, "ops": ["cpu_adam"]})
    assert not named.all_ops and named.ops_spec == ["cpu_adam"] and named.on_op_failure == "fail"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"ops": "every"}, 'ops = "every" is not a list of ops or "all"'),
        ({"ops": ["cpu_adam"], "ops_except": ["async_io"]}, 'ops_except is only for ops = "all"'),
        ({"ops_except": "async_io"}, "ops_except must be a list"),
        ({"ops_except": ["async_io", "async_io"]}, "ops_except lists async_io more than once"),
        ({"on_op_failure": "skip"}, 'on_op_failure = "skip" is not one of fail, drop'),
        ({"on_op_failure": True}, "on_op_failure must be a string"),
    ],
)
def test_bad_op_selections_are_rejected(change: dict[str, Any], expected: str) -> None:
    with pytest.raises(RecipeError) as err:
        parse_recipe({**BASE, **change}, Path("r.toml"))
    assert expected in err.value.message


def test_all_takes_every_op_deepspeed_offers_and_refuses_what_cannot_build(probe: ProbeReport) -> None:
    """On the CPU accelerator, as captured: async_io refused (no libaio then), deepspeed_ccl_comm
    refused (no CCL_ROOT), the placeholder op never built; the others are built."""
    built, missing = select_ops(parse_recipe(BASE), probe, None, {})
    names = [o.name for o in built]
    assert names == ["cpu_adagrad", "cpu_adam", "cpu_lion", "deepspeed_shm_comm", "fused_adam", "pin_memory"]
    assert set(missing) == {"async_io", "deepspeed_ccl_comm"}
    assert "libaio" in missing["async_io"] and "apt-get install libaio-dev" in missing["async_io"]
    assert "CCL_ROOT is not set" in missing["deepspeed_ccl_comm"]
    with_ccl, missing = select_ops(parse_recipe(BASE), probe, None, {"CCL_ROOT": "/opt/oneccl"})
    assert "deepspeed_ccl_comm" in [o.name for o in with_ccl] and "deepspeed_ccl_comm" not in missing
    fewer, _ = select_ops(parse_recipe({**BASE, "ops_except": ["fused_adam", "deepspeed_shm_comm"]}), probe, None, {})
    assert [o.name for o in fewer] == ["cpu_adagrad", "cpu_adam", "cpu_lion", "pin_memory"]


def test_an_unknown_op_in_ops_except_is_an_error(probe: ProbeReport) -> None:
    with pytest.raises(RecipeError, match='unknown op "fused_adma" for the cpu accelerator'):
        select_ops(parse_recipe({**BASE, "ops_except": ["fused_adma"]}), probe, None, {})


def test_a_named_op_that_cannot_build_is_an_error_unless_dropped(probe: ProbeReport) -> None:
    named = parse_recipe({**BASE, "ops": ["cpu_adam", "deepspeed_ccl_comm"]})
    with pytest.raises(BuildError) as err:
        select_ops(named, probe, None, {})
    assert "cannot build deepspeed_ccl_comm here" in err.value.message and "CCL_ROOT" in err.value.message
    assert 'on_op_failure = "drop"' in err.value.fix
    built, missing = select_ops(dataclasses.replace(named, on_op_failure="drop"), probe, None, {})
    assert [o.name for o in built] == ["cpu_adam"] and list(missing) == ["deepspeed_ccl_comm"]
    with pytest.raises(BuildError, match="no op of recipe r can build here"):
        select_ops(parse_recipe({**BASE, "ops": ["async_io"], "on_op_failure": "drop"}), probe, None, {})


def test_ops_deepspeeds_own_check_lets_through_are_refused_before_compiling(probe: ProbeReport) -> None:
    recipe = parse_recipe({**BASE, "accelerator": "cuda", "arch": ["9.0"], "torch": {"version": "2.14.1"}})
    built, missing = select_ops(recipe, cuda_probe(probe), "13.0", {})
    assert [o.name for o in built] == ["dc", "evoformer_attn", "fused_adam"]
    assert "No module named 'dskernels'" in missing["cutlass_ops"] and "deepspeed-kernels" in missing["cutlass_ops"]
    assert "dskernels" in missing["ragged_device_ops"]
    assert "does not compile with nvcc 13.0" in missing["fp_quantizer"]
    # With dskernels in the build env, and with nvcc 12 (or a DeepSpeed not measured broken), they build.
    built, missing = select_ops(recipe, cuda_probe(probe, dskernels=True), "12.8", {})
    assert not missing and len(built) == 6
    newer = dataclasses.replace(recipe, deepspeed=dataclasses.replace(recipe.deepspeed, version="0.20.0"))
    assert "fp_quantizer" not in select_ops(newer, cuda_probe(probe, dskernels=True), "13.0", {})[1]


def test_cutlass_is_installed_only_when_an_op_needs_it() -> None:
    assert needs.wants_cutlass((), True, ())
    assert not needs.wants_cutlass((), True, ("evoformer_attn",))
    assert needs.wants_cutlass(("fused_adam", "evoformer_attn"), False, ())
    assert not needs.wants_cutlass(("fused_adam",), False, ())


def test_link_names_are_made_for_versioned_libraries_only() -> None:
    """torch's pip CUDA libraries as they are on disk here (libcurand.so.10, libcufile.so.0, no
    unversioned names): each gets its link name; a library with one already, or not a lib*.so.N, none."""
    cu13 = Path("/site/nvidia/cu13/lib")
    nccl = Path("/site/nvidia/nccl/lib")
    listing = {
        cu13: ["libcurand.so.10", "libcufile.so.0", "libcufile_rdma.so.1", "libcudart.so.13", "libcudadevrt.a",
               "libnvrtc-builtins.so.13.0", "libnvrtc-builtins.alt.so.13.0", "libcublas.so", "libcublas.so.13"],
        nccl: ["libnccl.so.2", "libcurand.so.11"],
    }  # fmt: skip
    links = needs.link_names([cu13, nccl], listing)
    assert links["libcurand.so"] == cu13 / "libcurand.so.10"  # the first folder wins
    assert links["libcufile.so"] == cu13 / "libcufile.so.0" and links["libnccl.so"] == nccl / "libnccl.so.2"
    assert links["libnvrtc-builtins.so"] == cu13 / "libnvrtc-builtins.so.13.0"
    assert "libcublas.so" not in links and not any(name.endswith(".a") for name in links)


def test_supplied_folders_go_before_what_the_environment_names() -> None:
    supplied = needs.Supplied(("/site/nvidia/nccl/include",), ("/w/toolchain/lib/abc",), "/cache/cutlass")
    env = supplied.apply({"CPATH": "/site/nvidia/cu13/include", "PATH": "/bin"})
    assert env["CPATH"] == "/site/nvidia/nccl/include:/site/nvidia/cu13/include"
    assert env["LIBRARY_PATH"] == "/w/toolchain/lib/abc" and env["CUTLASS_PATH"] == "/cache/cutlass"
    assert supplied.apply({"CUTLASS_PATH": "/mine"})["CUTLASS_PATH"] == "/mine"  # the user's own wins
    assert needs.Supplied().apply({"A": "1"}) == {"A": "1"}


def test_a_dropped_op_leaves_the_plan_and_its_build_variable(probe: ProbeReport) -> None:
    plan = plan_build(load_recipe(ROOT / "recipes" / "cpu.toml"), probe)
    dropped = plan.without({"cpu_lion": "failed: op cpu_lion failed to compile"})
    assert [o.name for o in dropped.ops] == ["cpu_adam", "cpu_adagrad", "deepspeed_shm_comm", "fused_adam"]
    assert "DS_BUILD_CPU_LION" not in dropped.env and dropped.missing == {
        "cpu_lion": "failed: op cpu_lion failed to compile"
    }
    one_line = dropped_reason("op x failed to compile:\n    csrc/x.cpp:1: error: boom\n\n    more\n")
    assert one_line == "op x failed to compile: | csrc/x.cpp:1: error: boom | more"
    assert len(dropped_reason("e" * 5000)) == 600


def test_only_libaio_is_carried_inside_the_wheel() -> None:
    needs_of = {
        "deepspeed/ops/aio/async_io_op.cpython-311-x86_64-linux-gnu.so": ["libaio.so.1", "libc10.so", "libc.so.6"],
        "deepspeed/ops/adam/cpu_adam_op.cpython-311-x86_64-linux-gnu.so": ["libc10.so", "libcudart.so.13"],
        "deepspeed/ops/gds/gds_op.cpython-311-x86_64-linux-gnu.so": ["libaio.so.1", "libcufile.so.0", "libcuda.so.1"],
    }  # fmt: skip
    assert graft.plan_grafts(needs_of) == {
        "libaio.so.1": [
            "deepspeed/ops/aio/async_io_op.cpython-311-x86_64-linux-gnu.so",
            "deepspeed/ops/gds/gds_op.cpython-311-x86_64-linux-gnu.so",
        ]
    }


def _entry(**changes: Any) -> WheelEntry:
    checks = {"load:cpu_adam": ("passed", "loaded"), "numerics:cpu_adam": ("passed", "max 1e-7"),
              "load:async_io": ("passed", "loaded"), "numerics:async_io": ("skipped", "no driver")}  # fmt: skip
    base = WheelEntry(
        name="deepspeed-0.19.8+cpu.torch2.13-cp311-cp311-linux_x86_64.whl", sha256="0" * 64,
        version="0.19.8+cpu.torch2.13",
        recipe="cpu-all", accelerator="cpu", python_tag="cp311", torch="2.13.0+cpu", cuda=None, archs=(),
        cpu_target="x86-64-v3", cpu_flags=(), ops=("async_io", "cpu_adam", "pin_memory"),
        smoke=SmokeSummary(True, "2026-11-23T00:00:00+00:00", checks),
        missing_ops={"deepspeed_ccl_comm": "refused: CCL_ROOT is not set"},
    )  # fmt: skip
    return dataclasses.replace(base, **changes)


def test_the_op_table_says_built_loaded_and_checked_per_op() -> None:
    rows = {r["op"]: r for r in op_table(_entry())}
    assert list(rows) == ["async_io", "cpu_adam", "deepspeed_ccl_comm", "pin_memory"]
    assert rows["cpu_adam"] == {"op": "cpu_adam", "built": "yes", "archs": "cpu", "loaded": "passed",
                                "checked": "passed", "why": ""}  # fmt: skip
    assert rows["async_io"]["checked"] == "skipped" and rows["async_io"]["why"] == "no driver"
    assert rows["pin_memory"]["loaded"] == "not run"
    assert rows["deepspeed_ccl_comm"]["built"] == "no" and "CCL_ROOT" in rows["deepspeed_ccl_comm"]["why"]


def test_missing_ops_in_a_manifest_are_checked_as_hostile_input() -> None:
    assert reason_table(Fields({"missing_ops": {"gds": "refused: no libaio"}}, "m"), "missing_ops") == {
        "gds": "refused: no libaio"
    }
    for bad in ({"../x": "why"}, {"gds": 5}, {"gds": "x" * 5000}):
        with pytest.raises(ManifestError):
            reason_table(Fields({"missing_ops": bad}, "m"), "missing_ops")


def test_the_driver_link_stub_exports_what_cuda_h_declares() -> None:
    """Names after cuda.h's macros (cuMemAlloc is cuMemAlloc_v2), each once: what NVIDIA's stub
    exports, so an op calling the driver (gds: cuGetErrorName) keeps libcuda.so.1 as a dependency."""
    text = (
        "typedef int CUresult;\nCUresult cuGetErrorName(CUresult error, const char **pStr);\n"
        "CUresult cuMemAlloc_v2(void **dptr, unsigned long bytesize);\nCUresult cuInit(unsigned int Flags);\n"
        "CUresult cuInit(unsigned int Flags);\nint cudaNotADriverCall(void);\n"
    )
    assert needs.driver_functions(text) == ["cuGetErrorName", "cuInit", "cuMemAlloc_v2"]
