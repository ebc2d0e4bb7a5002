"""Issue 63: the GH200 recipe's CUDA ops, cross-built on this x86_64 machine with no GPU, load on an
aarch64 node under qemu.

nvcc (this machine's) compiles the device code for sm_90 with the root's aarch64 g++ as its host compiler;
the ops link against torch 2.13.0's aarch64 CUDA libraries and NVIDIA's aarch64 libcudart. The smoke on
the emulated aarch64 node (the one the cpu-aarch64 test uses: one root serves both) loads every op with
no compiler, its symbols resolved against torch's CUDA libraries there, and checks the CPU ops' numerics;
what the CUDA ops compute is `prove`'s on a GH200 (no GPU here, and qemu-user has none).
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from test_aarch64 import _emulation_ready, build_and_smoke, cross_work

from builder import glibc
from builder.machines import HOST

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(HOST != "x86_64", reason="the toolkit cross-builds from an x86_64 host only")


@pytest.mark.integration
@pytest.mark.skipif(_emulation_ready() is not None, reason=str(_emulation_ready()))
def test_the_gh200_recipe_is_cross_built_and_its_cuda_ops_load_on_an_emulated_aarch64_node(
    workspace: Path, tmp_path: Path, held: contextlib.ExitStack
) -> None:
    wheel, said = build_and_smoke("cu130-gh200.toml", *cross_work("cu130-gh200", workspace, tmp_path, held))
    ops = ("fused_adam", "fused_lamb", "fused_lion", "cpu_adam", "cpu_adagrad", "cpu_lion", "utils")
    for op in ops:  # every op loads from the wheel on the aarch64 node, CUDA ones included, with no JIT
        assert re.search(rf"passed\s+load:{op}\s+{op} loaded from \S+aarch64-linux-gnu\.so, no JIT", said), op
    for op in ("cpu_adam", "cpu_adagrad", "cpu_lion"):
        assert re.search(rf"passed\s+numerics:{op}\s", said), op
    assert re.search(r"skipped\s+numerics:fused_adam\s+no GPU visible", said)  # said, never passed
    assert wheel.name == "deepspeed-0.19.8+cu130.torch2.13.sm90-cp311-cp311-manylinux_2_28_aarch64.whl"
    tree = tmp_path / "tree"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(tree)
    assert len(list(tree.rglob("*.so"))) == 7 and glibc.foreign_objects(tree, "EM_AARCH64") == []
    assert glibc.above_floor(glibc.needed_symbols(tree), "manylinux_2_28", "aarch64") == []
    (fused,) = tree.glob("deepspeed/ops/adam/fused_adam_op.*.so")
    needed = subprocess.run(["readelf", "-d", str(fused)], capture_output=True, text=True, check=True).stdout
    for lib in ("libcudart.so.13", "libc10_cuda.so"):  # the node's (torch's aarch64 wheel brings them)
        assert f"[{lib}]" in needed, needed
    (info,) = tree.glob("*.dist-info")
    built = json.loads((info / "ds_builder.json").read_text())
    assert built["op_archs"]["fused_adam"] == ["sass_90"] and built["op_archs"]["cpu_adam"] == []
    assert built["torch"] == {"version": "2.13.0+cu130", "cuda": "13.0"} and built["cpu_target"] == "armv8-a"
    assert "Requires-Dist: torch==2.13.0\n" in (info / "METADATA").read_text()


@pytest.mark.integration
@pytest.mark.skipif(_emulation_ready() is not None, reason=str(_emulation_ready()))
def test_a_folder_gathered_for_a_gh200_node_installs_the_toolkit_there_from_it_alone(tmp_path: Path) -> None:
    """gather --machine aarch64 (a GH200 node with its own torch: recipes/system.toml) fetches every wheel for
    aarch64; this x86_64 host refuses the folder in one line; on the emulated aarch64 node (the smoke's root)
    pip installs the toolkit from the folder alone, with no index, as docs/pipeline.md tells a node."""
    import os
    import shutil

    from builder.buildroot import emulated, make
    from builder.machines import machine_of

    found = sorted(make.roots_folder(os.environ).glob("node-bookworm-arm64-*.json"))
    if not found:
        pytest.skip("no emulated aarch64 node root on this machine yet (the GH200 test above makes it)")
    folder = tmp_path / "for-gh200"
    done = subprocess.run([sys.executable, "-m", "builder", "gather", "--machine", "aarch64", "--python", "3.11",
                           "--recipe", "recipes/system.toml", "--dest", str(folder), "--work-dir", str(tmp_path / "w")],
                          cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    record = json.loads((folder / "offline.json").read_text())
    assert record["machine"] == "aarch64" and record["root"] is None  # an x86_64 root is no use there
    names = [w["file"] for w in record["wheels"]]
    assert not any("x86_64" in n for n in names) and any(n.endswith("aarch64.whl") for n in names), names
    # the node's own torch and its CUDA libraries stay out (nvidia-ml-py is the toolkit's own)
    assert not any(n.startswith(("torch-", "nvidia_")) and not n.startswith("nvidia_ml_py-") for n in names)
    refused = subprocess.run([sys.executable, "-m", "builder", "build-wheel", "--recipe", "recipes/system.toml",
                              "--offline", str(folder), "--work-dir", str(tmp_path / "w")], cwd=ROOT,
                             capture_output=True, text=True)  # fmt: skip
    assert refused.returncode == 4 and "was gathered for aarch64 hosts, and this is x86_64" in refused.stderr

    root = Path(json.loads(found[0].read_text())["path"])
    node = tmp_path / "node"
    source = node / "src"  # the toolkit's source as a node receives it (pip builds in the tree it is given)
    shutil.copytree(ROOT / "builder", source / "builder", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    programs = {"python3": "/usr/bin/python3", "venv": str(node / "venv" / "bin" / "python")}
    wrappers = emulated.enter_folder(root, machine_of("aarch64"), node / "enter", [node, folder], programs)
    env = {"HOME": str(node), "PATH": "/usr/bin:/bin", "PIP_CONFIG_FILE": "/dev/null", "PIP_NO_CACHE_DIR": "1",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}  # fmt: skip
    steps = [[str(wrappers["python3"]), "-m", "venv", str(node / "venv")],
             [str(wrappers["venv"]), "-m", "pip", "install", "--no-index", "--find-links", str(folder / "wheels"),
              str(source)],
             [str(wrappers["venv"]), "-c", "import platform, uv, builder.cli, builder.machines as m; "
              "print(platform.machine(), m.HOST)"]]  # fmt: skip
    for argv in steps:
        ran = subprocess.run(argv, capture_output=True, text=True, env=env)
        assert ran.returncode == 0, (argv[1:3], ran.stdout[-2000:], ran.stderr[-3000:])
    assert ran.stdout.split() == ["aarch64", "aarch64"]
