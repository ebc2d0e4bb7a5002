"""The Slurm side without a cluster: the scripts and the run record (pure), how squeue's answers
are read, and every file a job writes for another read back as hostile."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from builder import cmd, slurm
from builder.errors import RecipeError, ToolError
from builder.recipe import load_recipe
from builder.slurm import plan as slurm_plan_mod
from builder.slurm import results as slurm_results_mod
from builder.targets import GpuSmoke, parse_matrix, targets_for

ROOT = Path(__file__).resolve().parents[1]
SHA = "ab" * 32
WHEEL = "deepspeed-0.19.8+cu130.sm80.sm90-cp311-cp311-manylinux_2_35_x86_64.whl"
H100 = {"9.0": GpuSmoke("h100", "gpu:h100:1"), "8.0": GpuSmoke("a100")}


def _targets() -> list[Any]:
    return targets_for(
        [load_recipe(ROOT / "recipes" / "cpu.toml"), load_recipe(ROOT / "recipes" / "cu130-multi-min.toml")]
    )


def test_the_scripts_map_each_task_to_its_target(tmp_path: Path) -> None:
    text = slurm.build_script([t.name for t in _targets()], tmp_path / "r un", "/opt/py/bin/python")
    assert "names=(cpu cu130-multi-min)\n" in text
    assert (
        f"/opt/py/bin/python -m builder slurm-task '{tmp_path}/r un' --target \"${{names[$SLURM_ARRAY_TASK_ID]}}\""
        in text
    )
    smoke = slurm.smoke_script("cu130-multi-min", "h100", tmp_path / "run", "/opt/py/bin/python")
    assert f"slurm-smoke {tmp_path}/run --target cu130-multi-min \\\n    --partition h100" in smoke
    flags = slurm_plan_mod._sbatch_flags(slurm.SlurmOptions(partition="build", account="ml", cpus=4, mem="8G"))
    assert flags == ["--cpus-per-task=4", "--mem=8G", "--time=02:00:00", "--partition=build", "--account=ml"]


def test_cuda_targets_smoke_on_each_gpu_type_their_archs_run_on(tmp_path: Path) -> None:
    cpu, cuda = _targets()
    assert slurm.smoke_partitions(cpu, H100) == []  # a CPU target smokes in its build task
    assert slurm.smoke_partitions(cuda, H100) == [("8.0", GpuSmoke("a100")), ("9.0", H100["9.0"])]
    assert slurm.smoke_partitions(cuda, {"9.0": GpuSmoke("h100")}) == [("9.0", GpuSmoke("h100"))]
    assert slurm.smoke_partitions(cuda, {"7.0": GpuSmoke("v100")}) == []  # no partition for its archs: CPU
    record = slurm.plan_record([cpu, cuda], tmp_path / "m.toml", tmp_path / "run", tmp_path / "targets",
                               tmp_path / "house", tmp_path / "cc", tmp_path / "sd", H100)  # fmt: skip
    assert record["targets"][0]["smoke"] == [] and record["targets"][0]["folder"] == str(tmp_path / "targets" / "cpu")
    assert [s["partition"] for s in record["targets"][1]["smoke"]] == ["a100", "h100"]
    assert record["targets"][1]["smoke"][1] == {"gpu": "9.0", "partition": "h100", "gres": "gpu:h100:1",
                                                "require_gpu": True, "time": "00:30:00"}  # fmt: skip


def test_an_aarch64_target_smokes_on_a_partition_of_aarch64_nodes_only(tmp_path: Path) -> None:
    """A GH200 wheel (aarch64, sm_90) never goes to the H100 partition of x86_64 nodes."""
    (gh200,) = targets_for([load_recipe(ROOT / "recipes" / "cu130-gh200.toml")])
    assert slurm.smoke_partitions(gh200, H100) == []  # no aarch64 partition: smoked under emulation in its build task
    both = {**H100, "aarch64/9.0": GpuSmoke("gh200", "gpu:gh200:1")}
    assert slurm.smoke_partitions(gh200, both) == [("9.0", GpuSmoke("gh200", "gpu:gh200:1"))]
    (cuda,) = targets_for([load_recipe(ROOT / "recipes" / "cu130-multi-min.toml")])
    assert [g.partition for _, g in slurm.smoke_partitions(cuda, both)] == ["a100", "h100"]
    gpu = {"aarch64/sm_100": {"partition": "gb200"}, "x86_64/9.0": {"partition": "h100"}}
    m = parse_matrix({"recipes": [str(ROOT / "recipes" / "cpu.toml")], "slurm": {"gpu": gpu}}, tmp_path / "m.toml")
    assert m.gpu == {"aarch64/10.0": GpuSmoke("gb200"), "9.0": GpuSmoke("h100")}
    with pytest.raises(RecipeError, match='"riscv64" is not a machine this toolkit builds for') as err:
        parse_matrix({"recipes": [str(ROOT / "recipes" / "cpu.toml")],
                      "slurm": {"gpu": {"riscv64/9.0": {"partition": "h"}}}}, tmp_path / "m.toml")  # fmt: skip
    assert "aarch64/9.0" in err.value.fix


def test_the_matrix_gpu_table_is_checked(tmp_path: Path) -> None:
    base = {"recipes": [str(ROOT / "recipes" / "cpu.toml")]}
    gpu = {"sm_90": {"partition": "h100", "gres": "gpu:h100:1"}, "8.0": {"partition": "a100"}}
    m = parse_matrix({**base, "slurm": {"cpus": 4, "gpu": gpu}}, tmp_path / "m.toml")
    assert m.gpu == {"9.0": GpuSmoke("h100", "gpu:h100:1"), "8.0": GpuSmoke("a100")} and m.slurm == {"cpus": 4}
    bad = [
        ({"9.9": {"partition": "h"}}, "not a CUDA architecture"),
        ({"9.0": {"gres": "gpu:1"}}, "needs a partition"),
        ({"9.0": {"partition": "h100; rm -rf /"}}, "partition = 'h100; rm -rf /' is not valid"),
        ({"9.0": {"partition": "h100", "nodes": 2}}, 'unknown key "nodes"'),
        ({"9.0": {"partition": "h100", "require_gpu": "no"}}, "require_gpu = 'no' is not valid"),
    ]
    for table, message in bad:
        with pytest.raises(RecipeError, match=message):
            parse_matrix({**base, "slurm": {"gpu": table}}, tmp_path / "m.toml")
    with pytest.raises(RecipeError, match="compiler_cache = 'cache' is not valid"):
        parse_matrix({**base, "slurm": {"compiler_cache": "cache"}}, tmp_path / "m.toml")  # every node: absolute
    for table, message in [({"cpus": 0}, "slurm.cpus = '0' is not valid"), ({"cpus": True}, "slurm.cpus = 'True'"),
                           ({"account": "ml --wrap=x"}, "slurm.account = 'ml --wrap=x' is not valid"),
                           ({"partiton": "a"}, 'unknown key "slurm.partiton" (did you mean "partition"')]:  # fmt: skip
        with pytest.raises(RecipeError, match=re.escape(message)):
            parse_matrix({**base, "slurm": table}, tmp_path / "m.toml")


def _answers(monkeypatch: pytest.MonkeyPatch, answers: Sequence[tuple[int | None, str, str]]) -> list[list[str]]:
    """FAKE squeue: each call returns the next (exit status, stdout, stderr); a None status hangs."""
    asked: list[list[str]] = []
    left = list(answers)

    def ask(args: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
        asked.append(list(args))
        code, out, err = left.pop(0)
        if code is None:  # squeue hung past its timeout: a controller too busy to answer
            raise cmd.NoAnswer(f"squeue did not answer in {timeout:.0f} s", "check the service it asks")
        return subprocess.CompletedProcess(args, code, out, err)

    monkeypatch.setattr(cmd, "ask", ask)
    return asked


def test_the_queue_ends_when_slurm_forgets_the_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _answers(monkeypatch, [
        (0, "12_0 RUNNING\n12_1 PENDING\n13 PENDING\n", ""),
        (1, "", "slurm_load_jobs error: Invalid job id specified\n"),  # finished and purged (MinJobAge)
    ])  # fmt: skip
    assert slurm.queue(["12", "13"]) == {"12_0": "RUNNING", "12_1": "PENDING", "13": "PENDING"}
    assert slurm.queue(["12", "13"]) == {}
    assert asked[0][:5] == ["squeue", "-h", "-r", "-j", "12,13"]  # -r: one line per array task


def test_an_unreachable_controller_is_not_taken_for_the_end(monkeypatch: pytest.MonkeyPatch) -> None:
    _answers(monkeypatch, [(1, "", "Unable to contact slurm controller\n")] * 3 + [(0, "12 PENDING\n", "")])
    assert slurm.queue(["12"], poll=0) == {"12": "PENDING"}  # a controller restarting: asked again, answered
    _answers(monkeypatch, [(1, "", "Unable to contact slurm controller\n")] * 500)
    with pytest.raises(ToolError, match="squeue failed for 0 s: Unable to contact slurm controller"):
        slurm.queue(["12"], patience=0, poll=0)


def test_a_controller_too_busy_to_answer_is_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen in CI on a loaded machine: squeue hung a minute while slurmctld was starved of CPU,
    and the matrix it followed was given up while its jobs still ran."""
    _answers(monkeypatch, [(None, "", "")] * 2 + [(0, "12 RUNNING\n", "")])
    assert slurm.queue(["12"], poll=0) == {"12": "RUNNING"}
    _answers(monkeypatch, [(None, "", "")] * 500)
    with pytest.raises(ToolError, match="squeue failed for 0 s: squeue did not answer in 60 s"):
        slurm.queue(["12"], patience=0, poll=0)


