"""toolchain: turn a detect report into a build environment nvcc and torch will accept.

`plan_toolchain` and `compose_env` are pure. `apply` is the only writer: it makes a private folder
of gcc/g++ symlinks (never a system folder) when the default gcc is outside what nvcc accepts.
It is idempotent and never replaces a file that is not its own symlink.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from builder.detect import Compiler, Report, Toolkit, cuda_major_minor
from builder.errors import ToolError


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


def apply(plan: ToolchainPlan, dry_run: bool = False) -> list[str]:
    """Create the compiler symlinks; returns what was (or, with dry_run, would be) done."""
    if plan.compiler_dir is None:
        return []
    actions = []
    folder = plan.compiler_dir
    if not folder.is_dir():
        actions.append(f"mkdir {folder}")
        if not dry_run:
            folder.mkdir(parents=True)
    for name, target in sorted(plan.links.items()):
        link = folder / name
        if link.is_symlink():
            if os.readlink(link) == target:
                continue
            actions.append(f"relink {link} -> {target}")
            if not dry_run:
                tmp = folder / f".{name}.tmp"
                tmp.unlink(missing_ok=True)
                tmp.symlink_to(target)
                tmp.replace(link)
            continue
        if link.exists():
            raise ToolError(
                f"{link} exists and is not a symlink made by this toolkit", "remove it or use another folder"
            )
        actions.append(f"ln -s {target} {link}")
        if not dry_run:
            link.symlink_to(target)
    return actions
