"""Assemble a wheel from op units: what one setup.py run over the same ops would have made.

Every unit wheel is DeepSpeed built with one op, so they differ only in their shared objects and
the `installed_ops` line of deepspeed/git_version_info_installed.py. The assembled tree takes the
first unit's files, each op's shared objects from its own unit (a shared object only another
unit carries, such as pin_memory beside async_io, from the first unit that has it), and
`installed_ops` merged; any other difference between units (another version, torch, or source)
is refused, naming the file.
"""

from __future__ import annotations

import os
import re
import zipfile
from collections.abc import Sequence
from pathlib import Path

from builder.errors import BuildError
from builder.wheelbuild.artifacts import INSTALLED_INFO, parse_installed_info
from builder.wheelbuild.ops import OpInfo

_INSTALLED_LINE = re.compile(r"^installed_ops=.*$", re.MULTILINE)


def _members(wheel: Path) -> dict[str, tuple[bytes, int]]:
    """name -> (bytes, unix mode) of every file but RECORD (wheel pack writes it anew)."""
    with zipfile.ZipFile(wheel) as zf:
        return {
            i.filename: (zf.read(i), (i.external_attr >> 16) & 0o777 or 0o644)
            for i in zf.infolist()
            if not i.is_dir() and not i.filename.endswith(".dist-info/RECORD")
        }


def merge_installed(texts: Sequence[str]) -> str:
    """The first unit's git_version_info_installed.py with `installed_ops` merged over every unit
    (an op is installed when any unit installed it); every other value must agree."""
    infos = [parse_installed_info(t) for t in texts]
    base = infos[0]
    for info in infos[1:]:
        differ = sorted(k for k in set(base) | set(info) if k != "installed_ops" and base.get(k) != info.get(k))
        if differ:
            raise BuildError(
                f"op units disagree on {', '.join(differ)} in {INSTALLED_INFO} "
                f"({differ[0]}: {base.get(differ[0])!r} vs {info.get(differ[0])!r})",
                "the units were built from different sources or torch: rebuild with --force",
            )
    merged = dict(base["installed_ops"])
    for info in infos[1:]:
        for op, value in info["installed_ops"].items():
            if value and not merged.get(op):
                merged[op] = value
    return _INSTALLED_LINE.sub(lambda _: f"installed_ops={merged}", texts[0], count=1)


def assemble(units: Sequence[tuple[OpInfo, Path]], dest: Path) -> Path:
    """Write the assembled tree of `units` (op, unit wheel) under `dest`; returns the tree root
    (the folder holding the package and its dist-info, as `wheel unpack` makes it)."""
    if not units:
        raise BuildError("no op units to assemble", "name at least one op in the recipe")
    ordered = sorted(units, key=lambda u: u[0].name)
    contents = [(op, _members(wheel), wheel) for op, wheel in ordered]
    _, base, base_wheel = contents[0]
    files = {n: v for n, v in base.items() if not n.endswith(".so")}
    for op, members, wheel in contents[1:]:
        others = {n: v[0] for n, v in members.items() if not n.endswith(".so")}
        mine = {n: v[0] for n, v in files.items()}
        differ = sorted(n for n in set(mine) | set(others) if n != INSTALLED_INFO and mine.get(n) != others.get(n))
        if differ:
            raise BuildError(
                f"op units {ordered[0][0].name} and {op.name} differ in {len(differ)} files besides their shared "
                f"objects ({', '.join(differ[:5])}): {base_wheel.name} vs {wheel.name}",
                "the units were built from different sources, flags or torch: rebuild with --force",
            )
    shared: dict[str, tuple[bytes, int]] = {}
    for op, members, _ in contents:  # each op's own .so files from its own unit
        shared.update({n: v for n, v in members.items() if n.endswith(".so") and n.startswith(op.so_prefix)})
    for _, members, _ in contents:  # a .so only another unit carries (pin_memory beside async_io)
        for n, v in members.items():
            if n.endswith(".so") and n not in shared and not any(n.startswith(o.so_prefix) for o, _ in ordered):
                shared[n] = v
    installed = merge_installed([m[INSTALLED_INFO][0].decode("utf-8") for _, m, _ in contents])
    files[INSTALLED_INFO] = (installed.encode("utf-8"), files[INSTALLED_INFO][1])
    dist_info = next(n.split("/")[0] for n in files if n.count("/") == 1 and n.endswith(".dist-info/WHEEL"))
    root = dest / dist_info.removesuffix(".dist-info")
    for name, (data, mode) in sorted({**files, **shared}.items()):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        os.chmod(path, mode)
    return root
