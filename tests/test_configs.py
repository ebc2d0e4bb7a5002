"""DeepSpeed configs as the proof (issue 29): the matrix, config files, what results mean, and the
runner's pure parts. The runner itself runs for real against real wheels in test_pipeline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from fakes import raiser

import builder.resources.config_check.jit as runner_jit
import builder.resources.config_check.outcome as runner_outcome
import builder.resources.config_check.pool as runner_pool
import builder.resources.config_check.rank as runner_rank
import builder.resources.config_check.screen as runner_screen
from builder import configs
from builder.configs import ConfigCase, Outcome, as_check, matrix, read_config
from builder.errors import RecipeError
from builder.node import config_category, config_matrix, format_configs
from builder.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[1]


def test_the_matrix_covers_every_optimizer_stage_offload_and_dtype_deepspeed_accepts() -> None:
    cpu = matrix("cpu", ["cpu_adam"])
    # 6 optimizers x (ZeRO 0 + ZeRO 1-3 with and without CPU offload) x fp32/bf16
    assert len(cpu) == 6 * (1 + 3 * 2) * 2
    names = {c.name for c in cpu}
    assert "Adam/zero0/none/fp32" in names and "Lion/zero2/cpu/bf16" in names
    assert not any("nvme" in n or "fp16" in n for n in names)
    assert not any(n.split("/")[1] == "zero0" and n.split("/")[2] == "cpu" for n in names)  # no offload at ZeRO 0
    with_aio = matrix("cpu", ["cpu_adam", "async_io"])
    nvme = [c for c in with_aio if "/nvme/" in c.name]
    assert len(nvme) == 6 * 2 and all(c.name.split("/")[1] == "zero3" for c in nvme)
    zero = nvme[0].config["zero_optimization"]
    assert zero["offload_optimizer"] == {"device": "nvme", "nvme_path": runner_screen.SCRATCH}
    assert {c.name.split("/")[3] for c in matrix("cuda", [])} == {"fp32", "fp16", "bf16"}
    adam = next(c for c in cpu if c.name == "AdamW/zero1/cpu/bf16").config
    assert adam["optimizer"]["type"] == "AdamW" and adam["bf16"] == {"enabled": True}
    assert adam["zero_optimization"] == {"stage": 1, "offload_optimizer": {"device": "cpu"}}


def test_config_files_json_and_python_literal_and_every_bad_one(tmp_path: Path) -> None:
    good = tmp_path / "a.json"
    good.write_text('{"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 1}}')
    assert read_config(good) == ConfigCase("a.json", {"train_micro_batch_size_per_gpu": 2,
                                                      "zero_optimization": {"stage": 1}}, str(good))  # fmt: skip
    py = tmp_path / "b.py"
    py.write_text('"""a site config"""\nconfig = {"optimizer": {"type": "Adam"}, "bf16": {"enabled": True}}\n')
    assert read_config(py).config == {"optimizer": {"type": "Adam"}, "bf16": {"enabled": True}}
    marker = tmp_path / "ran"
    code = tmp_path / "c.py"  # nothing in a .py config is run: a call is not a literal
    code.write_text(f"config = {{'x': open({str(marker)!r}, 'w').write('x')}}\n")
    assert "is not a Python dict literal" in read_config(code).error and not marker.exists()
    cases: dict[str, tuple[str, str | bytes, str]] = {
        "not JSON": ("d.json", "{not json", "is not JSON (Expecting property name"),
        "a list": ("e.json", "[1, 2]", "holds a list, not a DeepSpeed config object"),
        "no dict": ("f.py", "x = 1\n", "no dict literal in it"),
        "not UTF-8": ("g.json", b"\xff\xfe{", "cannot read"),
    }
    for why, (name, content, said) in cases.items():
        path = tmp_path / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        assert said in read_config(path).error, why
    assert read_config(tmp_path / "missing.json").error == f"{tmp_path / 'missing.json'} does not exist"
    big = tmp_path / "big.json"
    big.write_text(" " * (runner_screen.MAX_CONFIG + 1))
    assert "over 1 MiB" in read_config(big).error


def test_results_become_checks_a_site_config_must_pass_a_matrix_row_says_what_it_needs() -> None:
    passed = Outcome("adam.json", "passed", "3 steps with FusedAdam", ("fused_adam", "deepspeed_shm_comm"))
    needs = Outcome(
        "Adam/zero0/none/fp32", "needs-op", "needs fused_adam ...", ("deepspeed_shm_comm",), ("fused_adam",)
    )
    refused = Outcome("Lion/zero2/none/fp32", "unsupported", "ValueError: This op had not been implemented on CPU")
    crashed = Outcome("x", "failed", "the config died before reporting (exit codes [-6])")
    assert as_check(passed, "cpu", site=True).status == "passed"
    assert "ops fused_adam, deepspeed_shm_comm" in as_check(passed, "cpu", site=True).detail
    row = as_check(needs, "cpu", site=False)
    assert (row.name, row.status) == ("config:matrix/Adam/zero0/none/fp32", "skipped")
    assert row.detail == 'needs op fused_adam, which the wheel lacks: add "fused_adam" to the recipe\'s ops'
    assert as_check(needs, "cpu", site=True).status == "failed"  # the recipe names it: the smoke fails
    lion = as_check(refused, "cpu", site=True)
    assert lion.status == "skipped" and lion.detail.startswith("not supported by DeepSpeed on cpu: ValueError")
    assert as_check(crashed, "cpu", site=False).status == "failed"
    assert configs.exit_status([Outcome("a", "passed", "")]) == 0
    assert configs.exit_status([Outcome("a", "passed", ""), Outcome("b", "unsupported", "")]) == 14


def test_the_matrix_collapses_to_a_line_per_optimizer() -> None:
    checks = {}
    for stage in range(4):
        for offload in ("none", "cpu") if stage else ("none",):
            for dtype in ("fp32", "bf16"):
                adam = ("passed", "runs") if offload == "cpu" or stage < 3 else ("skipped", "needs op async_io, which")
                lion = ("passed", "runs") if offload == "cpu" else ("skipped", "not supported by DeepSpeed on cpu: x")
                if (stage, offload, dtype) == (3, "cpu", "bf16"):
                    lion = ("failed", "boom")
                checks[f"config:matrix/Adam/zero{stage}/{offload}/{dtype}"] = adam
                checks[f"config:matrix/Lion/zero{stage}/{offload}/{dtype}"] = lion
    checks["config:site/configs/adam.json"] = ("passed", "runs from the wheel: ops cpu_adam")
    checks["load:cpu_adam"] = ("passed", "")
    assert format_configs(checks) == [
        "config Adam     runs: ZeRO 0-2, ZeRO 1-3 + CPU offload; needs async_io: ZeRO 3",
        "config Lion     not supported by DeepSpeed: ZeRO 0-3; runs: ZeRO 1-2 + CPU offload, "
        "ZeRO 3 + CPU offload (fp32); FAILED: ZeRO 3 + CPU offload (bf16)",
        "config configs/adam.json: runs (runs from the wheel: ops cpu_adam)",
    ]
    grid = config_matrix(checks)
    assert grid["Adam"][(3, "none", "fp32")] == "needs async_io"
    assert config_category("skipped", "torch.compile (inductor) compiles code") == "needs a compiler (torch.compile)"
    assert config_category("skipped", "no GPU visible: ...") == "not run (no GPU)"


def test_a_recipe_reads_its_configs_and_refuses_bad_ones(tmp_path: Path) -> None:
    default = load_recipe(ROOT / "recipes" / "cpu.toml")
    assert "fused_adam" in default.ops  # Adam and AdamW without offload load it (found by running them)
    names = [n for n, _ in default.configs]
    assert "configs/adam-zero0.json" in names and "configs/lion-zero2.json" in names
    assert default.config_table["configs/adam-zero0.json"]["optimizer"]["type"] == "Adam"
    text = (ROOT / "recipes" / "cpu.toml").read_text()
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "adam-zero0.json").write_text("{broken")
    copy = tmp_path / "r.toml"
    copy.write_text(text)
    with pytest.raises(RecipeError) as err:
        load_recipe(copy)
    assert f"{copy}: configs: {tmp_path / 'configs' / 'adam-zero0.json'} is not JSON" in err.value.message
    assert err.value.exit_code == 2
    copy.write_text(text.replace('"configs/adam-zero0.json",', '"configs/adam-zero0.json", "configs/adam-zero0.json",'))
    with pytest.raises(RecipeError, match="configs names a file twice"):
        load_recipe(copy)
    copy.write_text(
        text.replace('"configs/adam-zero0.json",', '"configs/adam-zero0.json", "./configs/adam-zero0.json",')
    )
    with pytest.raises(RecipeError, match="configs names a file twice"):
        load_recipe(copy)  # one file, two spellings
    copy.write_text(text.replace('"configs/adam-zero0.json",', '"", '))
    with pytest.raises(RecipeError, match="configs must list DeepSpeed config files"):
        load_recipe(copy)
    # A config outside the recipe's folder (its text is embedded in every wheel): refused, by a path
    # with '..', an absolute path, or a link out of the folder.
    secret = tmp_path.parent / f"{tmp_path.name}-secret" / "creds.json"
    secret.parent.mkdir()
    secret.write_text('{"train_batch_size": 1, "token": "s3cret"}')
    (tmp_path / "configs" / "link.json").symlink_to(secret)
    for name in (f"../{secret.parent.name}/creds.json", str(secret), "configs/link.json"):
        copy.write_text(text.replace('"configs/adam-zero0.json",', f'"{name}",'))
        with pytest.raises(RecipeError) as err:
            load_recipe(copy)
        assert "is outside the recipe's folder" in err.value.message and err.value.exit_code == 2


def test_the_runner_refuses_before_starting_what_cannot_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert runner_rank.world_size_of({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2,
                                        "gradient_accumulation_steps": 2}) == 4  # fmt: skip
    assert runner_rank.world_size_of({"train_micro_batch_size_per_gpu": 2}) == 1
    config = {"train_batch_size": 4096, "train_micro_batch_size_per_gpu": 1}
    many = {"name": "many", "config": config, "max_world": 8}
    said = runner_screen.refuse_early(many, runner_rank.world_size_of(config), [])
    assert said.startswith("the config needs 4096 processes") and "this machine allows 8" in said
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    etc_link = tmp_path / "etc-link"
    etc_link.symlink_to("/etc")
    cases = [(str(tmp_path / "absent") if _root() else str(ro), "is not a folder this user can write"),
             ("", "gives no nvme_path"), ("/", "the system folder /:"), ("/etc", "the system folder /etc:"),
             (str(etc_link), "the system folder /etc:"), ("/usr/lib", "the system folder /usr/lib:")]  # fmt: skip
    for path, expected in cases:
        section = {"device": "nvme", "nvme_path": path} if path else {"device": "nvme"}
        entry = {"name": "n", "config": {"zero_optimization": {"stage": 3, "offload_optimizer": section}}}
        made: list[str] = []
        assert expected in runner_screen.refuse_early(entry, 1, made), path
        assert made == []
    nvme = next(c for c in matrix("cpu", ["async_io"]) if "/nvme/" in c.name)
    scratch = {"name": "s", "config": json.loads(json.dumps(nvme.config))}
    made = []
    assert runner_screen.refuse_early(scratch, 1, made) == ""
    folder = Path(scratch["config"]["zero_optimization"]["offload_optimizer"]["nvme_path"])
    assert folder.parent == tmp_path and folder.is_dir() and str(folder) in made  # the work disk (O_DIRECT)
    assert all(Path(m).parent == tmp_path for m in made)
    # A node's own NVMe folder: the check writes into a scratch folder of its own inside it.
    disk = tmp_path / "nvme0"
    disk.mkdir()
    own = {"name": "o", "config": {"zero_optimization": {"stage": 3, "offload_optimizer": {
        "device": "nvme", "nvme_path": str(disk)}}}}  # fmt: skip
    made = []
    assert runner_screen.refuse_early(own, 1, made) == ""
    assert [Path(m).parent for m in made] == [disk] and Path(made[0]).name.startswith(".ds-config-check-")
    spec = configs.runner_spec([ConfigCase("bad", {}, "x.json", "x.json does not exist"), nvme], "cpu", 5.0, jobs=3)
    assert spec["configs"][0] == {"name": "bad", "error": "x.json does not exist"}
    assert spec["timeout"] == 5.0 and spec["jobs"] == 3 and spec["accelerator"] == "cpu"


def _root() -> bool:
    import os

    return os.geteuid() == 0


def test_the_runner_sorts_deepspeeds_errors() -> None:
    runner_jit.jit_asked.clear()
    runner_jit.refused_loads.clear()
    try:
        raise ValueError("This op had not been implemented on CPU backend.")
    except ValueError as exc:
        assert runner_outcome.classify(exc)[0] == "unsupported"
    # Raised inside torch's compile path (a frame of torch/_inductor), as torch raises it.
    inductor = raiser("torch/_inductor/codecache.py", RuntimeError)
    try:
        inductor("InductorError: InvalidCxxCompiler: No working C++ compiler found")
    except RuntimeError as exc:
        status, detail = runner_outcome.classify(exc)
        assert status == "needs-compiler" and "no prebuilt wheel can carry it" in detail
    # Issue 56: Muon on a GPU node with the compilers hidden: Triton's launcher needs a C compiler. It is
    # torch's need, not the wheel's (skipped, never sent to the reference, which has a compiler).
    try:
        inductor("InductorError: RuntimeError: Failed to find C compiler. Please specify via CC "
                 "environment variable or set triton.knobs.build.impl.")  # fmt: skip
    except RuntimeError as exc:
        status, detail = runner_outcome.classify(exc)
        assert status == "needs-compiler" and "Triton's GPU launcher" in detail and "not the wheel's" in detail
        outcome = configs.Outcome("Muon/zero0/none/bf16", status, detail)
        check = configs.as_check(outcome, "cuda", site=False)
        assert check.status == "skipped" and "compiler" in check.detail
        assert config_category(check.status, check.detail) == "needs a compiler (torch.compile)"
    # ... and the wheel's own JIT in the same config is still caught: a missing op, not a compiler.
    runner_jit.jit_asked.append("fused_adam")
    try:
        raise RuntimeError("Failed to find C compiler")
    except RuntimeError as exc:
        assert runner_outcome.classify(exc)[0] == "needs-op"
    runner_jit.jit_asked.clear()
    runner_jit.jit_asked.append("fused_adam")
    try:
        raise runner_jit.JitRefused("refused")
    except RuntimeError as exc:
        assert runner_outcome.classify(exc)[0] == "needs-op"
    runner_jit.jit_asked.clear()
    try:
        raise KeyError("ours")
    except KeyError as exc:
        assert runner_outcome.classify(exc)[0] == "failed"
    # Issue 51: DeepSpeed's checks of a config's contents are "invalid", not "not supported on this
    # accelerator": its config module's asserts (train_batch_size NaN), an optimizer it does not have.
    try:
        raise AssertionError("FooOpt is not a supported DeepSpeed Optimizer")
    except AssertionError as exc:
        assert runner_outcome.classify(exc)[0] == "invalid"
    namespace: dict[str, Any] = {}
    exec(compile("def _batch_assertion():\n    assert False, 'Train batch size: nan has to be greater than 0'\n",
                 os.path.join("site-packages", "deepspeed", "runtime", "config.py"), "exec"), namespace)  # fmt: skip
    try:
        namespace["_batch_assertion"]()
    except AssertionError as exc:
        status, detail = runner_outcome.classify(exc)
        assert (status, detail) == ("invalid", "AssertionError: Train batch size: nan has to be greater than 0")


def test_parse_outcomes_refuses_a_bad_report() -> None:
    from builder.errors import SmokeError

    record = {"name": "a", "status": "passed", "detail": "ok", "ops": ["cpu_adam"], "jit": [], "world_size": 1,
              "seconds": 0.25}  # fmt: skip
    good = f"noise\n{configs.MARKER}\n{json.dumps([record])}\nwarning printed at exit\n"
    assert configs.parse_outcomes(good) == [Outcome("a", "passed", "ok", ("cpu_adam",), (), 1, 0.25)]
    # What another process printed is validated item by item (it may be damaged, or not ours).
    hostile = {
        "no marker": "no marker",
        "not JSON": f"{configs.MARKER}\n{{",
        "not a list": f'{configs.MARKER}\n{{"name": "a"}}',
        "an unknown status": f"{configs.MARKER}\n{json.dumps([{**record, 'status': 'great'}])}",
        "an item that is no object": f"{configs.MARKER}\n[1]",
        "an op name with a path in it": f"{configs.MARKER}\n{json.dumps([{**record, 'ops': ['../../x']}])}",
        "a missing field": f"{configs.MARKER}\n{json.dumps([{k: v for k, v in record.items() if k != 'jit'}])}",
        "a world size that is text": f"{configs.MARKER}\n{json.dumps([{**record, 'world_size': '2'}])}",
    }
    for bad in hostile.values():
        with pytest.raises(SmokeError):
            configs.parse_outcomes(bad)


def test_a_recipes_configs_add_the_ops_they_load_round_by_round(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The build runs the recipe's configs from each wheel it makes (FAKE builds and runs here: the
    real ones are in test_pipeline) and adds what they loaded, until they run or nothing can be added."""
    import dataclasses

    from builder import build as wheelbuild
    from builder import pipeline
    from builder.errors import BuildError
    from builder.targets import Target, this_interpreter
    from builder.workspace import Workspace

    base = dataclasses.replace(load_recipe(ROOT / "recipes" / "cpu.toml"), ops=("cpu_adam",))
    built: list[tuple[str, ...]] = []
    loads = {"deepspeed_shm_comm": (), "fused_adam": ("deepspeed_shm_comm",)}  # fused_adam is asked for after shm

    def fake_build(recipe, *args, **kwargs):  # type: ignore[no-untyped-def]
        built.append(recipe.ops)
        return wheelbuild.BuildResult(tmp_path / f"{len(built)}.whl", 1.0, tmp_path / "log", "k")

    def fake_run(cases, ws, wheel, verbose=False):  # type: ignore[no-untyped-def]
        ops = built[-1]
        missing = [op for op, after in loads.items() if op not in ops and all(a in ops for a in after)]
        return [Outcome(c.name, "needs-op", "", (), tuple(missing[:1])) if missing else Outcome(c.name, "passed", "")
                for c in cases]  # fmt: skip

    monkeypatch.setattr(wheelbuild, "build_wheel", fake_build)
    monkeypatch.setattr("builder.smoke.run_cases", fake_run)
    ws = Workspace(tmp_path / "work")
    result = pipeline.build_for_configs(Target(base, this_interpreter()), ws, pipeline.Stages(), 1)
    assert built == [
        ("cpu_adam",),
        ("cpu_adam", "deepspeed_shm_comm"),
        ("cpu_adam", "deepspeed_shm_comm", "fused_adam"),
    ]
    assert result.wheel.name == "3.whl"
    # An op the configs load that the build cannot add (ops = "all" holds every op it could build)
    built.clear()
    every = dataclasses.replace(base, all_ops=True, ops=())
    with pytest.raises(BuildError) as err:
        pipeline.build_for_configs(Target(every, this_interpreter()), ws, pipeline.Stages(), 1)
    assert (
        "loads deepspeed_shm_comm, which the wheel of cpu does not hold and this build cannot add" in err.value.message
    )
    assert err.value.exit_code == 5
    # No configs: one build, nothing run
    built.clear()
    plain = dataclasses.replace(base, configs=())
    pipeline.build_for_configs(Target(plain, this_interpreter()), ws, pipeline.Stages(), 1)
    assert built == [("cpu_adam",)]