# ---------------------------------------------------------------- what jobs write, read back as hostile


def _run(tmp_path: Path, gpu: dict[str, GpuSmoke]) -> tuple[Path, dict[str, Any]]:
    run = tmp_path / "run"
    (run / "results").mkdir(parents=True)
    _, cuda = _targets()
    record = slurm.plan_record([cuda], tmp_path / "m.toml", run, tmp_path / "targets", tmp_path / "house",
                               tmp_path / "cc", tmp_path / "sd", gpu)  # fmt: skip
    record["arrays"][0]["job"] = "7"
    record["targets"][0].update(job="7_0", log=str(run / "logs" / "build-7_0.log"))
    for i, s in enumerate(record["targets"][0]["smoke"]):
        s.update(job=str(8 + i), log=str(run / "logs" / f"smoke-{8 + i}.log"))
    (run / "run.json").write_text(json.dumps(record))
    return run, slurm.load_run(run)["targets"][0]


def _build_result(run: Path, wheel: str = WHEEL, target: str = "cu130-multi-min", smoke: str = "skipped") -> None:
    stages = {s: {"status": "passed", "reason": "", "seconds": 1.0} for s in ("build", "smoke", "publish")}
    stages["smoke"]["status"] = smoke
    result = {"target": target, "recipe": "cu130-multi-min", "python": "3.11.7", "stages": stages, "wheel": wheel}
    data = {"schema": 1, "result": result, "sha256": SHA, "job": "7", "node": "n1"}
    (run / "results" / "cu130-multi-min.build.json").write_text(json.dumps(data))


