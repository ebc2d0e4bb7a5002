"""Toolchain repair: planned purely, applied idempotently, and proven by a real nvcc compile."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import pytest

from builder.detect import Compiler, Cpu, HostRange, Libraries, Report, Toolkit, TorchFacts, detect
from builder.errors import ToolError
from builder.wheelbuild.toolchain import LINKS_RECORD, ToolchainPlan, apply, compose_env, plan_toolchain

KIT = Toolkit(
    "/usr/local/cuda-13.0", "/usr/local/cuda-13.0/bin/nvcc", "13.0", ("PATH",), HostRange(None, 15, 3, 20, "t"), ()
)
GCC = [
    Compiler("gcc", "gcc", "/fake/gcc", "16.1.0"),
    Compiler("gcc", "g++", "/fake/g++", "16.1.0"),
    Compiler("gcc", "gcc-11", "/usr/bin/gcc-11", "11.4.0"),
    Compiler("gcc", "g++-11", "/usr/bin/g++-11", "11.4.0"),
    Compiler("gcc", "gcc-12", "/usr/bin/gcc-12", "12.2.0"),
    Compiler("gcc", "g++-12", "/usr/bin/g++-12", "12.2.0"),
    Compiler("gcc", "gcc-17", "/usr/bin/gcc-17", "17.0.0"),  # no g++-17, and too new anyway
]


def report(
    default_gcc: str = "16.1.0", kit: Toolkit = KIT, torch_cuda: str = "13.0", headers: tuple[str, ...] = ()
) -> Report:
    torch = TorchFacts("python", "2.14.1+cu130", torch_cuda, True, pip_cuda_include=headers)
    return Report((), "none", None, None, (kit,), kit.root, torch, tuple(GCC), default_gcc, Cpu(), Libraries())


def test_gcc_outside_nvccs_range_gets_the_newest_supported_pair(tmp_path: Path) -> None:
    plan = plan_toolchain(report(), tmp_path / "cc", need_cuda=True)
    assert plan.links == {
        "gcc": "/usr/bin/gcc-12",
        "g++": "/usr/bin/g++-12",
        "cc": "/usr/bin/gcc-12",
        "c++": "/usr/bin/g++-12",
    }
    assert plan.set_vars["CXX"] == str(tmp_path / "cc" / "g++")
    assert plan.set_vars["NVCC_PREPEND_FLAGS"] == f"-ccbin {tmp_path / 'cc'}"
    assert plan.set_vars["CUDA_HOME"] == "/usr/local/cuda-13.0"
    assert plan.prepend["PATH"][:2] == (str(tmp_path / "cc"), "/usr/local/cuda-13.0/bin")


def test_supported_default_gcc_needs_no_links(tmp_path: Path) -> None:
    plan = plan_toolchain(report("12.2.0"), tmp_path / "cc", need_cuda=True)
    assert plan.compiler_dir is None and not plan.links and "CC" not in plan.set_vars


def test_no_supported_gcc_is_a_clear_error(tmp_path: Path) -> None:
    bare = dataclasses.replace(report(), compilers=tuple(c for c in GCC if c.path.startswith("/fake")))
    with pytest.raises(ToolError, match="outside what nvcc 13.0 accepts") as err:
        plan_toolchain(bare, tmp_path, need_cuda=True)
    assert "apt-get install gcc-15 g++-15" in err.value.fix


def test_toolkit_mismatch_is_refused(tmp_path: Path) -> None:
    r = dataclasses.replace(report(torch_cuda="12.4"), chosen_toolkit=None)
    with pytest.raises(ToolError, match="no CUDA toolkit matches torch's CUDA 12.4") as err:
        plan_toolchain(r, tmp_path, need_cuda=True)
    assert "install CUDA 12.4" in err.value.fix


def test_cpu_build_needs_no_toolkit(tmp_path: Path) -> None:
    assert plan_toolchain(report(), tmp_path, need_cuda=False).toolkit is None


def test_missing_headers_come_from_pip_packages(tmp_path: Path) -> None:
    pip_inc = tmp_path / "site" / "nvidia" / "cu13" / "include"
    pip_inc.mkdir(parents=True)
    (pip_inc / "cusparse.h").write_text("")
    kit = dataclasses.replace(KIT, missing_headers=("cusparse.h",))
    plan = plan_toolchain(report(kit=kit, headers=(str(tmp_path / "empty"), str(pip_inc))), tmp_path, need_cuda=True)
    assert plan.prepend["CPATH"] == (str(pip_inc),)
    with pytest.raises(ToolError, match="lacks cusparse.h and no pip nvidia package provides them"):
        plan_toolchain(report(kit=kit), tmp_path, need_cuda=True)


def test_compose_env_prepends_and_never_overwrites() -> None:
    plan = ToolchainPlan(None, None, {}, {"PATH": ("/a", "/b"), "CPATH": ("/inc",)}, {"CUDA_HOME": "/cuda"})
    env = compose_env({"PATH": "/usr/bin:/b", "CPATH": "/mine", "HOME": "/root"}, plan)
    assert env["PATH"] == "/a:/b:/usr/bin"
    assert env["CPATH"] == "/inc:/mine"
    assert env["CUDA_HOME"] == "/cuda" and env["HOME"] == "/root"
    assert compose_env({}, plan)["PATH"] == "/a:/b"


def test_apply_is_idempotent_and_relinks_only_its_own_links(tmp_path: Path) -> None:
    folder = tmp_path / "cc"
    plan = ToolchainPlan(KIT, folder, {"gcc": "/usr/bin/gcc-12", "g++": "/usr/bin/g++-12"})
    assert apply(plan, dry_run=True) == [
        f"mkdir {folder}",
        f"link {folder}/g++ -> /usr/bin/g++-12",
        f"link {folder}/gcc -> /usr/bin/gcc-12",
    ]
    assert not folder.exists()  # dry run changed nothing
    assert len(apply(plan)) == 3
    assert os.readlink(folder / "gcc") == "/usr/bin/gcc-12"
    assert json.loads((folder / LINKS_RECORD).read_text())["links"] == dict(plan.links)
    assert apply(plan) == []  # second run: nothing to do
    moved = dataclasses.replace(plan, links={"gcc": "/usr/bin/gcc-11", "g++": "/usr/bin/g++-12"})
    assert apply(moved) == [f"relink {folder}/gcc -> /usr/bin/gcc-11"]
    assert os.readlink(folder / "gcc") == "/usr/bin/gcc-11"


def test_a_users_own_link_is_never_replaced(tmp_path: Path) -> None:
    """Hostile/foreign input: a gcc -> /bin/false the user made in the folder is refused, not relinked."""
    folder = tmp_path / "cc"
    folder.mkdir()
    (folder / "gcc").symlink_to("/bin/false")
    plan = ToolchainPlan(KIT, folder, {"gcc": "/usr/bin/gcc-12", "g++": "/usr/bin/g++-12"})
    with pytest.raises(ToolError, match=r"cc/gcc is a symlink to /bin/false that this toolkit did not make"):
        apply(plan)
    assert os.readlink(folder / "gcc") == "/bin/false"
    assert not (folder / "g++").exists()  # checked everything before creating anything
    with pytest.raises(ToolError, match="did not make"):
        apply(plan, dry_run=True)


def test_a_file_in_the_folder_is_refused_before_anything_is_made(tmp_path: Path) -> None:
    folder = tmp_path / "cc"
    folder.mkdir()
    (folder / "g++").write_text("not ours")
    plan = ToolchainPlan(KIT, folder, {"gcc": "/usr/bin/gcc-12", "g++": "/usr/bin/g++-12"})
    with pytest.raises(ToolError, match="is a file that this toolkit did not make"):
        apply(plan)
    assert (folder / "g++").read_text() == "not ours" and not (folder / "gcc").exists()


@pytest.mark.parametrize("folder", ["/usr/bin", "/usr/local/bin", "/bin", "/etc/alternatives", "/"])
def test_system_folders_are_refused_even_for_a_dry_run(folder: str) -> None:
    plan = ToolchainPlan(KIT, Path(folder), {"gcc": "/usr/bin/gcc-12", "g++": "/usr/bin/g++-12"})
    with pytest.raises(ToolError, match="is a system folder"):
        apply(plan, dry_run=True)


def fake_gcc16(folder: Path) -> Path:
    """FAKE gcc/g++ 16 first on PATH: answers the version query, fails any compile."""
    folder.mkdir()
    for name in ("gcc", "g++"):
        script = folder / name
        script.write_text(
            '#!/bin/sh\ncase "$1" in -dumpfullversion) echo 16.1.0; exit 0;; esac\n'
            'echo "fake gcc 16: refusing to compile" >&2\nexit 1\n'
        )
        script.chmod(0o755)
    return folder


@pytest.mark.spawns
@pytest.mark.skipif(not Path("/usr/local/cuda/bin/nvcc").exists(), reason="needs nvcc at /usr/local/cuda")
def test_repair_with_a_fake_gcc16_really_compiles_through_nvcc(tmp_path: Path) -> None:
    fake = fake_gcc16(tmp_path / "fakebin")
    env = {**os.environ, "PATH": f"{fake}:/usr/local/cuda/bin:{os.environ['PATH']}"}
    r = detect(env, "no-such-python")
    assert r.default_gcc == "16.1.0"
    # This torch-less report has no header facts; the .cu below needs none of the math headers.
    kits = tuple(dataclasses.replace(t, missing_headers=()) for t in r.toolkits)
    plan = plan_toolchain(dataclasses.replace(r, toolkits=kits), tmp_path / "toolchain", need_cuda=True)
    assert plan.compiler_dir == tmp_path / "toolchain"
    real_gxx = Path(plan.links["g++"])
    assert real_gxx.name.startswith("g++-") and int(real_gxx.name.split("-")[1]) <= 15
    apply(plan)
    cu = tmp_path / "k.cu"
    cu.write_text("__global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }\nint main() { return 0; }\n")
    compile_cmd = ["nvcc", "-arch=sm_90", "-c", str(cu), "-o", str(tmp_path / "k.o")]
    broken = subprocess.run(compile_cmd, env=env, capture_output=True, text=True)
    assert broken.returncode != 0 and "fake gcc 16" in broken.stderr  # the trap is real
    fixed = subprocess.run(compile_cmd, env=compose_env(env, plan), capture_output=True, text=True)
    assert fixed.returncode == 0, fixed.stderr
    assert (tmp_path / "k.o").stat().st_size > 0
