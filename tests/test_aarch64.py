"""Issue 63: wheels for aarch64 nodes (GH200, GB200), cross-built on the x86_64 build host.

The unit tests check what a recipe may say, what the build decides for another machine and what it
refuses; the integration test builds the cpu-aarch64 recipe's Adam op with the real cross compiler
of the toolkit's root, against torch's real aarch64 wheel and Debian's arm64 Python headers.
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from builder import glibc, signing
from builder.errors import BuildError, RecipeError
from builder.machines import HOST, MACHINES, machine_of
from builder.recipe import load_recipe, parse_recipe

ROOT = Path(__file__).resolve().parents[1]
BASE = {
    "name": "r",
    "accelerator": "cpu",
    "ops": ["cpu_adam"],
    "deepspeed": {"version": "0.19.8", "sha256": "9e491abd0827ea5c389dd702e15e11e13d83d904bac4a20d6c2a4cb37207a9af"},
    "torch": {"version": "2.13.0"},
}

pytestmark = pytest.mark.skipif(HOST != "x86_64", reason="the toolkit cross-builds from an x86_64 host only")


@pytest.mark.parametrize(
    ("machine", "said"),
    [
        ("riscv64", 'machine = "riscv64" is not one this toolkit builds for here'),
        ("ppc64le", 'machine = "ppc64le" is not one'),
        ("aarch46", '(did you mean "aarch64"?)'),
        ("", 'machine = "" is not one'),
    ],
)
def test_a_machine_the_toolkit_cannot_build_for_is_refused_with_the_list(machine: str, said: str) -> None:
    with pytest.raises(RecipeError) as err:
        parse_recipe({**BASE, "machine": machine})
    assert said in err.value.message and "x86_64, aarch64" in err.value.fix and err.value.exit_code == 2


def test_a_machine_that_is_not_a_string_is_refused_in_one_line() -> None:
    with pytest.raises(RecipeError, match="machine must be a string"):
        parse_recipe({**BASE, "machine": 64})


def test_an_aarch64_recipe_takes_arm_cpu_targets_only() -> None:
    recipe = parse_recipe({**BASE, "machine": "aarch64"})
    assert recipe.machine == "aarch64" and recipe.cpu_target == "armv8-a"  # portable: NEON, never -march=native
    with pytest.raises(RecipeError) as err:
        parse_recipe({**BASE, "machine": "aarch64", "cpu_target": "x86-64-v3"})
    assert 'unknown cpu_target "x86-64-v3" for machine aarch64' in err.value.message and "armv8-a" in err.value.fix
    with pytest.raises(RecipeError, match="for machine x86_64"):
        parse_recipe({**BASE, "cpu_target": "armv8-a"})
    assert parse_recipe(BASE).cpu_target == "x86-64-v3" and parse_recipe(BASE).machine == "x86_64"


def test_an_aarch64_recipe_cannot_take_this_machines_os_gpus_or_torch() -> None:
    with pytest.raises(RecipeError, match=r'platform = "host" is this machine\'s own OS, and the wheel is for aarch64'):
        parse_recipe({**BASE, "machine": "aarch64", "platform": "host"})
    cuda = {**BASE, "machine": "aarch64", "accelerator": "cuda"}
    with pytest.raises(RecipeError, match=r'arch = "auto" reads this machine\'s GPUs') as err:
        parse_recipe({**cuda, "arch": "auto"})
    assert '["9.0"] for GH200' in err.value.fix
    with pytest.raises(RecipeError, match=r'torch = "system" is this machine\'s torch') as err:
        parse_recipe({**cuda, "arch": ["9.0"], "torch": {"version": "system"}})
    assert 'version = "2.13.0"' in err.value.fix
    assert parse_recipe({**cuda, "arch": ["9.0"]}).machine == "aarch64"


@pytest.mark.parametrize(("name", "arch"), [("cu130-gh200", "9.0"), ("cu130-gb200", "10.0")])
def test_the_grace_recipes_load(name: str, arch: str) -> None:
    from builder.wheelbuild import cross

    recipe = load_recipe(ROOT / "recipes" / f"{name}.toml")
    said = (recipe.machine, recipe.accelerator, recipe.archs, recipe.cpu_target)
    assert said == ("aarch64", "cuda", (arch,), "armv8-a")
    assert recipe.platform == "manylinux_2_28" and recipe.torch.requirement == "torch==2.13.0"
    # the build env runs PyPI's unlabelled CUDA build here: a +cpu wheel in pip's find-links cannot stand in
    assert cross.host_torch(recipe).requirement == "torch===2.13.0"
    assert cross.host_torch(recipe).describe() == "2.13.0"


def test_the_cpu_aarch64_recipe_loads() -> None:
    recipe = load_recipe(ROOT / "recipes" / "cpu-aarch64.toml")
    assert recipe.machine == "aarch64" and recipe.cpu_target == "armv8-a" and recipe.platform == "manylinux_2_28"
    assert set(recipe.ops) == set(load_recipe(ROOT / "recipes" / "cpu.toml").ops)  # the default recipe's ops


def test_an_aarch64_wheel_has_its_own_build_key_and_x86_keys_are_unchanged() -> None:
    from builder.wheelbuild import buildkey
    from builder.wheelbuild.buildkey import MachineFacts

    facts = MachineFacts(python="3.11.7", toolkits=(), compilers=(), gpu_archs=(), system_torch=None, root="r")
    x86 = buildkey.key_inputs(parse_recipe(BASE), facts, {})
    arm = buildkey.key_inputs(parse_recipe({**BASE, "machine": "aarch64"}), facts, {})
    assert "machine" not in x86  # keys of x86_64 wheels are as before machines were named
    assert arm["machine"]["name"] == "aarch64" and arm["cpu_target"] == "armv8-a"
    assert buildkey.build_key(x86) != buildkey.build_key(arm)


def test_the_floor_and_tag_of_an_aarch64_wheel_come_from_auditwheels_aarch64_policy() -> None:
    versions = {"libc.so.6": {"GLIBC_2.17"}, "libstdc++.so.6": {"GLIBCXX_3.4.22", "CXXABI_1.3.9"}}
    assert glibc.platform_tags(versions, "aarch64") == ("manylinux_2_24_aarch64",)  # GLIBCXX_3.4.22: 2_24
    assert glibc.platform_tags({"libc.so.6": {"GLIBC_2.17"}}, "aarch64")[0].endswith("_aarch64")
    assert glibc.tag_for("manylinux_2_24", "manylinux_2_28", "aarch64") == "manylinux_2_28_aarch64"
    assert "manylinux_2_28" in glibc.known_floors("aarch64")
    above = glibc.above_floor([glibc.Needed("a.so", "libm.so.6", "GLIBC_2.29", "pow")], "manylinux_2_28", "aarch64")
    assert [n.symbol for n in above] == ["pow"]


def test_the_glibc_pins_are_the_machines_own() -> None:
    from builder.buildroot.spec import MACHINE_PINS, pins_header

    arm = pins_header(*MACHINE_PINS["aarch64"])
    assert "defined(__aarch64__)" in arm and '".symver pow,pow@GLIBC_2.17"' in arm and "__x86_64__" not in arm
    assert pins_header(*MACHINE_PINS["x86_64"]) == pins_header()  # x86 wrappers (and ccache's keys) unchanged


def test_an_so_for_another_machine_is_refused_by_name(tmp_path: Path) -> None:
    """A wheel for aarch64 holding an x86_64 object (a compiler for the wrong machine ran) is refused."""
    from builder.wheelbuild import cross

    ops = tmp_path / "deepspeed" / "ops" / "adam"
    ops.mkdir(parents=True)
    shutil.copyfile(sys.executable, ops / "cpu_adam_op.cpython-311-aarch64-linux-gnu.so")  # an x86_64 ELF
    (ops / "notes.so.txt").write_text("not an object")
    with pytest.raises(BuildError) as err:
        cross.check_machine(tmp_path, "aarch64")
    assert "cpu_adam_op.cpython-311-aarch64-linux-gnu.so (EM_X86_64)" in err.value.message
    assert "notes.so.txt (not ELF)" in err.value.message and err.value.exit_code == 5
    (ops / "notes.so.txt").unlink()
    cross.check_machine(tmp_path, "x86_64")  # the same object is right for an x86_64 wheel


def test_the_extension_suffix_is_the_target_interpreters() -> None:
    assert machine_of("aarch64").ext_suffix("3.11.7") == ".cpython-311-aarch64-linux-gnu.so"
    assert MACHINES["x86_64"].ext_suffix("3.12") == ".cpython-312-x86_64-linux-gnu.so"


def _zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def test_a_torch_wheel_that_is_not_torchs_for_the_machine_is_refused(tmp_path: Path) -> None:
    """FAKE torch wheels (labelled): one naming a member outside, one whose libraries are x86_64's."""
    from builder.wheelbuild import cross

    arm = machine_of("aarch64")
    outside = _zip(tmp_path / "torch-0-cp311-cp311-manylinux_2_28_aarch64.whl", {"torch/include/../../x.h": b""})
    with pytest.raises(BuildError, match="holds a member named 'torch/include/../../x.h'"):
        cross._unpack_torch(outside, tmp_path / "a", arm)
    assert not (tmp_path / "x.h").exists()
    x86 = Path(sys.executable).read_bytes()
    libs = {f"torch/lib/{n}": x86 for n in cross.LINKED}
    wrong = _zip(tmp_path / "torch-1-cp311-cp311-manylinux_2_28_aarch64.whl", {"torch/include/t.h": b"", **libs})
    with pytest.raises(BuildError, match="has no libc10.so for aarch64"):
        cross._unpack_torch(wrong, tmp_path / "b", arm)


