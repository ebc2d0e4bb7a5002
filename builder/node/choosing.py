"""Choosing a wheel for a node: why each wheel does or does not fit it (Python, torch, CUDA, GPU
architectures, CPU flags, glibc floor), newest by PEP 440 version among those that do.
"""

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from builder.node.contract import CPU_TARGETS, TARGET_FLAGS, InstallError
from builder.node.entries import ProofEntry, WheelEntry, WheelhouseManifest
from builder.node.fields import torch_variant
from builder.node.files import printable
from builder.node.names import check_wheel_name, public_version


@dataclass(frozen=True)
class Node:
    python_tag: str
    torch: "str | None"
    cuda: "str | None"
    gpus: "tuple[str, ...]" = ()
    cpu_flags: "frozenset[str]" = field(default_factory=frozenset)
    glibc: "str | None" = None  # "2.36"; None where the C library is not glibc or unknown
    machine: str = ""  # platform.machine() of the interpreter that installs (x86_64, aarch64); "" unknown

    def describe(self) -> str:
        gpus = ", ".join(self.gpus) or "none"
        simd = (
            " ".join(sorted(f for f in self.cpu_flags if f.startswith(("avx", "fma", "sse4", "asimd", "sve")))) or "-"
        )
        return (f"python {self.python_tag}, torch {self.torch or 'not installed'}, CUDA {self.cuda or 'none'}, "
                f"GPU compute capabilities {gpus}, CPU {simd}, glibc {self.glibc or 'unknown'}"
                + (f", {self.machine}" if self.machine else ""))  # fmt: skip

    def to_json(self) -> "dict[str, Any]":
        return {"python_tag": self.python_tag, "torch": self.torch, "cuda": self.cuda, "gpus": list(self.gpus),
                "cpu_flags": sorted(self.cpu_flags), "glibc": self.glibc, "machine": self.machine}  # fmt: skip


_MANYLINUX = re.compile(r"^manylinux_(\d+)_(\d+)_")
_LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


_TAG_MACHINE = re.compile(
    r"^(?:manylinux_\d+_\d+|manylinux1|manylinux2010|manylinux2014|musllinux_\d+_\d+|linux)_(\w+)$"
)


def tag_machine(platform_tag: str) -> "str | None":
    """The machine a wheel's platform tag is for (manylinux_2_28_aarch64: aarch64); None for none."""
    found = {m[1] for m in (_TAG_MACHINE.match(tag) for tag in platform_tag.split(".")) if m}
    return found.pop() if len(found) == 1 else None


def machine_mismatch(entry_name: str, node: "Node") -> "str | None":
    """Why a wheel for another machine rules this node out (None: the same, or either is unknown)."""
    want = tag_machine(check_wheel_name(entry_name).platform)
    if want and node.machine and want != node.machine:
        return f"built for {want} nodes, this node is {node.machine}"
    return None


def glibc_floor(platform_tag: str) -> "tuple[int, int] | None":
    """The glibc (major, minor) a wheel's platform tag needs (manylinux_2_35_x86_64: 2.35); None
    for a plain linux tag, which promises nothing."""
    floors = []
    for tag in platform_tag.split("."):
        m = _MANYLINUX.match(tag)
        if m:
            floors.append((int(m[1]), int(m[2])))
        elif tag.split("_")[0] in _LEGACY_MANYLINUX:
            floors.append(_LEGACY_MANYLINUX[tag.split("_")[0]])
    return min(floors) if floors else None


# The glibc of the releases clusters run, per family, oldest first (each family's first release
# with a glibc >= N is what "glibc N or newer" means there). Sources: each release's glibc package.
OS_GLIBC = (
    ("RHEL", (("7", (2, 17)), ("8", (2, 28)), ("9", (2, 34)), ("10", (2, 39)))),
    ("Debian", (("9", (2, 24)), ("10", (2, 28)), ("11", (2, 31)), ("12", (2, 36)), ("13", (2, 41)))),
    ("Ubuntu", (("16.04", (2, 23)), ("18.04", (2, 27)), ("18.10", (2, 28)), ("20.04", (2, 31)), ("22.04", (2, 35)),
                ("24.04", (2, 39)))),
)  # fmt: skip


def floor_systems(floor: "tuple[int, int]") -> str:
    """The releases a glibc floor reaches, for people: (2, 28) -> "RHEL 8+, Debian 10+, Ubuntu 18.10+"."""
    out = []
    for family, releases in OS_GLIBC:
        first = next((name for name, glibc in releases if glibc >= floor), None)
        if first is not None:
            out.append(f"{family} {first}+")
    return ", ".join(out) or "no release listed here"


