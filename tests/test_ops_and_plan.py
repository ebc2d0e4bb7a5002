"""Op checks and build planning, against the op probe captured from DeepSpeed 0.19.8 on this CPU machine."""

from __future__ import annotations

import dataclasses
import os
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from builder.errors import BuildError, RecipeError, SourceError
from builder.node import torch_variant
from builder.recipe import load_recipe, parse_recipe
from builder.resources import resource
from builder.units.plan import plan_units
from builder.wheelbuild.ops import OpInfo, ProbeReport, check_archs, check_requested, parse_probe
from builder.wheelbuild.plan import (
    check_torch_build,
    cpu_target_env,
    local_label,
    max_jobs,
    plan_build,
    resolve_archs,
)
from builder.wheelbuild.source import patch_build_tree

DATA = Path(__file__).with_name("data")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def probe() -> ProbeReport:
    # Real output of builder/ds_probe.py (DeepSpeed 0.19.8, torch 2.13.0+cpu, no libaio installed).
    return parse_probe((DATA / "probe-cpu-0.19.8.txt").read_text())


def test_probe_is_parsed_past_deepspeeds_own_output(probe: ProbeReport) -> None:
    assert probe.accelerator == "cpu"
    assert probe.torch.version == "2.13.0+cpu" and probe.torch.cuda is None
    assert probe.python_tag == "cp311"
    assert {"cpu_adam", "cpu_adagrad", "cpu_lion", "async_io"} <= set(probe.ops)
    adam = probe.ops["cpu_adam"]
    assert adam.build_var == "DS_BUILD_CPU_ADAM" and adam.so_prefix == "deepspeed/ops/adam/cpu_adam_op."
    assert not probe.ops["async_io"].compatible and "libaio" in probe.ops["async_io"].why


def test_probe_without_report_is_an_error() -> None:
    with pytest.raises(BuildError, match="printed no report"):
        parse_probe("Traceback ...\nImportError: torch")


def test_unknown_op_suggests_the_near_miss(probe: ProbeReport) -> None:
    with pytest.raises(RecipeError) as err:
        check_requested(("cpu_adma",), probe)
    assert 'unknown op "cpu_adma" for the cpu accelerator (did you mean "cpu_adam"?)' in err.value.message
    assert "cpu_adagrad" in err.value.fix  # lists DeepSpeed's own ops for this accelerator


def test_cuda_only_op_is_not_in_the_cpu_list(probe: ProbeReport) -> None:
    with pytest.raises(RecipeError, match='unknown op "utils" for the cpu accelerator'):
        check_requested(("cpu_adam", "utils"), probe)


def test_incompatible_op_fails_with_deepspeeds_reason(probe: ProbeReport) -> None:
    from builder.wheelbuild.plan import select_ops

    recipe = dataclasses.replace(load_recipe(ROOT / "recipes" / "cpu.toml"), ops=("cpu_adam", "async_io"))
    with pytest.raises(BuildError) as err:
        select_ops(recipe, probe)
    assert "cannot build async_io here" in err.value.message
    assert "libaio" in err.value.message and "apt-get install libaio-dev" in err.value.message


def test_local_labels() -> None:
    assert local_label("cpu", "2.13.0+cpu", None) == "cpu.torch2.13"
    assert local_label("cpu", "2.14.1", "13.0") == "cpu.torch2.14"
    assert local_label("cuda", "2.14.1+cu130", "13.0", ("9.0",)) == "cu130.torch2.14.sm90"
    assert local_label("cuda", "2.11.0+cu130", "13.0", ("8.0", "9.0+PTX")) == "cu130.torch2.11.sm80.sm90ptx"
    with pytest.raises(BuildError, match="has no CUDA"):
        local_label("cuda", "2.13.0+cpu", None)