def _smoke_result(run: Path, partition: str = "h100", **change: Any) -> None:
    data = {"schema": 1, "target": "cu130-multi-min", "job": "8", "partition": partition, "status": "passed",
            "reason": "", "node": "g1", "gpus": "0", "saw_gpu": True, "seconds": 40.0, "sha256": SHA}  # fmt: skip
    data.update(change)
    (run / "results" / f"cu130-multi-min.smoke.{partition}.json").write_text(json.dumps(data))


def test_a_tampered_run_record_is_refused(tmp_path: Path) -> None:
    run, _ = _run(tmp_path, H100)
    record = json.loads((run / "run.json").read_text())
    for change, message in [
        ({"folder": "/etc"}, "field 'folder' is not"),  # a build only ever in the run's own work folder
        ({"name": "../x"}, "field 'name' is not valid"),
        ({"job": "7; rm"}, "field 'job' is not valid"),
        ({"task": 1}, "field 'task' is not cu130-multi-min's place in its job array"),
    ]:
        evil = json.loads(json.dumps(record))
        evil["targets"][0].update(change)
        (run / "run.json").write_text(json.dumps(evil))
        with pytest.raises(RecipeError, match=message):
            slurm.load_run(run)
    (run / "run.json").write_text(json.dumps({**record, "schema": 1}))
    with pytest.raises(RecipeError, match="is not 2"):
        slurm.load_run(run)
    (run / "run.json").write_text("{")
    with pytest.raises(RecipeError, match="cannot be read as JSON"):
        slurm.load_run(run)


