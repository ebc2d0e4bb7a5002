"""The GPU tier (issue 49): on a machine with an NVIDIA GPU, with the node's own Python and torch,
from a folder `gather` made (DS_GPU_OFFLINE) where the node reaches nothing. Run by `nox -s gpu`
(no venv is made: the node's environment runs it); everywhere else every test here skips, saying why.

Written on the 2-core CPU machine, which has no GPU: not yet run on one (see the closing notes).
Each test adds rows to the table `nox -s gpu` prints at the end (tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gpu_table import ROWS

pytestmark = [pytest.mark.gpu, pytest.mark.integration]
ROOT = Path(__file__).resolve().parents[1]
OFFLINE_ENV = "DS_GPU_OFFLINE"  # a folder `python -m builder gather` made for this node
# The gathering host's key (`python -m builder key show` there: a line, or a file holding it): the folder's
# offline.json is signed by it, and a node believes the folder only when it trusts that key.
OFFLINE_TRUST_ENV = "DS_GPU_OFFLINE_TRUST"


def _offline_args() -> list[str]:
    offline, trust = os.environ.get(OFFLINE_ENV), os.environ.get(OFFLINE_TRUST_ENV)
    return ["--offline", offline, *(["--trust", trust] if trust else [])] if offline else []


def _no_gpu() -> str | None:
    """Why this machine cannot run the GPU tier (None: it can)."""
    if shutil.which("nvidia-smi") is None:
        return "no NVIDIA GPU here (nvidia-smi is not on PATH): the GPU tier runs on a GPU node (nox -s gpu)"
    said = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                          capture_output=True, text=True)  # fmt: skip
    if said.stdout.strip() != "True":
        return f"torch in {sys.executable} sees no GPU ({(said.stderr.strip().splitlines() or ['CPU torch'])[-1]})"
    return None


NO_GPU = _no_gpu()
skip_without_gpu = pytest.mark.skipif(NO_GPU is not None, reason=str(NO_GPU))


def builder(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    extra = _offline_args() if args[0] in ("build-wheel", "smoke", "check-config") else []
    return subprocess.run([sys.executable, "-m", "builder", *args, *extra], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **(env or {})})  # fmt: skip


@skip_without_gpu
def test_detect_sees_every_gpu_and_the_cuda_torch_was_built_with() -> None:
    done = builder("detect", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    gpus = report["gpus"]
    assert gpus and all(g.get("capability") for g in gpus), gpus
    ROWS.append(("detect", f"{len(gpus)} GPU(s), compute capability {gpus[0]['capability']}", ""))


def _smoke(work: Path) -> dict[str, dict[str, str]]:
    (report,) = sorted((work / "dist").glob("*.smoke.json"))
    return {c["name"]: c for c in json.loads(report.read_text())["checks"]}


@skip_without_gpu
def test_the_system_recipe_builds_smokes_and_checks_every_op_on_the_gpu(tmp_path: Path) -> None:
    """recipes/system.toml for this node's GPUs and torch: every op compiled, each checked for what it
    computes on the GPU (none left unchecked without why), the CUDA config matrix within 60 s."""
    work = tmp_path / "work"
    start = time.monotonic()
    done = builder("build-wheel", "--recipe", "recipes/system.toml", "--work-dir", str(work), "--no-publish")
    seconds = time.monotonic() - start
    assert done.returncode == 0, done.stderr[-5000:]
    checks = _smoke(work)
    numerics = {n: c for n, c in checks.items() if n.startswith("numerics:")}
    unchecked = {n: c["detail"] for n, c in numerics.items() if c["status"] != "passed"}
    assert not unchecked, unchecked
    matrix = next(line for line in done.stderr.splitlines() if "configs:" in line and "ran from the wheel" in line)
    took = float(matrix.rsplit(" in ", 1)[1].rstrip("s"))
    assert took <= 60, matrix
    upstream = sorted(n for n, c in checks.items() if c["status"] == "upstream")
    ROWS.append(("system recipe: build + smoke", f"{seconds:.0f} s", f"{len(numerics)} ops checked"))
    ROWS.append(("CUDA config matrix", f"{took:.0f} s", f"DeepSpeed's own: {', '.join(upstream) or 'none'}"))


@skip_without_gpu
def test_a_manylinux_cuda_wheel_built_with_no_gpu_visible_runs_on_the_gpu(tmp_path: Path) -> None:
    """The way most sites work: the CUDA wheel compiled where no GPU is visible (here: none shown to
    the build), in the Debian 11 root (manylinux_2_28), for the node's torch and this GPU's arch;
    then installed against the node's torch and checked on the GPU."""
    detected = json.loads(builder("detect", "--json").stdout)
    arch = detected["gpus"][0]["capability"]
    text = (ROOT / "recipes" / "system.toml").read_text()
    # The name stays "system": a gathered folder (DS_GPU_OFFLINE) serves the recipe it was gathered for.
    text = text.replace('arch = "auto"', f'arch = ["{arch}"]')
    text = text.replace('ops = ["fused_adam", "fused_lamb", "fused_lion", "cpu_adam", "cpu_adagrad", "cpu_lion", '
                        '"utils"]', 'ops = ["fused_adam", "cpu_adam", "utils"]')  # fmt: skip
    recipe = tmp_path / "nogpu.toml"
    recipe.write_text(text)
    work = tmp_path / "work"
    hidden = {"CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": "void"}
    start = time.monotonic()
    built = builder("build-wheel", "--recipe", str(recipe), "--work-dir", str(work), "--no-smoke", env=hidden)
    assert built.returncode == 0, built.stderr[-5000:]
    (wheel,) = sorted((work / "dist").glob("deepspeed-*.whl"))
    assert "manylinux_2_28" in wheel.name, wheel.name
    seconds = time.monotonic() - start
    smoked = builder("smoke", str(wheel), "--work-dir", str(work))
    assert smoked.returncode == 0, smoked.stderr[-5000:]
    checks = _smoke(work)
    assert checks["numerics:fused_adam"]["status"] == "passed", checks["numerics:fused_adam"]
    ROWS.append(("manylinux_2_28 wheel, no GPU at build", f"{seconds:.0f} s", checks["numerics:fused_adam"]["detail"]))


