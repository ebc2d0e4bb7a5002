"""A wheel's runtime closure: which dependency wheels of the wheelhouse it installs with (pure).

pip download resolved the closure once, when it was fetched; afterwards the wheelhouse itself is
the only index a publish host or a node may have. So the closure is read back from the files:
each requirement (markers evaluated for the wheel's Python on this platform) is met by the newest
dependency wheel whose tags fit that Python (abi3 and py3 wheels included) and whose version the
specifier allows, and its own requirements are followed in turn. What nothing in the wheelhouse
meets is returned as missing, for pip download to fetch.
"""

from __future__ import annotations

import functools
import platform
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from packaging.requirements import Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags, platform_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from builder.machines import manylinux_tags, requires_dist
from builder.wheelhouse.layout import NOT_BUNDLED


def _version_of(python_tag: str) -> tuple[int, int]:
    return int(python_tag[2]), int(python_tag[3:])


def node_platforms(machine: str) -> list[str]:
    """The platform tags a Linux node of `machine` installs, newest first: this machine's own (packaging
    reads its glibc), or for another machine every manylinux tag up to glibc 2.40."""
    if machine == platform.machine():
        return list(platform_tags())
    return [*manylinux_tags(machine, 40), f"manylinux2014_{machine}", f"linux_{machine}"]


@functools.cache
def supported_tags(python_tag: str, machine: str = "") -> frozenset[Tag]:
    """Every tag a CPython of `python_tag` on `machine` (default: this one) installs (cp311: cp311, abi3 of
    cp32..cp311, py3)."""
    version = _version_of(python_tag)
    platforms = node_platforms(machine or platform.machine())
    return frozenset(cpython_tags(version, platforms=platforms)) | frozenset(
        compatible_tags(version, python_tag, platforms)
    )


def fits(file_name: str, python_tag: str, machine: str = "") -> bool:
    """Whether a wheel file installs on CPython `python_tag` on `machine` (by its tags, not its name's text)."""
    try:
        tags = parse_wheel_filename(file_name)[3]
    except InvalidWheelFilename:
        return False
    return not tags.isdisjoint(supported_tags(python_tag, machine))


def requirements_of(metadata: str, python_tag: str, extras: Iterable[str] = (), machine: str = "") -> list[Requirement]:
    """The requirements in METADATA that apply to `python_tag` on `machine` with these extras (torch left out)."""
    return [req for req in requires_dist(metadata, python_tag, machine or platform.machine(), extras)
            if canonicalize_name(req.name) not in NOT_BUNDLED]  # fmt: skip


@dataclass(frozen=True)
class Closure:
    files: tuple[str, ...]  # dependency wheel file names, sorted
    missing: tuple[str, ...]  # requirements nothing in the wheelhouse meets


def resolve(
    requirements: Sequence[Requirement],
    python_tag: str,
    available: Iterable[str],
    metadata_of: Callable[[str], str],
    machine: str = "",
) -> Closure:
    """The dependency files meeting `requirements` and theirs, for `python_tag` on `machine`, from `available`."""
    by_project: dict[str, list[tuple[Version, str]]] = {}
    for name in available:
        if fits(name, python_tag, machine):
            project, version, _, _ = parse_wheel_filename(name)
            by_project.setdefault(project, []).append((version, name))
    chosen: dict[str, tuple[Version, str]] = {}
    missing: list[str] = []
    queue = list(requirements)
    while queue:
        req = queue.pop(0)
        project = canonicalize_name(req.name)
        if project in chosen:
            if not req.specifier.contains(chosen[project][0], prereleases=True):
                missing.append(str(req))
            continue
        meets = [c for c in by_project.get(project, []) if req.specifier.contains(c[0], prereleases=True)]
        if not meets:
            missing.append(str(req))
            continue
        chosen[project] = max(meets)
        queue += requirements_of(metadata_of(chosen[project][1]), python_tag, req.extras, machine)
    return Closure(tuple(sorted(name for _, name in chosen.values())), tuple(missing))