def test_a_tampered_build_result_fails_its_target_never_publishes(tmp_path: Path) -> None:
    run, item = _run(tmp_path, {})
    died = slurm.target_result(run, item)  # the task died before writing one
    assert died.stages["build"].status == "failed" and "build-7_0.log" in died.stages["build"].reason
    evil = "/etc/../../evil/" + WHEEL
    _build_result(run, wheel=evil, smoke="passed")
    result = slurm.target_result(run, item)
    assert result.wheel == tmp_path / "targets" / "cu130-multi-min" / "dist" / WHEEL  # its own folder only
    assert result.stages["smoke"].reason == "on CPU: no [slurm.gpu] partition for archs 8.0, 9.0"
    assert result.slurm == {"job": "7_0", "log": str(run / "logs" / "build-7_0.log"), "node": "n1", "smoke_on": "cpu"}
    for kwargs, message in [({"wheel": "../../x.sh"}, "not a wheel file name"), ({"target": "other"}, "is not cu130")]:
        _build_result(run, **kwargs)
        bad = slurm.target_result(run, item)
        assert bad.stages["build"].status == "failed" and message in bad.stages["build"].reason
        assert bad.wheel is None and bad.stages["publish"].status == "skipped"
    (run / "results" / "cu130-multi-min.build.json").write_text("[1, 2")
    assert "cannot be read as JSON" in slurm.target_result(run, item).stages["build"].reason


def test_which_node_built_which_unit_is_read_from_the_unit_tasks_and_checked(tmp_path: Path) -> None:
    run, item = _run(tmp_path, {})
    _build_result(run, smoke="passed")
    results = run / "results"
    for group, node, ops in ((0, "node2", ["cpu_adam"]), (1, "node3", ["cpu_adagrad", "fused_adam"])):
        rows = [{"op": op, "status": "built"} for op in ops]
        (results / f"cu130-multi-min.units-{group}.json").write_text(json.dumps({"units": rows, "node": node}))
    got = slurm.target_result(run, item).slurm
    assert got is not None and got["units_on"] == "cpu_adam (node2), cpu_adagrad (node3), fused_adam (node3)"
    # A file a job wrote is checked: a node or op name that is not one is left out, never shown.
    (results / "cu130-multi-min.units-1.json").write_text(json.dumps({"units": [{"op": "x"}], "node": "<b>"}))
    (results / "cu130-multi-min.units-2.json").write_text(json.dumps({"units": [{"op": "../x"}], "node": "n"}))
    (results / "cu130-multi-min.units-3.json").write_text("{")
    got = slurm.target_result(run, item).slurm
    assert got is not None and got["units_on"] == "cpu_adam (node2)"
    # A unit task that started (its marker names its node and units) and wrote no result died there.
    (results / "cu130-multi-min.units-4.started.json").write_text(json.dumps({"ops": ["cpu_lion"], "job": "23",
                                                                               "node": "node3"}))  # fmt: skip
    (results / "cu130-multi-min.units-0.started.json").write_text(json.dumps({"ops": ["cpu_adam"], "job": "20",
                                                                               "node": "node2"}))  # fmt: skip
    got = slurm.target_result(run, item).slurm
    assert got is not None and got["units_on"] == (
        "cpu_adam (node2), cpu_lion (its unit task 23 died on node3: built by the build task)"
    )
    (results / "cu130-multi-min.units-4.started.json").write_text(json.dumps({"ops": ["../x"], "job": "23",
                                                                               "node": "node3"}))  # fmt: skip
    got = slurm.target_result(run, item).slurm
    assert got is not None and got["units_on"] == "cpu_adam (node2)"