WHEELHOUSE_ENV = "DS_GPU_WHEELHOUSE"  # a wheelhouse a GPU-less build host published (nox -s gpu -- --wheelhouse DIR)


@skip_without_gpu
def test_prove_passes_for_a_cuda_wheel_built_where_no_gpu_is_and_publish_takes_its_proof_in(tmp_path: Path) -> None:
    """Issue 58: the CUDA wheel of a build host with no GPU (DS_GPU_WHEELHOUSE, copied here; else built
    and published here with the GPUs hidden, where this node can sign), proven with `prove` on this node's
    GPUs; its proof is then taken in by `publish --proof` and required by the installer's
    --require-gpu-proof (where this node can sign; on a node without ssh-keygen the proof is kept in
    DS_GPU_PROOFS, or the run's folder, for the build host to take in)."""
    house = Path(os.environ[WHEELHOUSE_ENV]) if os.environ.get(WHEELHOUSE_ENV) else None
    signs = shutil.which("ssh-keygen") is not None
    if house is None:
        if not signs:
            pytest.skip(f"no wheelhouse to prove from: this node cannot publish one (no ssh-keygen); pass a wheelhouse "
                        f"a build host published: nox -s gpu -- --wheelhouse DIR ({WHEELHOUSE_ENV})")  # fmt: skip
        house = tmp_path / "house"
        hidden = {"CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": "void"}  # as a CPU build host
        text = (ROOT / "recipes" / "system.toml").read_text()
        arch = json.loads(builder("detect", "--json").stdout)["gpus"][0]["capability"]
        recipe = tmp_path / "system.toml"
        recipe.write_text(text.replace('arch = "auto"', f'arch = ["{arch}"]'))
        built = builder("build-wheel", "--recipe", str(recipe), "--work-dir", str(tmp_path / "work"), "--wheelhouse",
                        str(house), env=hidden)  # fmt: skip
        assert built.returncode == 0, built.stderr[-5000:]
    dest = Path(os.environ.get("DS_GPU_PROOFS") or tmp_path / "proofs")
    start = time.monotonic()
    proved = builder("prove", "--wheelhouse", str(house), "--dest", str(dest), "--work-dir", str(tmp_path / "prove"),
                     *_offline_args())  # fmt: skip
    seconds = time.monotonic() - start
    assert proved.returncode == 0, proved.stderr[-5000:]
    (path,) = sorted(dest.glob("*.proof.json"))
    predicate = json.loads(path.read_text())["predicate"]
    checks = {c["name"]: c for c in predicate["checks"]}
    assert checks["numerics:fused_adam"]["status"] == "passed", checks["numerics:fused_adam"]
    gpus = ", ".join(f"{g['name']} ({g['capability']})" for g in predicate["gpus"])
    ROWS.append(("prove (wheel built with no GPU)", f"{seconds:.0f} s", f"{gpus}; {path.name}"))
    if not signs or os.environ.get(WHEELHOUSE_ENV):
        ROWS.append(("publish --proof", "-", f"take {path} in on the build host (this node does not publish)"))
        return
    taken = builder("publish", "--wheelhouse", str(house), "--proof", str(path))
    assert taken.returncode == 0, taken.stderr[-3000:]
    key = builder("key", "show").stdout.strip().splitlines()[-1]
    need = builder("install", "--wheelhouse", str(house), "--trust", key, "--dry-run", "--require-gpu-proof")
    assert need.returncode == 0 and "==> GPU proof: proven on" in need.stderr, need.stderr[-3000:]
    ROWS.append(("publish --proof, install --require-gpu-proof", "-", "taken in; required and found"))