def test_a_launched_rank_whose_world_does_not_fit_the_config_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torchrun across nodes the launcher decides the world: a config whose batch sizes give
    another number of processes is invalid, said before DeepSpeed is imported."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    config = {"train_batch_size": 3, "train_micro_batch_size_per_gpu": 1}
    got = runner_rank.run_launched("zero2.json", config)
    assert got["status"] == "invalid" and got["rank"] == 1 and got["world"] == 2 and got["ops"] == []
    assert got["detail"] == ("the config's batch sizes give 3 processes (train_batch_size / (micro batch x "
                             "accumulation)); the launcher started 2")  # fmt: skip


def test_a_configs_rendezvous_port_is_held_until_its_ranks_are_done() -> None:
    """The store the runner hosts keeps its port bound: another process cannot take it between the
    choice and rank 0's rendezvous (the smoke failed one config in 91 with EADDRINUSE when the port
    was chosen by binding port 0 and closing it)."""
    import socket

    store = runner_rank.held_store(2)
    with socket.socket() as other, pytest.raises(OSError) as taken:
        other.bind(("127.0.0.1", store.port))
    assert taken.value.errno == 98  # EADDRINUSE: held, not merely chosen
    client = __import__("torch").distributed.TCPStore("127.0.0.1", store.port, 2, False)  # a rank connects
    client.set("k", "v")
    assert store.get("k") == b"v"


