"""Trusting a root, and the toolchain folder whose compiler wrappers enter it.

A root's compiler runs on every build, so a root someone else can change is refused, the way
OpenSSH refuses a key file others can write: the root's folder and every folder above it, the
folders its compilers and headers come from, and the compilers themselves must belong to root or
to this user and be writable by no one else (a sticky folder above, such as /var/tmp, is fine).
"""

from __future__ import annotations

import dataclasses
import os
import stat
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from builder import node, output
from builder.buildroot import make
from builder.buildroot.spec import (
    MACHINE_PINS,
    RootFacts,
    RootSpec,
    bind_paths,
    default_spec,
    outermost,
    pins_header,
    wrapper_files,
)
from builder.errors import RootError
from builder.files import make_dirs, write_atomic
from builder.machines import HOST, machine_of

FIX_HOST = 'or build for this machine\'s own OS only with platform = "host"'


def check_trusted(root: Path, spec: RootSpec) -> None:
    """RootError unless the root may be trusted (see the module) and is a root with the compilers."""
    why = node.folder_problem(str(root), system_ok=True)
    real = Path(os.path.realpath(root))
    if why is None and real.is_dir():  # what its compilers run and read, entry by entry (node.ROOT_CODE)
        # stamped only in a root the toolkit made: a site's folder (or the host's /) is never written to
        why = node.tree_problem(str(real), absolute_inside=True, stamp=spec.kind != "folder")
    if why:
        raise RootError(f"the build root {node.shown(str(root))} is not trusted: {why}; whoever could change it "
                        "could change the compiler every build runs",
                        f"use a root that root or you own, written by no one else (chown -R, chmod -R go-w), "
                        f"{FIX_HOST}")  # fmt: skip
    if not (real / "usr").is_dir() or not ((real / "bin").exists() or (real / "usr" / "bin").is_dir()):
        raise RootError(f"{root} is not the top folder of an OS's files (no usr/ and bin/ in it)",
                        f"name the folder that holds the root's usr/, bin/ and lib/, {FIX_HOST}")  # fmt: skip
    if any(c in str(real) for c in ",:\n"):
        raise RootError(f"the build root's path {real} holds a ',' or ':', which an overlay mount cannot take",
                        "move or link the root to a plain path")  # fmt: skip
    for tool, what in ((spec.cxx, "g++ (Debian: apt-get install g++; RHEL: dnf install gcc-c++)"),
                       (spec.cc, "gcc")):  # fmt: skip
        found = make.inside(real, tool)
        if found is None or not found.is_file() or not os.access(found, os.X_OK):
            raise RootError(f"the build root {root} has no compiler {tool}",
                            f"install {what} in the root, or name its compiler with [root] cxx / cc, "
                            + FIX_HOST)  # fmt: skip
    if make.inside(real, "/usr/include/stdio.h") is None:
        raise RootError(f"the build root {root} has no C library headers (/usr/include/stdio.h)",
                        f"install them in the root (Debian: libc6-dev; RHEL: glibc-devel), {FIX_HOST}")  # fmt: skip


_RESOLVED: dict[tuple[RootSpec, Path], RootFacts] = {}


def for_machine(spec: RootSpec, machine: str) -> RootSpec:
    """The root that compiles for `machine`: the same, or for another machine its cross compilers (the
    toolkit's own root gets Debian's cross packages; a site's root must hold them, at the same paths
    unless [root] cc/cxx name them)."""
    if machine == HOST:
        return spec
    target = machine_of(machine)
    plain = RootSpec(spec.kind)
    named = {k: getattr(spec, k) for k in ("cc", "cxx") if getattr(spec, k) != getattr(plain, k)}
    tools = {"cc": named.get("cc", target.tool("gcc")), "cxx": named.get("cxx", target.tool("g++"))}
    if spec.kind == "debian":
        return dataclasses.replace(spec, packages=(*spec.packages, *target.cross_packages), **tools)
    return dataclasses.replace(spec, **tools)


