"""The matrix on a real one-node Slurm (tests/slurm_cluster.py brings it up and down).

Two targets through sbatch: `adam` (cpu_adam) builds and smokes in its array task and is
published by the collect job; `aio` (async_io, which DeepSpeed cannot build without libaio) fails
in its task, and the run goes on. `--wait` follows the jobs and exits 11 naming the failure.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import slurm_cluster

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(slurm_cluster.missing() is not None, reason=str(slurm_cluster.missing())),
    pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the cpu recipe's local torch wheel is for Python 3.11"),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    folder = tmp_path_factory.mktemp("slurm")
    env = slurm_cluster.up(folder)
    try:
        yield env
    finally:
        slurm_cluster.down(folder)


def test_a_matrix_runs_as_a_job_array_and_one_collect_job_publishes(
    cluster: dict[str, str], workspace: Path, tmp_path: Path
) -> None:
    text = (ROOT / "recipes" / "cpu.toml").read_text()
    start = text.index("ops = [")
    end = text.index("]", start) + 1
    for name, op in (("adam", "cpu_adam"), ("aio", "async_io")):
        (tmp_path / f"{name}.toml").write_text(
            text[:start].replace('name = "cpu"', f'name = "{name}"') + f'ops = ["{op}"]' + text[end:]
        )
    matrix = tmp_path / "matrix.toml"
    matrix.write_text('recipes = ["adam.toml", "aio.toml"]\n\n[slurm]\ncpus = 2\nmem = "6G"\ntime = "00:30:00"\n')
    house = tmp_path / "wheelhouse"
    done = subprocess.run(
        [sys.executable, "-m", "builder", "build-wheel", "--matrix", str(matrix), "--slurm", "--wait",
         "--work-dir", str(workspace / "slurm-work"), "--wheelhouse", str(house)],
        cwd=ROOT, capture_output=True, text=True, env=cluster, timeout=1800,
    )  # fmt: skip
    assert done.returncode == 11, done.stderr[-5000:]
    assert "submitted 2 targets: build array " in done.stderr
    assert "1 of 2 targets failed: aio" in done.stderr
    (run,) = (workspace / "slurm-work" / "slurm").glob("run-*")
    record = json.loads((run / "run.json").read_text())
    report = json.loads((run / "coverage" / "coverage.json").read_text())
    rows = {t["target"]: t for t in report["targets"]}
    assert {s: v["status"] for s, v in rows["adam"]["stages"].items()} == {
        "build": "passed", "smoke": "passed", "publish": "passed"
    }  # fmt: skip
    assert rows["adam"]["slurm"]["job"] == f"{record['array_job']}_0" and Path(rows["adam"]["slurm"]["log"]).is_file()
    aio_build = rows["aio"]["stages"]["build"]
    assert aio_build["status"] == "failed" and "async_io" in aio_build["reason"]
    assert rows["aio"]["stages"]["publish"]["status"] == "skipped"
    assert "| adam | 3.11." in (run / "coverage" / "coverage.md").read_text()
    # The collect job was the wheelhouse's only writer, and what it published verifies.
    wheels = json.loads((house / "manifest.json").read_text())["wheels"]
    assert [e["recipe"] for e in wheels.values()] == ["adam"]
    verify = subprocess.run([sys.executable, "-m", "builder", "verify", "--wheelhouse", str(house)],
                            cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    assert verify.returncode == 0, verify.stderr[-2000:]
