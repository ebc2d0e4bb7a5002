"""Reading wheels back: the checks that catch DeepSpeed's silently skipped ops."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from builder.errors import BuildError
from builder.wheelbuild.artifacts import WheelContents, missing_ops, parse_installed_info, pin_requirement, read, verify
from builder.wheelbuild.ops import OpInfo

DATA = Path(__file__).with_name("data")
ADAM = OpInfo("cpu_adam", "DS_BUILD_CPU_ADAM", "deepspeed.ops.adam.cpu_adam_op", True)
LION = OpInfo("cpu_lion", "DS_BUILD_CPU_LION", "deepspeed.ops.lion.cpu_lion_op", True)
SO = "deepspeed/ops/adam/cpu_adam_op.cpython-311-x86_64-linux-gnu.so"


def test_installed_info_of_a_real_build() -> None:
    # Written by DeepSpeed 0.19.8's setup.py for cpu_adam+cpu_adagrad+cpu_lion.
    info = parse_installed_info((DATA / "git_version_info_installed-cpu.py").read_text())
    assert info["version"] == "0.19.8+cpu.torch2.13"
    assert info["installed_ops"]["cpu_adam"] == 1
    assert info["installed_ops"]["async_io"] is False
    assert info["accelerator_name"] == "cpu"


def contents(installed: dict[str, bool], sos: list[str]) -> WheelContents:
    return WheelContents("0.19.8+cpu.torch2.13", installed, dict.fromkeys(sos, 100), "deepspeed-0.19.8.dist-info")


def test_every_way_an_op_can_be_missing() -> None:
    assert missing_ops(contents({"cpu_adam": True}, [SO]), [ADAM]) == []
    assert missing_ops(contents({"cpu_adam": False}, []), [ADAM]) == [
        "cpu_adam: DeepSpeed's setup.py skipped it (not in installed_ops, no .so)"
    ]
    assert "would JIT" in missing_ops(contents({}, [SO]), [ADAM])[0]
    assert "is not in the wheel" in missing_ops(contents({"cpu_adam": True}, []), [ADAM])[0]
    # A .so of another op with a similar name does not count.
    assert missing_ops(contents({"cpu_lion": True}, [SO]), [LION])


def fake_wheel(path: Path, installed_ops: dict[str, object], sos: list[str], version: str) -> Path:
    """A zip shaped like a DeepSpeed wheel (fake: only the files the checks read)."""
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(
            "deepspeed/git_version_info_installed.py",
            f"version='{version}'\ngit_hash='unknown'\ninstalled_ops={installed_ops!r}\naccelerator_name='cpu'\n",
        )
        zf.writestr("deepspeed-0.19.8+cpu.torch2.13.dist-info/METADATA", "Metadata-Version: 2.1\n")
        for so in sos:
            zf.writestr(so, b"\x7fELF")
    return path


def test_verify_passes_a_complete_wheel(tmp_path: Path) -> None:
    wheel = fake_wheel(tmp_path / "w.whl", {"cpu_adam": 1}, [SO], "0.19.8+cpu.torch2.13")
    got = verify(wheel, [ADAM], "0.19.8+cpu.torch2.13")
    assert got.shared_objects == {SO: 4}
    assert got.dist_info == "deepspeed-0.19.8+cpu.torch2.13.dist-info"


def test_verify_names_the_skipped_op(tmp_path: Path) -> None:
    wheel = fake_wheel(tmp_path / "w.whl", {"cpu_adam": 1, "cpu_lion": False}, [SO], "0.19.8+cpu.torch2.13")
    with pytest.raises(BuildError) as err:
        verify(wheel, [ADAM, LION], "0.19.8+cpu.torch2.13")
    assert (
        "lacks requested ops" in err.value.message and "cpu_lion: DeepSpeed's setup.py skipped it" in err.value.message
    )
    assert "cpu_adam" not in err.value.message.split("lacks requested ops")[1]


def test_verify_checks_the_version(tmp_path: Path) -> None:
    wheel = fake_wheel(tmp_path / "w.whl", {"cpu_adam": 1}, [SO], "0.19.8+abc1234")
    with pytest.raises(BuildError, match="DS_BUILD_STRING did not reach"):
        verify(wheel, [ADAM], "0.19.8+cpu.torch2.13")


def test_not_a_wheel(tmp_path: Path) -> None:
    bad = tmp_path / "x.whl"
    bad.write_bytes(b"not a zip")
    with pytest.raises(BuildError, match="is not a DeepSpeed wheel"):
        read(bad)


def test_pin_requirement() -> None:
    meta = (
        'Metadata-Version: 2.1\nName: deepspeed\nRequires-Dist: torch>=2.0.0; extra == "all"\n'
        "Requires-Dist: tqdm\nRequires-Dist: torch>=2.0.0\nRequires-Dist: torchvision\n\nREADME"
    )
    pinned = pin_requirement(meta, "torch", "==2.13.0")
    assert "Requires-Dist: torch==2.13.0\n" in pinned
    assert "Requires-Dist: torch>=2.0.0\n" not in pinned
    assert 'Requires-Dist: torch>=2.0.0; extra == "all"' in pinned  # extras keep their own specifier
    assert "Requires-Dist: torchvision\n" in pinned  # a longer name is left alone
    assert pinned.endswith("\n\nREADME")
    added = pin_requirement("Metadata-Version: 2.1\nName: x\n\nbody", "torch", "==2.13.0")
    assert added == "Metadata-Version: 2.1\nName: x\nRequires-Dist: torch==2.13.0\n\nbody"


def test_arch_leak_is_caught_per_op(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """verify_archs with a stubbed fatbin reader (FAKE .so contents; the real reader is tested in test_archs)."""
    import dataclasses

    from builder import archs
    from builder.archs import FatbinCode
    from builder.recipe import load_recipe
    from builder.wheelbuild import artifacts
    from builder.wheelbuild.plan import BuildPlan

    ops_dir = tmp_path / "deepspeed" / "ops" / "adam"
    ops_dir.mkdir(parents=True)
    tag = ".cpython-311-x86_64-linux-gnu.so"
    for name in ("fused_adam_op", "cpu_adam_op"):
        (ops_dir / (name + tag)).write_bytes(b"")
    held = {"fused_adam_op": {FatbinCode("sass", 80)}, "cpu_adam_op": set()}
    monkeypatch.setattr(archs, "so_archs", lambda p: held[p.name.split(".")[0]])
    fused = OpInfo("fused_adam", "DS_BUILD_FUSED_ADAM", "deepspeed.ops.adam.fused_adam_op", True, device_code=True)
    recipe = load_recipe(Path(__file__).resolve().parents[1] / "recipes" / "cu130-hopper-min.toml")
    plan = BuildPlan(recipe, "v", (fused, ADAM), {}, "2.14.1", "13.0", "cp311", archs=("8.0", "9.0"))
    with pytest.raises(BuildError) as err:
        artifacts.verify_archs(tmp_path, plan)
    assert "fused_adam: no code for 9.0 (has sass_80)" in err.value.message
    assert "cpu_adam" not in err.value.message  # host-only ops carry no device code
    held["fused_adam_op"] = {FatbinCode("sass", 80), FatbinCode("sass", 90)}
    assert artifacts.verify_archs(tmp_path, dataclasses.replace(plan))["fused_adam"] == ["sass_80", "sass_90"]