def test_two_torches_of_other_pybind_abis_are_refused(tmp_path: Path) -> None:
    """FAKE libtorch_python.so files (labelled): only the pybind11 internals id they carry matters."""
    from builder.wheelbuild import cross

    for name, abi in (("host", b"v11"), ("same", b"v11"), ("other", b"v12")):
        (tmp_path / name / "lib").mkdir(parents=True)
        (tmp_path / name / "lib" / "libtorch_python.so").write_bytes(
            b"\0junk__pybind11_internals_" + abi + b"_system_libstdcpp_gxx_abi_1xxx_use_cxx11_abi_1__\0"
        )
    cross.check_same_abi(tmp_path / "host", tmp_path / "same", "aarch64")
    with pytest.raises(BuildError, match="built with different pybind11 ABIs"):
        cross.check_same_abi(tmp_path / "host", tmp_path / "other", "aarch64")


def test_the_targets_cuda_is_read_from_its_version_file(tmp_path: Path) -> None:
    from builder.wheelbuild import cross

    (tmp_path / "version.py").write_text("__version__ = '2.13.0'\ncuda: Optional[str] = '13.0'\n")
    assert cross.torch_cuda(tmp_path) == "13.0"
    (tmp_path / "version.py").write_text("__version__ = '2.10.0'\ncuda: Optional[str] = None\n")
    assert cross.torch_cuda(tmp_path) is None


def test_a_cuda_runtime_wheel_that_is_not_nvidias_for_the_machine_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FAKE nvidia-cuda-runtime wheels (labelled), put where pip would download them: one without
    libcudart, one whose libcudart is x86_64's. Nothing is left in the folder either time."""
    from builder import cmd
    from builder.wheelbuild import cross

    x86 = Path(sys.executable).read_bytes()
    cases = (({"nvidia/cu13/include/cuda.h": b""}, "holds no libcudart.so.N"),
             ({"nvidia/cu13/lib/libcudart.so.13": x86}, "libcudart is not built for aarch64"))  # fmt: skip
    for members, said in cases:

        def download(argv: list[str], members: dict[str, bytes] = members, **_: Any) -> None:
            _zip(Path(argv[argv.index("-d") + 1]) / "nvidia_cuda_runtime-13.0.96-py3-none-manylinux_2_28_aarch64.whl",
                 members)  # fmt: skip

        monkeypatch.setattr(cmd, "run", download)
        with pytest.raises(BuildError, match=said):
            cross.cuda_runtime(machine_of("aarch64"), "13.0", "manylinux_2_28", tmp_path / "rt", tmp_path / "log")
        assert not (tmp_path / "rt").exists() and [p.name for p in tmp_path.iterdir() if p.name.startswith(".rt.")] == [
            ".rt.lock"
        ]