def test_the_torch_build_the_environment_got_is_checked_against_the_recipe() -> None:
    """Issue 31 item 6: PyPI's torch 2.15.0 is its CUDA 13 build; a CPU recipe given it is an error
    naming PyTorch's index for the CPU build (or the recipe's own index), and the reverse."""
    base = {"name": "cpu", "accelerator": "cpu", "ops": ["cpu_adam"],
            "deepspeed": {"version": "0.19.8", "sha256": "9" * 64}}  # fmt: skip
    cpu = parse_recipe({**base, "torch": {"version": "2.15.0"}})
    assert torch_variant(None) == "cpu" and torch_variant("12.6") == "cu126" and torch_variant("13.0") == "cu130"
    check_torch_build(cpu, "2.15.0+cpu", None)  # the CPU build: fine
    with pytest.raises(BuildError) as err:
        check_torch_build(cpu, "2.15.0", "13.0")
    assert err.value.message == ("recipe cpu is a cpu recipe, but its build environment got torch 2.15.0, the CUDA "
                                 "13.0 build (from pip's sources)")  # fmt: skip
    assert 'variant = "cpu" (PyTorch\'s index https://download.pytorch.org/whl/cpu' in err.value.fix
    mirror = parse_recipe({**base, "torch": {"version": "2.15.0", "index": "file:///srv/whl"}})
    with pytest.raises(BuildError) as err:
        check_torch_build(mirror, "2.15.0+cu130", "13.0")
    assert "(from file:///srv/whl)" in err.value.message and "point [torch] index at the cpu build" in err.value.fix
    cuda = {**base, "accelerator": "cuda", "arch": ["9.0"]}
    any_cuda = parse_recipe({**cuda, "torch": {"version": "2.14.1"}})
    check_torch_build(any_cuda, "2.14.1", "12.8")  # a CUDA recipe naming no build takes any CUDA build
    with pytest.raises(BuildError) as err:
        check_torch_build(any_cuda, "2.14.1+cpu", None)
    assert "the CPU build" in err.value.message and 'variant = "cu130"' in err.value.fix
    cu126 = parse_recipe({**cuda, "torch": {"version": "2.14.1", "variant": "cu126"}})
    check_torch_build(cu126, "2.14.1+cu126", "12.6")
    with pytest.raises(BuildError) as err:
        check_torch_build(cu126, "2.14.1+cu130", "13.0")
    assert "naming cu126" in err.value.message and "whl/cu126" in err.value.fix
    check_torch_build(parse_recipe({**base, "torch": {"version": "system"}}), "2.14.1", "13.0")  # the site's own


def test_another_op_set_of_one_target_is_labelled(probe: ProbeReport) -> None:
    """cpu-all is the cpu target with every op: its label gives its wheel a file name of its own."""
    every = load_recipe(ROOT / "recipes" / "cpu-all.toml")
    assert every.label == "all"
    assert plan_build(every, probe).version == "0.19.8+cpu.torch2.13.all"
    for bad in ("All", "1x", "a-b", "x" * 17):
        with pytest.raises(RecipeError, match="is not usable in a version"):
            parse_recipe({**tomllib.loads((ROOT / "recipes" / "cpu-all.toml").read_text()), "label": bad})


def test_plan_for_the_default_recipe(probe: ProbeReport) -> None:
    plan = plan_build(load_recipe(ROOT / "recipes" / "cpu.toml"), probe)
    assert plan.version == "0.19.8+cpu.torch2.13"
    assert plan.env["DS_BUILD_STRING"] == "+cpu.torch2.13"
    assert plan.env["DS_BUILD_OPS"] == "0"
    assert plan.env["DS_ACCELERATOR"] == "cpu"
    assert plan.env["DS_ENABLE_NINJA"] == "1"
    assert "MAX_JOBS" not in plan.env  # the op units' plan shares out the cores
    assert {k for k, v in plan.env.items() if k.startswith("DS_BUILD_") and v == "1"} == {
        "DS_BUILD_CPU_ADAM",
        "DS_BUILD_CPU_ADAGRAD",
        "DS_BUILD_CPU_LION",
        "DS_BUILD_SHM_COMM",
        "DS_BUILD_FUSED_ADAM",
    }
    assert [op.name for op in plan.ops] == ["cpu_adam", "cpu_adagrad", "cpu_lion", "deepspeed_shm_comm", "fused_adam"]


def test_plan_refuses_a_build_env_with_other_torch(probe: ProbeReport) -> None:
    recipe = load_recipe(ROOT / "recipes" / "cpu.toml")
    other = dataclasses.replace(recipe, torch=dataclasses.replace(recipe.torch, version="2.14.1"))
    with pytest.raises(BuildError, match=r"has torch 2\.13\.0\+cpu but the recipe pins 2\.14\.1"):
        plan_build(other, probe)


