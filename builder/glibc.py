"""The glibc floor of a wheel: the manylinux tag its shared objects' symbol versions allow.

A wheel compiled on this Debian 12 host needs the host's glibc and libstdc++ symbol versions
(GLIBC_2.34, GLIBCXX_3.4.30, ...); tagged linux_x86_64, pip installs it on an older node and it
fails at import. auditwheel's policies map symbol versions to the oldest manylinux_2_N that
provides them; only that part of auditwheel is used (its repair would bundle libraries, and
torch's must not be bundled). The tag goes into WHEEL and the file name, so pip on an older node
refuses the wheel, and the node installer checks it too.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from builder.machines import HOST as HOST_MACHINE

LINUX = f"linux_{HOST_MACHINE}"
_KINDS = ("GLIBC", "GLIBCXX", "CXXABI")


def elf_machine(path: Path) -> str | None:
    """e_machine of an ELF file as pyelftools names it (EM_AARCH64, EM_X86_64), None if not ELF."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        with path.open("rb") as f:
            if f.read(4) != b"\x7fELF":
                return None
            f.seek(0)
            return str(ELFFile(f).header["e_machine"])
    except (OSError, ELFError):
        return None


def foreign_objects(tree: Path, want: str) -> list[str]:
    """The shared objects under `tree` (relative paths) that are not ELF files for `want` (EM_AARCH64)."""
    return [str(so.relative_to(tree)) for so in sorted(tree.rglob("*.so*"))
            if so.is_file() and not so.is_symlink() and elf_machine(so) != want]  # fmt: skip


def needed_versions(tree: Path) -> dict[str, set[str]]:
    """Versioned symbols every shared object under `tree` needs, by library (libc.so.6: {GLIBC_2.34, ...})."""
    found: dict[str, set[str]] = defaultdict(set)
    for n in needed_symbols(tree):
        found[n.library].add(n.version)
    return dict(found)


def platform_tags(versions: Mapping[str, set[str]], machine: str = HOST_MACHINE) -> tuple[str, ...]:
    """The manylinux tags (the policy's name and its aliases) these symbol versions allow, or the
    plain linux tag where no manylinux policy covers them."""
    policy = _policies(machine).versioned_symbols_policy({lib: set(v) for lib, v in versions.items()})
    if policy.name.startswith("linux"):
        return (f"linux_{machine}",)
    return tuple(sorted({policy.name, *policy.aliases}))


def newest(versions: Mapping[str, set[str]]) -> dict[str, str]:
    """The newest GLIBC_/GLIBCXX_/CXXABI_ version needed, per kind (for the build manifest)."""
    best: dict[str, Version] = {}
    for names in versions.values():
        for name in names:
            kind, _, number = name.partition("_")
            if kind not in _KINDS:
                continue
            try:
                v = Version(number)
            except InvalidVersion:
                continue
            if kind not in best or v > best[kind]:
                best[kind] = v
    return {k: str(best[k]) for k in _KINDS if k in best}


def retag(tree: Path, tags: Sequence[str]) -> None:
    """Set the platform part of every Tag line in the unpacked wheel's WHEEL file (`wheel pack`
    names the file from them)."""
    (wheel_file,) = tree.glob("*.dist-info/WHEEL")
    lines = wheel_file.read_text(encoding="utf-8").splitlines()
    heads = sorted({line.split(": ", 1)[1].rsplit("-", 1)[0] for line in lines if line.startswith("Tag: ")})
    kept = [line for line in lines if line.strip() and not line.startswith("Tag: ")]  # headers end at a blank
    wheel_file.write_text(
        "\n".join([*kept, *(f"Tag: {head}-{tag}" for head in heads for tag in tags)]) + "\n", encoding="utf-8"
    )


# ---- A floor a recipe names (platform = "manylinux_2_28") and the proof of it -------------------

HOST = "host"  # platform = "host": whatever the build machine's own glibc and libstdc++ give (no check)


def known_floors(machine: str = HOST_MACHINE) -> tuple[str, ...]:
    """The manylinux_2_N floors auditwheel has a policy for on `machine`, oldest first."""
    names = [p.name.removesuffix(f"_{machine}") for p in _policies(machine)._policies]
    found = [n for n in names if _GLIBC_OF.match(n)]
    return tuple(sorted(found, key=floor_glibc))


_GLIBC_OF = re.compile(r"^manylinux_(\d+)_(\d+)$")


def floor_glibc(floor: str) -> tuple[int, int]:
    """manylinux_2_28 -> (2, 28)."""
    m = _GLIBC_OF.match(floor)
    if not m:
        raise ValueError(floor)
    return int(m[1]), int(m[2])