@pytest.mark.spawns
def test_the_hooks_link_cuda_ops_against_the_targets_libcudart(tmp_path: Path) -> None:
    """In a fresh interpreter with torch (the build env's): cpp_extension's CUDA library folders lose
    the ones beside this machine's nvcc (CUDA_HOME) and gain the target's."""
    pytest.importorskip("torch")
    home, tree, lib = tmp_path / "cuda", tmp_path / "tree", tmp_path / "aarch64-cudart"
    for folder in (home / "lib64", tree / "lib", lib):
        folder.mkdir(parents=True)
    # CUDA_HOME set as a CUDA build of torch finds it (this torch may be a CPU build, which finds none)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import ds_build_hooks; "
            "import torch.utils.cpp_extension as e; e.CUDA_HOME = sys.argv[2]; "
            "print(e.library_paths('cuda')); print(e.library_paths())")  # fmt: skip
    env = {**os.environ, "CUDA_HOME": str(home), "DS_BUILDER_TORCH_TREE": str(tree), "DS_BUILDER_CUDA_LIB": str(lib)}
    done = subprocess.run([sys.executable, "-c", code, str(ROOT / "builder" / "resources"), str(home)],
                          capture_output=True, text=True, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    cuda, cpu = done.stdout.splitlines()
    assert ast.literal_eval(cuda) == [str(tree / "lib"), str(lib)] and ast.literal_eval(cpu) == [str(tree / "lib")]


def test_pythons_without_debian_headers_for_the_machine_are_refused(tmp_path: Path) -> None:
    from builder.wheelbuild import cross

    with pytest.raises(BuildError) as err:
        cross.python_headers(machine_of("aarch64"), "3.12.1", "http://x", tmp_path / "h", {}, tmp_path / "log")
    assert "headers of Python 3.12 for aarch64 come from Debian" in err.value.message and "3.11" in err.value.fix
    assert not (tmp_path / "h").exists()


def test_a_cross_build_runs_torch_s_cpu_build_here() -> None:
    from builder.wheelbuild import cross

    arm = parse_recipe({**BASE, "machine": "aarch64"})
    assert cross.host_torch(arm).requirement == "torch==2.13.0+cpu" and arm.torch.requirement == "torch==2.13.0"
    assert cross.host_torch(parse_recipe(BASE)) == parse_recipe(BASE).torch


@pytest.mark.spawns
def test_the_hooks_point_setuptools_at_the_targets_headers(tmp_path: Path) -> None:
    """In a fresh interpreter (it patches the process), as DeepSpeed's setup.py imports the hooks."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import ds_build_hooks; from distutils import sysconfig; "
            "print(sysconfig.get_python_inc(), sysconfig.get_python_inc(True))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code, str(ROOT / "builder" / "resources")], capture_output=True,
                          text=True, env={**os.environ, "DS_BUILDER_PYTHON_INCLUDE": "/t/python3.11:/t"})  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["/t/python3.11:/t", "/t/python3.11:/t"]


# ---------------------------------------------------------------- the real thing: build, smoke under qemu, publish


def _emulation_ready() -> str | None:
    """Why the emulated aarch64 node cannot be made or entered here (None: it can)."""
    if os.geteuid() != 0:
        return "making the cross root and the aarch64 node root takes root (debootstrap)"
    missing = [t for t in ("unshare", "debootstrap", "dpkg-deb", "qemu-aarch64-static") if not shutil.which(t)]
    if missing:
        return f"{', '.join(missing)} not installed (qemu-user-static, debootstrap, util-linux)"
    done = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                           "mount -t binfmt_misc b /proc/sys/fs/binfmt_misc"], capture_output=True)  # fmt: skip
    return None if done.returncode == 0 else "this kernel has no binfmt_misc of a user namespace's own (Linux 6.7+)"


# Cross builds of the tests compile in work folders at fixed paths on this machine, with one ccache and
# one folder of build environments kept there between runs (like the roots): ccache hashes each compile's
# absolute paths, so only a build at the same paths finds what an earlier run of the suite compiled.
# Each build still runs every unit's setup.py and compiler through ccache; a change to a flag, a source,
# a compiler or torch's headers misses. Several runs on one machine each take a free slot (a lock).
CROSS = Path("/var/tmp") / f"ds-builder-test-cross-{os.getuid()}"


@contextlib.contextmanager
def cross_slot(name: str, slots: int = 3) -> Iterator[Path | None]:
    """A slot folder of CROSS for a build named `name`, held until the test ends and emptied then; None
    where every slot is another run's (that build then compiles in the test's own folder, cold)."""
    CROSS.mkdir(mode=0o755, exist_ok=True)
    for i in range(slots):
        with open(CROSS / f"{name}-{i}.lock", "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            slot = CROSS / f"{name}-{i}"
            shutil.rmtree(slot, ignore_errors=True)  # what a killed run left
            slot.mkdir()
            try:
                yield slot
            finally:
                shutil.rmtree(slot, ignore_errors=True)
            return
    yield None


def cross_work(
    name: str, workspace: Path, tmp_path: Path, held: contextlib.ExitStack
) -> tuple[Path, dict[str, str] | None]:
    """A work folder for cross builds sharing the suite's caches (its units), at a slot's fixed path with
    this machine's cross-build ccache and build environments where a slot is free (cross_slot), and the
    environment its builds run with (None: the test run's)."""
    from conftest import work_sharing_cache

    (workspace / "cache").mkdir(parents=True, exist_ok=True)
    slot = held.enter_context(cross_slot(name))
    work = work_sharing_cache(workspace, (slot or tmp_path) / "work")
    machine_wide = {"DS_BUILDER_CCACHE_DIR": str(CROSS / "ccache"), "DS_BUILDER_ENV_CACHE": str(CROSS / "envs")}
    return work, {**os.environ, **machine_wide} if slot else None


def build_and_smoke(recipe: str, work: Path, env: dict[str, str] | None) -> tuple[Path, str]:
    """`build-wheel --no-publish` of recipes/`recipe` in `work` (cross_work), its smoke under qemu passed:
    the wheel and what the build said."""
    done = subprocess.run([sys.executable, "-m", "builder", "build-wheel", "--recipe", f"recipes/{recipe}",
                           "--work-dir", str(work), "--no-publish"], cwd=ROOT, capture_output=True,
                          text=True, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-6000:]
    said = done.stdout + done.stderr
    assert "smoke PASSED" in said and "under qemu" in said, said[-3000:]
    built = re.search(r"==> built (\S+\.whl) in", said)
    assert built, said[-3000:]
    return work / "dist" / built.group(1), said


@pytest.mark.integration
@pytest.mark.skipif(_emulation_ready() is not None, reason=str(_emulation_ready()))
def test_the_cpu_aarch64_recipe_and_its_sve_variant_are_built_smoked_under_qemu_and_published_beside_x86(
    request: pytest.FixtureRequest, workspace: Path, tmp_path: Path, held: contextlib.ExitStack
) -> None:
    """Issue 63, done when: one command builds the cpu-aarch64 recipe into a manylinux_2_28_aarch64 wheel and
    smoke-tests it on an aarch64 node under qemu (its pip, the CPU ops' numerics, the recipe's configs); it is
    published beside the x86_64 wheel of the default recipe (by `publish`, once the suite's default build is
    made: the aarch64 build runs beside it). The Grace variant (recipes/cpu-aarch64-sve.toml) is built next,
    compiling CPU Adam alone (its other units are the NEON wheel's), smoked on the emulated node shown a
    Neoverse V2 (a labelled fake CPU description) and published too. Then the published node installer
    installs the NEON wheel on the emulated aarch64 node (shown a Neoverse N1), chooses the SVE one on a node
    shown a Neoverse V2, and on this x86_64 machine chooses the x86_64 wheel."""
    from conftest import copy_house

    from builder.buildroot import emulated, make
    from builder.node import INSTALLER, tag_machine

    work, env = cross_work("cpu-aarch64", workspace, tmp_path, held)
    wheel, said = build_and_smoke("cpu-aarch64.toml", work, env)
    for check in ("numerics:cpu_adam", "numerics:cpu_adagrad", "numerics:cpu_lion", "engine:zero2-offload"):
        assert re.search(rf"passed\s+{re.escape(check)}\s", said), check
    assert "configs/adam-zero2-offload.json: runs" in said
    assert wheel.name == "deepspeed-0.19.8+cpu.torch2.13-cp311-cp311-manylinux_2_28_aarch64.whl"
    tree = tmp_path / "tree"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(tree)
    sos = sorted(p.name for p in tree.rglob("*.so"))
    assert len(sos) == 5 and all(s.endswith(".cpython-311-aarch64-linux-gnu.so") for s in sos), sos
    assert glibc.foreign_objects(tree, "EM_AARCH64") == []
    assert glibc.above_floor(glibc.needed_symbols(tree), "manylinux_2_28", "aarch64") == []  # pow pinned to 2.17
    (info,) = tree.glob("*.dist-info")
    assert "Requires-Dist: torch==2.13.0\n" in (info / "METADATA").read_text()  # aarch64's torch: no +cpu
    built = json.loads((info / "ds_builder.json").read_text())
    assert built["cpu_target"] == "armv8-a" and built["platform"]["tags"] == ["manylinux_2_28_aarch64"]
    assert built["torch"]["version"] == "2.13.0+cu130"  # the target's torch, not the build host's CPU build

    # The SVE variant, built next in the same work folder as a user would: CPU Adam compiled for
    # armv8.2-a+sve (DeepSpeed's SVE path), the other four units built with the NEON wheel's flags, so each of
    # their compiles is a ccache hit; its smoke on a node shown Grace's core.
    sve, sve_said = build_and_smoke("cpu-aarch64-sve.toml", work, env)
    assert "shown a neoverse-v2 CPU" in sve_said, sve_said[-3000:]
    for op in ("cpu_adagrad", "cpu_lion", "deepspeed_shm_comm", "fused_adam"):
        assert re.search(rf"unit {op}: built in \d+s; ccache: [1-9]\d* hits, 0 misses", sve_said), (
            op,
            sve_said[-4000:],
        )
    for check in ("numerics:cpu_adam", "numerics:cpu_adagrad", "numerics:cpu_lion", "engine:zero2-offload"):
        assert re.search(rf"passed\s+{re.escape(check)}\s", sve_said), check
    assert sve.name == "deepspeed-0.19.8+cpu.torch2.13.sve-cp311-cp311-manylinux_2_28_aarch64.whl"
    sve_tree = tmp_path / "sve-tree"
    with zipfile.ZipFile(sve) as zf:
        zf.extractall(sve_tree)
    (adam,) = sve_tree.glob("deepspeed/ops/adam/cpu_adam_op.*.so")
    assert sve_counts(adam) > 0  # DeepSpeed's SVE path (sve.h) is in it
    (lion,) = sve_tree.glob("deepspeed/ops/lion/cpu_lion_op.*.so")
    assert sve_counts(lion) == 0 and lion.read_bytes() == next(tree.glob("deepspeed/ops/lion/*.so")).read_bytes()
    (sve_info,) = sve_tree.glob("*.dist-info")
    assert json.loads((sve_info / "ds_builder.json").read_text())["cpu_target"] == "armv8.2-a+sve"

    # The default recipe's x86_64 wheel, published meanwhile by another worker (not waited for until now).
    house = copy_house(request.getfixturevalue("default_build"), tmp_path / "house")
    published = subprocess.run([sys.executable, "-m", "builder", "publish", str(wheel), str(sve), "--work-dir",
                                str(work), "--wheelhouse", str(house)], cwd=ROOT, capture_output=True,
                               text=True)  # fmt: skip
    assert published.returncode == 0, published.stderr[-4000:]
    manifest = json.loads((house / "manifest.json").read_text())
    machines = {n: tag_machine(n.removesuffix(".whl").rsplit("-", 1)[-1]) for n in manifest["wheels"]}
    assert {"aarch64", "x86_64"} <= set(machines.values()), machines
    arm_deps = manifest["wheels"][wheel.name]["requires"]
    assert arm_deps and not any(d.endswith("x86_64.whl") for d in arm_deps), arm_deps  # fetched for aarch64
    assert any(d.endswith("aarch64.whl") for d in arm_deps), arm_deps  # numpy, psutil, pydantic-core...
    page = (house / "index.html").read_text()
    row = page[page.index(f'<tr data-wheel="{wheel.name}"') :].split("</tr>")[0]
    assert "<td>aarch64</td>" in row and "<td>armv8-a</td>" in row  # the page says which machine it is for

    # The published installer on this x86_64 machine takes the x86_64 wheel; the aarch64 one is not for it.
    key = signing.keys().key().line()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env.update(PIP_CONFIG_FILE="/dev/null", PIP_INDEX_URL="http://127.0.0.1:9/simple/", PIP_NO_CACHE_DIR="1")
    here = subprocess.run([sys.executable, str(house / INSTALLER), "--wheelhouse", str(house), "--trust", key,
                           "--dry-run", "--json"], capture_output=True, text=True, env=env)  # fmt: skip
    assert here.returncode == 0, here.stderr[-3000:]
    chosen = json.loads(here.stdout)
    assert chosen["wheel"].endswith("-linux_x86_64.whl") or chosen["wheel"].endswith("_x86_64.whl"), chosen
    assert chosen["node"]["machine"] == "x86_64"

    # On the emulated aarch64 node (the smoke's root: named by what it holds, and this machine may hold
    # others), the installer installs the aarch64 wheel with no compiler.
    from types import SimpleNamespace

    from builder import smoke
    from builder.debian import host_mirror

    needs = smoke.node_requirements(wheel, SimpleNamespace(python_tag="cp311"), "aarch64")  # type: ignore[arg-type]
    root = make.roots_folder(os.environ) / emulated.NodeSpec(machine_of("aarch64"), host_mirror(), needs).name
    assert (root.parent / f"{root.name}.json").is_file()
    node_tmp = tmp_path / "node"
    node_tmp.mkdir()
    venv_python = str(node_tmp / "venv" / "bin" / "python")
    wrappers = emulated.enter_folder(root, machine_of("aarch64"), node_tmp / "enter", [node_tmp, house],
                                     {"python3": "/usr/bin/python3", "venv": venv_python})  # fmt: skip
    run_env = {"HOME": str(node_tmp), "PATH": "/usr/bin:/bin", "PIP_CONFIG_FILE": "/dev/null",
               "PIP_NO_CACHE_DIR": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}  # fmt: skip
    made = subprocess.run([str(wrappers["python3"]), "-m", "venv", "--system-site-packages", "--without-pip",
                           str(node_tmp / "venv")], capture_output=True, text=True, env=run_env)  # fmt: skip
    assert made.returncode == 0, made.stderr[-2000:]
    there = subprocess.run([str(wrappers["venv"]), str(house / INSTALLER), "--wheelhouse", str(house), "--trust", key,
                            "--python", str(node_tmp / "venv" / "bin" / "python")], capture_output=True, text=True,
                           env=run_env)  # fmt: skip
    assert there.returncode == 0, there.stderr[-4000:]
    assert wheel.name in there.stdout + there.stderr and sve.name not in there.stdout + there.stderr
    grace = emulated.enter_folder(root, machine_of("aarch64"), node_tmp / "enter-grace", [node_tmp, house],
                                  {"venv": venv_python}, cpu="neoverse-v2")  # fmt: skip
    on_grace = subprocess.run([str(grace["venv"]), str(house / INSTALLER), "--wheelhouse", str(house), "--trust",
                               key, "--python", venv_python, "--dry-run", "--json"], capture_output=True, text=True,
                              env=run_env)  # fmt: skip
    assert on_grace.returncode == 0, on_grace.stderr[-4000:]
    assert json.loads(on_grace.stdout)["wheel"] == sve.name
    loaded = subprocess.run([str(wrappers["venv"]), "-c", "from deepspeed.ops.op_builder import CPUAdamBuilder; "
                             "import platform; CPUAdamBuilder().load(verbose=False); print(platform.machine(), 'ok')"],
                            capture_output=True, text=True, env={**run_env, "DS_ACCELERATOR": "cpu",
                            "TORCH_EXTENSIONS_DIR": str(node_tmp / "ext")})  # fmt: skip
    assert loaded.stdout.strip().splitlines()[-1:] == ["aarch64 ok"], loaded.stderr[-3000:]
    assert not (node_tmp / "ext").exists() or not any((node_tmp / "ext").iterdir())  # nothing JIT-compiled


# ---------------------------------------------------------------- the node side: one machine per wheel


def _node_entry(machine: str) -> Any:
    from builder.node.manifest import parse_wheel_entry

    name = f"deepspeed-0.19.8+cpu.torch2.13-cp311-cp311-manylinux_2_28_{machine}.whl"
    data = {
        "python_tag": "cp311", "torch": "2.13.0", "accelerator": "cpu", "cuda": None, "archs": [],
        "cpu_target": "armv8-a" if machine == "aarch64" else "x86-64-v3", "cpu_flags": [], "ops": ["cpu_adam"],
        "recipe": "cpu", "published_at": "2026-11-01", "sha256": "0" * 64, "version": "0.19.8+cpu.torch2.13",
        "smoke": {"passed": True, "finished_at": "", "checks": {"import": {"status": "passed", "detail": ""}}},
    }  # fmt: skip
    return parse_wheel_entry(name, data, "test")


@pytest.mark.parametrize(
    ("tag", "machine"),
    [("manylinux_2_28_aarch64", "aarch64"), ("linux_x86_64", "x86_64"), ("manylinux2014_aarch64", "aarch64"),
     ("manylinux_2_17_x86_64.manylinux2014_x86_64", "x86_64"), ("any", None),
     ("manylinux_2_28_aarch64.manylinux_2_28_x86_64", None)],
)  # fmt: skip
def test_the_machine_of_a_platform_tag(tag: str, machine: str | None) -> None:
    from builder.node import tag_machine

    assert tag_machine(tag) == machine


def test_a_wheel_for_another_machine_is_refused_in_one_line_both_ways() -> None:
    """An x86_64 wheel offered to an aarch64 node and the reverse: one reason, the machines named (its
    CPU flags, glibc and the rest cannot be judged on a node it cannot run on)."""
    from builder.node import Node, mismatches

    arm, x86 = _node_entry("aarch64"), _node_entry("x86_64")
    grace = Node("cp311", "2.13.0+cu130", None, (), frozenset({"fp", "asimd"}), "2.36", "aarch64")
    epyc = Node("cp311", "2.13.0", None, (), frozenset({"avx2", "fma", "bmi2"}), "2.36", "x86_64")
    assert mismatches(x86, grace) == ["built for x86_64 nodes, this node is aarch64"]
    assert mismatches(arm, epyc) == ["built for aarch64 nodes, this node is x86_64"]
    assert mismatches(arm, grace) == [] and mismatches(x86, epyc) == []
    lacking = Node("cp311", "2.13.0", None, (), frozenset({"fp"}), "2.36", "aarch64")
    assert mismatches(arm, lacking) == ["CPU ops built for armv8-a, node CPU lacks asimd"]


def test_an_arm_node_reads_its_cpu_features_and_its_machine() -> None:
    from builder.node.probe import parse_cpu_flags, parse_node_probe

    grace = "processor\t: 0\nFeatures\t: fp asimd sve2 bf16\nCPU implementer\t: 0x41\n"
    assert parse_cpu_flags(grace, "aarch64") == frozenset({"fp", "asimd", "sve2", "bf16"})
    assert parse_cpu_flags("flags\t\t: fpu avx2\n", "aarch64") == frozenset()  # qemu-user shows the host's list
    assert parse_cpu_flags("flags\t\t: fpu avx2\n", "x86_64") == frozenset({"fpu", "avx2"})
    said = json.dumps({"python_tag": "cp311", "torch": "2.13.0+cu130", "cuda": "13.0", "gpus": [],
                       "glibc": "2.36", "machine": "aarch64"})  # fmt: skip
    node = parse_node_probe(said, frozenset())
    assert node.machine == "aarch64" and "aarch64" in node.describe()
    from builder.node import InstallError

    with pytest.raises(InstallError, match="machine"):
        parse_node_probe(said.replace('"aarch64"', '"aarch64; rm -rf /"'), frozenset())


# ---------------------------------------------------------------- the emulated node


def test_qemu_missing_is_one_line_saying_how_to_get_it() -> None:
    import dataclasses

    from builder.buildroot import emulated
    from builder.errors import SmokeError

    nowhere = dataclasses.replace(machine_of("aarch64"), qemu="qemu-aarch64-static-not-here")
    with pytest.raises(SmokeError) as err:
        emulated.qemu_for(nowhere)
    assert "runs under emulation, and this machine has no qemu-aarch64-static-not-here" in err.value.message
    assert "apt-get install qemu-user-static" in err.value.fix and "--no-smoke" in err.value.fix
    assert err.value.exit_code == 6


def test_the_node_is_entered_with_a_private_binfmt_and_an_arm_cpu_description() -> None:
    from builder.buildroot import emulated

    line = emulated.binfmt_line(machine_of("aarch64"), "/usr/bin/qemu-aarch64-static")
    assert line.startswith(":ds-builder-aarch64:M::\\x7f\\x45\\x4c\\x46\\x02") and line.endswith(
        ":/usr/bin/qemu-aarch64-static:F")  # fmt: skip
    inside = emulated.NODE_INSIDE
    assert inside.index("mount -t binfmt_misc") < inside.index("exec chroot")  # in the namespace, before the root
    assert 'mount --bind "$here/cpuinfo" "$mnt/root/proc/cpuinfo"' in inside
    assert "--map-root-user" in emulated.NODE_ENTER  # always a user namespace: its own binfmt_misc
    cpuinfo, files = emulated.cpu_description(4)
    assert cpuinfo.count("processor\t:") == 4 and "Features\t: fp asimd" in cpuinfo
    assert files["possible"] == "0-3\n" and files["cpu3/regs/identification/midr_el1"].strip() == "0x00000000413fd0c1"
    assert emulated.cpu_description(1)[1]["online"] == "0\n"


def test_the_node_roots_name_follows_what_it_holds() -> None:
    from builder.buildroot import emulated

    one = emulated.NodeSpec(machine_of("aarch64"), "http://m", ("torch==2.13.0", "numpy"))
    assert one.name.startswith("node-bookworm-arm64-") and one.name == emulated.NodeSpec(
        machine_of("aarch64"), "http://m", ("numpy", "torch==2.13.0")).name  # fmt: skip
    assert one.name != emulated.NodeSpec(machine_of("aarch64"), "http://m", ("torch==2.14.1", "numpy")).name
    assert one.describe() == "Debian bookworm arm64, torch==2.13.0 and 1 more"


def test_the_smoke_knows_the_machine_of_a_wheel_and_what_its_node_needs(tmp_path: Path) -> None:
    from builder import smoke

    assert smoke.wheel_machine("deepspeed-0.19.8+cpu.torch2.13-cp311-cp311-manylinux_2_28_aarch64.whl") == "aarch64"
    assert smoke.wheel_machine("deepspeed-0.19.8+cpu.torch2.13-cp311-cp311-linux_x86_64.whl") == "x86_64"
    meta = ("Metadata-Version: 2.1\nName: deepspeed\nVersion: 0.19.8\nRequires-Dist: torch==2.13.0\n"
            "Requires-Dist: numpy\nRequires-Dist: pywin32; sys_platform == 'win32'\n"
            "Requires-Dist: sve-only; platform_machine == 'aarch64'\n"
            "Requires-Dist: docs; extra == 'dev'\nRequires-Dist: odd; nonsense_name == 'x'\n"
            "Requires-Dist: ((broken\n\n")  # fmt: skip  # lines another's METADATA may hold: left out, no traceback
    wheel = _zip(tmp_path / "d.whl", {"deepspeed-0.19.8.dist-info/METADATA": meta.encode()})

    class Manifest:  # only what node_requirements reads
        python_tag = "cp311"

    wanted = smoke.node_requirements(wheel, Manifest(), "aarch64")  # type: ignore[arg-type]
    assert "torch==2.13.0" in wanted and "numpy" in wanted
    assert 'sve-only; platform_machine == "aarch64"' in wanted
    assert not any(w.startswith(("pywin32", "docs", "odd", "((")) for w in wanted) and "safetensors>=0.4" in wanted
    assert "nvidia-ml-py" in wanted  # a CUDA wheel's one more requirement: one node root serves both accelerators


def test_a_sites_root_without_the_cross_compiler_is_refused_in_one_line(tmp_path: Path) -> None:
    """[root] folder = a site's root (here a stand-in holding an x86 g++ only: labelled) for an aarch64 recipe."""
    from builder.buildroot import sandbox
    from builder.buildroot.spec import RootSpec
    from builder.errors import RootError

    root = tmp_path / "site-root"
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "usr" / "bin" / "g++").write_text("#!/bin/sh\n")  # STAND-IN: the site's own x86 compiler
    (root / "bin").symlink_to("usr/bin")
    spec = sandbox.for_machine(RootSpec("folder", folder=root), "aarch64")
    assert spec.cxx == "/usr/bin/aarch64-linux-gnu-g++"
    with pytest.raises(RootError) as err:
        sandbox.check_cross_compiler(root, spec, "aarch64")
    assert "has no /usr/bin/aarch64-linux-gnu-gcc: a wheel for aarch64 is compiled by a cross compiler" in (
        err.value.message)  # fmt: skip
    assert "g++-aarch64-linux-gnu" in err.value.fix and "[root] cc and cxx" in err.value.fix
    assert err.value.exit_code == 15
    named = sandbox.for_machine(RootSpec("folder", folder=root, cxx="/opt/cross/bin/g++"), "aarch64")
    assert named.cxx == "/opt/cross/bin/g++" and named.cc == "/usr/bin/aarch64-linux-gnu-gcc"  # what [root] names
    toolkit = sandbox.for_machine(RootSpec("debian"), "aarch64")
    assert "g++-aarch64-linux-gnu" in toolkit.packages and "libaio-dev" in toolkit.packages
    assert sandbox.for_machine(RootSpec("debian"), "x86_64") == RootSpec("debian")  # the host's root as before