def describe_floor(platform_tag: str) -> str:
    """What a wheel's platform tag asks of a node, in words: "glibc 2.28 or newer: RHEL 8+, Debian
    10+, Ubuntu 18.10+"; a plain linux tag promises nothing."""
    floor = glibc_floor(platform_tag)
    if floor is None:
        return "no glibc floor stated (a plain linux tag: it may need the build host's glibc)"
    return f"glibc {floor[0]}.{floor[1]} or newer: {floor_systems(floor)}"


def glibc_mismatch(entry_name: str, node: "Node") -> "str | None":
    """Why a wheel's glibc floor rules this node out (None: it does not)."""
    platform_tag = check_wheel_name(entry_name).platform
    floor = glibc_floor(platform_tag)
    if floor is None or node.glibc is None:
        return None  # pip's own tag check still applies on the node
    have = tuple(int(x) for x in node.glibc.split(".")[:2])
    if have < floor:
        return f"needs {describe_floor(platform_tag)} (built on a newer OS), node has glibc {node.glibc}"
    return None


def _cc(text: str) -> "tuple[int, int]":
    major, minor = text.split("+")[0].rstrip("af").split(".")
    return int(major), int(minor)


def arch_covers(archs: "Sequence[str]", gpu: str) -> bool:
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


def cpu_mismatch(entry: "WheelEntry", node: "Node") -> "str | None":
    """Why the wheel's CPU code cannot run on the node's CPU, or None."""
    if entry.cpu_target == "native":
        if not entry.cpu_flags:
            return "CPU ops built with -march=native on a machine whose CPU flags were not recorded"
        if not node.cpu_flags:
            return "CPU ops built with -march=native, and this node's CPU flags are unknown"
        lacking = sorted(set(entry.cpu_flags) - node.cpu_flags)
        if lacking:
            shown = ", ".join(lacking[:8]) + (f" and {len(lacking) - 8} more" if len(lacking) > 8 else "")
            return f"CPU ops built with -march=native on a CPU with {shown}, which this node lacks"
        return None
    lacking = [f for f in TARGET_FLAGS[entry.cpu_target] if node.cpu_flags and f not in node.cpu_flags]
    return f"CPU ops built for {entry.cpu_target}, node CPU lacks {', '.join(lacking)}" if lacking else None


def mismatches(entry: "WheelEntry", node: "Node") -> "list[str]":
    """Why a wheelhouse entry does not fit the node (empty: it fits)."""
    machine = machine_mismatch(entry.name, node)
    if machine:
        return [machine]  # nothing else of it can be judged on this node
    why = []
    if entry.python_tag != node.python_tag:
        why.append(f"built for {entry.python_tag}, node has {node.python_tag}")
    if node.torch and public_version(entry.torch) != public_version(node.torch):
        why.append(f"built for torch {entry.torch}, node has {node.torch}")
    if entry.accelerator == "cuda":
        if node.torch and not node.cuda:
            why.append("a CUDA wheel, but the node's torch has no CUDA")
        elif node.cuda and entry.cuda and entry.cuda.split(".")[:2] != node.cuda.split(".")[:2]:
            why.append(f"built for CUDA {entry.cuda}, node's torch has CUDA {node.cuda}")
        missing = [g for g in node.gpus if not arch_covers(entry.archs, g)]
        if missing:
            why.append(f"no code for GPU compute capability {', '.join(sorted(set(missing)))} "
                       f"(wheel has {', '.join(entry.archs) or 'none'})")  # fmt: skip
    elif node.gpus:
        why.append("a CPU wheel, but the node has GPUs (DeepSpeed would use its CUDA accelerator and JIT)")
    cpu = cpu_mismatch(entry, node)
    if cpu:
        why.append(cpu)
    glibc = glibc_mismatch(entry.name, node)
    if glibc:
        why.append(glibc)
    if not entry.smoke.passed:
        why.append("its smoke tests did not pass")
    return why


def narrowed_for(entry: "WheelEntry", node: "Node") -> "list[str]":
    """Ops of a fitting wheel that hold no code for one of the node's GPUs (the recipe let them
    build for fewer archs): they would fail to load there, everything else works."""
    out = []
    for op, archs in sorted(entry.narrowed_ops.items()):
        missing = sorted({g for g in node.gpus if not arch_covers(archs, g)})
        if missing:
            out.append(f"op {op} has code only for {', '.join(archs)}, not for this node's GPU {', '.join(missing)}")
    return out


def proofs_for(entry: "WheelEntry", node: "Node") -> "list[ProofEntry]":
    """The GPU proofs of a wheel made on GPUs of this node's compute capabilities, newest first."""
    caps = set(node.gpus)
    return sorted((p for p in entry.proofs if caps & set(p.capabilities)), key=lambda p: p.finished_at, reverse=True)


