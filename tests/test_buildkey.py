from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from builder.recipe import load_recipe
from builder.wheelbuild.buildkey import MachineFacts, build_key, find_built, key_inputs

ROOT = Path(__file__).resolve().parents[1]
MACHINE = MachineFacts(python="3.11.7", toolkits=("13.0@/usr/local/cuda-13.0",), compilers=("g++=12.2.0", "gcc=12.2.0"))


def key(recipe_name: str = "cpu", machine: MachineFacts | None = None, env: dict[str, str] | None = None,
        **changes: Any) -> str:  # fmt: skip
    recipe = dataclasses.replace(load_recipe(ROOT / "recipes" / f"{recipe_name}.toml"), **changes)
    return build_key(key_inputs(recipe, machine or MACHINE, env or {}))


def test_same_inputs_same_key() -> None:
    assert key() == key()
    assert key(env={"MAX_JOBS": "16", "HOME": "/x"}) == key()  # speed settings do not change the wheel


def test_every_input_changes_the_key() -> None:
    base = key()
    assert key(ops=("cpu_adam", "cpu_adagrad")) != base
    assert key(cpu_target="x86-64-v4") != base
    assert key(strip=False) != base
    assert key(machine=dataclasses.replace(MACHINE, compilers=("g++=13.1.0", "gcc=13.1.0"))) != base
    assert key(machine=dataclasses.replace(MACHINE, python="3.11.8")) != base
    assert key(env={"CXXFLAGS": "-O0"}) != base
    cuda = key("cu130-hopper-min")
    assert (
        key("cu130-hopper-min", machine=dataclasses.replace(MACHINE, toolkits=("13.1@/usr/local/cuda-13.1",))) != cuda
    )
    assert key("cu130-hopper-min", archs=("8.0", "9.0")) != cuda


def test_system_torch_and_auto_arch_use_what_the_machine_has() -> None:
    system = dataclasses.replace(MACHINE, system_torch="2.11.0+cu130", gpu_archs=("9.0",))
    k1 = key("system", machine=system)
    assert key("system", machine=dataclasses.replace(system, system_torch="2.12.0+cu130")) != k1
    assert key("system", machine=dataclasses.replace(system, gpu_archs=("8.0", "9.0"))) != k1


def test_find_built(tmp_path: Path) -> None:
    from fakes import BUILD, fake_wheel

    wheel = fake_wheel(tmp_path, build_key="abc123abc123")  # FAKE wheel: only the embedded manifest matters
    (tmp_path / "broken.whl").write_bytes(b"not a zip")
    assert find_built(tmp_path, "abc123abc123") == wheel
    assert find_built(tmp_path, "other") is None
    # A wheel whose manifest does not pass the loader is rebuilt, never reused.
    (tmp_path / "b").mkdir()
    bad = fake_wheel(tmp_path / "b", build_key="abc123abc123", accelerator="tpu")
    assert BUILD["accelerator"] == "cpu" and find_built(tmp_path / "b", "abc123abc123") is None
    assert bad.is_file()