def test_max_jobs() -> None:
    assert max_jobs(16) == 16
    assert max_jobs(0) == 1
    assert max_jobs(16, mem_gb=20.0, job_gb=3.0) == 6  # memory, not cores, is the limit
    assert max_jobs(16, mem_gb=1.0, job_gb=3.0) == 1  # always at least one


def test_plan_drops_debug_info_when_the_recipe_strips(probe: ProbeReport) -> None:
    plan = plan_build(load_recipe(ROOT / "recipes" / "cpu.toml"), probe)
    assert plan.env["DS_BUILDER_NO_DEBUG"] == "1"  # the recipe strips, so nothing compiles with -g


def test_nvcc_threads_only_where_there_are_several_archs(probe: ProbeReport) -> None:
    """Planned against the CPU probe with the accelerator faked to cuda: only the env is checked."""
    recipe = dataclasses.replace(
        load_recipe(ROOT / "recipes" / "cpu.toml"), accelerator="cuda", ops=("cpu_adam", "cpu_adagrad", "cpu_lion")
    )
    cuda_probe = dataclasses.replace(probe, accelerator="cuda", torch=dataclasses.replace(probe.torch, cuda="13.0"))
    one = plan_build(recipe, cuda_probe, archs=("9.0",))
    assert one.env["NVCC_APPEND_FLAGS"] == "-Xfatbin -compress-all"
    units, parallel = plan_units(one, {}, 16, 128.0)
    assert (parallel, units[0].env["MAX_JOBS"]) == (3, "11")  # three units, each up to twice its share of 16
    three = plan_build(recipe, cuda_probe, archs=("8.0", "9.0", "10.0"))
    assert three.env["NVCC_APPEND_FLAGS"] == "--threads 3 -Xfatbin -compress-all"
    units, parallel = plan_units(three, {}, 16, 128.0)
    assert (parallel, units[0].env["MAX_JOBS"]) == (3, "4")  # memory for 14 jobs of 9 GB: 3 units of 4
    assert three.env["DS_BUILDER_ARCH_LIST"] == "8.0;9.0;10.0"  # DeepSpeed's narrowing is undone per op
    plain = plan_build(dataclasses.replace(recipe, compress_device_code=False), cuda_probe, archs=("9.0",))
    assert "NVCC_APPEND_FLAGS" not in plain.env


def _fp_quantizer(accepted: tuple[str, ...] | None) -> OpInfo:
    return OpInfo("fp_quantizer", "DS_BUILD_FP_QUANTIZER", "deepspeed.ops.fp_quantizer.fp_quantizer_op", True,
                  device_code=True, accepted_archs=accepted)  # fmt: skip


def test_an_op_that_would_drop_an_arch_is_an_error_before_compiling() -> None:
    fp = _fp_quantizer(("8.0", "9.0"))  # what its filter_ccs keeps of 7.5;8.0;9.0 (8.0+ only)
    adam = OpInfo("fused_adam", "DS_BUILD_FUSED_ADAM", "deepspeed.ops.adam.fused_adam_op", True, device_code=True)
    with pytest.raises(RecipeError) as err:
        check_archs((adam, fp), ("7.5", "8.0", "9.0"), narrow_ops=())
    assert "op fp_quantizer does not build for arch 7.5" in err.value.message
    assert "keeps only 8.0, 9.0 of 7.5, 8.0, 9.0" in err.value.message
    assert "drop 7.5 from arch" in err.value.fix and 'narrow_ops = ["fp_quantizer"]' in err.value.fix
    held = check_archs((adam, fp), ("7.5", "8.0", "9.0"), narrow_ops=("fp_quantizer",))
    assert held == {"fused_adam": ("7.5", "8.0", "9.0"), "fp_quantizer": ("8.0", "9.0")}
    with pytest.raises(RecipeError, match="builds for none of 7.5"):
        check_archs((_fp_quantizer(()),), ("7.5",), narrow_ops=("fp_quantizer",))


def test_the_plan_knows_which_ops_are_narrowed(probe: ProbeReport) -> None:
    recipe = dataclasses.replace(
        load_recipe(ROOT / "recipes" / "cpu.toml"), accelerator="cuda", ops=("fp_quantizer",),
        narrow_ops=("fp_quantizer",),
    )  # fmt: skip
    cuda_probe = dataclasses.replace(
        probe, accelerator="cuda", torch=dataclasses.replace(probe.torch, cuda="13.0"),
        ops={"fp_quantizer": _fp_quantizer(("8.0",))},
    )  # fmt: skip
    plan = plan_build(recipe, cuda_probe, archs=("7.5", "8.0"))
    assert plan.archs_of("fp_quantizer") == ("8.0",) and plan.narrowed == {"fp_quantizer": ["8.0"]}