def unproven(entry: "WheelEntry", node: "Node") -> "list[str]":
    """The node's compute capabilities no GPU proof of a CUDA wheel covers (empty for a CPU wheel)."""
    if entry.accelerator != "cuda":
        return []
    proven = {cap for p in entry.proofs for cap in p.capabilities}
    return sorted({g for g in node.gpus if g not in proven})


_PEP440 = re.compile(
    r"^v?(?:(?P<epoch>\d+)!)?(?P<release>\d+(?:\.\d+)*)(?:[-_.]?(?P<pre>a|b|rc|alpha|beta|c)[-_.]?(?P<pre_n>\d*))?"
    r"(?:[-_.]?(?:post|rev|r)[-_.]?(?P<post>\d*))?(?:[-_.]?dev[-_.]?(?P<dev>\d*))?(?:\+(?P<local>.*))?$",
    re.IGNORECASE,
)


def version_key(version: str) -> "tuple[Any, ...]":
    """A sort key that orders versions as PEP 440 does (0.19.10 after 0.19.9, 1.0rc1 before 1.0),
    standard library only; a version it cannot read sorts first."""
    m = _PEP440.match(version.strip())
    if not m:
        return (-1,)
    release = [int(x) for x in m["release"].split(".")]
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    pre_rank = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2}
    if m["pre"] is not None:
        pre: tuple[int, int] = (pre_rank[m["pre"].lower()], int(m["pre_n"] or 0))
    elif m["dev"] is not None and m["post"] is None:
        pre = (-1, 0)  # 1.0.dev1 comes before 1.0a1
    else:
        pre = (3, 0)
    post = int(m["post"] or 0) if m["post"] is not None else -1
    dev = int(m["dev"] or 0) if m["dev"] is not None else float("inf")
    parts = [p for p in re.split(r"[-_.]", m["local"] or "") if p]
    local = tuple((1, int(p), "") if p.isdigit() else (0, 0, p.lower()) for p in parts)
    return (0, int(m["epoch"] or 0), tuple(release), pre, post, dev, local)


def choose(manifest: "WheelhouseManifest", node: "Node", ops: "Sequence[str]" = ()) -> "WheelEntry":
    """The newest fitting wheel by version (never by publish time or file-name text); among op sets
    of one target (labelled wheels: +cpu.torch2.13 and +cpu.torch2.13.all) the one with the most ops,
    or with `ops` the ones holding all of them. InstallError listing what the wheelhouse has when none fits."""

    def why_not(e: "WheelEntry") -> "list[str]":
        lacking = [op for op in ops if op not in e.ops]
        return mismatches(e, node) + ([f"lacks op {', '.join(printable(op)[:40] for op in lacking)} (--ops)"]
                                      if lacking else [])  # fmt: skip

    fits = [e for e in manifest.wheels.values() if not why_not(e)]
    if fits:
        exact = [e for e in fits if node.torch and e.torch == node.torch]
        wanted = "cuda" if node.gpus else "cpu"  # a node without GPUs prefers a CPU wheel
        return max(exact or fits, key=lambda e: (e.accelerator == wanted, version_key(e.version.split("+")[0]),
                                                 len(e.ops), CPU_TARGETS.index(e.cpu_target),
                                                 version_key(e.version)))  # fmt: skip
    lines = [f"  {name}: {'; '.join(why_not(e))}" for name, e in sorted(manifest.wheels.items())]
    fix = "build one for this node, smoke it and publish it: " + build_for(node)
    fitting = [e for e in manifest.wheels.values() if not mismatches(e, node)]
    if ops and fitting:  # wheels fit the node; none holds every op asked for
        wanted = ", ".join(printable(op)[:40] for op in ops)
        fix = (f"add {wanted} to the recipe of a wheel that fits ({fitting[0].recipe}: ops = [..., {wanted}]), build, "
               "smoke and publish it; or install without --ops (the fitting wheel with the most ops)")  # fmt: skip
    raise InstallError(
        f"no wheel in the wheelhouse fits this node ({node.describe()}); it has:\n" + ("\n".join(lines) or "  nothing"),
        fix,
    )


def build_for(node: "Node") -> str:
    """What a wheel for this node takes, in recipe and build-host terms (the fix of "nothing fits")."""
    parts = [f'python = ["{node.python_tag[2]}.{node.python_tag[3:]}"]']
    if node.torch:
        parts.append(f'[torch] version = "{public_version(node.torch)}", variant = "{torch_variant(node.cuda)}"')
    if node.gpus:
        parts.append(f"arch = {json.dumps(sorted(set(node.gpus)))}")
    if node.glibc:
        have = node.glibc.replace(".", "_")
        parts.append(f'platform = "manylinux_{have}" or lower (the default, "manylinux_2_28", reaches glibc 2.28 '
                     f"and newer: {floor_systems((2, 28))})")  # fmt: skip
    return "a recipe with " + "; ".join(parts)
