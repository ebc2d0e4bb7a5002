"""podman as the toolkit runs it: rootful, no daemon, with the toolkit's own containers.conf.

The configuration (builder/resources/containers.conf: runc, cgroupfs, ulimits root may set here)
is handed to podman through CONTAINERS_CONF for the toolkit's runs only; the system's files are
never written. DS_BUILDER_CONTAINERS_CONF names another file where a site needs its own.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from builder import cmd
from builder.errors import ImageError, ToolError
from builder.resources import resource

CONF = resource("containers.conf")
INSTALL_FIX = (
    "install podman and runc (Debian 12: apt-get install -y --no-install-recommends podman runc), "
    "or build the image elsewhere from the lock's Containerfile"
)


def environ(base: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env["CONTAINERS_CONF"] = env.get("DS_BUILDER_CONTAINERS_CONF") or str(CONF)
    return env


def require() -> str:
    """podman's path, or the error that says how to install it (before anything is started)."""
    found = cmd.which("podman", environ())
    if found is None:
        raise ImageError("podman was not found on PATH", INSTALL_FIX)
    return found


def run(
    args: Sequence[str | os.PathLike[str]],
    log: Path,
    verbose: bool = False,
    progress: Callable[[str], str | None] | None = None,
    fix: str = "",
) -> str:
    """A podman command to completion (output logged); ToolError with `fix` when it fails."""
    try:
        return cmd.run(["podman", *args], env=environ(), log=log, verbose=verbose, progress=progress, fix=fix)
    except ToolError as exc:
        if "was not found on PATH" in exc.message:
            raise ImageError("podman was not found on PATH", INSTALL_FIX) from exc
        raise


def ask(args: Sequence[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """A short podman query (inspect, exists, rm): its exit status and output, nothing printed."""
    return cmd.ask(["podman", *args], timeout=timeout, env=environ())


def inspect(ref: str) -> dict[str, object] | None:
    """`podman image inspect` of a local image, or None when there is no such image."""
    done = ask(["image", "inspect", ref])
    if done.returncode != 0:
        return None
    try:
        data = json.loads(done.stdout)
    except ValueError:
        return None
    return data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else None


def image_id(ref: str) -> str | None:
    data = inspect(ref)
    value = data.get("Id") if data else None
    return value if isinstance(value, str) else None


def remove_image(ref: str) -> None:
    """Remove an image the toolkit made (its tag, and its layers when nothing else uses them)."""
    ask(["rmi", ref])


def remove_container(name: str) -> None:
    ask(["rm", "--force", "--ignore", name])
