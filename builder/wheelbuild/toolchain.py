"""toolchain: turn a detect report into a build environment nvcc and torch will accept.

`plan_toolchain` and `compose_env` are pure. `apply` is the only writer: it makes a private folder
of gcc/g++ symlinks (never a system folder) when the default gcc is outside what nvcc accepts.
It is idempotent, checks everything before it creates anything, refuses system folders, and
only ever replaces links it recorded as its own.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from builder.detect import Compiler, Report, Toolkit, cuda_major_minor
from builder.errors import FolderError, ToolError
from builder.files import link_atomic, make_dirs, write_atomic


@dataclass(frozen=True)
class ToolchainPlan:
    toolkit: Toolkit | None
    compiler_dir: Path | None  # private folder of symlinks, when the default gcc must be replaced
    links: Mapping[str, str] = field(default_factory=dict)  # name in compiler_dir -> real compiler
    prepend: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # PATH-like variables
    set_vars: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


def pick_host_compiler(compilers: Sequence[Compiler], toolkit: Toolkit) -> tuple[Compiler, Compiler] | None:
    """The newest gcc-N/g++-N pair that this toolkit's nvcc accepts."""
    if toolkit.host_range is None:
        return None
    by_name = {c.name: c for c in compilers}
    pairs = []
    for c in compilers:
        if c.kind == "gcc" and not c.is_cxx and c.name.startswith("gcc-"):
            cxx = by_name.get("g++-" + c.name.split("-", 1)[1])
            if cxx and toolkit.host_range.accepts("gcc", c.major):
                pairs.append((c, cxx))
    return max(pairs, key=lambda p: p[0].major) if pairs else None


def plan_toolchain(report: Report, folder: Path, need_cuda: bool) -> ToolchainPlan:
    """Decide the toolkit, host compiler links and environment for a build (pure)."""
    if not need_cuda:
        return ToolchainPlan(toolkit=None, compiler_dir=None, notes=("CPU-only build: no CUDA toolkit needed",))
    toolkit = next((t for t in report.toolkits if t.root == report.chosen_toolkit), None)
    torch_cuda = report.torch.cuda
    if toolkit is None:
        have = ", ".join(f"CUDA {t.version} at {t.root}" for t in report.toolkits) or "none"
        raise ToolError(
            f"no CUDA toolkit matches torch's CUDA {torch_cuda or '(torch has no CUDA)'}; toolkits here: {have}",
            f"install CUDA {cuda_major_minor(torch_cuda) or '<torch CUDA>'} and set CUDA_HOME to it, "
            "or build with a torch whose CUDA major matches an installed toolkit",
        )
    notes = [f"CUDA {toolkit.version} at {toolkit.root} (torch CUDA {torch_cuda})"]
    root = Path(toolkit.root)
    prepend: dict[str, tuple[str, ...]] = {
        "PATH": (str(root / "bin"),),
        "LD_LIBRARY_PATH": tuple(str(root / d) for d in ("lib64", "lib") if (root / d).is_dir()),
    }
    set_vars = {"CUDA_HOME": str(root)}

    if toolkit.missing_headers:
        dirs = _header_dirs(toolkit.missing_headers, report.torch.pip_cuda_include)
        still = [h for h in toolkit.missing_headers if not any((Path(d) / h).is_file() for d in dirs)]
        if still:
            raise ToolError(
                f"CUDA {toolkit.version} at {toolkit.root} lacks {', '.join(still)} and no pip nvidia package "
                "provides them",
                "install the CUDA math libraries' dev packages, or a torch whose pip nvidia-* packages carry them",
            )
        prepend["CPATH"] = tuple(dirs)
        notes.append(f"headers {', '.join(toolkit.missing_headers)} from {', '.join(dirs)}")

    links: dict[str, str] = {}
    compiler_dir = None
    default = report.default_gcc
    host = toolkit.host_range
    if default and host and not host.accepts("gcc", int(default.split(".")[0])):
        pair = pick_host_compiler(report.compilers, toolkit)
        if pair is None:
            raise ToolError(
                f"default gcc {default} is outside what nvcc {toolkit.version} accepts "
                f"(gcc <= {host.gcc_max}) and no supported gcc-N/g++-N is on PATH",
                f"install one (e.g. apt-get install gcc-{host.gcc_max} g++-{host.gcc_max})",
            )
        gcc, gxx = pair
        compiler_dir = folder
        links = {"gcc": gcc.path, "g++": gxx.path, "cc": gcc.path, "c++": gxx.path}
        prepend["PATH"] = (str(folder), *prepend["PATH"])
        set_vars.update(
            {"CC": str(folder / "gcc"), "CXX": str(folder / "g++"), "NVCC_PREPEND_FLAGS": f"-ccbin {folder}"}
        )
        notes.append(f"default gcc {default} is outside nvcc's range; using {gcc.name} {gcc.version} via {folder}")
    return ToolchainPlan(toolkit, compiler_dir, links, prepend, set_vars, tuple(notes))


