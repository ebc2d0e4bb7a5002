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
