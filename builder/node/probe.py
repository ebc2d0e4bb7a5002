"""What a node has: its Python, torch, CUDA, GPUs and glibc (asked of the interpreter that will
install) and its CPU flags.
"""

import json
import re
import subprocess
from pathlib import Path

from builder.node.choosing import Node
from builder.node.contract import ARCH_RE, LIMITS, PYTHON_TAG_RE, InstallError, ManifestError
from builder.node.fields import CUDA_RE, GLIBC_RE, VERSION_RE, Fields

MACHINE_RE = re.compile(r"[a-z0-9_]{1,32}")  # platform.machine(): x86_64, aarch64

# torch's own version.py (what torch.__version__ and torch.version.cuda read) is run alone first: where
# it names no CUDA or ROCm build there is no GPU torch can see, and the answer needs no `import torch`
# (2.5 s of CPU and hundreds of MB on every node, and in every test that probes the toolkit's Python).
# A GPU build, or a torch without that file, is imported and asked, as before.
_NODE_PROBE = r"""
import json, platform, sys
out = {"python_tag": f"cp{sys.version_info[0]}{sys.version_info[1]}", "torch": None, "cuda": None, "gpus": [],
       "machine": platform.machine()}
def _cpu_torch():
    import importlib.util, os, runpy
    spec = importlib.util.find_spec("torch")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        path = os.path.join(folder, "version.py")
        if os.path.isfile(path):
            found = runpy.run_path(path)
            version = found.get("__version__")
            if isinstance(version, str) and found.get("cuda") is None and found.get("hip") is None:
                return version
            return None
    return None
try:
    cpu = _cpu_torch()
except Exception:
    cpu = None
if cpu is not None:
    out["torch"] = cpu
else:
    try:
        import torch
        out["torch"], out["cuda"] = torch.__version__, torch.version.cuda
        if torch.cuda.is_available():
            caps = [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())]
            out["gpus"] = [f"{major}.{minor}" for major, minor in caps]
    except ImportError:
        pass
try:
    import os
    out["glibc"] = os.confstr("CS_GNU_LIBC_VERSION").split()[-1]
except (AttributeError, ValueError, OSError, IndexError):
    out["glibc"] = None
print(json.dumps(out))
"""


def parse_cpu_flags(cpuinfo: str, machine: str = "x86_64") -> "frozenset[str]":
    """The CPU's feature flags as the kernel of `machine` lists them: x86's "flags", Arm's "Features"
    (under qemu-user an aarch64 program reads the host's x86 list: no Arm features, so none are known)."""
    key = "Features" if machine == "aarch64" else "flags"
    for line in cpuinfo.splitlines():
        if line.split(":", 1)[0].strip() == key:
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def cpu_flags(machine: str = "") -> "frozenset[str]":
    import platform

    try:
        return parse_cpu_flags(Path("/proc/cpuinfo").read_text(), machine or platform.machine())
    except OSError:
        return frozenset()


def parse_node_probe(output: str, flags: "frozenset[str] | None" = None) -> "Node":
    """The probe's report; `flags` None: the CPU's, read for the machine the interpreter runs as."""
    lines = output.strip().splitlines()
    try:
        data = json.loads(lines[-1]) if lines else None
        f = Fields(data, "the node probe")
        gpus = f.texts("gpus", ARCH_RE)
        machine = f.text("machine", MACHINE_RE, optional=True) or ""
        return Node(f.text("python_tag", PYTHON_TAG_RE), f.text("torch", VERSION_RE, optional=True),
                    f.text("cuda", CUDA_RE, optional=True), gpus, cpu_flags(machine) if flags is None else flags,
                    f.text("glibc", GLIBC_RE, optional=True), machine)  # fmt: skip
    except (ValueError, ManifestError) as exc:
        raise InstallError(
            f"the node probe printed no usable report: {exc}", "pass --python with a working Python"
        ) from exc


def probe_node(python: str) -> "Node":
    """This node's Python, torch, CUDA and GPUs (asked of `python`), and its CPU flags."""
    try:
        done = subprocess.run([python, "-c", _NODE_PROBE], capture_output=True, text=True, errors="replace",
                              check=False)  # fmt: skip
    except OSError as exc:
        raise InstallError(f"cannot run {python}: {exc.strerror}", "pass --python with a working Python") from exc
    if done.returncode != 0:
        raise InstallError(f"cannot run {python}: {done.stderr.strip()[-300:]}", "pass --python with a working Python")
    if len(done.stdout) > LIMITS["probe"]:
        raise InstallError(f"{python} printed {len(done.stdout)} characters for a one-line probe",
                           "pass --python with a plain Python (its startup prints too much)")  # fmt: skip
    return parse_node_probe(done.stdout)
