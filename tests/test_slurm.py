"""The matrix on a real one-node Slurm (tests/slurm_cluster.py brings it up and down).

Three targets through sbatch, each op first compiled by a task of the unit array into the shared
unit cache: `adam` (cpu_adam) builds and smokes in its array task; `cuadam` (a
CUDA recipe for sm_90) builds in its array task and is smoked by its own job on the `h100`
partition with --gres=gpu:1, whose GPUs are FAKE (so the smoke inside honestly sees none, and the
matrix says require_gpu = false); `ccl` (deepspeed_ccl_comm, which needs Intel oneCCL: refused
before compiling) fails in its task and the run goes on. The collect job publishes the two that passed. A second
run of `adam` reuses its build from the same target folder. Then `provision --launcher slurm`
installs the published wheel on the node through srun.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import slurm_cluster
from fakes import default_recipe_text
from nodes import node_venv

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(slurm_cluster.missing() is not None, reason=str(slurm_cluster.missing())),
    pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the cpu recipe's local torch wheel is for Python 3.11"),
]


_CCACHE_BOOKS = {"stats", "CACHEDIR.TAG", "lock"}  # ccache's own bookkeeping, not cached objects


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    folder = tmp_path_factory.mktemp("slurm")
    env = slurm_cluster.up(folder)
    try:
        yield env
    finally:
        slurm_cluster.down(folder)


def _variant(source: str, folder: Path, name: str, ops: list[str], arch: list[str] | None = None) -> None:
    text = default_recipe_text(source)
    start = text.index("ops = [")
    end = text.index("]", start) + 1
    text = text[:start] + f"ops = {json.dumps(ops)}" + text[end:]
    old = tomllib.loads(text)["name"]
    text = text.replace(f'name = "{old}"', f'name = "{name}"')
    if arch is not None:
        start = text.index("arch = [")
        text = text[:start] + f"arch = {json.dumps(arch)}" + text[text.index("]", start) + 1 :]
    (folder / f"{name}.toml").write_text(text)


@pytest.fixture(scope="module")
def matrix_run(cluster: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    folder = tmp_path_factory.mktemp("slurm-matrix")
    _variant("cpu.toml", folder, "adam", ["cpu_adam"])
    _variant("cpu.toml", folder, "ccl", ["deepspeed_ccl_comm"])
    _variant("cu130-multi-min.toml", folder, "cuadam", ["cpu_adam"], ["9.0"])
    matrix = folder / "matrix.toml"
    matrix.write_text(
        'recipes = ["adam.toml", "ccl.toml", "cuadam.toml"]\n\n[slurm]\ncpus = 2\nmem = "6G"\ntime = "00:40:00"\n\n'
        "[slurm.gpu]  # FAKE GPUs (see slurm_cluster): the smoke job runs there, its torch sees none\n"
        '"9.0" = { partition = "h100", gres = "gpu:1", require_gpu = false }\n'
    )
    work, house = folder / "work", folder / "wheelhouse"
    done = subprocess.run(
        [sys.executable, "-m", "builder", "build-wheel", "--matrix", str(matrix), "--slurm", "--wait",
         "--work-dir", str(work), "--wheelhouse", str(house)],
        cwd=ROOT, capture_output=True, text=True, env=cluster, timeout=2400,
    )  # fmt: skip
    return {"done": done, "work": work, "house": house, "folder": folder}


def test_a_matrix_runs_as_a_job_array_gpu_smoke_jobs_and_one_collect_job(
    cluster: dict[str, str], matrix_run: dict[str, object]
) -> None:
    done = matrix_run["done"]
    assert isinstance(done, subprocess.CompletedProcess)
    work, house = Path(str(matrix_run["work"])), Path(str(matrix_run["house"]))
    assert done.returncode == 11, done.stderr[-5000:]
    assert "submitted 3 targets: build array " in done.stderr and "GPU smoke jobs: cuadam on h100 (" in done.stderr
    assert "1 of 3 targets failed: ccl" in done.stderr
    assert "cuadam: build passed, smoke on h100 " in done.stderr  # --wait's progress line per target
    (run,) = (work / "slurm").glob("run-*")
    record = json.loads((run / "run.json").read_text())
    report = json.loads((run / "coverage" / "coverage.json").read_text())
    rows = {t["target"]: t for t in report["targets"]}
    status = {name: {s: v["status"] for s, v in row["stages"].items()} for name, row in rows.items()}
    assert status["adam"] == status["cuadam"] == {"build": "passed", "smoke": "passed", "publish": "passed"}
    # Op units (issue 21): each target's op compiled in a unit task of the unit array, into the unit
    # cache every job shares; the build task then assembled its wheel from the cache.
    (units,) = record["unit_arrays"]
    assert units["tasks"] == [["adam", 0, 1], ["ccl", 0, 1], ["cuadam", 0, 1]] and units["job"]
    unit_rows = json.loads((run / "results" / "adam.units-0.json").read_text())["units"]
    assert [(u["op"], u["status"]) for u in unit_rows] == [("cpu_adam", "built")]
    (built,) = (work / "slurm" / "targets" / "adam" / "dist").glob("*.whl.build.json")
    assert json.loads(built.read_text())["units"]["cpu_adam"]["status"] == "cached"
    assert not (run / "results" / "ccl.units-0.json").exists()  # refused before compiling: the build task says so
    assert (
        rows["adam"]["slurm"]["job"] == f"{record['arrays'][0]['job']}_0"
        and Path(rows["adam"]["slurm"]["log"]).is_file()
    )
    assert rows["adam"]["slurm"]["smoke_on"] == "cpu"
    # The GPU smoke ran in its own job on the h100 partition with the GPUs Slurm gave it (fake ones).
    (smoke,) = record["targets"][2]["smoke"]
    assert smoke["partition"] == "h100" and rows["cuadam"]["slurm"]["smoke_on"] == f"h100 ({smoke['job']})"
    gpu = json.loads((run / "results" / "cuadam.smoke.h100.json").read_text())
    assert gpu["gpus"] and gpu["saw_gpu"] is False  # Slurm set CUDA_VISIBLE_DEVICES; torch honestly saw none
    assert "saw no GPU" in rows["cuadam"]["stages"]["smoke"]["reason"] and "require_gpu = false" in done.stderr
    ccl_build = rows["ccl"]["stages"]["build"]
    assert ccl_build["status"] == "failed" and "deepspeed_ccl_comm" in ccl_build["reason"]
    assert rows["ccl"]["stages"]["publish"]["status"] == "skipped"
    table = (run / "coverage" / "coverage.md").read_text()
    assert "| adam | 3.11." in table and "| smoked on |" in table
    # One compiler cache for every build task; each target in its own folder, the same in every run.
    cached = [p for p in (work / "cache" / "ccache").rglob("*") if p.is_file() and p.name not in _CCACHE_BOOKS]
    assert len(cached) >= 4 and not (work / "slurm" / "targets" / "adam" / "cache" / "ccache").exists()
    # Each unit task counts its own compiles (adam's is the unit array's first task).
    assert re.search(r"ccache: \d+ hits, \d+ misses", (run / "logs" / f"units-{units['job']}_0.log").read_text())
    # The collect job was the wheelhouse's only writer, and what it published verifies.
    wheels = json.loads((house / "manifest.json").read_text())["wheels"]
    assert sorted(e["recipe"] for e in wheels.values()) == ["adam", "cuadam"]
    # The run's coverage is published with them and shown on the wheelhouse page, job ids and all.
    assert (house / "coverage.json").read_bytes() == (run / "coverage" / "coverage.json").read_bytes()
    page = (house / "index.html").read_text()
    assert '<tr data-target="adam">' in page and f"<td>{rows['adam']['slurm']['job']}</td>" in page
    assert f"<td>h100 ({smoke['job']})</td>" in page
    assert "2 of 3 targets passed every stage they ran" in page
    verify = subprocess.run([sys.executable, "-m", "builder", "verify", "--wheelhouse", str(house)],
                            cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    assert verify.returncode == 0, verify.stderr[-2000:]
    status_cmd = subprocess.run([sys.executable, "-m", "builder", "slurm-status", str(run)], cwd=ROOT,
                                capture_output=True, text=True, env=cluster)  # fmt: skip
    assert "cuadam: build passed, smoke passed, publish passed" in status_cmd.stdout, status_cmd.stderr


def test_a_second_run_reuses_unchanged_targets_and_their_gpu_smoke(
    cluster: dict[str, str], matrix_run: dict[str, object]
) -> None:
    folder, work = Path(str(matrix_run["folder"])), Path(str(matrix_run["work"]))
    again = folder / "again.toml"
    again.write_text((folder / "matrix.toml").read_text().replace('"ccl.toml", ', ""))  # adam and cuadam again
    done = subprocess.run(
        [sys.executable, "-m", "builder", "build-wheel", "--matrix", str(again), "--slurm", "--wait",
         "--work-dir", str(work), "--wheelhouse", str(matrix_run["house"])],
        cwd=ROOT, capture_output=True, text=True, env=cluster, timeout=1200,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-5000:]
    run = max((work / "slurm").glob("run-*"), key=lambda p: p.stat().st_mtime)
    rows = json.loads((run / "coverage" / "coverage.json").read_text())["targets"]
    assert [(r["target"], r["stages"]["build"]["status"], r["stages"]["smoke"]["status"]) for r in rows] == [
        ("adam", "reused", "reused"), ("cuadam", "reused", "reused")
    ]  # fmt: skip
    # The GPU smoke job still ran on h100, and found these bytes already smoked there.
    host = socket.gethostname().split(".")[0]
    assert f"passed on {host} in an earlier run, for these bytes" in rows[1]["stages"]["smoke"]["reason"]


def test_provisioning_through_srun_installs_on_every_node(
    cluster: dict[str, str], matrix_run: dict[str, object], tmp_path: Path
) -> None:
    house = Path(str(matrix_run["house"]))
    python = node_venv(tmp_path / "node", "torch==2.13.0")  # the node's Python, with the torch the wheel needs
    out = tmp_path / "provision"
    done = subprocess.run(
        [sys.executable, "-m", "builder", "provision", "--launcher", "slurm", "--partition", "cpu",
         "--python", python, "--wheelhouse", str(house), "--out", str(out), "--run",
         "--work-dir", str(tmp_path / "work")],
        cwd=ROOT, capture_output=True, text=True, env=cluster, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-5000:]
    host = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
    assert f"installed on 1/1 nodes: {host}" in done.stderr
    result = json.loads((out / "results" / f"{host}.json").read_text())
    assert result["installed"] is True and result["wheel"].startswith("deepspeed-")
    shown = subprocess.run([python, "-m", "pip", "show", "deepspeed"],
                           capture_output=True, text=True)  # fmt: skip
    assert "Version: 0.19.8+" in shown.stdout


def test_a_submission_sbatch_refuses_leaves_no_job_and_no_run(cluster: dict[str, str], tmp_path: Path) -> None:
    """The build array goes in, then the GPU smoke job's partition does not exist: sbatch's own
    message is shown, the array is cancelled and the run folder removed."""
    _variant("cu130-multi-min.toml", tmp_path, "cuadam", ["cpu_adam"], ["9.0"])
    matrix = tmp_path / "matrix.toml"
    matrix.write_text('recipes = ["cuadam.toml"]\n\n[slurm.gpu]\n"9.0" = { partition = "nope" }\n')
    done = subprocess.run(
        [sys.executable, "-m", "builder", "build-wheel", "--matrix", str(matrix), "--slurm",
         "--work-dir", str(tmp_path / "work")],
        cwd=ROOT, capture_output=True, text=True, env=cluster, timeout=300,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr[-3000:]
    # The unit array and the build array went in first: both cancelled.
    assert "invalid partition" in done.stderr.lower() and "(cancelled the 2 jobs already submitted)" in done.stderr
    assert list((tmp_path / "work" / "slurm").glob("run-*")) == []
    queued = subprocess.run(["squeue", "-h", "-n", "ds-build", "-t", "PENDING,RUNNING"], capture_output=True,
                            text=True, env=cluster)  # fmt: skip
    assert queued.stdout.strip() == ""
