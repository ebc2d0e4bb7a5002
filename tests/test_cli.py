from __future__ import annotations

from pathlib import Path

import pytest

from builder.cli import main, parser

ROOT = Path(__file__).resolve().parents[1]


def test_every_command_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("build-wheel", "smoke", "publish", "detect", "toolchain"):
        with pytest.raises(SystemExit) as done:
            main([command, "--help"])
        assert done.value.code == 0
        assert "--work-dir" in capsys.readouterr().out


def test_matrix_validates_every_recipe_before_building(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text((ROOT / "recipes" / "cpu.toml").read_text().replace('accelerator = "cpu"', 'accelerator = "gpu"'))
    work = tmp_path / "work"
    code = main(["build-wheel", "--recipe", str(ROOT / "recipes" / "cpu.toml"), "--recipe", str(bad),
                 "--work-dir", str(work)])  # fmt: skip
    assert code == 2
    assert f'error: {bad}: unknown accelerator "gpu"' in capsys.readouterr().err
    assert not work.exists()  # nothing was built for the good recipe either


def test_several_recipes_parse() -> None:
    args = parser().parse_args(["build-wheel", "--recipe", "a.toml", "--recipe", "b.toml", "--no-publish"])
    assert args.recipes == [Path("a.toml"), Path("b.toml")] and args.no_publish


def test_no_module_but_output_prints() -> None:
    """One output module: steps, notes and results go through builder/output.py (builder/node/, which
    runs alone on nodes, and the resource scripts, which run in other interpreters, excepted)."""
    import ast

    root = Path(__file__).resolve().parents[1] / "builder"
    offenders = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).as_posix()
        if rel == "output.py" or rel.startswith(("resources/", "node/")):
            continue
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print":
                offenders.append(f"{rel}:{n.lineno}")
            if isinstance(n, ast.Attribute) and n.attr in ("stderr", "stdout") and getattr(n.value, "id", "") == "sys":
                offenders.append(f"{rel}:{n.lineno} sys.{n.attr}")
    assert offenders == []


def test_install_is_the_node_installers_own_cli(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["install", "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert "--wheelhouse" in text and "--dry-run" in text and "--json" in text and "Exit codes" in text


def test_every_wheelhouse_command_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("verify", "repair", "prune", "lock", "image", "provision", "serve", "bench"):
        with pytest.raises(SystemExit) as done:
            main([command, "--help"])
        assert done.value.code == 0, command
        assert "--wheelhouse" in capsys.readouterr().out or command == "bench"


def test_slurm_options_need_slurm_and_a_matrix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    work = tmp_path / "work"
    assert main(["build-wheel", "--wait", "--work-dir", str(work)]) == 2
    assert "error: --wait, --partition and --account are for --slurm" in capsys.readouterr().err
    assert main(["build-wheel", "--slurm", "--work-dir", str(work)]) == 2
    assert "error: --slurm submits a matrix" in capsys.readouterr().err
    assert main(["build-wheel", "--slurm", "--variants", "--work-dir", str(work)]) == 2
    said = capsys.readouterr().err
    assert "error: --variants is not passed on to the Slurm collect job" in said and "publish --variants" in said
    assert main(["build-wheel", "--target", "nope", "--work-dir", str(work)]) == 2
    assert 'error: the matrix has no target "nope"' in capsys.readouterr().err
    assert not work.exists()
    with pytest.raises(SystemExit) as done:
        main(["build-wheel", "--jobs", "0"])
    assert done.value.code == 2


def test_provision_through_slurm_needs_a_partition_or_nodelist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["provision", "--launcher", "slurm", "--work-dir", str(tmp_path / "w"), "--out", str(tmp_path / "p")]
    assert main(base) == 2
    assert "error: --launcher slurm installs on a partition's or a nodelist's nodes" in capsys.readouterr().err
    assert main([*base, "--partition", "gpu", "--hostfile", str(tmp_path / "h")]) == 2
    assert main(["provision", "--work-dir", str(tmp_path / "w")]) == 2
    assert "error: provision needs --hostfile" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()


def test_slurm_without_sbatch_says_so_before_writing_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from builder import cmd

    monkeypatch.setattr(cmd, "which", lambda program, env=None: None)  # FAKE: a machine without Slurm's clients
    matrix = tmp_path / "m.toml"
    matrix.write_text(f'recipes = ["{ROOT / "recipes" / "cpu.toml"}"]\n')
    work = tmp_path / "work"
    assert main(["build-wheel", "--matrix", str(matrix), "--slurm", "--work-dir", str(work)]) == 3
    assert "error: sbatch was not found on PATH: this machine cannot submit Slurm jobs" in capsys.readouterr().err
    assert not work.exists()


def test_the_entry_points_slurm_jobs_run_are_hidden_from_help_and_still_run(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    listed = capsys.readouterr().out
    assert "slurm-status" in listed and "build-wheel" in listed and "sign" in listed and "key" in listed
    for internal in ("slurm-task", "slurm-units", "slurm-smoke", "slurm-collect"):
        assert internal not in listed
        with pytest.raises(SystemExit) as done:
            main([internal, "--help"])
        assert done.value.code == 0 and capsys.readouterr().out.count("Internal, run by") == 1
    args = parser().parse_args(["slurm-task", "run", "--target", "cpu"])
    assert args.command == "slurm-task" and args.target == "cpu"