def test_gpu_smoke_results_are_merged_and_checked(tmp_path: Path) -> None:
    run, item = _run(tmp_path, H100)
    _build_result(run)
    missing = slurm.target_result(run, item).stages["smoke"]
    assert missing.status == "failed" and "the smoke job on a100 wrote no result: read" in missing.reason
    _smoke_result(run, "a100", gpus="0,1")
    _smoke_result(run, "h100")
    both = slurm.target_result(run, item)
    assert both.ok and both.stages["smoke"].reason == "on a100 (g1, GPUs 0,1); on h100 (g1, GPUs 0)"
    assert both.slurm is not None and both.slurm["smoke_on"] == "a100 (8), h100 (9)"
    _smoke_result(run, "h100", sha256="cd" * 32)  # smoked other bytes than were built
    assert "smoked other bytes" in slurm.target_result(run, item).stages["smoke"].reason
    _smoke_result(run, "h100", status="failed", reason="saw no GPU on g1")
    assert "on h100 (g1): saw no GPU on g1" in slurm.target_result(run, item).stages["smoke"].reason
    _smoke_result(run, "h100", partition_x=1, gpus="0; rm -rf /")
    assert "field 'gpus' is not valid" in slurm.target_result(run, item).stages["smoke"].reason
    _smoke_result(run, "h100", target="other")
    assert not slurm.target_result(run, item).ok


def test_a_smoke_that_saw_no_gpu_is_told_apart() -> None:
    assert slurm.saw_no_gpu(["torch 2.14.1, CUDA 13.0, no GPU visible", "skipped"])
    assert not slurm.saw_no_gpu(["torch 2.14.1, CUDA 13.0, NVIDIA H100 80GB HBM3"])


def test_each_targets_state_comes_from_results_and_the_queue(tmp_path: Path) -> None:
    run, _ = _run(tmp_path, {"9.0": GpuSmoke("h100")})
    record = slurm.load_run(run)
    assert slurm.states(run, record, {"7_0": "PENDING"}) == {"cu130-multi-min": "build pending (job 7_0)"}
    assert slurm.states(run, record, {}) == {"cu130-multi-min": "build ended without a result (job 7_0)"}
    _build_result(run)
    line = slurm.states(run, record, {"8": "RUNNING"})["cu130-multi-min"]
    assert line == "build passed, smoke on h100 running (job 8), publish waits for the collect job"
    _smoke_result(run, "h100")
    assert "smoke on h100 passed (job 8)" in slurm.states(run, record, {})["cu130-multi-min"]


def test_the_two_partition_example_plans_a_smoke_job_per_gpu_type(tmp_path: Path) -> None:
    from builder.targets import load_matrix

    m = load_matrix(ROOT / "recipes" / "matrices" / "slurm-two-partitions.toml")
    assert m.gpu == {"8.0": GpuSmoke("a100", "gpu:a100:1"), "9.0": GpuSmoke("h100", "gpu:h100:2", time="00:30:00")}
    assert m.slurm == {"cpus": 8, "mem": "24G", "time": "02:00:00", "partition": "build", "account": "ml",
                       "compiler_cache": "/shared/ccache"}  # fmt: skip
    cuda = next(r for r in m.recipes if r.accelerator == "cuda")
    (target,) = targets_for([cuda])
    assert [g.partition for _, g in slurm.smoke_partitions(target, m.gpu)] == ["a100", "h100"]


def test_a_recipe_sizes_its_own_build_task_in_its_own_job_array(tmp_path: Path) -> None:
    """An array's tasks share one size: a recipe that needs more than the matrix gives gets an array of its own."""
    import dataclasses

    cpu, cuda = _targets()
    big = dataclasses.replace(cuda, recipe=dataclasses.replace(cuda.recipe, slurm=(("cpus", 16), ("mem", "64G"))))
    opts = slurm.SlurmOptions(partition="build", cpus=4, mem="8G")
    assert slurm.sizing(big, opts) == slurm.SlurmOptions(partition="build", cpus=16, mem="64G")
    record = slurm.plan_record([cpu, big], tmp_path / "m.toml", tmp_path / "run", tmp_path / "t", tmp_path / "h",
                               tmp_path / "cc", tmp_path / "sd", {}, opts)  # fmt: skip
    assert [a["targets"] for a in record["arrays"]] == [["cpu"], ["cu130-multi-min"]]
    assert record["arrays"][1]["size"]["cpus"] == 16 and record["arrays"][0]["size"]["mem"] == "8G"
    assert [(t["array"], t["task"]) for t in record["targets"]] == [(0, 0), (1, 0)]
    same = slurm.plan_record([cpu, cuda], tmp_path / "m.toml", tmp_path / "run", tmp_path / "t", tmp_path / "h",
                             tmp_path / "cc", tmp_path / "sd", {}, opts)  # fmt: skip
    assert [a["targets"] for a in same["arrays"]] == [["cpu", "cu130-multi-min"]]
    assert [(t["array"], t["task"]) for t in same["targets"]] == [(0, 0), (0, 1)]