def test_cpu_target_reaches_the_build_env(probe: ProbeReport) -> None:
    recipe = load_recipe(ROOT / "recipes" / "cpu.toml")
    env = plan_build(recipe, probe).env
    assert env["DS_BUILDER_CPU_ARCH"] == "-march=x86-64-v3" and env["DS_BUILDER_SIMD_WIDTH"] == "-D__AVX256__"
    assert "TORCH_CUDA_ARCH_LIST" not in env
    native = plan_build(dataclasses.replace(recipe, cpu_target="native"), probe).env
    assert "DS_BUILDER_CPU_ARCH" not in native
    assert cpu_target_env("x86-64-v4") == {
        "DS_BUILDER_CPU_ARCH": "-march=x86-64-v4",
        "DS_BUILDER_SIMD_WIDTH": "-D__AVX512__",
    }


def test_resolve_archs() -> None:
    cuda = dataclasses.replace(load_recipe(ROOT / "recipes" / "cu130-hopper.toml"))
    nvcc13 = ("7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0")
    assert resolve_archs(cuda, [], nvcc13, "13.0") == ("9.0",)
    auto = dataclasses.replace(cuda, archs=(), auto_arch=True)
    assert resolve_archs(auto, ["8.0", "9.0"], nvcc13, "13.0") == ("8.0", "9.0")
    with pytest.raises(BuildError, match='arch = "auto" but no GPU is visible'):
        resolve_archs(auto, [], nvcc13, "13.0")
    volta = dataclasses.replace(cuda, archs=("7.0", "9.0a"))
    with pytest.raises(BuildError, match="nvcc 13.0 cannot target 7.0 "):
        resolve_archs(volta, [], nvcc13, "13.0")
    assert resolve_archs(load_recipe(ROOT / "recipes" / "cpu.toml"), ["9.0"], nvcc13, "13.0") == ()


SETUP_LINE = "    cmdclass['build_ext'] = get_accelerator().build_extension().with_options(use_ninja=use_ninja)\n"
SETUP_PY = f"import os\ncmdclass = {{}}\nif True:\n{SETUP_LINE}"
OP_BUILDER_PY = (
    "import os\n\nclass OpBuilder:\n    def cpu_arch(self):\n        return '-march=native'\n\n"
    "    def simd_width(self):\n        return '-D__AVX512__'\n\n"
    "    def strip_empty_entries(self, args):\n        return [x for x in args if len(x) > 0]\n"
)


def build_tree(root: Path) -> Path:
    """The two files of a DeepSpeed source tree that patch_build_tree changes, as 0.19.8 has them."""
    (root / "op_builder").mkdir()
    (root / "op_builder" / "builder.py").write_text(OP_BUILDER_PY)
    (root / "setup.py").write_text(SETUP_PY)
    return root


def hooks_importable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The patched files import the hooks module from the source tree, as under setup.py."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "ds_builder_hooks", raising=False)


def test_patch_op_builder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ob = build_tree(tmp_path) / "op_builder"
    patch_build_tree(tmp_path)
    patch_build_tree(tmp_path)  # idempotent
    hooks_importable(tmp_path, monkeypatch)
    text = (ob / "builder.py").read_text()
    assert text.count("__import__('ds_builder_hooks')") == 5  # one-line calls; the logic is a real file
    assert (tmp_path / "ds_builder_hooks.py").read_bytes() == resource("ds_build_hooks.py").read_bytes()
    scope: dict[str, object] = {}
    exec(text, scope)
    builder = scope["OpBuilder"]()  # type: ignore[operator]
    assert builder.cpu_arch() == "-march=native"  # unchanged without the variable
    monkeypatch.setenv("DS_BUILDER_CPU_ARCH", "-march=x86-64-v3")
    monkeypatch.setenv("DS_BUILDER_SIMD_WIDTH", "-D__AVX256__")
    assert builder.cpu_arch() == "-march=x86-64-v3" and builder.simd_width() == "-D__AVX256__"
    flags = ["-O3", "", "-g", "-Wno-reorder"]
    assert builder.strip_empty_entries(flags) == ["-O3", "-g", "-Wno-reorder"]
    monkeypatch.setenv("DS_BUILDER_NO_DEBUG", "1")
    assert builder.strip_empty_entries(flags) == ["-O3", "-Wno-reorder"]
    (ob / "builder.py").write_text("import os\n")
    with pytest.raises(SourceError, match="this DeepSpeed version differs"):
        patch_build_tree(tmp_path)


