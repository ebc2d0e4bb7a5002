from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from builder.bench import render_table

ROOT = Path(__file__).resolve().parents[1]


def test_table_shows_ratios_against_the_plain_command() -> None:
    result = {
        "recipe": "cpu", "runs": 3, "cores": 2, "extra_op": "deepspeed_shm_comm",
        "median_s": {"plain": 110.0, "cold": 88.0, "unchanged": 0.9, "one_op": 30.0, "node_wheel": 6.0,
                     "node_jit": 60.0, "env_uv": 2.1, "env_pip": 32.7, "smoke_uv": 48.0, "smoke_pip": 95.0,
                     "clone_uv": 140.0, "clone_pip": 280.0, "configs_matrix": 24.0, "configs_each": 420.0,
                     "cold_host": 84.0, "root_make": 41.0, "cold_no_header": 120.0, "header_make": 34.0},
        "wheel_bytes": {"plain": 15_900_000, "toolkit": 2_400_000, "configs": 91, "header": 799_129_093},
        "ratios": {"cold_vs_plain": 0.8, "unchanged_vs_cold": 0.0102, "one_op_vs_cold": 0.341,
                   "wheel_vs_plain": 0.151, "node_vs_jit": 0.1, "env_uv_vs_pip": 0.064, "smoke_uv_vs_pip": 0.505,
                   "clone_uv_vs_pip": 0.5, "configs_vs_each": 0.057, "root_vs_host": 1.048,
                   "header_vs_none": 0.733},
    }  # fmt: skip
    table = render_table(result)
    assert "Recipe `cpu`, 2 cores, median of 3 run(s):" in table
    assert "| cold build vs plain `setup.py build_ext -j bdist_wheel` | 88 s vs 110 s | 0.80 | <= 0.5 |" in table
    assert "| unchanged rebuild (build key hit) vs cold | 0.9 s vs 88 s | 0.01 | < 2 s for the build step |" in table
    assert "(+deepspeed_shm_comm) | 0.34 | <= 0.2 |" in table
    assert (
        "| cold build with the precompiled torch header (made in it) vs without | 88 s vs 120 s | 0.73 | - |" in table
    )
    assert "Making the precompiled torch header (once per flag set, in the cold build): 34 s, 799 MB." in table
    assert "| wheel size vs plain wheel | 2.4 MB vs 15.9 MB | 0.15 | <= 0.3 |" in table
    assert "| environment with the recipe's torch: uv vs venv + pip | 2.1 s vs 32.7 s | 0.06 | - |" in table
    assert "| smoke, uv environments vs venv + pip | 48 s vs 95 s | 0.51 | smoke <= 50 s |" in table
    assert "`nox -s build-wheel`): uv vs pip environments | 140 s vs 280 s | 0.50 | <= 150 s |" in table
    assert "one forked runner vs a process per config | 24 s vs 420 s (91 configs) | 0.06 | - |" in table
    assert 'the same on the host (`platform = "host"`) | 88 s vs 84 s | 1.05 | <= 1.1 |' in table
    assert "Making the build root (Debian 11, once per machine): 41 s." in table


def test_the_slurm_bench_changes_one_recipe_of_a_copy_of_the_matrix(tmp_path: Path) -> None:
    from builder.bench.slurm import _add_op, _copy_matrix, _hits, render_slurm
    from builder.targets import load_matrix

    matrix = ROOT / "recipes" / "matrices" / "example.toml"
    copy, recipes = _copy_matrix(matrix, tmp_path / "m")
    loaded = load_matrix(copy)
    assert [r.name for r in loaded.recipes] == [r.name for r in load_matrix(matrix).recipes]
    assert loaded.python == load_matrix(matrix).python and copy.parent == recipes[0].parent
    _add_op(recipes[0], "pin_memory")
    assert load_matrix(copy).recipes[0].ops[0] == "pin_memory"
    assert (ROOT / "recipes" / "cpu.toml").read_text() != recipes[0].read_text()  # the original is untouched
    assert _hits("ccache: 5 hits, 2 misses (71% hit rate)\nx\nccache: 1 hits, 0 misses") == (6, 2)
    result = {"matrix": "m.toml", "targets": 3, "changed": {"recipe": "cpu", "added_op": "cpu_lion"},
              "slurm_nodes": "1 2", "seconds": {"local_cold": 300.0, "slurm_cold": 240.0, "local_second": 100.0,
              "slurm_second": 60.0}, "second_slurm_ccache": {"hits": 6, "misses": 2},
              "ratios": {"slurm_vs_local_cold": 0.8, "slurm_second_vs_cold": 0.25,
                         "slurm_vs_local_second": 0.6}}  # fmt: skip
    table = render_slurm(result)
    assert "| cold: Slurm job array vs here one after another | 240 s vs 300 s | 0.80 |" in table
    assert (
        "| second run (+cpu_lion in cpu): Slurm, shared compiler cache, vs Slurm cold | 60 s vs 240 s | 0.25 |" in table
    )