def test_a_module_for_aarch64_nodes_has_a_version_of_its_own() -> None:
    """A software tree both x86_64 and GH200 nodes mount holds both modules of one recipe; an x86_64
    wheel's module keeps the version it always had."""
    from builder.node import module_version

    assert module_version(_node_entry("aarch64")) == "0.19.8+cpu.torch2.13-py3.11-aarch64"
    assert module_version(_node_entry("x86_64")) == "0.19.8+cpu.torch2.13-py3.11"


def test_an_aarch64_wheels_dependencies_are_resolved_for_aarch64() -> None:
    """The wheelhouse's closure for an aarch64 wheel takes aarch64 (and pure) dependency wheels, never this
    machine's, and evaluates markers for an aarch64 node; an x86_64 wheel's is as before."""
    import importlib

    from packaging.requirements import Requirement

    from builder.wheelhouse import closure

    publish = importlib.import_module("builder.wheelhouse.publish")  # the package's name `publish` is its function
    arm = "numpy-2.3.0-cp311-cp311-manylinux_2_17_aarch64.manylinux2014_aarch64.whl"
    x86 = "numpy-2.3.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
    pure = "hjson-3.1.0-py3-none-any.whl"
    assert closure.fits(arm, "cp311", "aarch64") and not closure.fits(x86, "cp311", "aarch64")
    assert closure.fits(x86, "cp311") and not closure.fits(arm, "cp311") and closure.fits(pure, "cp311", "aarch64")
    meta = "Requires-Dist: numpy\nRequires-Dist: sve-tools; platform_machine == 'aarch64'\n\n"
    assert [r.name for r in closure.requirements_of(meta, "cp311", (), "aarch64")] == ["numpy", "sve-tools"]
    assert [r.name for r in closure.requirements_of(meta, "cp311")] == ["numpy"]
    found = closure.resolve([Requirement("numpy")], "cp311", [x86, arm], lambda n: "", "aarch64")
    assert found.files == (arm,) and not found.missing
    assert publish.other_machine("deepspeed-0.19.8+cpu.torch2.13-cp311-cp311-manylinux_2_28_aarch64.whl") == "aarch64"
    assert publish.other_machine("deepspeed-0.19.8+cpu.torch2.13-cp311-cp311-manylinux_2_28_x86_64.whl") == ""
    assert "manylinux_2_28_aarch64" in closure.node_platforms("aarch64")


