"""The machines a wheel can be built for, and what each means to a build (pure).

The build host is x86_64; a recipe's `machine` may name another (aarch64: GH200 and GB200 nodes, Grace
CPUs). Such a wheel is cross-compiled, never emulated: its host C++ by the cross compiler of the
toolkit's Debian 11 root, against torch's wheel for that machine (fetched, never run) and the target
Python's own headers. Everything that differs between machines is named here once.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

HOST = platform.machine()


@dataclass(frozen=True)
class Machine:
    name: str  # platform.machine() on such a node: the wheel's tag ends with it
    debian: str  # Debian's architecture name (arm64)
    triplet: str  # the GNU triplet: the cross compiler's prefix, Debian's multiarch folder, the ext suffix
    elf_machine: str  # e_machine of its shared objects, as pyelftools spells it
    cpu_targets: tuple[str, ...]  # the recipe's cpu_target values for it, the portable one first
    cross_packages: tuple[str, ...]  # what the build root needs to compile for it from x86_64
    qemu: str  # qemu-user's program for it

    @property
    def default_cpu_target(self) -> str:
        return self.cpu_targets[0]

    def ext_suffix(self, python_version: str) -> str:
        """CPython's extension suffix on such a node: .cpython-311-aarch64-linux-gnu.so (an .so named
        for x86_64 is not found by an aarch64 interpreter's import)."""
        major, minor = python_version.split(".")[:2]
        return f".cpython-{major}{minor}-{self.triplet}.so"

    def tool(self, name: str) -> str:
        """A cross tool's path in the build root: /usr/bin/aarch64-linux-gnu-g++."""
        return f"/usr/bin/{self.triplet}-{name}"


MACHINES = {
    "x86_64": Machine("x86_64", "amd64", "x86_64-linux-gnu", "EM_X86_64",
                      ("x86-64-v3", "x86-64", "x86-64-v2", "x86-64-v4", "native"), (), "qemu-x86_64-static"),
    # armv8-a: every 64-bit Arm server CPU (NEON is part of it). armv8.2-a+sve: Arm CPUs with SVE (Grace's
    # Neoverse V2, Graviton 3/4, A64FX), a variant beside the portable build (gcc 10 has no -mcpu=neoverse-v2).
    "aarch64": Machine("aarch64", "arm64", "aarch64-linux-gnu", "EM_AARCH64", ("armv8-a", "armv8.2-a+sve"),
                       ("g++-aarch64-linux-gnu",), "qemu-aarch64-static"),
}  # fmt: skip
# Where the build host is x86_64 (the only host this toolkit builds on), the machines it can build for.
BUILDABLE = ("x86_64", "aarch64")

# cpu_target -> (the -march flag, DeepSpeed's SIMD macro): what DeepSpeed's -march=native and host-read
# SIMD width are replaced by (source.patch_build_tree's hooks). DeepSpeed's aarch64 path is NEON.
CPU_TARGET_FLAGS = {
    "x86-64": ("-march=x86-64", "-D__SCALAR__"),
    "x86-64-v2": ("-march=x86-64-v2", "-D__SCALAR__"),
    "x86-64-v3": ("-march=x86-64-v3", "-D__AVX256__"),
    "x86-64-v4": ("-march=x86-64-v4", "-D__AVX512__"),
    "armv8-a": ("-march=armv8-a", "-D__NEON__"),
    "armv8.2-a+sve": ("-march=armv8.2-a+sve", "-D__SVE__"),
}
# Targets whose flags only some ops gain from: (the portable target the other ops are built for, the
# ops built for the target itself). DeepSpeed 0.19.8 has an SVE path for CPU Adam only
# (csrc/includes/sve.h; its pull request 8365 measured 1.30x to 1.55x over the scalar path), and its
# simd.h (Adagrad, Lion) has none, so its own `-D__SVE__` for every op of an SVE CPU leaves those scalar:
# here they keep NEON, built for armv8-a. Each op unit is built in a process of its own, with its own
# flags; the variant's other units are compiled as the portable recipe's (in one work folder, ccache
# hits) and keyed by the portable target with the variant's label.
OP_TARGETS = {"armv8.2-a+sve": ("armv8-a", ("cpu_adam",))}


