"""Targets: interpreters found on this machine, recipes x Pythons, matrix files."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import pytest
from fakes import default_recipe_text

from builder.errors import RecipeError, ToolError
from builder.recipe import load_recipe
from builder.targets import Target, candidates, find_interpreter, load_matrix, targets_for, this_interpreter

ROOT = Path(__file__).resolve().parents[1]
CPU = load_recipe(ROOT / "recipes" / "cpu.toml")


def test_candidates_skip_pyenv_shims_and_prefer_the_newest_patch(tmp_path: Path) -> None:
    for v in ("3.12.1", "3.12.10", "3.12.9", "3.10.13"):
        (tmp_path / "versions" / v / "bin").mkdir(parents=True)
    found = candidates("3.12", "/usr/bin:/root/.pyenv/shims:/opt/py/bin", tmp_path)
    assert found == [
        Path("/usr/bin/python3.12"),
        Path("/opt/py/bin/python3.12"),
        tmp_path / "versions/3.12.10/bin/python3.12",
        tmp_path / "versions/3.12.9/bin/python3.12",
        tmp_path / "versions/3.12.1/bin/python3.12",
    ]


def test_a_target_is_named_for_its_python() -> None:
    own = this_interpreter()
    assert Target(CPU, own).name == "cpu"  # the builder's own Python keeps the recipe's folders
    other = dataclasses.replace(own, path=Path("/opt/python3.12"), version="3.12.1")
    assert Target(CPU, other).name == "cpu-cp312" and other.tag == "cp312"


def test_unknown_and_bad_interpreters() -> None:
    with pytest.raises(ToolError) as err:
        find_interpreter("3.99", {"PATH": "/nonexistent", "PYENV_ROOT": "/nonexistent"})
    assert "no Python 3.99 on this machine" in err.value.message and "pyenv install 3.99" in err.value.fix
    with pytest.raises(RecipeError, match='python "python-three" is neither a version'):
        find_interpreter("python-three")
    assert find_interpreter(f"{sys.version_info[0]}.{sys.version_info[1]}") == this_interpreter()


def test_system_torch_is_for_the_builders_own_python() -> None:
    system = load_recipe(ROOT / "recipes" / "system-cpu.toml")
    with pytest.raises(RecipeError, match='torch = "system" builds for the interpreter running the builder'):
        targets_for([system], ["3.12"])
    assert [t.name for t in targets_for([system])] == ["system-cpu"]


@pytest.mark.spawns
def test_other_pythons_on_this_machine_are_found() -> None:
    """This image has pyenv's 3.10 and 3.12 (machine.md); each is asked for its version."""
    found = []
    for spec in ("3.10", "3.12"):
        try:
            found.append(find_interpreter(spec))
        except ToolError:
            continue
    if not found:
        pytest.skip("no Python 3.10 or 3.12 on this machine")
    for interp in found:
        assert interp.path.is_file() and os.access(interp.path, os.X_OK) and interp.tag in ("cp310", "cp312")
    targets = targets_for([CPU], [str(found[0].path), "3.11"])
    assert [t.python.tag for t in targets] == [found[0].tag, "cp311"]


def test_matrix_files(tmp_path: Path) -> None:
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "cpu.toml").write_text(default_recipe_text())
    good = tmp_path / "matrix.toml"
    good.write_text(
        'recipes = ["recipes/cpu.toml"]\npython = ["3.11"]\njobs = 2\n'
        'deepspeed = [{ version = "0.19.8", sha256 = "' + CPU.deepspeed.sha256 + '" },'
        ' { version = "0.18.9", sha256 = "' + "a" * 64 + '" }]\n'
    )
    matrix = load_matrix(good)
    assert matrix.jobs == 2 and matrix.python == ("3.11",)
    assert [r.deepspeed.version for r in matrix.recipes] == ["0.19.8", "0.18.9"]
    assert [t.name for t in targets_for(matrix.recipes, matrix.python)] == ["cpu-ds0.19.8", "cpu-ds0.18.9"]
    assert all(r.on_op_failure == "fail" for r in matrix.recipes)
    dropping = tmp_path / "drop.toml"
    dropping.write_text('recipes = ["recipes/cpu.toml"]\non_op_failure = "drop"\n')
    assert [r.on_op_failure for r in load_matrix(dropping).recipes] == ["drop"]
    for text, expected in [
        ('recipes = ["recipes/cpu.toml"]\non_op_failure = "ignore"\n', 'on_op_failure = "ignore" is not one of'),
        ('recipes = ["recipes/cpu.toml"]\ncolour = 1\n', 'unknown key "colour"'),
        ("recipes = []\n", "recipes must list recipe files"),
        ('recipes = ["recipes/nope.toml"]\n', "cannot read recipe"),
        ('recipes = ["recipes/cpu.toml"]\njobs = 0\n', "jobs must be 1 or more"),
        ('recipes = ["recipes/cpu.toml"]\ndeepspeed = [{ version = "0.18.9" }]\n', "needs version and sha256"),
        ('recipes = ["recipes/cpu.toml"]\ndeepspeed = [{ version = "0.18.9", sha256 = "x" }]\n', "not a sha256"),
        # A version names the target's work folder and logs: '../' must not get that far.
        (
            'recipes = ["recipes/cpu.toml"]\ndeepspeed = [{ version = "../../etc", sha256 = "' + "a" * 64 + '" }]\n',
            "is not a release version",
        ),
        ("recipes = [", "is not valid TOML"),
    ]:
        bad = tmp_path / "bad.toml"
        bad.write_text(text)
        with pytest.raises(RecipeError, match=expected):
            load_matrix(bad)


def test_the_shipped_example_matrix_loads() -> None:
    matrix = load_matrix(ROOT / "recipes" / "matrices" / "example.toml")
    assert [r.name for r in matrix.recipes] == ["cpu", "cu130-multi-min"] and matrix.python == ("3.11", "3.12")
