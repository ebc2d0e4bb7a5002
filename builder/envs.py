"""Python virtual environments the toolkit builds and tests in.

Build environments are cached by what they hold and marked complete only after every install
succeeded, so a killed install is redone rather than half-used. Smoke environments are always new.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from pathlib import Path

from builder import cmd, output

COMPLETE = ".builder-complete"


def python_in(venv: Path) -> Path:
    return venv / "bin" / "python"


def env_key(requirements: Sequence[str], system_site_packages: bool = False) -> str:
    """A folder name for an environment with these requirements on this interpreter."""
    text = "\n".join(
        [sys.executable, sys.version, f"system-site-packages={system_site_packages}", *sorted(requirements)]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def venv_environ(venv: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The process environment of a command run inside `venv`: its bin first on PATH."""
    env = dict(os.environ if base is None else base)
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PYTHONHOME", None)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def create(
    venv: Path, requirements: Sequence[str], log: Path, verbose: bool = False, system_site_packages: bool = False
) -> Path:
    """Make a new venv at `venv` (replacing any there) and pip-install `requirements` into it.

    With system_site_packages the venv sees this interpreter's packages (its torch) and pip
    installs only what is missing, leaving the system torch untouched.
    """
    if venv.exists():
        shutil.rmtree(venv)
    flags = ["--system-site-packages"] if system_site_packages else []
    cmd.run([sys.executable, "-m", "venv", *flags, venv], log=log, verbose=verbose)
    if system_site_packages and sys.prefix != sys.base_prefix:
        _see_parent_venv(venv)
    if requirements:
        cmd.run(
            [python_in(venv), "-m", "pip", "install", *requirements],
            env=venv_environ(venv),
            log=log,
            verbose=verbose,
            progress=_pip_progress,
            fix="check the requirement names and versions, and that the package index is reachable",
        )
    return venv


def _see_parent_venv(venv: Path) -> None:
    """Make `venv` see the packages of the venv this interpreter runs in.

    --system-site-packages exposes the *base* interpreter's packages, so a torch installed in a
    venv (as in many images, e.g. /opt/torch/.venv) would stay invisible; a .pth file appends the
    parent's site-packages after the child's own.
    """
    parents = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    child = Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"])
    (child / "_builder_parent_site.pth").write_text("\n".join(parents) + "\n", encoding="utf-8")


def cached(
    root: Path, requirements: Sequence[str], log: Path, verbose: bool = False, system_site_packages: bool = False
) -> Path:
    """A complete venv with `requirements` under `root`, made once and reused."""
    venv = root / env_key(requirements, system_site_packages)
    if (venv / COMPLETE).is_file():
        output.note(f"reusing environment {venv}")
        return venv
    create(venv, requirements, log, verbose, system_site_packages)
    (venv / COMPLETE).write_text("\n".join(requirements) + "\n", encoding="utf-8")
    return venv


def _pip_progress(line: str) -> str | None:
    return line if line.startswith(("Collecting ", "Successfully installed")) else None
