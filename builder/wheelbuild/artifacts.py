"""What is inside a built wheel, proven against the plan; and the final touches made to it.

DeepSpeed's setup.py drops a requested op without failing when it is incompatible, so a wheel
is trusted only after its .so files and `installed_ops` were read back from the zip itself.
"""

from __future__ import annotations

import ast
import re
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import Version

from builder import archs, cmd
from builder.contracts import BuildManifest
from builder.errors import BuildError
from builder.node import BUILD_MANIFEST
from builder.wheelbuild import buildid
from builder.wheelbuild.ops import OpInfo
from builder.wheelbuild.plan import BuildPlan

INSTALLED_INFO = "deepspeed/git_version_info_installed.py"
MANIFEST_NAME = BUILD_MANIFEST


@dataclass(frozen=True)
class WheelContents:
    version: str
    installed_ops: Mapping[str, bool]
    shared_objects: Mapping[str, int]  # path in the wheel -> size in bytes
    dist_info: str


def parse_installed_info(text: str) -> dict[str, Any]:
    """The assignments in DeepSpeed's generated git_version_info_installed.py, read as literals."""
    values: dict[str, Any] = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            values[node.targets[0].id] = ast.literal_eval(node.value)
    return values


def read(wheel: Path) -> WheelContents:
    try:
        with zipfile.ZipFile(wheel) as zf:
            names = zf.namelist()
            info = parse_installed_info(zf.read(INSTALLED_INFO).decode())
            sizes = {i.filename: i.file_size for i in zf.infolist() if i.filename.endswith(".so")}
    except (zipfile.BadZipFile, KeyError) as exc:
        raise BuildError(f"{wheel.name} is not a DeepSpeed wheel: {exc}", "rebuild it") from exc
    dist_info = next((n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA")), "")
    return WheelContents(
        version=str(info.get("version", "")),
        installed_ops={k: bool(v) for k, v in info.get("installed_ops", {}).items()},
        shared_objects=sizes,
        dist_info=dist_info,
    )


def missing_ops(contents: WheelContents, ops: Sequence[OpInfo]) -> list[str]:
    """One line per requested op that is not really in the wheel, saying how it is missing."""
    problems = []
    for op in ops:
        has_so = any(path.startswith(op.so_prefix) for path in contents.shared_objects)
        listed = contents.installed_ops.get(op.name, False)
        if not listed and not has_so:
            problems.append(f"{op.name}: DeepSpeed's setup.py skipped it (not in installed_ops, no .so)")
        elif not listed:
            problems.append(f"{op.name}: its .so is inside but installed_ops does not list it, so it would JIT")
        elif not has_so:
            problems.append(f"{op.name}: installed_ops lists it but {op.so_prefix}*.so is not in the wheel")
    return problems


def verify(wheel: Path, ops: Sequence[OpInfo], version: str) -> WheelContents:
    """Fail unless the wheel has the planned version and every requested op, listed and built."""
    contents = read(wheel)
    if contents.version != version:
        raise BuildError(
            f"{wheel.name} says version {contents.version!r}, the plan was {version!r}",
            "DS_BUILD_STRING did not reach DeepSpeed's setup.py; rebuild from a clean source tree",
        )
    problems = missing_ops(contents, ops)
    if problems:
        raise BuildError(
            f"{wheel.name} lacks requested ops:\n    " + "\n    ".join(problems),
            "read the build log for the op's warnings; fix what it needs or drop the op",
        )
    return contents


# Where the sdist's files land in a wheel (setup.py copies them verbatim): (wheel prefix, sdist prefix).
_FROM_SDIST = (("deepspeed/ops/csrc/", "csrc/"), ("deepspeed/ops/op_builder/", "op_builder/"),
               ("deepspeed/accelerator/", "accelerator/"), ("", ""))  # fmt: skip
_DIST_INFO = frozenset({"METADATA", "WHEEL", "RECORD", "entry_points.txt", "top_level.txt"})
GENERATED = "deepspeed/git_version_info_installed.py"  # setup.py writes it: literal assignments only


def foreign_files(wheel: Path, sdist: Path, so_prefixes: Sequence[str]) -> list[str]:
    """Files of a unit's wheel that its op's build does not make (pure but for reading the two files):
    every file must be the sdist's own bytes at its place, a script of the sdist's bin/ (setuptools
    rewrites its first line), the dist-info setup.py writes, the generated version module (literal
    assignments only), or a shared object of the unit's ops. A compiler in a root that wrote
    `pwned_marker.py` beside its output put it in the wheel, importable on every node."""
    import tarfile
    import zipfile

    sdist_files: dict[str, bytes] = {}
    with tarfile.open(sdist) as tf:
        for member in tf.getmembers():
            if member.isfile() and "/" in member.name and (f := tf.extractfile(member)) is not None:
                sdist_files[member.name.split("/", 1)[1]] = f.read()
    foreign = []
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            name = info.filename
            if info.is_dir():
                continue
            head, _, tail = name.partition("/")
            if head.endswith(".dist-info"):
                if tail in _DIST_INFO or (tail.startswith("licenses/") and tail[9:] in sdist_files):
                    continue
            elif head.endswith(".data") and tail.startswith("scripts/"):
                ours = sdist_files.get("bin/" + tail[8:])
                if ours is not None and zf.read(info).partition(b"\n")[2] == ours.partition(b"\n")[2]:
                    continue
            elif name.endswith(".so") and any(name.startswith(p) and "/" not in name[len(p) :] for p in so_prefixes):
                continue
            elif name == GENERATED:
                if _literal_assignments(zf.read(info)):
                    continue
            else:
                data = zf.read(info)
                if any(name.startswith(w) and sdist_files.get(s + name[len(w) :]) == data for w, s in _FROM_SDIST):
                    continue
            foreign.append(name)
    return foreign


def _literal_assignments(text: bytes) -> bool:
    """Whether a module only assigns literals to names (nothing it runs at import but that)."""
    import ast

    try:
        tree = ast.parse(text)
        for node in tree.body:
            if not isinstance(node, ast.Assign) or not all(isinstance(t, ast.Name) for t in node.targets):
                return False
            ast.literal_eval(node.value)
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
        return False
    return True


def pin_requirement(metadata: str, name: str, spec: str) -> str:
    """METADATA with the unconditional Requires-Dist of `name` replaced by `name<spec>` (added if absent)."""
    line = f"Requires-Dist: {name}{spec}"
    # The unconditional requirement only: lines with a marker (extras) keep their own specifiers.
    pattern = re.compile(rf"^Requires-Dist: {re.escape(name)}(?=[\s<>=!~\[(]|$)[^;\n]*$", re.MULTILINE | re.IGNORECASE)
    if pattern.search(metadata):
        return pattern.sub(line, metadata, count=1)
    head, sep, body = metadata.partition("\n\n")
    return f"{head}\n{line}{sep}{body}"


def unpack(wheel: Path, python: Path, dest: Path, log: Path) -> Path:
    """Unpack with the `wheel` tool; returns the tree (the folder holding the package and dist-info)."""
    cmd.run([python, "-m", "wheel", "unpack", "-d", dest, wheel], log=log)
    (tree,) = (p for p in dest.iterdir() if p.is_dir())
    return tree


def finish_tree(tree: Path, manifest: BuildManifest) -> None:
    """Pin the exact torch in METADATA and embed the build manifest in the dist-info of an unpacked wheel."""
    (dist_info,) = tree.glob("*.dist-info")
    meta = dist_info / "METADATA"
    pin = f"=={Version(manifest.torch_version).public}"
    meta.write_text(pin_requirement(meta.read_text(encoding="utf-8"), "torch", pin), encoding="utf-8")
    (dist_info / MANIFEST_NAME).write_text(manifest.to_json(), encoding="utf-8")


def pack(tree: Path, python: Path, out: Path, log: Path, env: Mapping[str, str] | None = None) -> Path:
    """Pack with the `wheel` tool (which rewrites RECORD) into a temporary name, then rename into `out`."""
    with tempfile.TemporaryDirectory(dir=out, prefix=".pack-") as tmp:
        cmd.run([python, "-m", "wheel", "pack", "-d", tmp, tree], log=log, env=env)  # env: SOURCE_DATE_EPOCH
        (result,) = Path(tmp).glob("*.whl")
        final = out / result.name
        result.replace(final)
    return final


def so_sizes(tree: Path) -> dict[str, dict[str, int]]:
    return {str(p.relative_to(tree)): {"bytes": p.stat().st_size} for p in sorted(tree.rglob("*.so"))}


def strip_debug(tree: Path, log: Path, program: str = "strip") -> dict[str, dict[str, int]]:
    """Strip what debug info is left in every .so (-g is dropped already) with `program` (the build
    root's cross strip for a wheel for another machine: this machine's knows only its own); sizes
    before and after. The build-id is then recomputed over what is left, so stripped wheels are reproducible.
    """
    before = so_sizes(tree)
    files = sorted(tree.rglob("*.so"))
    if files:
        cmd.run([program, "--strip-debug", *files], log=log, fix="install binutils (strip), or set strip = false")
    for so in files:
        buildid.rehash(so)
    after = so_sizes(tree)
    return {k: {"before": v["bytes"], "bytes": after[k]["bytes"]} for k, v in before.items()}


def verify_archs(tree: Path, plan: BuildPlan) -> dict[str, list[str]]:
    """Every op with device code must carry SASS (and PTX where asked) for every requested arch.

    DeepSpeed narrows TORCH_CUDA_ARCH_LIST for later ops once one op filters archs (its issues
    7972/7974), so this is read back from each .so rather than trusted.
    """
    found: dict[str, list[str]] = {}
    problems = []
    for op in plan.ops:
        sos = sorted(tree.glob(op.so_prefix + "*.so"))
        codes = set().union(*(archs.so_archs(p) for p in sos)) if sos else set()
        found[op.name] = sorted(f"{c.kind}_{c.sm}" for c in codes)
        if op.device_code and plan.archs:
            missing = archs.missing_archs(codes, plan.archs_of(op.name))
            if missing:
                have = ", ".join(found[op.name]) or "no device code"
                problems.append(f"{op.name}: no code for {', '.join(missing)} (has {have})")
    if problems:
        raise BuildError(
            "CUDA ops lack requested archs:\n    " + "\n    ".join(problems),
            "DeepSpeed narrowed TORCH_CUDA_ARCH_LIST while building; build the affected ops in a separate recipe",
        )
    return found


def device_code_compressed(tree: Path, plan: BuildPlan) -> bool | None:
    """Whether every device-code op's .so holds compressed device code, read back from its fatbin
    (None for a build without device code). A recipe that asked for compression and did not get
    it is an error: nvcc takes the flag from the environment, where a wrapper can lose it."""
    sos = [so for op in plan.ops if op.device_code for so in sorted(tree.glob(op.so_prefix + "*.so"))]
    if not sos or not plan.archs:
        return None
    compressed = all(archs.so_compressed(so) for so in sos)
    if plan.recipe.compress_device_code and not compressed:
        raise BuildError(
            "the recipe asks for compressed device code, but the .so files hold it uncompressed",
            "check that NVCC_APPEND_FLAGS reaches nvcc (a wrapper may reset it), or set compress_device_code = false",
        )
    return compressed
