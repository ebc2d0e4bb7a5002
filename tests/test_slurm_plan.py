"""The Slurm side without a cluster: the scripts (pure) and how squeue's answers are read."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from builder import cmd, slurm
from builder.errors import ToolError
from builder.recipe import load_recipe
from builder.targets import targets_for

ROOT = Path(__file__).resolve().parents[1]


def test_the_array_script_maps_each_task_to_its_target(tmp_path: Path) -> None:
    cpu = load_recipe(ROOT / "recipes" / "cpu.toml")
    targets = targets_for([cpu])
    text = slurm.build_script(targets, tmp_path / "m atrix.toml", tmp_path / "run", "/opt/py/bin/python")
    assert "names=(cpu)\nname=${names[$SLURM_ARRAY_TASK_ID]}" in text
    assert f"--matrix '{tmp_path}/m atrix.toml' --target \"$name\"" in text  # quoted: paths may hold spaces
    assert f'--work-dir {tmp_path}/run/targets/"$name" --no-publish' in text
    flags = slurm._sbatch_flags(slurm.SlurmOptions(partition="build", account="ml", cpus=4, mem="8G"))
    assert flags == ["--cpus-per-task=4", "--mem=8G", "--time=02:00:00", "--partition=build", "--account=ml"]


def _answers(monkeypatch: pytest.MonkeyPatch, answers: list[tuple[int, str, str]]) -> list[list[str]]:
    """FAKE squeue: each call returns the next (exit status, stdout, stderr)."""
    asked: list[list[str]] = []

    def ask(args: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
        asked.append(list(args))
        code, out, err = answers.pop(0)
        return subprocess.CompletedProcess(args, code, out, err)

    monkeypatch.setattr(cmd, "ask", ask)
    return asked


def test_waiting_ends_when_slurm_forgets_the_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _answers(monkeypatch, [
        (0, "12_[0-1] PENDING\n13 PENDING\n", ""),
        (0, "12_0 RUNNING\n12_1 RUNNING\n13 PENDING\n", ""),
        (1, "", "slurm_load_jobs error: Invalid job id specified\n"),  # finished and purged (MinJobAge)
    ])  # fmt: skip
    slurm.wait({"array_job": "12", "collect_job": "13"}, poll=0)
    assert len(asked) == 3 and asked[0][:4] == ["squeue", "-h", "-j", "12,13"]


def test_an_unreachable_controller_is_not_taken_for_the_end(monkeypatch: pytest.MonkeyPatch) -> None:
    _answers(monkeypatch, [(0, "12 RUNNING\n", "")] + [(1, "", "Unable to contact slurm controller\n")] * 5)
    with pytest.raises(ToolError, match="squeue failed 5 times: Unable to contact slurm controller"):
        slurm.wait({"array_job": "12", "collect_job": "13"}, poll=0)
