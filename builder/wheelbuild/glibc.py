"""The glibc floor of a wheel: the manylinux tag its shared objects' symbol versions allow.

A wheel compiled on this Debian 12 host needs the host's glibc and libstdc++ symbol versions
(GLIBC_2.34, GLIBCXX_3.4.30, ...); tagged linux_x86_64, pip installs it on an older node and it
fails at import. auditwheel's policies map symbol versions to the oldest manylinux_2_N that
provides them; only that part of auditwheel is used (its repair would bundle libraries, and
torch's must not be bundled). The tag goes into WHEEL and the file name, so pip on an older node
refuses the wheel, and the node installer checks it too.
"""

from __future__ import annotations

import platform
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

from packaging.version import InvalidVersion, Version

LINUX = f"linux_{platform.machine()}"
_KINDS = ("GLIBC", "GLIBCXX", "CXXABI")


def needed_versions(tree: Path) -> dict[str, set[str]]:
    """Versioned symbols every .so under `tree` needs, by library (libc.so.6: {GLIBC_2.34, ...})."""
    from auditwheel.elfutils import elf_find_versioned_symbols
    from elftools.elf.elffile import ELFFile

    found: dict[str, set[str]] = defaultdict(set)
    for so in sorted(tree.rglob("*.so")):
        with so.open("rb") as f:
            for lib, version in elf_find_versioned_symbols(ELFFile(f)):
                found[lib].add(version)
    return dict(found)


def platform_tags(versions: Mapping[str, set[str]]) -> tuple[str, ...]:
    """The manylinux tags (the policy's name and its aliases) these symbol versions allow, or the
    plain linux tag where no manylinux policy covers them."""
    from auditwheel.architecture import Architecture
    from auditwheel.libc import Libc
    from auditwheel.policy import WheelPolicies

    policies = WheelPolicies(libc=Libc.GLIBC, arch=Architecture(platform.machine()))
    policy = policies.versioned_symbols_policy({lib: set(v) for lib, v in versions.items()})
    if policy.name.startswith("linux"):
        return (LINUX,)
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