def resolve(spec: RootSpec | None, env: Mapping[str, str], machine: str = HOST) -> RootFacts:
    """The root a build for `machine` compiles in, made or exported if needed, checked, its facts known
    (once a process: the build key and the toolchain both ask)."""
    from builder.debian import host_mirror

    spec = for_machine(spec if spec is not None else default_spec(host_mirror()), machine)
    roots = make.roots_folder(env)
    asked = (spec, roots)
    if asked in _RESOLVED:
        return _RESOLVED[asked]
    if spec.kind == "debian":
        facts = make.ensure_debian(spec, roots)
        check_trusted(facts.path, spec)
    else:
        if spec.kind == "image":
            path = make.export_image(spec, roots)
            path_env = make.image_path(spec.image or "")
            named = {
                k for k in ("cc", "cxx") if getattr(spec, k) != getattr(for_machine(RootSpec("image"), machine), k)
            }
            cc = spec.cc if "cc" in named else make.first_on_path(path, path_env, "gcc") or spec.cc
            cxx = spec.cxx if "cxx" in named else make.first_on_path(path, path_env, "g++") or spec.cxx
            if machine == HOST:
                spec = dataclasses.replace(spec, cc=cc, cxx=cxx)
        else:
            assert spec.folder is not None
            path = spec.folder
            if not path.is_dir():
                raise RootError(f"the recipe's root folder {path} does not exist or is not a folder",
                                f"name an OS root's top folder in [root] folder, {FIX_HOST}")  # fmt: skip
        check_trusted(path, spec)
        if machine != HOST:
            check_cross_compiler(path, spec, machine)
        gcc = probe(path, spec.cxx, ["-dumpfullversion"]).strip()
        facts = make.folder_facts(spec, path, gcc)
    _RESOLVED[asked] = facts
    return facts


def check_cross_compiler(path: Path, spec: RootSpec, machine: str) -> None:
    """RootError, in one line, where a site's root lacks the compiler for `machine` or has one for another."""
    target = machine_of(machine)
    package = " ".join(target.cross_packages) or "its compilers"
    fix = (
        f"install {package} in the root (Debian/Ubuntu; on RHEL-like roots gcc-{target.triplet}), or name the "
        f"root's cross compilers with [root] cc and cxx; without [root] the toolkit's own root has them"
    )
    for tool in (spec.cc, spec.cxx):
        if not os.path.lexists(str(path) + tool):
            raise RootError(f"the build root {node.shown(str(path))} has no {tool}: a wheel for {machine} is "
                            "compiled by a cross compiler in the root", fix)  # fmt: skip
    said = probe(path, spec.cxx, ["-dumpmachine"]).strip()
    if not said.startswith(f"{machine}-"):
        raise RootError(f"{spec.cxx} in the build root {node.shown(str(path))} compiles for "
                        f"{said or 'an unknown machine'}, "
                        f"not {machine}", fix)  # fmt: skip


def _write(
    folder: Path, facts: RootFacts, binds: Iterable[str], covers: Iterable[str] = (), machine: str = HOST
) -> None:
    make_dirs(folder)
    make_dirs(folder / "mnt")
    pins = pins_header(*MACHINE_PINS[machine])
    for name, (text, mode) in wrapper_files(facts, tuple(binds), pins, covers=tuple(covers)).items():
        path = folder / name
        try:
            same = path.read_text(encoding="utf-8") == text and stat.S_IMODE(path.stat().st_mode) == mode
        except OSError:
            same = False
        if not same:
            write_atomic(path, text, mode=mode)


def probe(root: Path, tool: str, args: list[str]) -> str:
    """Run one tool of a root through the namespace wrappers (in a scratch folder): its output, or
    RootError saying what this machine lacks to enter a root."""
    facts = RootFacts(root, "probe", "?", "?", "probe")
    with tempfile.TemporaryDirectory(prefix="ds-root-probe-") as tmp:
        _write(Path(tmp), facts, [])
        return _run(Path(tmp) / "enter", tool, args, root)


