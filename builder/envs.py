"""Python virtual environments the toolkit builds and tests in, made by uv.

uv makes a venv and fills it from its cache in seconds where venv + pip took half a minute (torch
2.13.0 CPU: 32.7 s with pip, 5.0 s with uv cold, 1.0 s warm). A venv whose files come from uv's
cache is still a fresh environment: nothing of another venv is visible in it.

uv reads no pip configuration, so the toolkit reads pip's (`pip config list`, PIP_* variables) and
passes the same index, extra indexes and find-links to uv, and says which it used. pip's rule is
"the best version from any source", so uv gets --index-strategy unsafe-best-match.

Build environments are cached by what they hold and marked complete only after every install
succeeded, so a killed install is redone rather than half-used. Smoke environments are always new.
Environments that must see a torch installed elsewhere (torch = "system") see the parent's
packages through system site-packages (and a .pth file when the parent is a venv). uv does not look
at packages visible that way, so it is asked what the *parent* environment lacks (a dry run against
it, which installs nothing there) and installs exactly that into the new venv, without dependencies:
the system torch stays the one used, as pip would leave it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import shutil
import sys
import sysconfig
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from builder import cmd, node, output
from builder.errors import ToolError
from builder.files import env_folder, held, make_dirs, settle_modes, tree_checked
from builder.node import shown

if TYPE_CHECKING:
    from builder.recipe import TorchSpec

COMPLETE = ".builder-complete"

# One folder of build environments for several work folders (a site building many recipes on one
# host, a test run): an environment is keyed by what it holds, so another work folder's is the same.
ENV_CACHE_ENV = "DS_BUILDER_ENV_CACHE"


def build_envs_folder(work_cache: Path, env: Mapping[str, str]) -> Path:
    """DS_BUILDER_ENV_CACHE (shared by several work folders), else the work folder's own."""
    named = env_folder(env, ENV_CACHE_ENV, "build environments")  # their code runs in every build
    return named if named is not None else work_cache / "envs"


UV_VERSION = "0.13.9"  # also pinned in pyproject.toml
BACKENDS = ("uv", "pip")
# Where the toolkit installs uv when neither its own install nor PATH has one (a folder it owns).
TOOLS = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ds-wheel-builder" / "tools"


@dataclass(frozen=True)
class PackageSources:
    """Where pip on this machine finds packages, as pip's configuration says."""

    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    no_index: bool = False

    def uv_args(self) -> list[str]:
        args = ["--index-strategy", "unsafe-best-match"]
        if self.no_index:
            args.append("--no-index")
        if self.index_url:
            args += ["--index-url", self.index_url]
        for url in self.extra_index_urls:
            args += ["--extra-index-url", url]
        for link in self.find_links:
            args += ["--find-links", link]
        return args

    def describe(self) -> str:
        """Where packages come from, for people and logs: credentials in a URL shown as ***."""
        parts = [f"index {self.index_url}" if self.index_url else ("no index" if self.no_index else "PyPI")]
        parts += [f"extra index {u}" for u in self.extra_index_urls]
        parts += [f"find-links {f}" for f in self.find_links]
        return _QUERY.sub("?***", _USERINFO.sub(r"\1***@", ", ".join(parts)))


_USERINFO = re.compile(r"(://)[^/@\s]+@")
_QUERY = re.compile(r"\?[^\s,]*")  # ?token=...: a machine's own pip configuration may carry one


@dataclass(frozen=True)
class IndexFor:
    """A package index for one requirement (torch's build): a site's own mirror is `always` asked;
    PyTorch's index is asked only when pip's own sources cannot meet the exact requirement, so a
    site whose wheel folder or mirror already has that build never reaches out."""

    requirement: str
    url: str
    always: bool

    def key(self) -> str:
        return f"index={self.url}{'' if self.always else ' (when needed)'}"


def torch_index(torch: TorchSpec) -> IndexFor | None:
    """Where torch's named build comes from: the recipe's index, else PyTorch's for its variant."""
    url = torch.index_url
    return IndexFor(torch.requirement, url, always=torch.index is not None) if url else None


_PIP_KEYS = {"index-url": "index_url", "extra-index-url": "extra_index_urls", "find-links": "find_links",
             "no-index": "no_index"}  # fmt: skip