def _header_dirs(missing: Sequence[str], candidates: Sequence[str]) -> list[str]:
    """The pip include folders that hold at least one missing header, in the order given."""
    return [d for d in candidates if any((Path(d) / h).is_file() for h in missing)]


def compose_env(base: Mapping[str, str], plan: ToolchainPlan) -> dict[str, str]:
    """`base` with the plan's folders prepended (never replacing what was there) and its variables set."""
    env = dict(base)
    for var, dirs in plan.prepend.items():
        if not dirs:
            continue
        old = [p for p in env.get(var, "").split(os.pathsep) if p and p not in dirs]
        env[var] = os.pathsep.join([*dirs, *old])
    existing = env.get("NVCC_PREPEND_FLAGS", "")
    env.update(plan.set_vars)
    if existing and "NVCC_PREPEND_FLAGS" in plan.set_vars:
        env["NVCC_PREPEND_FLAGS"] = f"{plan.set_vars['NVCC_PREPEND_FLAGS']} {existing}"
    return env


LINKS_RECORD = ".ds-builder-links.json"  # the links this toolkit made in a compiler folder
# Folders that belong to the system or the package manager: never a place for our links.
SYSTEM_PREFIXES = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc", "/boot", "/dev", "/proc", "/sys",
                   "/snap", "/nix")  # fmt: skip


def _system_folder(folder: Path) -> bool:
    real = Path(os.path.realpath(folder))
    if real == Path("/") or real == Path.home():
        return True
    return any(real == Path(p) or Path(p) in real.parents for p in SYSTEM_PREFIXES)


def _recorded(folder: Path) -> dict[str, str]:
    """The links a previous apply made here (name -> target); {} when none or unreadable."""
    try:
        data = json.loads((folder / LINKS_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    links = data.get("links") if isinstance(data, dict) else None
    if not isinstance(links, dict):
        return {}
    return {k: v for k, v in links.items() if isinstance(k, str) and isinstance(v, str)}


def plan_links(plan: ToolchainPlan) -> list[tuple[str, Path, str]]:
    """What apply would do, as (action, link, target); ToolError before anything is touched.

    Only links this toolkit recorded in the folder may be replaced; a system folder, or a file
    or link someone else put there, is refused with the reason.
    """
    folder = plan.compiler_dir
    if folder is None:
        return []
    blocker = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise FolderError(
            f"the compiler folder {folder} cannot be made: {blocker} is a file, not a folder",
            "pass --folder with a folder (or a path that does not exist yet), e.g. WORK_DIR/toolchain/bin",
        )
    if _system_folder(folder):
        raise ToolError(
            f"{folder} is a system folder; the toolchain step only writes a private folder of its own",
            "pass --folder with a new folder (default: WORK_DIR/toolchain/bin)",
        )
    ours = _recorded(folder)
    actions: list[tuple[str, Path, str]] = []
    refused = []
    for name, target in sorted(plan.links.items()):
        link = folder / name
        if not link.is_symlink() and not link.exists():
            actions.append(("link", link, target))
        elif link.is_symlink() and os.readlink(link) == target and name in ours:
            continue
        elif link.is_symlink() and ours.get(name) == os.readlink(link):
            actions.append(("relink", link, target))
        else:
            what = f"a symlink to {os.readlink(link)}" if link.is_symlink() else "a file"
            refused.append(f"{link} is {what} that this toolkit did not make")
    if refused:
        raise ToolError(
            "the compiler folder holds what is not ours: " + "; ".join(refused),
            "remove those entries yourself, or pass --folder with a new folder",
        )
    return actions


def apply(plan: ToolchainPlan, dry_run: bool = False) -> list[str]:
    """Create the compiler symlinks; returns what was (or, with dry_run, would be) done.

    Everything is checked first (plan_links); then links are made and recorded in the folder.
    """
    actions = plan_links(plan)
    folder = plan.compiler_dir
    if folder is None:
        return []
    shown = ([f"mkdir {folder}"] if not folder.is_dir() else []) + [f"{a} {link} -> {t}" for a, link, t in actions]
    if dry_run or not actions:
        return shown
    make_dirs(folder)
    for _, link, target in actions:
        link_atomic(link, target)
    record = {**_recorded(folder), **dict(plan.links)}
    write_atomic(folder / LINKS_RECORD, json.dumps({"links": record}, indent=2, sort_keys=True) + "\n")
    return shown