def test_a_recipes_slurm_sizes_are_checked() -> None:
    from builder.recipe import parse_recipe

    base = {"name": "x", "accelerator": "cpu", "ops": ["cpu_adam"], "torch": {"version": "2.13.0"},
            "deepspeed": {"version": "0.19.8", "sha256": SHA}}  # fmt: skip
    assert parse_recipe({**base, "slurm": {"cpus": 16, "time": "04:00:00"}}).slurm == (
        ("cpus", 16),
        ("time", "04:00:00"),
    )
    for table, message in [({"cpus": 0}, "slurm.cpus = '0' is not valid"), ({"cpus": True}, "is not valid"),
                           ({"mem": "8G; reboot"}, "slurm.mem = '8G; reboot' is not valid"),
                           ({"gpus": 1}, 'unknown key "slurm.gpus"')]:  # fmt: skip
        with pytest.raises(RecipeError, match=message):
            parse_recipe({**base, "slurm": table})


def test_a_gpu_smoke_of_the_same_bytes_is_reused_only_when_it_proved_a_gpu(tmp_path: Path) -> None:
    """The next run of an unchanged target reuses a passing GPU smoke kept in its folder, for
    exactly those bytes on that partition; a damaged or different one means smoke again."""
    run, item = _run(tmp_path, {"9.0": GpuSmoke("h100")})
    folder = Path(item["folder"]) / "gpu-smoke"
    folder.mkdir(parents=True)
    kept = {"schema": 1, "target": "cu130-multi-min", "job": "8", "partition": "h100", "status": "passed",
            "reason": "", "node": "g1", "gpus": "0", "saw_gpu": True, "seconds": 40.0, "sha256": SHA}  # fmt: skip
    (folder / "h100.json").write_text(json.dumps(kept))
    earlier = slurm_results_mod._earlier_smoke(Path(item["folder"]), "cu130-multi-min", "h100", SHA, require_gpu=True)
    assert earlier is not None and earlier.node == "g1"
    assert slurm_results_mod._earlier_smoke(Path(item["folder"]), "cu130-multi-min", "h100", "cd" * 32, True) is None
    (folder / "h100.json").write_text(json.dumps({**kept, "saw_gpu": False}))  # proved no GPU: not for a real one
    assert slurm_results_mod._earlier_smoke(Path(item["folder"]), "cu130-multi-min", "h100", SHA, True) is None
    assert slurm_results_mod._earlier_smoke(Path(item["folder"]), "cu130-multi-min", "h100", SHA, False) is not None
    (folder / "h100.json").write_text("{")
    assert slurm_results_mod._earlier_smoke(Path(item["folder"]), "cu130-multi-min", "h100", SHA, False) is None
    _build_result(run)
    _smoke_result(run, "h100", status="reused", reason="passed on g1 in an earlier run, for these bytes")
    assert slurm.target_result(run, item).stages["smoke"].status == "reused"


# ---------------------------------------------------------------- op units on Slurm (issue 21)