def parse_pip_config(text: str) -> PackageSources:
    """`pip config list` output (`global.find-links='/opt/wheels'`, `:env:.index-url=...`)."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        name = key.rsplit(".", 1)[-1].strip()
        if name in _PIP_KEYS:
            found.setdefault(_PIP_KEYS[name], []).extend(value.strip().strip("'\"").split())
    index = found.get("index_url", [])
    no_index = found.get("no_index", [])
    return PackageSources(
        index_url=index[-1] if index else None,
        extra_index_urls=tuple(dict.fromkeys(found.get("extra_index_urls", []))),
        find_links=tuple(dict.fromkeys(found.get("find_links", []))),
        no_index=bool(no_index) and no_index[-1].lower() in ("1", "true", "yes", "on"),
    )


def folders_only(folders: Sequence[Path]) -> dict[str, str]:
    """The variables that make pip and uv install from `folders` alone: no index, no configuration file
    of either (a machine's find-links or index would still be asked), nothing fetched."""
    links = " ".join(str(f) for f in folders)
    return {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": links, "UV_NO_CONFIG": "1",
            "UV_NO_INDEX": "1", "UV_FIND_LINKS": links, "UV_OFFLINE": "1"}  # fmt: skip


@contextlib.contextmanager
def only_from(folders: Sequence[Path]) -> Iterator[None]:
    """Every install of this process reads `folders` alone (folders_only) until the block ends."""
    wanted = folders_only(folders)
    saved = {k: os.environ.get(k) for k in wanted}
    os.environ.update(wanted)
    pip_sources.cache_clear()
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        pip_sources.cache_clear()


@functools.cache
def pip_sources() -> PackageSources:
    """What this machine's pip would use (its config files and PIP_* variables), asked of pip once."""
    return parse_pip_config(cmd.query([sys.executable, "-m", "pip", "config", "list"]))


def backend() -> str:
    """uv, unless BUILDER_ENV_BACKEND=pip asks for the plain venv + pip path (the bench compares both)."""
    chosen = os.environ.get("BUILDER_ENV_BACKEND", "uv")
    if chosen not in BACKENDS:
        raise ToolError(f"BUILDER_ENV_BACKEND={chosen!r} is not one of {', '.join(BACKENDS)}", "unset it, or use uv")
    return chosen


@functools.cache
def uv_binary(tools: Path) -> str:
    """The pinned uv: the one installed with the toolkit, else on PATH, else pip-installed into `tools`."""
    try:
        from uv import find_uv_bin

        return str(find_uv_bin())
    except (ImportError, FileNotFoundError):
        pass
    on_path = shutil.which("uv")
    if on_path:
        return on_path
    target = tools / f"uv-{UV_VERSION}"
    binary = target / "bin" / "uv"
    if not binary.is_file():
        output.note(f"installing uv {UV_VERSION} into {target} (the toolkit makes its environments with it)")
        cmd.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", target, f"uv=={UV_VERSION}"],
                fix="install uv (pip install uv), or set BUILDER_ENV_BACKEND=pip")  # fmt: skip
    return str(binary)


def python_in(venv: Path) -> Path:
    return venv / "bin" / "python"