def test_sixteen_worlds_at_once_each_meet_at_their_own_store() -> None:
    """The rendezvous of 16 two-rank worlds at once (the smoke runs configs 4 at a time; its 91
    configs run for real in test_pipeline): 16 distinct held ports, each rank meeting its own."""
    torch = pytest.importorskip("torch")
    from concurrent.futures import ThreadPoolExecutor

    stores = [runner_rank.held_store(2) for _ in range(16)]
    assert len({s.port for s in stores}) == 16

    def meet(store: object) -> bytes:
        client = torch.distributed.TCPStore("127.0.0.1", store.port, 2, False)  # type: ignore[attr-defined]
        client.set("rank1", "here")
        return store.get("rank1")  # type: ignore[attr-defined,no-any-return]

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(meet, stores)) == [b"here"] * 16


def test_a_key_deepspeed_does_not_know_fails_the_config_with_did_you_mean(monkeypatch: pytest.MonkeyPatch) -> None:
    """DeepSpeed ignores unknown keys: {"zero_optimisation": {"stage": 2}} ran at ZeRO 0 and passed.
    The names are DeepSpeed's own, read from its sources (here: the installed torch-side test env has
    no DeepSpeed, so a FAKE list stands in for what the scan finds; the scan itself runs for real in
    every smoke and check-config)."""
    monkeypatch.setattr(runner_screen, "_NAMES", [frozenset({"zero_optimization", "stage", "offload_optimizer",
                                                             "device", "train_batch_size", "optimizer"})])  # fmt: skip
    assert runner_screen.unknown_keys({"zero_optimization": {"stage": 2}, "train_batch_size": 2}) == ""
    said = runner_screen.unknown_keys({"zero_optimisation": {"stage": 2}})
    assert said.startswith("unknown key 'zero_optimisation' (did you mean 'zero_optimization'?)")
    said = runner_screen.unknown_keys({"zero_optimization": {"stage": 2, "offload_optimizer": {"devcie": "cpu"}}})
    assert "'zero_optimization.offload_optimizer.devcie' (did you mean 'device'?)" in said