def test_the_all_ops_bench_projects_the_units_over_nodes() -> None:
    """Longest first to the least loaded node: one node is the sum, enough nodes the longest unit."""
    from builder.bench.all_ops import PeakMemory, projection, render_all_ops

    times = [600.0, 300.0, 200.0, 100.0, 100.0]
    assert projection(times, 1) == 1300.0
    assert projection(times, 2) == 700.0  # 600+100 / 300+200+100
    assert projection(times, 64) == 600.0 and projection([], 4) == 0.0
    assert PeakMemory.used_gb() > 0
    result = {
        "recipe": "cu130-hopper-all", "cores": 2, "ops": ["a"] * 19, "extra_op": "utils",
        "seconds": {"units_cold": 1000.0, "plain": 2000.0, "one_op": 60.0},
        "wheel_bytes": {"units": 30_000_000, "plain": 90_000_000}, "peak_memory_gb": 7.5,
        "unit_seconds": {"evoformer_attn": 600.0, "utils": 20.0},
        "projection_s": {1: 1300, 4: 600, 16: 600, 64: 600},
        "ratios": {"units_vs_plain": 0.5, "one_op_vs_cold": 0.06},
    }  # fmt: skip
    table = render_all_ops(result)
    assert (
        "| cold, op units vs plain DeepSpeed (DS_BUILD_<OP>=1, ninja, MAX_JOBS=2) | 1000 s vs 2000 s | 0.50 |" in table
    )
    assert "(+utils) to the built recipe vs its cold build | 60 s vs 1000 s | 0.06 | <= 0.1 |" in table
    assert "evoformer_attn 600 s, bounds it): 1300 s / 600 s / 600 s / 600 s." in table


def test_the_image_bench_table() -> None:
    from builder.bench.image import render_image

    result = {"ref": "localhost/deepspeed-cpu:0.19.8-cpu.torch2.13-cp311", "image_id": "c" * 64, "same_image": True,
              "image_bytes": 1_190_000_000, "archive_bytes": 363_000_000, "seconds": {"cold": 200.0, "warm": 90.0},
              "steps": {"cold": {"base": 88.0, "build": 47.0}, "warm": {"base": 0.1, "build": 46.0}},
              "ratios": {"warm_vs_cold": 0.45}}  # fmt: skip
    table = render_image(result)
    assert "(base 88 s, build 47 s) | 200 s |" in table and "| 90 s | 0.45 of cold |" in table
    assert "1190 MB / 363 MB" in table and "the same ID both times: True" in table


def _fake_build_rows(bench: Any, tmp_path: Path, monkeypatch: Any) -> None:
    """FAKE measurements for the bench's rows up to the smoke: fixed times, nothing built."""

    class Built:
        seconds = 90.0
        wheel = tmp_path / "w.whl"

    Built.wheel.write_bytes(b"x" * 2000)
    monkeypatch.setattr(bench, "plain_build", lambda *a: (110.0, 8000))
    monkeypatch.setattr(bench, "root_making", lambda out: 41.0)
    monkeypatch.setattr(bench, "build_wheel", lambda recipe, ws, force=False: Built())
    monkeypatch.setattr(bench, "fresh_node", lambda *a: (6.0, 60.0))
    monkeypatch.setattr(bench, "env_creation", lambda *a: {"uv": 2.0, "pip": 30.0})


def test_a_bench_that_fails_midway_keeps_every_row_it_measured(tmp_path: Path, monkeypatch: Any) -> None:
    """FAKE measurements (each returns a fixed time; nothing is built): the smoke step fails, and
    bench.md still holds the rows taken before it, and names the step that stopped it."""
    import pytest

    from builder import bench
    from builder.errors import SmokeError
    from builder.recipe import load_recipe

    _fake_build_rows(bench, tmp_path, monkeypatch)

    def smoke_fails(*a: Any) -> dict[str, float]:
        raise SmokeError("config 17 failed: EADDRINUSE", "run it again")

    monkeypatch.setattr(bench, "smoke_times", smoke_fails)
    with pytest.raises(SmokeError):
        bench.bench(load_recipe(ROOT / "recipes" / "cpu.toml"), tmp_path / "out", 1)
    table = (tmp_path / "out" / "bench.md").read_text()
    assert "| cold build vs plain `setup.py build_ext -j bdist_wheel` | 90 s vs 110 s | 0.82 | <= 0.5 |" in table
    assert "| environment with the recipe's torch: uv vs venv + pip | 2.0 s vs 30.0 s | 0.07 | - |" in table
    assert "Making the build root (Debian 11, once per machine): 41 s." in table
    assert "Stopped at smoke (run 1): config 17 failed: EADDRINUSE" in table
    import json

    assert json.loads((tmp_path / "out" / "bench.json").read_text())["failed"].startswith("smoke (run 1): ")