def env_key(requirements: Sequence[str], system_site_packages: bool = False, base: Path | None = None,
            index: IndexFor | None = None) -> str:  # fmt: skip
    """A folder name for an environment with these requirements on this interpreter (or `base`)."""
    interpreter = [sys.executable, sys.version] if base is None else [str(base)]
    text = "\n".join(
        [*interpreter, f"system-site-packages={system_site_packages}", *sorted(requirements), f"backend={backend()}",
         "bytecode=compiled", *([index.key()] if index else [])]
    )  # fmt: skip
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def venv_environ(venv: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The process environment of a command run inside `venv`: its bin first on PATH."""
    env = dict(os.environ if base is None else base)
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PYTHONHOME", None)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def create(
    venv: Path,
    requirements: Sequence[str],
    log: Path,
    verbose: bool = False,
    system_site_packages: bool = False,
    base: Path | None = None,
    index: IndexFor | None = None,
    bytecode: bool = False,
) -> Path:
    """Make a new venv at `venv` (replacing any there) on `base` (default: the interpreter running
    the builder) and install `requirements` into it, with `index` for torch's build.

    With system_site_packages the venv sees this interpreter's packages (its torch) and pip
    installs only what is missing, leaving the system torch untouched. With `bytecode` uv compiles
    what it installs (pip always does): an environment many processes start from.
    """
    if venv.exists():
        shutil.rmtree(venv)
    python = base or Path(sys.executable)
    if backend() == "uv":
        if system_site_packages:
            return _create_system_with_uv(venv, requirements, log, verbose, bytecode)
        return _create_with_uv(venv, requirements, log, verbose, python, index, bytecode)
    flags = ["--system-site-packages"] if system_site_packages else []
    cmd.run([python, "-m", "venv", *flags, venv], log=log, verbose=verbose)
    if system_site_packages and sys.prefix != sys.base_prefix:
        _see_parent_venv(venv)
    if requirements:
        extra = _index_args(python, pip_sources(), index)
        cmd.run(
            [python_in(venv), "-m", "pip", "install", *extra, *requirements],
            env=venv_environ(venv),
            log=log,
            verbose=verbose,
            progress=_pip_progress,
            fix=_install_fix(index if extra else None),
        )
    return venv


def _create_with_uv(venv: Path, requirements: Sequence[str], log: Path, verbose: bool, base: Path,
                    index: IndexFor | None, bytecode: bool = False) -> Path:  # fmt: skip
    uv = uv_binary(TOOLS)
    cmd.run([uv, "venv", "--quiet", "--python", base, venv], log=log, verbose=verbose)
    if requirements:
        sources = pip_sources()
        output.note(f"uv installs from pip's sources: {sources.describe()}")
        extra = _index_args(base, sources, index)
        cmd.run(
            [
                uv,
                "pip",
                "install",
                "--python",
                python_in(venv),
                *sources.uv_args(),
                *extra,
                *(["--compile-bytecode"] if bytecode else []),
                *requirements,
            ],
            env=venv_environ(venv),
            log=log,
            verbose=verbose,
            progress=_uv_progress,
            fix=_install_fix(index if extra else None),
        )
    return venv


def _install_fix(index: IndexFor | None) -> str:
    """What to do when an install fails: about the index torch's build had to come from, if one was asked."""
    if index is None:
        return "check the requirement names and versions, and that the package index is reachable"
    why = "the recipe's [torch] index" if index.always else "pip's sources do not have it"
    return (
        f"{index.requirement} comes from {index.url} ({why}): check that this machine reaches it, or name a "
        "mirror it reaches in the recipe's [torch] index, or put that torch wheel into pip's find-links"
    )


def _index_args(python: Path, sources: PackageSources, index: IndexFor | None) -> list[str]:
    """The installer's arguments for `index`: a site's index always; PyTorch's only when pip's sources
    cannot meet the requirement for `python` (uv resolves that one requirement; nothing is downloaded)."""
    if index is None:
        return []
    if not index.always:
        uv = uv_binary(TOOLS)
        found = cmd.ask([uv, "pip", "compile", "--quiet", "--no-header", "--no-deps", "--python", str(python),
                         *sources.uv_args(), "-"], timeout=300, stdin=index.requirement + "\n")  # fmt: skip
        if found.returncode == 0:
            output.note(f"{index.requirement}: found in pip's sources, {index.url} not asked")
            return []
        said = [line.strip() for line in (found.stderr or "").splitlines() if line.strip()]
        output.note(f"{index.requirement}: not in pip's sources ({shown(said[-1] if said else 'no answer', 200)})")
    output.note(f"{index.requirement}: from {index.url}")
    return ["--extra-index-url", index.url]


def install_source(venv: Path, sdist: Path, env: Mapping[str, str], log: Path, verbose: bool = False,
                   deps: bool = True) -> None:  # fmt: skip
    """Install an sdist into `venv` without build isolation (its setup.py imports what the venv
    holds: DeepSpeed's imports torch), its build steered by `env` (DS_BUILD_OPS=0). deps=False: the
    sdist alone, its dependencies already in the venv or reached by it (a node's own packages, which an
    installer resolving against the venv does not count when reached through a .pth file)."""
    fix = "check that pip's package index is reachable and has the sdist's dependencies"
    run_env = {**venv_environ(venv), **env}
    no_deps = [] if deps else ["--no-deps"]
    if backend() == "uv":
        sources = pip_sources()
        cmd.run([uv_binary(TOOLS), "pip", "install", "--python", python_in(venv), "--no-build-isolation",
                 "--compile-bytecode", *no_deps, *sources.uv_args(), sdist], env=run_env, log=log, verbose=verbose,
                progress=_uv_progress, fix=fix)  # fmt: skip
    else:
        cmd.run([python_in(venv), "-m", "pip", "install", "--no-build-isolation", *no_deps, sdist], env=run_env,
                log=log, verbose=verbose, progress=_pip_progress, fix=fix)  # fmt: skip


def install_into(
    folder: Path, requirements: Sequence[str], log: Path, verbose: bool = False, deps: bool = True
) -> None:
    """Install `requirements` as plain files into `folder` (pip's --target), for tools such as
    nvcc's wheels that are used from their folder rather than imported (deps=False: those alone)."""
    fix = "check that pip's package index is reachable and has these versions"
    requirements = [*requirements, *([] if deps else ["--no-deps"])]
    if backend() == "uv":
        sources = pip_sources()
        output.note(f"uv installs from pip's sources: {sources.describe()}")
        cmd.run(
            [uv_binary(TOOLS), "pip", "install", "--quiet", "--python", sys.executable, "--target", folder,
             *sources.uv_args(), *requirements],
            log=log, verbose=verbose, fix=fix,
        )  # fmt: skip
    else:
        cmd.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", folder, *requirements],
                log=log, verbose=verbose, fix=fix)  # fmt: skip