def test_a_config_that_hit_its_time_limit_beside_others_runs_again_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """FAKE runs (no DeepSpeed): seen once in CI, a Muon config stopped inside torch.compile holding
    inductor's lock while three others waited on it until the 180 s limit. It runs once more alone;
    a config that hangs alone too is a failure, and each result says it ran twice."""
    runs: dict[str, int] = {}

    class FakeRunning:
        def __init__(self, entry: dict[str, Any], context: Any, timeout: float) -> None:
            self.entry, self.name = entry, entry["name"]
            runs[self.name] = runs.get(self.name, 0) + 1

        def finish(self) -> dict[str, Any]:
            base = {"name": self.name, "world_size": 1, "ops": [], "jit": [], "seconds": 1.0}
            if self.name == "ok" or (self.name == "flaky" and runs["flaky"] > 1):
                return {**base, "status": "passed", "detail": "3 steps"}
            return {**base, "status": "failed", "detail": "the config did not finish within 180 s (its time limit)"}

    monkeypatch.setattr(runner_pool, "Running", FakeRunning)
    monkeypatch.setattr(runner_pool, "prepare", lambda accelerator: None)
    entries: list[dict[str, Any]] = [{"name": n, "config": {}} for n in ("ok", "flaky", "hangs")]
    results = {r["name"]: r for r in runner_pool.run({"configs": entries, "jobs": 4, "accelerator": "cpu"})}
    assert runs == {"ok": 1, "flaky": 2, "hangs": 2}
    assert results["ok"]["detail"] == "3 steps"
    assert results["flaky"]["status"] == "passed" and "run again alone" in results["flaky"]["detail"]
    assert results["hangs"]["status"] == "failed" and "and again alone" in results["hangs"]["detail"]
    runs.clear()  # one config at a time: nothing ran beside it, so nothing to run again
    alone = runner_pool.run({"configs": entries[2:], "jobs": 1, "accelerator": "cpu"})
    assert runs == {"hangs": 1} and alone[0]["status"] == "failed"


