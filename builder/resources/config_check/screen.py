"""A config read and screened before anything runs: a JSON or one-dict .py file within its size,
keys DeepSpeed does not know, NVMe paths that point at system folders.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any


def _nvme_paths(config: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    zero = config.get("zero_optimization")
    found = []
    if isinstance(zero, dict):
        for key in ("offload_optimizer", "offload_param"):
            section = zero.get(key)
            if isinstance(section, dict) and section.get("device") == "nvme":
                found.append((section, str(section.get("nvme_path", ""))))
    return found


_NAMES: list[frozenset[str]] = []


def deepspeed_names() -> frozenset[str]:
    """Every name DeepSpeed's own code spells as a string ('zero_optimization', 'offload_param', ...):
    a superset of the config keys it reads, found in its sources (0.2 s, once)."""
    if not _NAMES:
        import importlib.util
        import re

        spec = importlib.util.find_spec("deepspeed")
        root = os.path.dirname(spec.origin) if spec and spec.origin else ""
        quoted, names = re.compile(r"""["']([a-z][a-z0-9_]{1,60})["']"""), set()
        for folder, _, files in os.walk(root):
            for name in files:
                if name.endswith(".py"):
                    with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as f:
                        names.update(quoted.findall(f.read()))
        _NAMES.append(frozenset(names))
    return _NAMES[0]


def unknown_keys(config: dict[str, Any]) -> str:
    """Keys DeepSpeed does not know, at the top and in zero_optimization: it ignores them, so a typo
    ('zero_optimisation') runs as if the section were not there. Empty when all are known."""
    known = deepspeed_names()
    if not known:
        return ""
    found = [k for k in config if isinstance(k, str) and k not in known]
    zero = config.get("zero_optimization")
    if isinstance(zero, dict):
        found += [f"zero_optimization.{k}" for k in zero if isinstance(k, str) and k not in known]
        for section in ("offload_optimizer", "offload_param"):
            if isinstance(zero.get(section), dict):
                found += [f"zero_optimization.{section}.{k}" for k in zero[section] if isinstance(k, str)
                          and k not in known]  # fmt: skip
    if not found:
        return ""
    import difflib

    said = []
    for key in found[:5]:
        close = difflib.get_close_matches(key.rsplit(".", 1)[-1], known, n=1, cutoff=0.8)
        said.append(f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key))
    return (f"unknown key {', '.join(said)}: DeepSpeed ignores keys it does not know, so the config would run "
            "without what it says; fix the name, or remove it")  # fmt: skip


# Folders a config's nvme_path may not name: the checker would write DeepSpeed's swap files there.
_SYSTEM = ("/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/opt", "/proc", "/root", "/run",
           "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var")  # fmt: skip
_SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc", "/run", "/sbin", "/sys", "/usr")


def refuse_early(entry: dict[str, Any], world: int, scratch: list[str]) -> str:
    """What stops a config before it starts: more processes than allowed, an NVMe folder that cannot
    be written or is a system folder. Each nvme_path is then pointed at a scratch folder of the
    checker's own inside it (SCRATCH: on the work disk), listed in `scratch` and removed after the
    config ran, so a check leaves nothing in the node's NVMe folder."""
    allowed = int(entry.get("max_world") or os.cpu_count() or 1)
    if world > allowed:
        return (f"the config needs {world} processes (train_batch_size / (micro batch x gradient accumulation)) "
                f"and this machine allows {allowed}: run it where there are {world} CPUs or GPUs, or lower "
                "train_batch_size")  # fmt: skip
    for section, path in _nvme_paths(entry["config"]):
        if not path:
            return "the config offloads to nvme but gives no nvme_path: name a folder on a local NVMe disk"
        if path == SCRATCH:
            path = os.getcwd()  # O_DIRECT: not tmpfs
        real = os.path.realpath(path)
        if real in _SYSTEM or any(real.startswith(tree + "/") for tree in _SYSTEM_TREES):
            return (f"the config offloads to nvme_path {path[:200]!r}, the system folder {real}: DeepSpeed would "
                    "write its swap files there; name a folder on a local NVMe disk")  # fmt: skip
        if not os.path.isdir(real) or not os.access(real, os.W_OK | os.X_OK):
            return (f"the config offloads to nvme_path {path[:200]!r}, which is not a folder this user can write: "
                    "create it or name another")  # fmt: skip
        scratch.append(tempfile.mkdtemp(prefix=".ds-config-check-", dir=real))
        section["nvme_path"] = scratch[-1]
    return ""


SCRATCH = "@scratch"  # nvme_path of the smoke's matrix: a fresh folder on the work disk


MAX_CONFIG = 1 << 20  # a DeepSpeed config is a few KB


def read_config_file(path: str) -> tuple[dict[str, Any] | None, str]:
    """(config, "") or (None, why not): JSON, or a Python file holding one dict literal (`config =
    {...}` or the dict alone, read with ast.literal_eval: nothing in it is run)."""
    import ast
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))  # a FIFO must not block
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None, f"{path} is not a regular file (a FIFO, a folder or a device): not a DeepSpeed config"
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as f:
            raw = f.read(MAX_CONFIG + 1)  # bounded: /dev/zero and its like never end
        if len(raw) > MAX_CONFIG:
            return None, f"{path} is over {MAX_CONFIG >> 20} MiB: not a DeepSpeed config"
        text = raw.decode("utf-8")
    except FileNotFoundError:
        return None, f"{path} does not exist"
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}"
    try:
        if path.endswith(".py"):
            data: Any = None
            for node in ast.parse(text, filename=path).body:  # the first dict literal (a docstring is skipped)
                if isinstance(node, (ast.Expr, ast.Assign)) and isinstance(node.value, ast.Dict):
                    data = ast.literal_eval(node.value)  # ValueError for anything but literals (a call, a name)
                    break
            else:
                raise ValueError("no dict literal in it (write `config = {...}`)")
        else:
            data = json.loads(text)
    except (ValueError, SyntaxError, RecursionError) as exc:
        kind = "a Python dict literal" if path.endswith(".py") else "JSON"
        return None, f"{path} is not {kind} ({str(exc).splitlines()[0]})"
    if not isinstance(data, dict):
        return None, f"{path} holds a {type(data).__name__}, not a DeepSpeed config object"
    return data, ""