def _create_system_with_uv(venv: Path, requirements: Sequence[str], log: Path, verbose: bool,
                           bytecode: bool = False) -> Path:  # fmt: skip
    """A venv that sees this interpreter's packages, with only what they lack installed by uv."""
    uv = uv_binary(TOOLS)
    cmd.run([uv, "venv", "--quiet", "--system-site-packages", "--python", sys.executable, venv], log=log,
            verbose=verbose)  # fmt: skip
    if sys.prefix != sys.base_prefix:
        _see_parent_venv(venv)
    if not requirements:
        return venv
    sources = pip_sources()
    output.note(f"uv installs from pip's sources: {sources.describe()}")
    fix = "check the requirement names and versions, and that the package index is reachable"
    # A dry run against the parent: what it lacks (--break-system-packages only lets uv look at an
    # externally managed Python; nothing is installed there).
    plan = cmd.run(
        [uv, "pip", "install", "--dry-run", "--break-system-packages", "--python", sys.executable,
         *sources.uv_args(), *requirements],
        log=log, verbose=verbose, fix=fix,
    )  # fmt: skip
    missing = parse_dry_run(plan)
    if missing:
        cmd.run(
            [uv, "pip", "install", "--no-deps", "--python", python_in(venv), *sources.uv_args(),
             *(["--compile-bytecode"] if bytecode else []), *missing],
            env=venv_environ(venv), log=log, verbose=verbose, progress=_uv_progress, fix=fix,
        )  # fmt: skip
    output.note(f"installed {len(missing)} packages beside the system's: {' '.join(missing) or 'none'}")
    return venv


# " + name==version", " + name @ URL", and for a local file uv has cached already (a wheel installed a
# minute earlier by check-config) " + name==version (from file:///...)": the file is what is wanted.
_DRY_RUN_LINE = re.compile(r"^\s*\+\s+([A-Za-z0-9._-]+)(?:==(\S+?)(?:\s+\(from\s+(\S+)\))?|\s+@\s+(\S+))\s*$")


_WOULD_INSTALL = re.compile(r"^Would install (\d+) packages?$", re.M)


def parse_dry_run(text: str) -> list[str]:
    """The packages `uv pip install --dry-run` would add (" + name==version", " + name @ file:///..."),
    as requirements for an exact, dependency-free install. A plan is read only as it was asked for:
    colour codes in it (FORCE_COLOR), or fewer packages read than uv says it would install, or no
    verdict at all, is an error, never an empty plan (the wheel under test was then never installed)."""
    fix = f"use the uv this toolkit pins (uv=={UV_VERSION}), with colour off (unset FORCE_COLOR), or report the plan"
    if "\x1b" in text:
        raise ToolError("uv's dry run printed terminal colour codes, so its plan cannot be read", fix)
    counted = _WOULD_INSTALL.search(text)
    added = any(line.lstrip().startswith("+ ") for line in text.splitlines())
    if counted is None and "Would make no changes" not in text and not added:
        raise ToolError(f"uv's dry run said neither what it would install nor that nothing was missing: "
                        f"{shown(text.strip()[-300:])!r}", fix)  # fmt: skip
    wanted = []
    for line in text.splitlines():
        m = _DRY_RUN_LINE.match(line)
        if not m:
            if line.lstrip().startswith("+ "):  # an added package in a form not known here: never dropped silently
                raise ToolError(f"uv's dry run printed a line this toolkit cannot read: {line.strip()[:200]!r}",
                                f"use the uv this toolkit pins (uv=={UV_VERSION}), or report the line")  # fmt: skip
            continue
        name, version, url, cached = m.groups()
        url = url or cached
        if url:
            parsed = urllib.parse.urlparse(url)
            wanted.append(urllib.request.url2pathname(parsed.path) if parsed.scheme == "file" else url)
        else:
            wanted.append(f"{name}=={version}")
    if counted is not None and int(counted.group(1)) != len(wanted):
        raise ToolError(f"uv's dry run said it would install {counted.group(1)} packages, and {len(wanted)} of them "
                        "could be read", fix)  # fmt: skip
    return wanted