def test_each_target_gets_unit_tasks_and_the_builds_wait_for_them(tmp_path: Path) -> None:
    """One unit task per named op, [slurm] unit_tasks of them for ops = "all"; the unit tasks of
    each build size are one array, and the build array waits (afterany) for every unit array."""
    import dataclasses

    cpu, cuda = _targets()
    every = dataclasses.replace(cpu, recipe=dataclasses.replace(cpu.recipe, name="every", all_ops=True, ops=()))
    opts = slurm.SlurmOptions(unit_tasks=4)
    assert [slurm.unit_tasks(t, 4) for t in (cpu, cuda, every)] == [4, 3, 4]  # cpu: 5 ops, 4 tasks; cuda: 3
    assert slurm.unit_tasks(cpu, 2) == 2
    record = slurm.plan_record([cpu, every], tmp_path / "m.toml", tmp_path / "run", tmp_path / "targets",
                               tmp_path / "house", tmp_path / "cc", tmp_path / "sd", {}, opts,
                               {"cpu_adam": 90.0})  # fmt: skip
    (units,) = record["unit_arrays"]
    assert units["tasks"] == [["cpu", 0, 4], ["cpu", 1, 4], ["cpu", 2, 4], ["cpu", 3, 4],
                              ["every", 0, 4], ["every", 1, 4], ["every", 2, 4], ["every", 3, 4]]  # fmt: skip
    assert record["unit_times"] == {"cpu_adam": 90.0}
    script = slurm.units_script([tuple(t) for t in units["tasks"]], tmp_path / "run", "/py")
    assert "names=(cpu cpu cpu cpu every every every every)\n" in script
    assert "groups=(0/4 1/4 2/4 3/4 0/4 1/4 2/4 3/4)" in script
    assert '--group "${share%/*}" --of "${share#*/}"' in script


def test_recorded_unit_times_take_each_ops_newest_record() -> None:
    records: list[dict[str, Any]] = [
        {"op": "cpu_adam", "seconds": 100.0, "built_at": "2026-11-22T10:00:00+00:00"},
        {"op": "cpu_adam", "seconds": 80.0, "built_at": "2026-11-23T10:00:00+00:00"},
        {"op": "async_io", "seconds": 284, "built_at": "2026-11-23T09:00:00+00:00"},
        {"op": "dc", "seconds": "slow"}, {"op": 5, "seconds": 1.0}, {},
    ]  # fmt: skip
    assert slurm.recorded_times(records) == {"async_io": 284.0, "cpu_adam": 80.0}


def test_units_are_shared_out_by_their_recorded_times() -> None:
    """Longest first, each to the least loaded task: 4 units on 2 tasks, one long op alone; an op
    never built counts as long (UNKNOWN_SECONDS); every task computes the same split."""
    from builder.units.plan import UNKNOWN_SECONDS, group_units

    class _Op:
        def __init__(self, name: str) -> None:
            self.name = name

    class _Unit:
        def __init__(self, name: str) -> None:
            self.op = _Op(name)

    units: list[Any] = [_Unit(n) for n in ("cpu_adam", "async_io", "pin_memory", "utils")]
    times = {"cpu_adam": 100.0, "async_io": 300.0, "pin_memory": 60.0, "utils": 50.0}
    groups = group_units(units, 2, times)
    assert [[u.op.name for u in g] for g in groups] == [["async_io"], ["cpu_adam", "pin_memory", "utils"]]
    again = group_units(list(reversed(units)), 2, times)
    assert [[u.op.name for u in g] for g in again] == [[u.op.name for u in g] for g in groups]
    unknown = group_units([*units, _Unit("evoformer_attn")], 2, times)  # type: ignore[list-item]
    assert [u.op.name for u in unknown[0]] == ["evoformer_attn"] and UNKNOWN_SECONDS > 300
    assert group_units(units, 8, times)[7] == []  # more tasks than units: some have none


def test_a_tampered_unit_array_is_refused(tmp_path: Path) -> None:
    run, _ = _run(tmp_path, H100)
    record = json.loads((run / "run.json").read_text())
    changes: list[tuple[dict[str, Any], str]] = [
        ({"unit_arrays": [{"size": {}, "tasks": [["../x", 0, 1]]}]}, "not \\[target, task, tasks\\]"),
        ({"unit_arrays": [{"size": {}, "tasks": [["cu130-multi-min", 3, 2]]}]}, "holds task 3 of 2"),
        ({"unit_arrays": [{"size": {}, "tasks": [["cu130-multi-min", 0, 1]], "job": "1;rm"}]}, "field 'job'"),
        ({"unit_times": {"../x": 1.0}}, "is not \\{op: seconds\\}"),
    ]
    for change, message in changes:
        (run / "run.json").write_text(json.dumps({**record, **change}))
        with pytest.raises(RecipeError, match=message):
            slurm.load_run(run)