def test_time_limits_stretch_on_an_emulated_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under qemu-user torch imports 10 times slower: the smoke's torchrun, isolated checks and configs get
    10 times their limit there (a loaded build machine timed a 2-node torchrun out at 180 s); nonsense is 1."""
    from builder import smoke
    from builder.resources.smoke.common import SLOWDOWN_ENV, seconds

    monkeypatch.setenv(SLOWDOWN_ENV, str(smoke.EMULATED_SLOWDOWN))
    assert seconds(180) == 1800
    for said, factor in (("", 1), ("0.5", 1), ("nan", 1), ("1e9", 100), ("x", 1)):
        monkeypatch.setenv(SLOWDOWN_ENV, said)
        assert seconds(10) == 10 * factor, said


def test_a_folder_gathered_for_aarch64_nodes_is_refused_on_this_host_and_the_reverse(tmp_path: Path) -> None:
    """gather --machine aarch64 makes a folder for a GH200 node; an x86_64 host refuses it in one line (exit 4),
    and gather refuses what it cannot make before it fetches anything (exit 2)."""
    from fakes import sign_offline

    from builder import offline
    from builder.errors import SourceError, UsageError

    (tmp_path / "wheels").mkdir()
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    record = {"schema": 1, "recipe": "system", "python": python, "machine": "aarch64", "wheels": []}
    (tmp_path / offline.RECORD).write_text(json.dumps(record))
    sign_offline(tmp_path)
    with pytest.raises(SourceError, match="was gathered for aarch64 hosts, and this is x86_64") as err:
        offline.environ(tmp_path)
    assert err.value.exit_code == 4 and "--machine x86_64" in err.value.fix
    tags = offline.platforms("aarch64")
    assert tags[0] == "manylinux_2_17_aarch64" and "manylinux1_aarch64" not in tags
    gh200 = load_recipe(ROOT / "recipes" / "cu130-gh200.toml")
    with pytest.raises(UsageError, match="is for aarch64 nodes and --machine is x86_64") as err2:
        offline.gather(gh200, tmp_path / "dest", python, {}, tmp_path / "log")
    assert err2.value.exit_code == 2 and "--machine aarch64" in err2.value.fix
    with pytest.raises(UsageError, match="--machine 'riscv64' is not one this toolkit serves"):
        offline.gather(gh200, tmp_path / "dest", python, {}, tmp_path / "log", machine="riscv64")
    assert not (tmp_path / "dest").exists()


# ---------------------------------------------------------------- the SVE variant (Grace, Graviton 3/4)


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


def test_the_sve_variant_gives_cpu_adam_sve_and_the_other_ops_the_neon_recipes_units() -> None:
    """DeepSpeed's SVE path is CPU Adam's alone: its unit is built for armv8.2-a+sve with -D__SVE__, each
    other op's for armv8-a with NEON, keyed as the NEON recipe's own (a host that built that wheel
    compiles one unit for the variant)."""
    from types import SimpleNamespace

    from builder.units.plan import plan_units, unit_env
    from builder.wheelbuild.ops import OpInfo
    from builder.wheelbuild.plan import cpu_target_env

    recipe = load_recipe(ROOT / "recipes" / "cpu-aarch64-sve.toml")
    assert (recipe.cpu_target, recipe.label, recipe.machine) == ("armv8.2-a+sve", "sve", "aarch64")
    env = cpu_target_env(recipe.cpu_target)
    assert env["DS_BUILDER_CPU_ARCH"] == "-march=armv8-a" and env["DS_BUILDER_SIMD_WIDTH"] == "-D__NEON__"

    ops = [OpInfo(name, f"DS_BUILD_{name.upper()}", "", True) for name in ("cpu_adam", "cpu_lion")]

    def plan(target: str) -> Any:  # what unit_env and plan_units read
        env = {"DS_BUILD_CPU_ADAM": "1", "DS_BUILD_CPU_LION": "1", **cpu_target_env(target)}
        return SimpleNamespace(ops=ops, archs=(), recipe=SimpleNamespace(cpu_target=target), env=env)

    adam, lion = (unit_env(plan(recipe.cpu_target), op, 2) for op in ops)
    assert (adam["DS_BUILDER_CPU_ARCH"], adam["DS_BUILDER_SIMD_WIDTH"]) == ("-march=armv8.2-a+sve", "-D__SVE__")
    assert (lion["DS_BUILDER_CPU_ARCH"], lion["DS_BUILDER_SIMD_WIDTH"]) == ("-march=armv8-a", "-D__NEON__")
    assert "DS_BUILD_CPU_LION" not in adam
    assert unit_env(plan("armv8-a"), ops[0], 2)["DS_BUILDER_SIMD_WIDTH"] == "-D__NEON__"

    def keys(target: str, label: str | None) -> dict[str, str]:
        inputs = {"builder": "x", "cpu_target": target, "machine": {"name": "aarch64"}, "ops": ["cpu_adam", "cpu_lion"],
                  **({"label": label} if label else {})}  # fmt: skip
        return {u.op.name: u.key for u in plan_units(plan(target), inputs, 2, None)[0]}

    sve, neon = keys("armv8.2-a+sve", "sve"), keys("armv8-a", None)
    assert sve["cpu_lion"] == neon["cpu_lion"] and sve["cpu_adam"] != neon["cpu_adam"]


def test_a_node_with_sve_takes_the_sve_wheel_and_one_without_the_neon_wheel() -> None:
    from dataclasses import replace

    from builder.node import Node, WheelhouseManifest, choose, mismatches

    neon = _node_entry("aarch64")
    sve = replace(neon, cpu_target="armv8.2-a+sve", version="0.19.8+cpu.torch2.13.sve")
    house = WheelhouseManifest(wheels={"neon.whl": neon, "sve.whl": sve})
    grace = Node("cp311", "2.13.0", None, (), frozenset({"fp", "asimd", "sve", "sve2"}), "2.36", "aarch64")
    n1 = Node("cp311", "2.13.0", None, (), frozenset({"fp", "asimd"}), "2.36", "aarch64")
    assert choose(house, grace) is sve and choose(house, n1) is neon
    assert mismatches(sve, n1) == ["CPU ops built for armv8.2-a+sve, node CPU lacks sve"]


def test_the_emulated_smoke_forks_config_ranks_from_the_fork_server(tmp_path: Path) -> None:
    """Under qemu-user a rank forked from the config runner (its other configs' rendezvous on threads) hung
    on a lock held at the fork; the fork server holds no such threads. Limits are ten times longer."""
    from builder.smoke import emulated_env

    env = emulated_env(tmp_path, "cpu")
    assert env["DS_CONFIG_RUNNER_START"] == "forkserver" and env["DS_BUILDER_SLOWDOWN"] == "10"
    assert env["DS_ACCELERATOR"] == "cpu" and env["PATH"] == "/usr/bin:/bin"


def test_the_emulated_node_is_shown_a_cpu_with_what_the_wheel_needs() -> None:
    """FAKE CPU descriptions (labelled): Neoverse N1 for an armv8-a wheel, Neoverse V2 (Grace's core) for SVE."""
    from builder.buildroot import emulated

    assert emulated.cpu_for("armv8-a") == "neoverse-n1" and emulated.cpu_for("armv8.2-a+sve") == "neoverse-v2"
    text, files = emulated.cpu_description(2, "neoverse-v2")
    assert " sve " in text and "CPU part\t: 0xd4f" in text and text.count("processor") == 2
    assert files["cpu1/regs/identification/midr_el1"] == "0x00000000410fd4f0\n"
    assert emulated.cpu_description(1)[1]["cpu0/regs/identification/midr_el1"] == "0x00000000413fd0c1\n"