def op_target(target: str, op: str) -> str:
    """The cpu_target `op`'s unit is built for in a recipe of cpu_target `target` (OP_TARGETS)."""
    base, own = OP_TARGETS.get(target, (target, ()))
    return target if op in own else base


def manylinux_tags(machine: str, newest: int) -> list[str]:
    """The manylinux_2_N platform tags of `machine` from glibc 2.`newest` down to 2.17 (the first aarch64
    glibc), newest first: pip asks an index for exactly the tags it is given."""
    return [f"manylinux_2_{n}_{machine}" for n in range(newest, 16, -1)]


def legacy_tags(machine: str) -> list[str]:
    """The older manylinux spellings a wheel of `machine` may carry (2014 = 2_17; x86_64 also has 2010, 1)."""
    return [f"{t}_{machine}" for t in (("manylinux2014", "manylinux2010", "manylinux1") if machine == "x86_64"
                                        else ("manylinux2014",))]  # fmt: skip


def machine_of(name: str) -> Machine:
    return MACHINES[name]


def is_cross(name: str) -> bool:
    """A wheel for another machine than this one: cross-compiled, its smoke under emulation."""
    return name != HOST


def machine_problem(
    machine: object, cpu_target: object, near: Callable[[str, list[str]], str]
) -> tuple[str, str] | None:
    """What is wrong with a recipe's machine and cpu_target (message, fix), or None; `near` says a near miss."""
    can = list(BUILDABLE) if HOST == "x86_64" else [HOST]
    if not isinstance(machine, str) or machine not in can:
        shown = str(machine)[:40]
        return (
            f'machine = "{shown}" is not one this toolkit builds for here{near(shown, can)}',
            f"use one of: {', '.join(can)} (aarch64: GH200/GB200 and other Arm nodes, cross-built on x86_64)",
        )
    targets = list(MACHINES[machine].cpu_targets)
    if cpu_target not in targets:
        return (
            f'unknown cpu_target "{cpu_target}"{near(str(cpu_target), targets)} for machine {machine}',
            f"use one of: {', '.join(targets)}"
            + (
                " (x86-64-v3 = AVX2, v4 = AVX-512; native ties the wheel to this CPU)"
                if machine == "x86_64"
                else " (armv8-a: every 64-bit Arm server CPU, NEON; armv8.2-a+sve: Grace and other SVE CPUs)"
            ),
        )
    return None


def node_markers(python_tag: str, machine: str) -> dict[str, str]:
    """The environment markers of CPython `python_tag` (cp311) on a Linux node of `machine`."""
    major, minor = python_tag[2], python_tag[3:]
    return {"python_version": f"{major}.{minor}", "python_full_version": f"{major}.{minor}.0",
            "implementation_name": "cpython", "platform_python_implementation": "CPython",
            "implementation_version": f"{major}.{minor}.0", "sys_platform": "linux", "platform_system": "Linux",
            "os_name": "posix", "platform_machine": machine, "platform_release": "", "platform_version": "",
            "extra": ""}  # fmt: skip


def requires_dist(metadata: str, python_tag: str, machine: str, extras: Iterable[str] = ()) -> list[Any]:
    """The Requires-Dist lines of a wheel's METADATA that apply on such a node with these extras, as
    packaging Requirements; a line or marker that cannot be read is left out (METADATA is another's file)."""
    from email.parser import Parser

    from packaging.markers import InvalidMarker, UndefinedComparison, UndefinedEnvironmentName
    from packaging.requirements import InvalidRequirement, Requirement

    env = node_markers(python_tag, machine)
    out = []
    for line in Parser().parsestr(metadata).get_all("Requires-Dist") or []:
        try:
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate({**env, "extra": e}) for e in ("", *extras)):
                out.append(req)
        except (InvalidRequirement, InvalidMarker, UndefinedComparison, UndefinedEnvironmentName):
            continue
    return out
