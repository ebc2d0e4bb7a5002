"""Running pip on the node's Python, and saying what to do when pip fails."""

import subprocess
import sys
from collections.abc import Mapping, Sequence

from builder.node.contract import InstallError
from builder.node.entries import WheelEntry
from builder.node.names import public_version


def check_pip(python: str) -> None:
    done = subprocess.run([python, "-m", "pip", "--version"], capture_output=True, check=False)
    if done.returncode != 0:
        raise InstallError(f"{python} has no pip: the installer installs the checked wheels with pip",
                           f"install pip for it ({python} -m ensurepip, or the OS package python3-pip), or pass "
                           "--python with an interpreter that has pip")  # fmt: skip


def run_pip(cmd: "Sequence[str]", env: "Mapping[str, str] | None" = None) -> "tuple[int, str]":
    """pip's exit status and its output, shown as it comes (on stderr: stdout is for --json)."""
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    assert proc.stdout is not None
    tail: list[str] = []
    for raw in proc.stdout:
        line = raw.decode("utf-8", errors="replace")
        sys.stderr.write(line)
        tail = [*tail[-200:], line]
    return proc.wait(), "".join(tail)


def pip_fix(said: str, python: str, entry: "WheelEntry") -> str:
    """The fix for the failure pip's output shows (read-only site-packages, no torch, ...)."""
    if "Read-only file system" in said or "Permission denied" in said or "EACCES" in said:
        return (
            f"{python} cannot write its site-packages (read-only or another user's): run as the user who "
            "owns that environment, or pass --python with a virtual environment this user can write"
        )
    if "torch" in said and any(
        w in said for w in ("Could not find a version", "No matching distribution", "--require-hashes")
    ):
        return f"the node needs the wheel's torch installed first: pip install torch=={public_version(entry.torch)}"
    if "No space left" in said:
        return "free disk space on the node and run the installer again"
    return "read pip's output above; run the installer again with --debug for more"