def test_a_configs_extensions_folder_is_removed_when_it_is_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each config gets an empty TORCH_EXTENSIONS_DIR of its own, removed when its result is made (a
    node running the runner by hand, or the smoke's 91 configs a run, left a folder each in /tmp).
    Here DeepSpeed is not installed, so the config fails to import it: the folder goes all the same."""
    monkeypatch.setattr(runner_screen, "_NAMES", [frozenset({"train_batch_size"})])
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for name in ("RANK", "WORLD_SIZE", "TORCH_EXTENSIONS_DIR"):
        monkeypatch.setenv(name, "0" if name == "RANK" else "1")
    got = runner_rank.run_launched("zero0.json", {"train_batch_size": 1})
    assert got["status"] == "failed" and "deepspeed" in got["detail"], got
    assert os.environ["TORCH_EXTENSIONS_DIR"].startswith(str(tmp_path / "config-ext-"))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.spawns
def test_the_config_checker_is_its_package_in_one_file(tmp_path: Path) -> None:
    """Issue 50: the config checker is a package (builder/resources/config_check/, a module per
    noun); the smoke runs it and a wheelhouse publishes it (tools/ds-config-check.py) as one file,
    the same bytes each time, which runs alone (`--help` from a folder holding nothing else)."""
    from builder import bundle
    from builder.resources.config_check import BUNDLE

    first = configs.checker_source()
    bundle._BUILT.clear()  # built again from the package, not the bytes this process built
    assert first == configs.checker_source()
    text = first.decode()
    assert [m for m in BUNDLE if f"# ==================== builder/resources/config_check/{m}.py" not in text] == []
    assert "from builder" not in text and "import builder" not in text
    tool = tmp_path / "ds-config-check.py"
    tool.write_bytes(first)
    done = subprocess.run([sys.executable, "-I", str(tool), "--help"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0 and "--timeout" in done.stdout and "CONFIG" in done.stdout, done.stderr
