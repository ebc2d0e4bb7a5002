"""A CUDA wheel built for real on a machine without a GPU: fused_adam + cpu_adam + utils for sm_80
and sm_90, with no system toolkit visible (nvcc 13.0 comes from pip's nvidia-cuda-nvcc wheels).

Installs the CUDA 13.0 build of torch 2.14.1 (about 5.5 GB) into the build and smoke
environments; about 4 to 5 minutes on 2 cores.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from email.parser import Parser
from pathlib import Path

import pytest
from fakes import host_platform

from builder.archs import so_compressed

ROOT = Path(__file__).resolve().parents[1]
VERSION = "0.19.8+cu130.torch2.14.sm80.sm90"
RECIPE = "cu130-multi-min"
WHEEL = f"deepspeed-{VERSION}-cp311-cp311-manylinux_2_35_x86_64.whl"  # platform = "host": this Debian 12 build's floor
# Measured with DeepSpeed's plain build for the same ops (see docs/benchmarks.md): a 15.6 MB wheel.
PLAIN_WHEEL_BYTES = 15_600_000

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        sys.version_info[:2] != (3, 11), reason="the recipe's torch 2.14.1 wheel here is for Python 3.11"
    ),
]


def zmm_instructions(so: Path) -> int:
    """How many AVX-512 (zmm) instructions a shared object holds."""
    dump = subprocess.run(["objdump", "-d", str(so)], capture_output=True, text=True, check=True).stdout
    return dump.count("%zmm")


def debug_sections(so: Path) -> list[str]:
    """The .debug_* sections a shared object still holds (strip --strip-debug removes them all)."""
    from elftools.elf.elffile import ELFFile

    with so.open("rb") as f:
        return [sec.name for sec in ELFFile(f).iter_sections() if sec.name.startswith(".debug_")]


def supported_gcc() -> str | None:
    """A gcc-N (N <= 15, what nvcc 13 accepts) with its g++-N, to stand behind the fake gcc 16."""
    for n in range(15, 8, -1):
        if shutil.which(f"gcc-{n}") and shutil.which(f"g++-{n}"):
            return f"gcc-{n}"
    return None


# As root, a private mount namespace can hide this machine's toolkit, for the build and for the
# smoke, as on a GPU node that has none: /usr/local becomes a tmpfs holding everything it held
# except cuda* (an empty folder would not do: torch falls back to /usr/local/cuda if it exists).
# Nothing outside the namespace changes; HIDE_DIR is a scratch folder for the original view.
_MASK = """
orig="$HIDE_DIR/usr-local"; mkdir -p "$orig" || exit 97
mount --bind /usr/local "$orig" && mount -t tmpfs none /usr/local || exit 97
for e in "$orig"/* "$orig"/.[!.]*; do
  [ -e "$e" ] || [ -L "$e" ] || continue
  n=$(basename "$e")
  case "$n" in cuda*) continue;; esac
  if [ -L "$e" ]; then cp -P "$e" "/usr/local/$n"
  elif [ -d "$e" ]; then mkdir "/usr/local/$n" && mount --bind "$e" "/usr/local/$n"
  else touch "/usr/local/$n" && mount --bind "$e" "/usr/local/$n"; fi || exit 97
done
exec "$@"
"""
_HIDE_DIR = tempfile.mkdtemp(prefix="hide-toolkit-")
atexit.register(shutil.rmtree, _HIDE_DIR, True)


def _can_hide_toolkit() -> bool:
    if not shutil.which("unshare") or os.geteuid() != 0:
        return False
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", _MASK, "sh", "sh", "-c", "! ls -d /usr/local/cuda*"],
        capture_output=True, env={**os.environ, "HIDE_DIR": _HIDE_DIR},
    )  # fmt: skip
    return probe.returncode == 0


HIDE_TOOLKIT = _can_hide_toolkit()


def hidden_toolkit(args: list[str]) -> list[str]:
    """`args` run where /usr/local/cuda* do not exist, when this machine allows it."""
    if not HIDE_TOOLKIT:
        return args
    return ["env", f"HIDE_DIR={_HIDE_DIR}", "unshare", "-m", "--propagation", "private", "sh", "-c", _MASK, "sh", *args]


def without_system_toolkit(base: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in base.items() if k not in ("CUDA_HOME", "CUDA_PATH")}
    env["PATH"] = os.pathsep.join(d for d in base["PATH"].split(os.pathsep) if d and not Path(d, "nvcc").exists())
    env["DS_BUILDER_CUDA_SEARCH"] = ""  # /usr/local/cuda* and /opt/cuda* are not looked at
    return env


@pytest.fixture(scope="module")
def cuda_build(workspace: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """Build with no system CUDA toolkit visible (CUDA_HOME unset, no nvcc on PATH, no cuda*
    folder searched), so nvcc must come from pip; and with a FAKE gcc/g++ 16 first on PATH (nvcc 13
    rejects gcc 16, and the fake compiles nothing), so the build only succeeds if build-wheel
    really uses the repaired toolchain."""
    house = tmp_path_factory.mktemp("cuda-wheelhouse")
    env = without_system_toolkit(os.environ)
    if supported_gcc():
        fake = tmp_path_factory.mktemp("fake-gcc16")
        for name in ("gcc", "g++", "cc", "c++"):
            script = fake / name
            script.write_text(
                '#!/bin/sh\ncase "$1" in -dumpfullversion) echo 16.1.0; exit 0;; esac\n'
                'echo "fake gcc 16: refusing to compile" >&2\nexit 1\n'
            )
            script.chmod(0o755)
        env["PATH"] = f"{fake}{os.pathsep}{env['PATH']}"
    # The shipped recipe compiles in pypa's manylinux_2_28 image (torch 2.14 needs gcc 11+), which no
    # registry here serves: the same recipe for this host's own OS (platform = "host").
    recipe = tmp_path_factory.mktemp("cuda-recipe") / f"{RECIPE}.toml"
    recipe.write_text(host_platform((ROOT / "recipes" / f"{RECIPE}.toml").read_text()))
    result = subprocess.run(
        hidden_toolkit([sys.executable, "-m", "builder", "build-wheel", "--recipe", str(recipe),
                        "--work-dir", str(workspace), "--wheelhouse", str(house)]),
        cwd=ROOT, capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-5000:]
    return house, result.stderr


def test_cuda_wheel_holds_every_op_for_both_archs_built_with_nvcc_from_pip(
    cuda_build: tuple[Path, str], workspace: Path, tmp_path: Path
) -> None:
    house, stderr = cuda_build
    wheel = house / WHEEL
    assert wheel.is_file(), sorted(p.name for p in house.iterdir())
    assert "toolchain: headers" in stderr and "nvidia/cu13/include" in stderr  # pip headers on CPATH
    gcc = supported_gcc()
    if gcc:
        assert f"toolchain: default gcc 16.1.0 is outside nvcc's range; using {gcc}" in stderr
    with zipfile.ZipFile(wheel) as zf:
        manifest = json.loads(zf.read(f"deepspeed-{VERSION}.dist-info/ds_builder.json"))
        meta = Parser().parsestr(zf.read(f"deepspeed-{VERSION}.dist-info/METADATA").decode())
        installed = zf.read("deepspeed/git_version_info_installed.py").decode()
        zf.extractall(tmp_path)
    assert meta["Version"] == VERSION
    assert "torch==2.14.1" in (meta.get_all("Requires-Dist") or [])
    assert "'fused_adam': 1" in installed and "'cpu_adam': 1" in installed and "'utils': 1" in installed
    assert "accelerator_name='cuda'" in installed
    assert manifest["archs"] == ["8.0", "9.0"] and manifest["flags"]["TORCH_CUDA_ARCH_LIST"] == "8.0;9.0"
    assert manifest["op_archs"]["fused_adam"] == ["sass_80", "sass_90"]  # read back from the .so's fatbin
    assert manifest["narrowed_ops"] == {} and manifest["device_code_compressed"] is True
    assert manifest["toolchain"]["nvcc"] == "13.0" and manifest["torch"]["cuda"] == "13.0"
    # No system toolkit was visible: nvcc was installed from pip into the work folder's cache.
    assert manifest["toolchain"]["toolkit_source"].startswith("pip nvidia-cuda-nvcc==13.0.")
    assert manifest["toolchain"]["cuda_home"].startswith(str(workspace / "cache" / "toolkits" / "cuda-13.0"))
    assert "toolkit: installing nvcc for CUDA 13.0 from pip" in stderr or "/toolkits/cuda-13.0/" in stderr
    if gcc:
        assert manifest["toolchain"]["gcc"] == "16.1.0"  # the default it had to work around
        assert manifest["toolchain"]["host_compiler"] == shutil.which(gcc.replace("gcc", "g++"))

    # Stripped: nothing was compiled with -g (it would only be stripped), no .so keeps a debug
    # section, and the wheel stays well under the plain one. The build record next to the wheel
    # keeps the sizes before stripping (the wheel cannot: they may vary between clean builds).
    assert manifest["stripped"] is True and manifest["flags"]["DS_BUILDER_NO_DEBUG"] == "1"
    record = json.loads((workspace / "dist" / f"{WHEEL}.build.json").read_text())
    logs = "\n".join(Path(unit["log"]).read_text() for unit in record["units"].values() if unit["status"] == "built")
    compiles = [line for line in logs.splitlines() if " -c " in line and ("c++ " in line or "nvcc" in line)]
    assert compiles and not [line for line in compiles if " -g " in f"{line} "]
    (fused,) = (tmp_path / "deepspeed" / "ops" / "adam").glob("fused_adam_op*.so")
    assert so_compressed(fused)  # -Xfatbin -compress-all reached nvcc (read back from the fatbin)
    sizes = record["shared_objects"]
    assert {p: s["bytes"] for p, s in manifest["shared_objects"].items()} == {p: s["bytes"] for p, s in sizes.items()}
    for path, size in sizes.items():
        assert debug_sections(tmp_path / path) == [], path
        assert (tmp_path / path).stat().st_size == size["bytes"] <= size["before"]
    assert wheel.stat().st_size < PLAIN_WHEEL_BYTES * 0.3

    # Portable CPU ops: built on an AVX-512 host for x86-64-v3, so no AVX-512 instruction inside.
    if shutil.which("objdump"):
        (cpu_adam,) = (tmp_path / "deepspeed" / "ops" / "adam").glob("cpu_adam_op*.so")
        assert zmm_instructions(cpu_adam) == 0


def test_cuda_wheel_smoke_report(cuda_build: tuple[Path, str]) -> None:
    house, _ = cuda_build
    entry = json.loads((house / "manifest.json").read_text())["wheels"][WHEEL]
    checks = {name: check["status"] for name, check in entry["smoke"]["checks"].items()}
    assert entry["smoke"]["passed"] and entry["archs"] == ["8.0", "9.0"] and entry["cuda"] == "13.0"
    for op in ("fused_adam", "cpu_adam", "utils"):
        assert checks[f"load:{op}"] == "passed"
    assert checks["numerics:cpu_adam"] == "passed"
    assert checks["torch"] == "passed" and checks["no-jit"] == "passed"
    # FusedAdam needs a GPU; here it must be reported as skipped, never as passed.
    expected = "passed" if Path("/dev/nvidiactl").exists() else "skipped"
    assert checks["numerics:fused_adam"] == expected
    assert checks["engine:zero2-offload"] == expected  # the CUDA accelerator's engine needs NCCL, so GPUs
    for name in ("quantized:int8:auto", "quantized:nf4:auto", "dist:gloo:1x2", "dist:gloo:2-nodes", "ds_report"):
        assert checks[name] == "passed", name
    # Smoked as on a GPU node without a CUDA toolkit: import, ds_report and every op load above ran
    # with torch finding none. Where the toolkit cannot be hidden, the check says why it skipped.
    no_toolkit = entry["smoke"]["checks"]["no-toolkit"]
    if HIDE_TOOLKIT:
        assert no_toolkit["status"] == "passed", no_toolkit["detail"]
    else:
        assert no_toolkit["status"] == "skipped" and "still finds a CUDA toolkit" in no_toolkit["detail"]


def build_variant(workspace: Path, name: str, archs: list[str], ops: list[str]) -> subprocess.CompletedProcess[str]:
    """build-wheel --no-smoke for CI's CUDA recipe with another name, archs and ops, in the build
    environment cuda_build made, with no system toolkit visible."""
    text = host_platform((ROOT / "recipes" / f"{RECIPE}.toml").read_text())
    changes = {f'name = "{RECIPE}"': f'name = "{name}"', 'arch = ["8.0", "9.0"]': f"arch = {json.dumps(archs)}",
               'ops = ["fused_adam", "cpu_adam", "utils"]': f"ops = {json.dumps(ops)}"}  # fmt: skip
    for old, new in changes.items():
        assert old in text, old
        text = text.replace(old, new)
    recipe = workspace / f"{name}.toml"
    recipe.write_text(text)
    return subprocess.run(
        [sys.executable, "-m", "builder", "build-wheel", "--recipe", str(recipe), "--work-dir", str(workspace),
         "--no-smoke"],
        cwd=ROOT, capture_output=True, text=True, env=without_system_toolkit(os.environ),
    )  # fmt: skip


def test_ops_that_cannot_build_here_are_refused_before_compiling(cuda_build: tuple[Path, str], workspace: Path) -> None:
    """Both pass DeepSpeed's own compatibility check, then fail minutes into a build: DeepSpeed
    0.19.8's fp_quantizer does not compile with nvcc 13.0, cutlass_ops imports deepspeed-kernels
    while building. Named in the recipe, they are refused before anything compiles, each with its
    reason (exit 5). (The arch-narrowing refusal, exit 2, is tested in test_ops_and_plan: with nvcc
    13.0 every op whose builder drops 7.5 is one of these.)"""
    done = build_variant(workspace, "refused", ["7.5", "9.0"], ["fused_adam", "fp_quantizer", "cutlass_ops"])
    assert done.returncode == 5, done.stderr[-4000:]
    assert "cannot build fp_quantizer, cutlass_ops here" in done.stderr, done.stderr[-4000:]
    assert "does not compile with nvcc 13.0" in done.stderr and "No module named 'dskernels'" in done.stderr
    assert 'on_op_failure = "drop"' in done.stderr
    log = (workspace / "logs" / "refused-build.log").read_text()
    assert "nvcc" not in "".join(line for line in log.splitlines() if " -c " in line)  # nothing compiled


def test_the_cuda_wheel_as_a_wheel_variant_that_uv_picks_by_gpu(
    cuda_build: tuple[Path, str], workspace: Path, tmp_path: Path
) -> None:
    """Issue 23: the real CUDA wheel published again with --variants: its variant (labelled by
    both archs) is made from its bytes, verify rebuilds and compares it, and the uv the toolkit pins
    installs the variant on a forced sm_90 node with a CUDA 13 driver (the whole wheel: ops,
    dist-info with the shared version, DeepSpeed's scripts from .data); where the driver is too old
    nothing fits and nothing is installed (issue 28: no null fallback that cannot run there). No GPU
    here: the provider's FORCE variables stand in."""
    from builder.envs import uv_binary

    house, _ = cuda_build
    published = subprocess.run(
        [sys.executable, "-m", "builder", "publish", "--variants", "--work-dir", str(workspace), "--wheelhouse",
         str(house), str(workspace / "dist" / WHEEL)],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert published.returncode == 0, published.stderr[-3000:]
    shared = "0.19.8+cu130.torch2.14"
    labelled = f"deepspeed-{shared}-cp311-cp311-manylinux_2_35_x86_64-cu130_sm80.sm90.whl"
    manifest = json.loads((house / "manifest.json").read_text())
    assert sorted(manifest["variants"]) == [labelled]
    assert manifest["variants"][labelled]["properties"] == [
        "nvidia :: cuda_version_lower_bound :: 13.0", "nvidia :: sm_arch :: 80_real", "nvidia :: sm_arch :: 90_real"
    ]  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "builder", "verify", "--wheelhouse", str(house)], cwd=ROOT,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]

    uv = uv_binary(tmp_path / "tools")
    venv = tmp_path / "node"
    subprocess.run([uv, "venv", "-q", "-p", sys.executable, str(venv)], check=True)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("NV_VARIANT", "UV_", "PIP_"))}
    site = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    for driver, label in (("12.8", None), ("13.0", "cu130_sm80.sm90")):
        forced = {"NV_VARIANT_PROVIDER_FORCE_SM_ARCH": "9.0", "NV_VARIANT_PROVIDER_FORCE_CUDA_DRIVER_VERSION": driver}
        env = {**clean, **forced}
        got = subprocess.run(
            [uv, "pip", "install", "--python", str(venv / "bin" / "python"), "--no-deps", "--reinstall", "--no-cache",
             "--preview-features", "wheel-variants", "--index-url", (house / "simple").as_uri() + "/",
             f"deepspeed=={shared}"],
            capture_output=True, text=True, env=env,
        )  # fmt: skip
        if label is None:  # a CUDA 12.8 driver: no variant fits, nothing is installed
            said = " ".join(got.stderr.split())  # uv wraps its message at the terminal's width
            assert got.returncode != 0 and f"{shared} has only unsupported wheel variants" in said, got.stderr
            assert not (site / f"deepspeed-{shared}.dist-info").exists()
            continue
        assert got.returncode == 0, got.stderr[-3000:]
        info = site / f"deepspeed-{shared}.dist-info"
        assert list(json.loads((info / "variant.json").read_text())["variants"]) == [label]
        assert f"Version: {shared}" in (info / "METADATA").read_text()
        assert list((site / "deepspeed" / "ops" / "adam").glob("fused_adam_op*.so"))
        assert (venv / "bin" / "ds_report").is_file()  # DeepSpeed's scripts, from the renamed .data folder