def _run(enter: Path, tool: str, args: list[str], root: Path) -> str:
    try:
        done = subprocess.run(["/bin/sh", str(enter), tool, *args], capture_output=True, text=True, timeout=120,
                              check=False, cwd="/")  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RootError(f"cannot enter the build root {root}: {exc}", FIX_HOST) from exc
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        if "unshare" in said and ("Operation not permitted" in said or "not found" in said or "Invalid" in said):
            raise RootError(
                f"cannot make a mount namespace to enter the build root {root} ({said})",
                "run the build as root, or allow user namespaces (sysctl user.max_user_namespaces=15000; on "
                "older kernels kernel.unprivileged_userns_clone=1; util-linux's unshare must be installed), "
                + FIX_HOST,
            )
        raise RootError(f"the build root {root} cannot run {tool} {' '.join(args)}: {said}",
                        f"check the root (its compiler must run in it), {FIX_HOST}")  # fmt: skip
    return done.stdout


# Folders of a root whose own content is no compiler's business: where a build folder lies below one
# (/tmp/work), a fresh tmpfs covers it in the namespace and the build's folders are bound into that
# (a user namespace cannot make /tmp/work in the root's overlay: copying the root-owned /tmp up fails
# with "Value too large for defined data type"). The root's tools so see the build's own folders and
# nothing else of the host's /tmp: a root's g++ that wrote there (round 5 of the hostile inputs)
# wrote into a tmpfs that goes with its namespace. /usr/local is the host's, bound whole, as CUDA's
# toolkits live there and an image's own /usr/local is no compiler's either.
_SCRATCH = {"/tmp": "1777", "/var/tmp": "1777", "/run": "0755", "/root": "0700", "/home": "0755", "/srv": "0755",
            "/mnt": "0755", "/media": "0755"}  # fmt: skip
_WIDE = ("/usr/local",)


def mount_points(root: Path, paths: Iterable[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(covers, binds): the root's folders a tmpfs covers ("MODE PATH"), and the host folders bound
    into the root at their own paths, each link's target with it (a work folder whose cache is a link
    elsewhere)."""
    wanted = [*paths, *(os.path.realpath(p) for p in paths if os.path.isabs(p))]
    binds, covers = [], set()
    for path in bind_paths(wanted):
        up = Path(path)
        while str(up) != "/" and make.inside(root, str(up)) is None:
            up = up.parent
        if str(up) in _WIDE and up.is_dir():
            binds.append(str(up))
            continue
        binds.append(path)
        if str(up) in _SCRATCH and str(up) != path:
            covers.add(str(up))
    return tuple(f"{_SCRATCH[c]} {c}" for c in sorted(covers)), outermost(binds)


def enter(facts: RootFacts, folder: Path, binds: Iterable[str], machine: str = HOST) -> dict[str, str]:
    """Write the wrappers into the build's toolchain folder (the glibc pins of the machine compiled for)
    and check that they work (the root's compiler answers with its version); the variables that make
    the build use them."""
    covers, points = mount_points(facts.path, list(binds))
    _write(folder, facts, points, covers, machine)
    said = _run(folder / "enter", facts.cxx, ["-dumpfullversion"], facts.path).strip()
    if said != facts.gcc:
        raise RootError(f"the build root {facts.path} answers gcc {said!r}, not the {facts.gcc} it was recorded with",
                        "remove the root and its .json beside it; the next build makes it again")  # fmt: skip
    output.note(f"root: compiling in {facts.describe} at {facts.path} (gcc {facts.gcc}, glibc {facts.glibc}) "
                f"through {folder}")  # fmt: skip
    return {"CC": str(folder / "gcc"), "CXX": str(folder / "g++"), "NVCC_PREPEND_FLAGS": f"-ccbin {folder}"}