def _uv_progress(line: str) -> str | None:
    return line.strip() if line.lstrip().startswith(("Resolved ", "Prepared ", "Installed ")) else None


def _see_parent_venv(venv: Path) -> None:
    """Make `venv` see the packages of the venv this interpreter runs in.

    --system-site-packages exposes the *base* interpreter's packages, so a torch installed in a
    venv (as in many images, e.g. /opt/torch/.venv) would stay invisible; a .pth file appends the
    parent's site-packages after the child's own.
    """
    parents = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    child = Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"])
    (child / "_builder_parent_site.pth").write_text("\n".join(parents) + "\n", encoding="utf-8")


def cached(
    root: Path,
    requirements: Sequence[str],
    log: Path,
    verbose: bool = False,
    system_site_packages: bool = False,
    base: Path | None = None,
    index: IndexFor | None = None,
    then: Callable[[Path], None] | None = None,
    key: Sequence[str] = (),
) -> Path:
    """A complete venv with `requirements` under `root`, made once and reused. Builders sharing
    `root` (the op units of one target on Slurm) wait for the one making it, then reuse it.

    Its Python files are compiled when it is made: every op unit, the op probe and the toolchain's
    checks start a Python that imports torch from it, and where bytecode is not written
    (PYTHONDONTWRITEBYTECODE, read-only site-packages) each would compile torch's modules again
    (2.4 s of a unit's 5.4 s start, measured here). `then` finishes it before it counts as made (an
    sdist built into it), and `key` names what that adds to the environment's key."""
    venv = root / env_key([*requirements, *key], system_site_packages, base, index)
    if (venv / COMPLETE).is_file():
        _check_own(venv)
        output.note(f"reusing environment {venv}")
        return venv
    make_dirs(root)
    with held(Path(str(venv) + ".lock"), f"the build environment {venv.name}, which another builder is making"):
        if (venv / COMPLETE).is_file():
            _check_own(venv)
            output.note(f"reusing environment {venv} (made meanwhile by another builder)")
            return venv
        create(venv, requirements, log, verbose, system_site_packages, base, index, bytecode=True)
        if then is not None:
            then(venv)
        (venv / COMPLETE).write_text("\n".join(requirements) + "\n", encoding="utf-8")
        settle_modes(venv)  # written by no one else whatever the umask (2,205 entries others could write under 000)
    _check_own(venv)  # stamped: the next build reuses it without walking it file by file
    return venv


def _check_own(venv: Path) -> None:
    """A made environment is reused only where no one else could have put code in it (a planted `.pth`
    runs in every Python process of the build): the trust boundary's tree check, every entry this
    user's or root's (or a shared group's) and written by no one else, links only inside or to this
    user's interpreters. FolderError (exit 10) otherwise."""
    fix = (
        f"remove {venv} (the next build makes it again), and keep the environments' folder writable by you "
        "alone or by a group you share (docs/trust.md)"
    )
    tree_checked(venv, "the build environment", fix, links_out_to=_interpreter_home(venv, fix))


def _interpreter_home(venv: Path, fix: str) -> tuple[str, ...]:
    """The folder of the interpreter an environment was made from (pyvenv.cfg's `home`), where its
    bin/python leads, after the trust boundary's folder check of it."""
    from builder.errors import FolderError

    try:
        lines = (venv / "pyvenv.cfg").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ()
    homes = [line.partition("=")[2].strip() for line in lines if line.partition("=")[0].strip() == "home"]
    if not homes or not homes[0].startswith("/"):
        return ()
    why = node.folder_problem(homes[0], system_ok=True)
    if why:
        raise FolderError(f"the build environment {venv} runs an interpreter from a folder others could change: "
                          f"{why}", fix)  # fmt: skip
    real = os.path.realpath(homes[0])
    return (real,)


def _pip_progress(line: str) -> str | None:
    return line if line.startswith(("Collecting ", "Successfully installed")) else None
