"""install: on a node, pick the wheel built for it from a wheelhouse and install it, hash-checked.

Runs on cluster nodes that have only Python and pip, so this module (and the code path of
`python -m builder install`) uses the standard library alone. The wheelhouse may be a folder
or an http(s) URL (e.g. `python -m builder serve`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from builder.errors import BuilderError

# CPU features each portable target needs (the ones DeepSpeed's SIMD code uses).
TARGET_FLAGS = {
    "x86-64": (),
    "x86-64-v2": ("sse4_2", "popcnt"),
    "x86-64-v3": ("avx2", "fma", "bmi2"),
    "x86-64-v4": ("avx512f", "avx512bw", "avx512dq", "avx512vl"),
}

_NODE_PROBE = r"""
import json, sys
out = {"python_tag": f"cp{sys.version_info[0]}{sys.version_info[1]}", "torch": None, "cuda": None, "gpus": []}
try:
    import torch
    out["torch"], out["cuda"] = torch.__version__, torch.version.cuda
    if torch.cuda.is_available():
        caps = [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())]
        out["gpus"] = [f"{major}.{minor}" for major, minor in caps]
except ImportError:
    pass
print(json.dumps(out))
"""


class InstallError(BuilderError):
    """No wheel fits this node, or the chosen one failed its hash."""

    exit_code = 9


@dataclass(frozen=True)
class Node:
    python_tag: str
    torch: str | None
    cuda: str | None
    gpus: tuple[str, ...] = ()
    cpu_flags: frozenset[str] = field(default_factory=frozenset)

    def describe(self) -> str:
        gpus = ", ".join(self.gpus) or "none"
        simd = " ".join(sorted(f for f in self.cpu_flags if f.startswith(("avx", "fma", "sse4")))) or "-"
        return (f"python {self.python_tag}, torch {self.torch or 'not installed'}, CUDA {self.cuda or 'none'}, "
                f"GPU compute capabilities {gpus}, CPU {simd}")  # fmt: skip


def _public(version: str) -> str:
    return version.split("+", 1)[0]


def _cc(text: str) -> tuple[int, int]:
    major, minor = text.split("+")[0].rstrip("af").split(".")
    return int(major), int(minor)


def arch_covers(archs: Sequence[str], gpu: str) -> bool:
    """Whether code for `archs` runs on a GPU of capability `gpu`.

    SASS runs on the same major version at an equal or higher minor (sm_80 on 8.6); PTX is
    JIT-compiled by the driver for any newer GPU; 'a' variants run only on their exact GPU.
    """
    want = _cc(gpu)
    for arch in archs:
        have = _cc(arch)
        base = arch.split("+")[0]
        if base.endswith(("a", "f")):
            if have == want:
                return True
        elif have[0] == want[0] and have[1] <= want[1]:
            return True
        elif arch.endswith("+PTX") and have <= want:
            return True
    return False


def mismatches(entry: Mapping[str, Any], node: Node) -> list[str]:
    """Why a wheelhouse entry does not fit the node (empty: it fits)."""
    why = []
    if entry["python_tag"] != node.python_tag:
        why.append(f"built for {entry['python_tag']}, node has {node.python_tag}")
    if node.torch and _public(entry["torch"]) != _public(node.torch):
        why.append(f"built for torch {entry['torch']}, node has {node.torch}")
    if entry["accelerator"] == "cuda":
        if node.torch and not node.cuda:
            why.append("a CUDA wheel, but the node's torch has no CUDA")
        elif node.cuda and entry.get("cuda") and entry["cuda"].split(".")[:2] != node.cuda.split(".")[:2]:
            why.append(f"built for CUDA {entry['cuda']}, node's torch has CUDA {node.cuda}")
        missing = [g for g in node.gpus if not arch_covers(entry.get("archs", []), g)]
        if missing:
            why.append(f"no code for GPU compute capability {', '.join(sorted(set(missing)))} "
                       f"(wheel has {', '.join(entry.get('archs', [])) or 'none'})")  # fmt: skip
    elif node.gpus:
        why.append("a CPU wheel, but the node has GPUs (DeepSpeed would use its CUDA accelerator and JIT)")
    need = TARGET_FLAGS.get(entry.get("cpu_target", "x86-64"), ())
    lacking = [f for f in need if node.cpu_flags and f not in node.cpu_flags]
    if lacking:
        why.append(f"CPU ops built for {entry['cpu_target']}, node CPU lacks {', '.join(lacking)}")
    if not entry.get("smoke", {}).get("passed"):
        why.append("its smoke tests did not pass")
    return why


def choose(manifest: Mapping[str, Any], node: Node) -> tuple[str, Mapping[str, Any]]:
    """The newest fitting wheel; InstallError listing what the wheelhouse has when none fits."""
    wheels: Mapping[str, Mapping[str, Any]] = manifest.get("wheels", {})
    fits = [(name, e) for name, e in wheels.items() if not mismatches(e, node)]
    if fits:
        exact = [(n, e) for n, e in fits if node.torch and e["torch"] == node.torch]
        return max(exact or fits, key=lambda item: item[1].get("published_at", ""))
    lines = [f"  {name}: {'; '.join(mismatches(e, node))}" for name, e in sorted(wheels.items())]
    raise InstallError(
        f"no wheel in the wheelhouse fits this node ({node.describe()}); it has:\n" + ("\n".join(lines) or "  nothing"),
        "build one for this node (a recipe with its torch, CUDA and GPU archs), smoke it and publish it",
    )


def cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def probe_node(python: str) -> Node:
    done = subprocess.run([python, "-c", _NODE_PROBE], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise InstallError(f"cannot run {python}: {done.stderr.strip()[-300:]}", "pass --python with a working Python")
    data = json.loads(done.stdout.strip().splitlines()[-1])
    return Node(data["python_tag"], data["torch"], data["cuda"], tuple(data["gpus"]), cpu_flags())


def _join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + quote(name)


def fetch(base: str, name: str) -> bytes:
    """A file of the wheelhouse at `base` (a folder or an http(s) URL)."""
    if base.startswith(("http://", "https://")):
        with urllib.request.urlopen(_join(base, name), timeout=120) as response:
            data: bytes = response.read()
            return data
    return (Path(base) / name).read_bytes()


def install(wheelhouse: str, python: str, dry_run: bool = False, pip_args: Sequence[str] = ()) -> str:
    """Pick, fetch, hash-check and pip-install the wheel for this node; returns its file name."""
    try:
        manifest = json.loads(fetch(wheelhouse, "manifest.json"))
    except (OSError, ValueError) as exc:
        raise InstallError(
            f"cannot read manifest.json from {wheelhouse}: {exc}", "check the wheelhouse path or URL"
        ) from exc
    node = probe_node(python)
    print(f"==> node: {node.describe()}", file=sys.stderr)
    name, entry = choose(manifest, node)
    print(f"==> chosen: {name} (torch {entry['torch']}, archs {', '.join(entry.get('archs', [])) or '-'}, "
          f"ops {', '.join(entry['ops'])})", file=sys.stderr)  # fmt: skip
    if dry_run:
        return name
    data = fetch(wheelhouse, name)
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry["sha256"]:
        raise InstallError(
            f"{name} from {wheelhouse} has sha256 {digest}, the manifest says {entry['sha256']}",
            "the wheelhouse copy is damaged or was tampered with: run `python -m builder verify` on it",
        )
    tmp = tempfile.mkdtemp(prefix="ds-install-")
    try:
        wheel = os.path.join(tmp, name)
        with open(wheel, "wb") as f:
            f.write(data)
        cmd = [python, "-m", "pip", "install", *pip_args, wheel]
        print(f"+ {' '.join(cmd)}", file=sys.stderr, flush=True)
        done = subprocess.run(cmd, check=False)
        if done.returncode != 0:
            raise InstallError(f"pip could not install {name} (exit {done.returncode})", "read pip's output above")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"==> installed {name} (sha256 {digest[:16]}... verified)", file=sys.stderr)
    return name
