"""A matrix goes on past a failed target and reports every target x stage with its reason."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from builder import build as build_module
from builder import coverage, pipeline
from builder.errors import BuildError
from builder.recipe import load_recipe
from builder.results import STAGES, StageResult, TargetResult
from builder.targets import targets_for
from builder.workspace import Workspace

ROOT = Path(__file__).resolve().parents[1]


def test_a_failed_target_does_not_stop_the_matrix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = dataclasses.replace(load_recipe(ROOT / "recipes" / "cpu.toml"), configs=())  # FAKE builds: no configs run
    cuda = load_recipe(ROOT / "recipes" / "cu130-multi-min.toml")
    built: list[str] = []

    def fake_build(recipe, ws, *args, **kwargs):  # type: ignore[no-untyped-def]
        """FAKE build (no compiler in unit tests): the CUDA recipe fails as a compile error would."""
        if recipe.accelerator == "cuda":
            raise BuildError("op fused_adam failed to compile (csrc/adam/multi_tensor_adam.o)", "drop fused_adam")
        built.append(recipe.name)
        wheel = ws.dist / "deepspeed-0.19.8+cpu.torch2.13-cp311-cp311-manylinux_2_35_x86_64.whl"
        return build_module.BuildResult(wheel=wheel, seconds=80.0, log=ws.logs / "x.log", key="k")

    monkeypatch.setattr(build_module, "build_wheel", fake_build)
    stages = pipeline.Stages(smoke=False, publish=False)
    targets = targets_for([cuda, cpu])
    with pytest.raises(BuildError):  # without keep_going (a plain build-wheel) the first failure stops the run
        pipeline.run(targets, Workspace(tmp_path / "w"), tmp_path / "house", stages)
    assert built == []
    results = pipeline.run(targets, Workspace(tmp_path / "w"), tmp_path / "house", stages, keep_going=True)
    assert built == ["cpu"] and [r.ok for r in results] == [False, True]
    failed = results[0].stages
    assert failed["build"].status == "failed" and "op fused_adam failed to compile" in failed["build"].reason
    assert "fix: drop fused_adam" in failed["build"].reason
    assert (failed["smoke"].status, failed["smoke"].reason) == ("skipped", "the build failed")
    assert (failed["publish"].status, failed["publish"].reason) == ("skipped", "the build failed")
    assert (results[1].stages["smoke"].status, results[1].stages["smoke"].reason) == ("skipped", "--no-smoke")

    js, md = coverage.write(results, tmp_path / "coverage", "matrix.toml")
    report = json.loads(js.read_text())
    assert report["schema"] == 1 and report["failed"] == ["cu130-multi-min"]
    assert report["targets"][1]["stages"]["build"] == {"status": "passed", "reason": "", "seconds": 80.0}
    text = md.read_text()
    assert "1 of 2 targets passed every stage they ran." in text
    assert "| cu130-multi-min | " in text and "| FAILED | skipped | skipped | - |" in text
    assert "| cpu | " in text and "| passed 80s | skipped | skipped | deepspeed-0.19.8+cpu" in text
    assert "- cu130-multi-min build: FAILED: op fused_adam failed to compile" in text
    assert oct(md.stat().st_mode & 0o777) == "0o644"
    # Read back (the collect job wrote it for --wait and slurm-status): what was written, checked.
    loaded = coverage.load(tmp_path / "coverage")
    assert loaded is not None and loaded.failed == ("cu130-multi-min",)
    assert loaded.stages["cpu"]["build"] == StageResult("passed", "", 80.0)
    assert coverage.load(tmp_path / "nothing") is None


def test_a_tampered_coverage_report_is_not_believed(tmp_path: Path) -> None:
    from builder.node import ManifestError

    stages = {s: {"status": "passed", "reason": "", "seconds": 1.0} for s in ("build", "smoke", "publish")}
    row = {"target": "cpu", "python": "3.11", "stages": stages, "wheel": None}
    good = {"schema": 1, "matrix": "m.toml", "finished_at": "2026-11-24T10:00:00+00:00", "targets": [row],
            "failed": []}  # fmt: skip
    fine = {**stages, "smoke": {"status": "fine", "reason": "", "seconds": 1}}
    changes: list[tuple[dict[str, Any], str]] = [
        ({"failed": ["../x"]}, "holds an invalid item"),
        ({"targets": [{**row, "stages": fine}]}, "not one of"),
        ({"targets": [{**row, "target": "Cpu; rm"}]}, "field 'target' is not valid"),
        ({"targets": [{**row, "python": "<script>"}]}, "field 'python' is not valid"),
        ({"targets": [{**row, "slurm": {"job": "12<b>"}}]}, "field 'job' is not valid"),
        ({"targets": [{**row, "slurm": {"node": 5}}]}, "field 'node'"),
        ({"targets": [{**row, "wheel": "/x/<img src=x>.whl"}]}, "field 'wheel' is not the path of a wheel"),
        ({"finished_at": "<i>now</i>"}, "field 'finished_at' is not valid"),
        ({"schema": 2}, "is not 1"),
    ]  # fmt: skip
    report = coverage.parse_report(good, "coverage.json")
    assert report.rows == (coverage.Row("cpu", "3.11", None, None, None, None),) and report.matrix == "m.toml"
    for change, message in changes:
        (tmp_path / "coverage.json").write_text(json.dumps({**good, **change}))
        with pytest.raises(ManifestError, match=message):
            coverage.load(tmp_path)
    (tmp_path / "coverage.json").write_text("{")
    with pytest.raises(ManifestError, match="cannot be read as JSON"):
        coverage.load(tmp_path)


def test_jobs_run_targets_at_once_with_a_share_of_the_cores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = dataclasses.replace(load_recipe(ROOT / "recipes" / "cpu.toml"), configs=())  # FAKE builds: no configs run
    seen: list[tuple[str, int | None, str]] = []
    both_started = threading.Barrier(2, timeout=10)

    def fake_build(recipe, ws, verbose, force, use_ccache, python, cores):  # type: ignore[no-untyped-def]
        """FAKE build: both must be running at the same time (the barrier), each with half the cores."""
        both_started.wait()
        seen.append((recipe.name, cores, threading.current_thread().name))
        return build_module.BuildResult(wheel=ws.dist / f"{recipe.name}.whl", seconds=1.0, log=ws.logs / "x", key="k")

    monkeypatch.setattr(build_module, "build_wheel", fake_build)
    recipes = [cpu, dataclasses.replace(cpu, name="cpu2")]
    results = pipeline.run(targets_for(recipes), Workspace(tmp_path / "w"), tmp_path / "house",
                           pipeline.Stages(smoke=False, publish=False), keep_going=True, jobs=2)  # fmt: skip
    assert [r.target for r in results] == ["cpu", "cpu2"] and all(r.ok for r in results)
    assert {cores for _, cores, _ in seen} == {max(1, (os.cpu_count() or 1) // 2)}
    assert len({thread for _, _, thread in seen}) == 2


def test_auto_jobs_follow_cores_and_memory() -> None:
    assert pipeline.auto_jobs(6, cores=2, mem_gb=22.0) == 1  # this machine: one target at a time
    assert pipeline.auto_jobs(6, cores=16, mem_gb=120.0) == 2  # the H100 machine: 8 cores each
    assert pipeline.auto_jobs(6, cores=64, mem_gb=60.0) == 2  # memory, not cores, is the limit
    assert pipeline.auto_jobs(3, cores=64, mem_gb=None) == 3  # never more than there are targets


def test_the_report_holds_each_wheels_op_table() -> None:
    """Per target with a wheel: op, built or why not, archs, loaded and checked (rows as node.op_rows
    makes them from the build manifest and the smoke report); a reason holding '|' or newlines
    stays inside its cell."""
    from builder.node import op_rows

    rows = op_rows(
        ["async_io", "fused_adam"], {"gds": "refused: no libaio |\nsecond line"}, ["9.0"], {},
        {"load:async_io": ("passed", ""), "numerics:async_io": ("passed", "4 MiB read back"),
         "load:fused_adam": ("passed", ""), "numerics:fused_adam": ("skipped", "no GPU visible")},
    )  # fmt: skip
    result = TargetResult("all", "all", "3.11", None, {s: StageResult("passed") for s in STAGES})
    text = coverage.to_markdown([result], None, "2026-11-23T00:00:00+00:00", {"all": rows})
    assert "Ops of all:" in text
    assert "| async_io | yes | 9.0 | passed | passed |  |" in text
    assert "| fused_adam | yes | 9.0 | passed | skipped | no GPU visible |" in text
    assert "| gds | no | - | - | - | refused: no libaio / second line |" in text
    data = coverage.to_json([result], None, "t", {"all": rows})
    assert data["targets"][0]["ops"] == rows