def test_the_full_op_recipe_joins_the_same_run_and_table(tmp_path: Path, monkeypatch: Any) -> None:
    """FAKE measurements (fixed times; nothing is built): with --full-ops the full-op CPU recipe's rows
    (issue 39: goal <= 0.6 of plain) follow the main rows in the same bench.md and bench.json; a
    recipe that is not ops = "all" is refused before the half hour of the main rows."""
    import json

    import pytest

    from builder import bench
    from builder.errors import ToolError
    from builder.recipe import load_recipe

    _fake_build_rows(bench, tmp_path, monkeypatch)
    monkeypatch.setattr(bench, "smoke_times", lambda *a: {"uv": 60.0, "pip": 90.0})
    costs = {"matrix": 30.0, "each": 900.0, "count": 91.0, "spawn_plain": 60.0, "spawn_once": 24.0, "spawn_count": 12.0,
             "server": 6.0}  # fmt: skip
    monkeypatch.setattr(bench, "config_costs", lambda *a: costs)
    monkeypatch.setattr(bench, "fresh_clone", lambda *a: {"uv": 200.0, "pip": 300.0})
    full = {"recipe": "cpu-all", "cores": 2, "ops": ["a"] * 8, "extra_op": "utils",
            "seconds": {"units_cold": 180.0, "plain": 300.0, "one_op": 20.0},
            "wheel_bytes": {"units": 4_000_000, "plain": 30_000_000}, "peak_memory_gb": 6.0,
            "unit_seconds": {"cpu_adam": 90.0}, "projection_s": {1: 180, 4: 90, 16: 90, 64: 90},
            "ratios": {"units_vs_plain": 0.6, "one_op_vs_cold": 0.11}}  # fmt: skip
    asked: list[str] = []

    def all_ops(recipe: Any, out: Path) -> dict[str, Any]:
        asked.append(recipe.name)
        return full

    monkeypatch.setattr(bench, "bench_all_ops", all_ops)
    cpu = load_recipe(ROOT / "recipes" / "cpu.toml")
    with pytest.raises(ToolError, match='does not say ops = "all"'):
        bench.bench(cpu, tmp_path / "refused", 1, full_ops=cpu)
    assert not (tmp_path / "refused").exists()
    bench.bench(cpu, tmp_path / "out", 1, full_ops=load_recipe(ROOT / "recipes" / "cpu-all.toml"))
    assert asked == ["cpu-all"]
    table = (tmp_path / "out" / "bench.md").read_text()
    assert table.index("| cold build vs plain `setup.py build_ext -j bdist_wheel` | 90 s vs 110 s") < table.index(
        "| cold, op units vs plain DeepSpeed (DS_BUILD_<OP>=1, ninja, MAX_JOBS=2) | 180 s vs 300 s | 0.60 | <= 0.6 |"
    )
    assert json.loads((tmp_path / "out" / "bench.json").read_text())["full_ops"]["recipe"] == "cpu-all"
    assert (
        "| configs spawned as on a GPU node, torch without .pyc and PYTHONDONTWRITEBYTECODE=1: bytecode compiled "
        "once into the run's folder vs in every process | 24 s vs 60 s (12 configs) | 0.40 | - |"
    ) in table
    assert (  # issue 56: the GPU node's configs forked from a server, measured on CPU
        "| configs as on a GPU node (a CUDA context cannot be forked): forked from a server that imported torch and "
        "DeepSpeed vs a new Python spawned per config (the bytecode folder in both) | 6 s vs 24 s (12 configs) | 0.25 "
        "| GPU matrix <= 60 s |"
    ) in table


def test_the_fresh_clone_row_copies_the_checkout_it_runs_in(tmp_path: Path, monkeypatch: Any) -> None:
    """The fresh clone row copied the bench module's own folder's parent: in the bench session (the toolkit
    installed into its environment) that is site-packages, with no noxfile.py, and the row failed in a
    full run. It copies the checkout nox runs it in; anywhere else it says so."""
    from builder import bench
    from builder.errors import BuilderError

    monkeypatch.chdir(ROOT)
    assert bench.repository() == ROOT
    ignored = bench._not_in_a_clone(str(ROOT), ["build", ".nox", "builder", "noxfile.py", "__pycache__"])
    assert ignored == {"build", ".nox", "__pycache__"}
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BuilderError, match="is not one"):
        bench.repository()
