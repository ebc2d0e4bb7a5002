"""Stand-ins for cluster nodes in the integration tests: real venvs with pip and torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def node_venv(path: Path, *packages: str) -> str:
    """A stand-in for a node's Python: a venv with pip (nodes install with pip) and `packages`.

    Made with uv from pip's own sources, as the toolkit makes its environments: a node's torch
    takes seconds instead of half a minute to set up. Returns the venv's python.
    """
    from builder.envs import TOOLS, pip_sources, uv_binary

    uv = uv_binary(TOOLS)
    subprocess.run([uv, "venv", "--quiet", "--python", sys.executable, str(path)], check=True)
    python = str(path / "bin" / "python")
    # pip alone, not uv's --seed (whose `wheel` brings `packaging`: a node has nothing it need not have).
    subprocess.run([uv, "pip", "install", "--quiet", "--python", python, *pip_sources().uv_args(), "pip", *packages],
                   check=True)  # fmt: skip
    return python