def test_parallel_extensions_each_get_their_own_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    patch_build_tree(build_tree(tmp_path))
    patch_build_tree(tmp_path)  # idempotent
    hooks_importable(tmp_path, monkeypatch)
    text = (tmp_path / "setup.py").read_text()
    assert text.count(".parallel_build_ext(") == 1

    calls: list[str | None] = []

    class Compiler:
        def compile(self, sources: list[str], output_dir: str | None = None, **kwargs: object) -> list[str]:
            calls.append(output_dir)
            return []

    class Base:
        def __init__(self) -> None:
            self.compiler = Compiler()
            self.parallel: int | None = None

        def finalize_options(self) -> None:
            pass

        def build_extension(self, ext: list[str]) -> None:
            self.compiler.compile(ext, output_dir="/tmp/build")

    class Accelerator:
        def build_extension(self) -> type:
            return type("B", (Base,), {"with_options": classmethod(lambda cls, **kw: cls)})

    scope: dict[str, object] = {"get_accelerator": Accelerator, "use_ninja": True}
    exec(text, scope)
    assert scope["cmdclass"]["build_ext"].__name__ == "B"  # type: ignore[index]  # untouched without the variable
    monkeypatch.setenv("DS_BUILDER_PARALLEL", "2")
    exec(text, scope)
    cmd = scope["cmdclass"]["build_ext"]()  # type: ignore[index]
    cmd.finalize_options()
    assert cmd.parallel == 2
    cmd.build_extension(["a.cpp", "b.cpp"])
    cmd.build_extension(["c.cpp"])
    cmd.build_extension(["a.cpp", "b.cpp"])
    assert calls[0] != calls[1] and calls[0] == calls[2]  # one folder per extension, stable
    assert all(c and c.startswith("/tmp/build/") for c in calls)

    (tmp_path / "setup.py").write_text("import os\nsetup()\n")
    with pytest.raises(SourceError, match="cmdclass"):
        patch_build_tree(tmp_path)


def test_one_ops_arch_filter_no_longer_narrows_the_ops_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DeepSpeed 0.19.8's compute_capability_args writes the filtered list back to the variable
    (its issues 7972/7974); with the hook every op filters the recipe's full list."""
    ds_lines = (
        "    def compute_capability_args(self, ccs):\n"
        "        ccs = self.filter_ccs(ccs)\n"
        "        arch_tokens = ['.'.join(cc) for cc in ccs]\n"
        '        os.environ["TORCH_CUDA_ARCH_LIST"] = ";".join(arch_tokens)\n'
        "        return arch_tokens\n"
    )
    build_tree(tmp_path)
    ob = tmp_path / "op_builder" / "builder.py"
    ob.write_text(OP_BUILDER_PY + "\n" + ds_lines)
    patch_build_tree(tmp_path)
    hooks_importable(tmp_path, monkeypatch)
    scope: dict[str, object] = {}
    exec(ob.read_text(), scope)

    base: Any = scope["OpBuilder"]

    class FpQuantizer(base):  # type: ignore[misc]
        def filter_ccs(self, ccs: list[str]) -> list[list[str]]:
            return [cc.split(".") for cc in ccs if int(cc.split(".")[0]) >= 8]

    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "7.5;8.0")
    assert FpQuantizer().compute_capability_args(["7.5", "8.0"]) == ["8.0"]
    assert os.environ["TORCH_CUDA_ARCH_LIST"] == "8.0"  # as shipped: the next op would lose 7.5
    monkeypatch.setenv("DS_BUILDER_ARCH_LIST", "7.5;8.0")
    assert FpQuantizer().compute_capability_args(["7.5", "8.0"]) == ["8.0"]  # the op itself still narrows
    assert os.environ["TORCH_CUDA_ARCH_LIST"] == "7.5;8.0"  # the ops after it get every arch
    # A DeepSpeed without that line is patched as before (the hook is optional; the .so check stays).
    ob.write_text(OP_BUILDER_PY)
    patch_build_tree(tmp_path)
    assert "arch_list(" not in ob.read_text()
