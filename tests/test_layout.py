"""The package as pip installs it: every folder of builder/ that holds code is a listed package.

CI installs the builder into the nox session (not editable): a folder missing from pyproject's
package list is missing there (builder/units once was: four test modules failed to import).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_code_folder_is_a_listed_package() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "builder").rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert folders == listed, (
        f"pyproject.toml's packages lack {sorted(folders - listed)}, list {sorted(listed - folders)}"
    )