def _policies(machine: str = HOST_MACHINE) -> Any:
    """auditwheel's manylinux policies for `machine` (its aarch64 policy for a wheel cross-built for GH200)."""
    from auditwheel.architecture import Architecture
    from auditwheel.libc import Libc
    from auditwheel.policy import WheelPolicies

    return WheelPolicies(libc=Libc.GLIBC, arch=Architecture(machine))


@dataclass(frozen=True)
class Needed:
    """One versioned symbol a shared object needs: what the floor check names when it fails."""

    so: str  # the .so, relative to the wheel's root
    library: str  # libc.so.6
    version: str  # GLIBC_2.34
    symbol: str  # sem_init

    def describe(self) -> str:
        return f"{self.so} needs {self.symbol}@{self.version} ({self.library})"


def needed_symbols(tree: Path) -> list[Needed]:
    """Every undefined, versioned symbol of every .so under `tree` (pyelftools: .dynsym with
    .gnu.version and .gnu.version_r), so a floor check can name the symbol and the op's file."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerNeedSection, GNUVerSymSection
    from elftools.elf.sections import SymbolTableSection

    out: list[Needed] = []
    for so in sorted(tree.rglob("*.so*")):
        if not so.is_file() or so.is_symlink():
            continue
        with so.open("rb") as f:
            if f.read(4) != b"\x7fELF":
                continue
            f.seek(0)
            elf = ELFFile(f)
            verneed, versym, dynsym = (
                elf.get_section_by_name(n) for n in (".gnu.version_r", ".gnu.version", ".dynsym")
            )
            if not (isinstance(verneed, GNUVerNeedSection) and isinstance(versym, GNUVerSymSection)
                    and isinstance(dynsym, SymbolTableSection)):  # fmt: skip
                continue
            names: dict[int, tuple[str, str]] = {}
            for need, auxes in verneed.iter_versions():
                for aux in auxes:
                    names[aux["vna_other"]] = (str(need.name), str(aux.name))
            for i, sym in enumerate(dynsym.iter_symbols()):
                if sym["st_shndx"] != "SHN_UNDEF" or not sym.name:
                    continue
                ndx = versym.get_symbol(i)["ndx"]
                if isinstance(ndx, int) and (ndx & 0x7FFF) in names:
                    library, version = names[ndx & 0x7FFF]
                    out.append(Needed(str(so.relative_to(tree)), library, version, sym.name))
    return out


def above_floor(needed: Sequence[Needed], floor: str, machine: str = HOST_MACHINE) -> list[Needed]:
    """The symbols a floor's policy does not allow (GLIBC_, GLIBCXX_, CXXABI_, GCC_ versions newer
    than manylinux_2_N's; libraries outside the policy, such as libgomp or CUDA's, are not its
    business), sorted by file and version."""
    policy = _policies(machine).get_policy_by_name(f"{floor}_{machine}")
    allowed: Mapping[str, set[str]] = policy.symbol_versions
    bad = []
    for n in needed:
        kind, _, number = n.version.partition("_")
        if kind in allowed and number not in allowed[kind]:
            bad.append(n)
    return sorted(set(bad), key=lambda n: (n.so, n.version, n.symbol))


def describe_above(bad: Sequence[Needed], limit: int = 12) -> str:
    """One line per symbol (the first `limit`), then how many more."""
    lines = [f"    {n.describe()}" for n in bad[:limit]]
    if len(bad) > limit:
        lines.append(f"    ... and {len(bad) - limit} more")
    return "\n".join(lines)


def tag_for(ops_floor: str | None, torch_floor: str | None, machine: str = HOST_MACHINE) -> str:
    """The wheel's platform tag: the newest of its ops' floor and torch's own wheel's floor (a wheel
    never claims to run where the torch it needs cannot)."""
    floors = [f for f in (ops_floor, torch_floor) if f]
    if not floors:
        return f"linux_{machine}"
    return f"{max(floors, key=floor_glibc)}_{machine}"


def ops_floor(versions: Mapping[str, set[str]], machine: str = HOST_MACHINE) -> str | None:
    """The oldest manylinux_2_N floor whose policy allows every symbol version (None: none does)."""
    tags = [t.removesuffix(f"_{machine}") for t in platform_tags(versions, machine)]
    return next((t for t in tags if _GLIBC_OF.match(t)), None)


def wheel_floor(wheel_text: str) -> str | None:
    """The manylinux_2_N floor a wheel's WHEEL file claims (torch 2.13.0+cpu: manylinux_2_28), from its
    Tag lines, read as the node reads a platform tag (manylinux2014 is 2.17); None without one."""
    from builder.node import glibc_floor

    floors = [glibc_floor(line.split(": ", 1)[1].rsplit("-", 1)[-1]) for line in wheel_text.splitlines()
              if line.startswith("Tag: ")]  # fmt: skip
    found = [f for f in floors if f is not None]
    return f"manylinux_{min(found)[0]}_{min(found)[1]}" if found else None
