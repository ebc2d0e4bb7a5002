"""Recipes: TOML files that say what to build, loaded into frozen dataclasses.

Loading is strict: unknown keys, wrong types and malformed versions are rejected with a message
that names the file, the key and (for near misses) what was probably meant. Op names are checked
later, against DeepSpeed's own op list for the chosen accelerator (see `ops.check_requested`).
"""

from __future__ import annotations

import collections
import dataclasses
import difflib
import json
import os
import re
import stat
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from builder.archs import normalize_all
from builder.buildroot.spec import DEFAULT_FLOOR, RootSpec
from builder.errors import RecipeError
from builder.machines import HOST, MACHINES, machine_problem
from builder.node import INDEX_URL_RE, TORCH_VARIANT_RE, link_secret, url_secret

ACCELERATORS = ("cpu", "cuda")
SYSTEM = "system"
_SCHEMA: dict[str, dict[str, type | tuple[type, ...]]] = {
    "": {
        "name": str,
        "description": str,
        "accelerator": str,
        "ops": (str, list),
        "ops_except": list,
        "on_op_failure": str,
        "arch": (str, list),
        "cpu_target": str,
        "strip": bool,
        "narrow_ops": list,
        "compress_device_code": bool,
        "cuda_toolkit": str,
        "python": list,
        "deepspeed": dict,
        "torch": dict,
        "slurm": dict,
        "configs": list,
        "known_failures": dict,
        "label": str,
        "platform": str,
        "root": dict,
        "machine": str,
    },
    "deepspeed": {"version": str, "sha256": str},
    "root": {"folder": str, "image": str, "cc": str, "cxx": str},
    "torch": {"version": str, "variant": str, "index": str},
}
_REQUIRED: dict[str, tuple[str, ...]] = {
    "": ("name", "accelerator", "ops", "deepspeed", "torch"),
    "deepspeed": ("version", "sha256"),
    "torch": ("version",),
    "root": (),
}
_KIND: dict[type | tuple[type, ...], str] = {
    str: "a string",
    list: "a list",
    dict: "a table",
    bool: "true or false",
    (str, list): "a string or a list",
}
CUDA_TOOLKITS = ("auto", "system", "pip")
PYTORCH_INDEX = "https://download.pytorch.org/whl"  # PyTorch's indexes, one per build: /cpu, /cu126, /cu130
ALL_OPS = "all"  # ops = "all": every op DeepSpeed offers for the accelerator (see build.needs)
ON_OP_FAILURE = ("fail", "drop")
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")  # 64 at most: it names files (the build log) and a version
# A local version segment of letters and digits, starting with a letter so it never reads as a number.
_LABEL = re.compile(r"^[a-z][a-z0-9]{0,15}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
SLURM_WORD = re.compile(r"^[A-Za-z0-9:_.-]{1,64}$")  # a partition, gres, 24G, 02:00:00: no shell, no spaces
SLURM_SIZES = {"cpus": int, "mem": str, "time": str}  # a build task's size (recipe and matrix [slurm])


def check_slurm_table(
    table: Mapping[str, Any], kinds: Mapping[str, type], where: str, prefix: str, example: str
) -> dict[str, Any]:
    """A [slurm]-like table (a recipe's, a matrix file's, a [slurm.gpu] entry), its keys named
    `prefix`key: known keys only; counts of 1 or more, true/false, absolute paths, and words
    Slurm takes (no shell, no spaces)."""
    for key, value in table.items():
        if key not in kinds:
            raise RecipeError(f'{where}: unknown key "{prefix}{key}"{did_you_mean(key, list(kinds))}',
                              f"allowed: {', '.join(kinds)}")  # fmt: skip
        kind = kinds[key]
        if kind is bool:
            ok = isinstance(value, bool)
        elif kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
        elif kind is Path:  # a folder every node sees
            ok = isinstance(value, str) and Path(value).is_absolute() and "\n" not in value
        else:
            ok = isinstance(value, str) and SLURM_WORD.match(value) is not None
        if not ok:
            raise RecipeError(f"{where}: {prefix}{key} = {str(value)[:40]!r} is not valid", example)
    return dict(table)


@dataclass(frozen=True)
class DeepSpeedSource:
    """The DeepSpeed sdist to build, pinned by version and by the sha256 of the file."""

    version: str
    sha256: str

    @property
    def requirement(self) -> str:
        return f"deepspeed=={self.version}"


@dataclass(frozen=True)
class TorchSpec:
    """The torch the wheel is built against, and therefore the one it must run with.

    version = "system" means the torch already installed for this interpreter (an NGC container,
    a site build): build and smoke environments then see it through system site-packages.
    `variant` names torch's build the way PyTorch's indexes do (cpu, cu126, cu130): the requirement
    pins it (torch==2.13.0+cpu), so no index's default build (PyPI's is CUDA) can stand in for it.
    `index` is where that build comes from: a site's mirror, always asked; without it, PyTorch's
    own index for the variant, asked only when pip's sources lack the build.
    """

    version: str
    variant: str | None = None
    index: str | None = None
    unlabelled: bool = False  # the build without a +label only (torch===2.13.0: PyPI's own), never a +cpu one

    @property
    def system(self) -> bool:
        return self.version == SYSTEM

    @property
    def requirement(self) -> str:
        if self.variant:
            return f"torch=={self.version}+{self.variant}"
        return f"torch==={self.version}" if self.unlabelled else f"torch=={self.version}"

    @property
    def index_url(self) -> str | None:
        """The index torch's build comes from: the recipe's own, else PyTorch's for the variant."""
        return self.index or (f"{PYTORCH_INDEX}/{self.variant}" if self.variant else None)

    def describe(self) -> str:
        shown = self.requirement.removeprefix("torch==").lstrip("=")
        return shown + (f" from {self.index_url}" if self.index_url else "")


@dataclass(frozen=True)
class Recipe:
    name: str
    accelerator: str
    ops: tuple[str, ...]  # the ops named; empty when all_ops
    deepspeed: DeepSpeedSource
    torch: TorchSpec
    archs: tuple[str, ...] = ()  # torch spelling ("9.0", "9.0+PTX"); empty for CPU recipes
    auto_arch: bool = False  # arch = "auto": the archs of this machine's GPUs, from detect
    cpu_target: str = "x86-64-v3"
    strip: bool = True
    machine: str = HOST  # what the wheel's nodes are (platform.machine()): another than this one is cross-built
    narrow_ops: tuple[str, ...] = ()  # ops allowed to build for fewer archs than `archs` (their builder filters)
    compress_device_code: bool = True  # nvcc -Xfatbin -compress-all, as PyTorch's own wheels
    cuda_toolkit: str = "auto"  # auto | system | pip: where nvcc comes from (see build.cudakit)
    python: tuple[str, ...] = ()  # interpreters to build for ("3.10", "3.12", or paths); () = the builder's
    slurm: tuple[tuple[str, int | str], ...] = ()  # [slurm] cpus, mem, time of its build task (not in the build key)
    all_ops: bool = False  # ops = "all": DeepSpeed's own op list for the accelerator, less ops_except
    ops_except: tuple[str, ...] = ()
    on_op_failure: str = "fail"  # fail | drop: ship the wheel without an op that fails to build or is refused
    deepspeed_suffix: bool = False  # a matrix varied the DeepSpeed version: it goes into the target name
    description: str = ""
    path: Path | None = None
    config_files: tuple[str, ...] = ()  # the site's DeepSpeed config files, relative to the recipe's folder
    # configs that fail for DeepSpeed's own reason, with why (and a link): they do not block publishing
    known_failures: tuple[tuple[str, str, str], ...] = ()  # (config file, reason, link or "")
    configs: tuple[tuple[str, str], ...] = ()  # (file name, the config as sorted JSON), read by load_recipe
    ops_from_configs: tuple[str, ...] = ()  # ops added to `ops` because a config loaded them (pipeline)
    label: str = ""  # ends the wheel's local version: two op sets of one target get two file names
    platform: str = DEFAULT_FLOOR  # manylinux_2_N: the oldest glibc the wheel may need; "host": this machine's
    root: RootSpec | None = None  # [root]: a site's root folder or image; None: the toolkit's own (Debian 11)

    @property
    def config_table(self) -> dict[str, Any]:
        """The site's configs, file name -> config object (embedded in the wheel's manifest)."""
        return {name: json.loads(text) for name, text in self.configs}

    @property
    def known_table(self) -> dict[str, dict[str, str]]:
        """config file -> {"reason", "link"?}: embedded in the wheel's manifest beside the configs."""
        return {
            name: {"reason": reason, **({"link": link} if link else {})} for name, reason, link in self.known_failures
        }

    @property
    def ops_spec(self) -> list[str] | dict[str, list[str]]:
        """The ops as the recipe says them: the list, or {"all": ops_except}."""
        return {ALL_OPS: list(self.ops_except)} if self.all_ops else list(self.ops)

    @property
    def ops_text(self) -> str:
        if not self.all_ops:
            return ", ".join(self.ops)
        return "all" + (f" except {', '.join(self.ops_except)}" if self.ops_except else "")


def did_you_mean(word: str, choices: list[str] | tuple[str, ...]) -> str:
    """' (did you mean "x"?)' for a near miss, else ''."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f' (did you mean "{close[0]}"?)' if close else ""


MAX_TOML = 1 << 20  # a recipe or matrix file is a few hundred bytes; past 1 MiB it is not one
MAX_OPS = 1000


def read_toml(path: Path, what: str, option: str) -> dict[str, Any]:
    """A recipe or matrix file, parsed: a regular file (not /dev/zero, a pipe or a folder) of at most
    MAX_TOML bytes, UTF-8, TOML, nested no deeper than the parser can follow."""
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise RecipeError(f"{what} {path} is not a regular file", f"pass a TOML file with {option}")
        if st.st_size > MAX_TOML:
            raise RecipeError(f"{what} {path} is {st.st_size} bytes, past the {MAX_TOML >> 20} MiB a {what} can be",
                              f"pass the {what}'s TOML file with {option}")  # fmt: skip
        with open(path, "rb") as f:
            raw = f.read(MAX_TOML + 1)
    except OSError as exc:
        raise RecipeError(f"cannot read {what} {path}: {exc.strerror}", f"pass an existing file with {option}") from exc
    if len(raw) > MAX_TOML:
        raise RecipeError(f"{what} {path} grew past {MAX_TOML >> 20} MiB while read", f"pass a TOML file with {option}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecipeError(
            f"{what} {path} is not UTF-8 text (byte {exc.start} is {exc.object[exc.start : exc.start + 1]!r})",
            f"save the {what} as UTF-8 (TOML files must be UTF-8)",
        ) from exc
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RecipeError(f"{what} {path} is not valid TOML: {exc}", "fix the TOML syntax at that line") from exc
    except RecursionError as exc:
        raise RecipeError(f"{what} {path} nests arrays or tables too deeply to read", f"a {what} is a flat table: "
                          "fix the file") from exc  # fmt: skip


def load_recipe(path: Path) -> Recipe:
    """Read and validate a recipe file, and the DeepSpeed configs it names."""
    recipe = parse_recipe(read_toml(path, "recipe", "--recipe"), path)
    if not recipe.config_files:
        return recipe
    from builder.configs import read_config

    read = []
    folder = path.parent.resolve()
    for name in recipe.config_files:
        if not (path.parent / name).resolve().is_relative_to(folder):
            raise RecipeError(f"{path}: configs: {name[:100]!r} is outside the recipe's folder {folder}: its text "
                              "would be embedded in every wheel", "copy the config into the recipe's folder (e.g. "
                              "configs/) and name it relative to it")  # fmt: skip
        case = read_config(path.parent / name)
        if case.error:
            raise RecipeError(f"{path}: configs: {case.error}",
                              "fix the config file, or take it out of the recipe's configs")  # fmt: skip
        read.append((name, json.dumps(case.config, sort_keys=True)))
    return dataclasses.replace(recipe, configs=tuple(read))


_KNOWN_EXAMPLE = (
    'e.g. [known_failures] "configs/x.json" = { reason = "DeepSpeed 0.19.8 steps LBFGS without its '
    'closure", link = "https://github.com/deepspeedai/DeepSpeed/issues/N" }'
)
MAX_REASON = 500


def _known_failures(table: Mapping[str, Any], config_files: list[str], where: str) -> tuple[tuple[str, str, str], ...]:
    """[known_failures]: a site's configs that fail for DeepSpeed's own reason, each with why. Only
    configs the recipe names; a reason of plain text; a link that is an https or http URL."""
    out = []
    for name, entry in table.items():
        if name not in config_files:
            raise RecipeError(f"{where}: known_failures names {name[:100]!r}, which is not one of the recipe's "
                              f"configs{did_you_mean(name, config_files)}",
                              "name a file exactly as configs lists it")  # fmt: skip
        if not isinstance(entry, dict) or set(entry) - {"reason", "link"}:
            raise RecipeError(f"{where}: known_failures.{name} must be a table of reason and link", _KNOWN_EXAMPLE)
        reason, link = entry.get("reason"), entry.get("link", "")
        if not isinstance(reason, str) or not reason.strip() or len(reason) > MAX_REASON:
            raise RecipeError(f"{where}: known_failures.{name}.reason must say why it fails, in 1 to {MAX_REASON} "
                              "characters", _KNOWN_EXAMPLE)  # fmt: skip
        if not isinstance(link, str) or (link and not re.match(r"^https?://[^\s<>\"']{1,500}$", link)):
            raise RecipeError(f"{where}: known_failures.{name}.link is not an http(s) URL", _KNOWN_EXAMPLE)
        if (secret := link_secret(link)) is not None:  # the same rule as torch.index's
            raise RecipeError(f"{where}: known_failures.{name}.link holds {secret}: it would be embedded in every "
                              "wheel's build manifest and shown on the wheelhouse page",
                              "link to the issue without credentials or a query string")  # fmt: skip
        out.append((name, " ".join(reason.split()), link))
    return tuple(sorted(out))


def _control_characters(data: object, key: str = "") -> str | None:
    """The first key (dotted) whose text holds a control character (ESC would rewrite a terminal),
    with the text shown escaped."""
    if isinstance(data, str):
        return f"{key} = {data[:80]!r}" if any(ord(c) < 32 or ord(c) == 127 for c in data) else None
    items = data.items() if isinstance(data, Mapping) else enumerate(data) if isinstance(data, list) else ()
    for k, v in items:
        found = _control_characters(k, f"{key}.{k}".lstrip(".")) or _control_characters(v, f"{key}.{k}".lstrip("."))
        if found is not None:
            return found
    return None


def parse_recipe(data: Mapping[str, Any], path: Path | None = None) -> Recipe:
    """Validate a recipe's parsed TOML; pure, so every rule is unit-tested without files."""
    where = str(path) if path else "recipe"
    bad = _control_characters(data)
    if bad is not None:
        raise RecipeError(f"{where}: {bad} holds a control character", "write it as plain text")
    _check_table(data, "", where)
    ds = data["deepspeed"]
    torch = data["torch"]
    _check_table(ds, "deepspeed", where)
    _check_table(torch, "torch", where)

    name = data["name"]
    if not _NAME.match(name):
        raise RecipeError(
            f'{where}: name "{name[:80]}{"..." if len(name) > 80 else ""}" is not usable in file and version names'
            + (f" ({len(name)} characters)" if len(name) > 64 else ""),
            "use 1 to 64 lowercase letters, digits, '.', '_' and '-'",
        )
    accelerator = data["accelerator"]
    if accelerator not in ACCELERATORS:
        raise RecipeError(
            f'{where}: unknown accelerator "{accelerator}"{did_you_mean(accelerator, ACCELERATORS)}',
            f"use one of: {', '.join(ACCELERATORS)}",
        )
    ops, all_ops, ops_except = _ops(data, where)
    on_failure = data.get("on_op_failure", "fail")
    if on_failure not in ON_OP_FAILURE:
        raise RecipeError(
            f'{where}: on_op_failure = "{on_failure}" is not one of {", ".join(ON_OP_FAILURE)}',
            "fail (the default: no wheel when an op fails) or drop (ship the wheel without it, saying why)",
        )
    sha = ds["sha256"].lower()
    if not _SHA256.match(sha):
        raise RecipeError(
            f"{where}: deepspeed.sha256 is not a sha256 hex digest", "copy the 64-hex-digit sha256 of the sdist"
        )
    archs, auto_arch = _archs(data.get("arch"), accelerator, where)
    machine = data.get("machine", HOST)
    cpu_target = data.get("cpu_target", MACHINES[machine].default_cpu_target if machine in MACHINES else "")
    if said := machine_problem(machine, cpu_target, did_you_mean):
        raise RecipeError(f"{where}: {said[0]}", said[1])
    narrow = data.get("narrow_ops", [])
    if not all(isinstance(op, str) for op in narrow):
        raise RecipeError(f"{where}: narrow_ops must be a list of op names", 'e.g. narrow_ops = ["fp_quantizer"]')
    stray = [op for op in narrow if op not in ops and not all_ops]
    if stray:
        raise RecipeError(
            f"{where}: narrow_ops names {', '.join(stray)}, which ops does not list",
            "list in narrow_ops only ops the recipe builds",
        )
    if narrow and accelerator != "cuda":
        raise RecipeError(f"{where}: narrow_ops is only for cuda recipes", "remove narrow_ops")
    toolkit = data.get("cuda_toolkit", "auto")
    if toolkit not in CUDA_TOOLKITS:
        raise RecipeError(
            f'{where}: unknown cuda_toolkit "{toolkit}"{did_you_mean(toolkit, CUDA_TOOLKITS)}',
            "use auto (a toolkit here matching torch's CUDA, else nvcc from pip), system or pip",
        )
    pythons = data.get("python", [])
    if not all(isinstance(p, str) and p for p in pythons):
        raise RecipeError(f"{where}: python must list versions or interpreter paths", 'e.g. python = ["3.10", "3.12"]')
    slurm = check_slurm_table(data.get("slurm", {}), SLURM_SIZES, where, "slurm.",
                              'e.g. [slurm] cpus = 16, mem = "64G", time = "04:00:00"')  # fmt: skip
    config_files = data.get("configs", [])
    if not all(isinstance(c, str) and c.strip() for c in config_files):
        raise RecipeError(f"{where}: configs must list DeepSpeed config files (relative to the recipe's folder)",
                          'e.g. configs = ["configs/adam-zero1.json"] (JSON, or a .py file of one dict)')  # fmt: skip
    if len({os.path.normpath(c) for c in config_files}) != len(config_files):
        raise RecipeError(f"{where}: configs names a file twice", "name each config once")
    known = _known_failures(data.get("known_failures", {}), config_files, where)
    label = data.get("label", "")
    if label and not _LABEL.match(label):
        raise RecipeError(f'{where}: label "{label}" is not usable in a version',
                          'use 1-16 lowercase letters and digits, e.g. label = "all"')  # fmt: skip
    platform, root = _platform(data, where, machine)
    if machine != HOST and platform == "host":
        raise RecipeError(f'{where}: platform = "host" is this machine\'s own OS, and the wheel is for {machine}',
                          f'set platform = "{DEFAULT_FLOOR}" (the floor of torch\'s {machine} wheels)')  # fmt: skip
    if machine != HOST and auto_arch:
        raise RecipeError(f'{where}: arch = "auto" reads this machine\'s GPUs, and the wheel is for {machine} nodes',
                          'name their GPUs\' archs: arch = ["9.0"] for GH200, ["10.0"] for GB200')  # fmt: skip
    torch_spec = _torch(torch, accelerator, where)
    if machine != HOST and torch_spec.system:
        raise RecipeError(f'{where}: torch = "system" is this machine\'s torch, and the wheel is for {machine} nodes',
                          f"pin the version of torch {machine} nodes run ([torch] version = \"2.13.0\"): its "
                          f"{machine} wheel is fetched to compile against")  # fmt: skip
    return Recipe(
        machine=machine,
        platform=platform,
        root=root,
        label=label,
        config_files=tuple(config_files),
        known_failures=known,
        slurm=tuple(sorted(slurm.items())),
        name=name,
        archs=archs,
        python=tuple(pythons),
        narrow_ops=tuple(narrow),
        compress_device_code=data.get("compress_device_code", True),
        cuda_toolkit=toolkit,
        auto_arch=auto_arch,
        cpu_target=cpu_target,
        strip=data.get("strip", True),
        accelerator=accelerator,
        ops=tuple(ops),
        all_ops=all_ops,
        ops_except=tuple(ops_except),
        on_op_failure=on_failure,
        deepspeed=DeepSpeedSource(version=_version(ds["version"], "deepspeed.version", where), sha256=sha),
        torch=torch_spec,
        description=data.get("description", ""),
        path=path,
    )


IMAGE_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}$")  # registry/name:tag or @sha256:..., no spaces


def _platform(data: Mapping[str, Any], where: str, machine: str = HOST) -> tuple[str, RootSpec | None]:
    """platform (a manylinux_2_N floor auditwheel knows, or "host") and [root] (folder or image)."""
    from builder.glibc import HOST, known_floors

    platform = data.get("platform", DEFAULT_FLOOR)
    floors = known_floors(machine)
    if platform != HOST and platform not in floors:
        raise RecipeError(
            f'{where}: platform = "{platform[:60]}" is not a floor this toolkit knows{did_you_mean(platform, floors)}',
            f'use one of {", ".join(floors)} (the oldest glibc the wheel may need; "{DEFAULT_FLOOR}" reaches RHEL 8+, '
            f'Debian 10+, Ubuntu 18.10+), or "host" for this machine\'s own OS only',
        )
    table = data.get("root")
    if table is None:
        return platform, None
    _check_table(table, "root", where)
    if platform == HOST:
        raise RecipeError(f'{where}: [root] names where to compile for a floor, and platform = "host" has none',
                          f'remove [root], or set platform = "{DEFAULT_FLOOR}"')  # fmt: skip
    if ("folder" in table) == ("image" in table):
        raise RecipeError(
            f"{where}: [root] names either a folder or an image",
            '[root] folder = "/srv/roots/alma8", or [root] image = "quay.io/pypa/manylinux_2_28_x86_64"',
        )
    tools = {}
    for key in ("cc", "cxx"):
        if key in table:
            value = table[key]
            if not value.startswith("/") or "\n" in value or ".." in value.split("/"):
                raise RecipeError(f'{where}: root.{key} = "{value[:60]}" is not an absolute path inside the root',
                                  'e.g. cxx = "/opt/rh/gcc-toolset-13/root/usr/bin/g++"')  # fmt: skip
            tools[key] = value
    if "folder" in table:
        folder = table["folder"]
        if not folder.startswith("/") or "\n" in folder:
            raise RecipeError(f'{where}: root.folder = "{folder[:60]}" is not an absolute path',
                              'e.g. [root] folder = "/srv/roots/bullseye"')  # fmt: skip
        return platform, RootSpec("folder", folder=Path(folder), **tools)
    image = table["image"]
    if not IMAGE_REF.match(image):
        raise RecipeError(f'{where}: root.image = "{image[:60]}" is not an image reference',
                          'e.g. [root] image = "quay.io/pypa/manylinux_2_28_x86_64"')  # fmt: skip
    return platform, RootSpec("image", image=image, **tools)


def _torch(table: Mapping[str, Any], accelerator: str, where: str) -> TorchSpec:
    """[torch]: a version (or "system"), and optionally the build (variant) and where it comes from (index)."""
    variant, index = table.get("variant"), table.get("index")
    if table["version"] == SYSTEM:
        if variant or index:
            raise RecipeError(f'{where}: torch.version = "system" takes no variant or index (it is the installed one)',
                              "remove torch.variant and torch.index, or pin a version")  # fmt: skip
        return TorchSpec(SYSTEM)
    version = _version(table["version"], "torch.version", where)
    if "+" in version:
        raise RecipeError(f'{where}: torch.version "{version}" has a build label',
                          f'put the build in variant: version = "{version.split("+")[0]}", '
                          f'variant = "{version.split("+")[1]}"')  # fmt: skip
    if variant is not None:
        if not TORCH_VARIANT_RE.match(variant):
            raise RecipeError(f'{where}: torch.variant "{variant}" is not a build PyTorch\'s indexes name',
                              'use "cpu", or "cu" and CUDA\'s version without the dot: "cu126", "cu130"')  # fmt: skip
        wanted = "cpu" if accelerator == "cpu" else "cu126, cu128, cu130, ..."
        if (variant == "cpu") != (accelerator == "cpu"):
            raise RecipeError(f'{where}: torch.variant "{variant}" does not fit accelerator "{accelerator}"',
                              f"use a {accelerator} build of torch: variant = {wanted}")  # fmt: skip
    if index is not None:
        if isinstance(index, str) and (secret := url_secret(index)):
            raise RecipeError(f"{where}: torch.index holds {secret}: it would be printed, logged and embedded in "
                              "every wheel's build manifest",
                              "keep credentials out of the recipe: put them in ~/.netrc (pip and uv read it) or a "
                              "keyring, and name the index without them")  # fmt: skip
        if not INDEX_URL_RE.match(index):
            raise RecipeError(f'{where}: torch.index "{index[:60]}" is not an index URL',
                              'e.g. index = "https://download.pytorch.org/whl/cu130", a mirror of it, '
                              'or "file:///srv/pytorch/whl/cpu"')  # fmt: skip
        index = index.rstrip("/")
    return TorchSpec(version, variant, index)


def _ops(data: Mapping[str, Any], where: str) -> tuple[list[str], bool, list[str]]:
    """(ops named, every op?, ops left out of every op): a non-empty list of names, or "all"."""
    ops = data["ops"]
    excluded = data.get("ops_except", [])
    if not all(isinstance(op, str) and op for op in excluded):
        raise RecipeError(f"{where}: ops_except must be a list of op names", 'e.g. ops_except = ["evoformer_attn"]')
    if isinstance(ops, str):
        if ops != ALL_OPS:
            raise RecipeError(
                f'{where}: ops = "{ops}" is not a list of ops or "all"', 'e.g. ops = ["cpu_adam"], or ops = "all"'
            )
        dupes = _repeated(excluded)
        if dupes:
            raise RecipeError(f"{where}: ops_except lists {', '.join(dupes)} more than once", "list each op once")
        return [], True, list(excluded)
    if excluded:
        raise RecipeError(f'{where}: ops_except is only for ops = "all"', "remove the op from ops instead")
    if not ops or not all(isinstance(op, str) and op for op in ops):
        raise RecipeError(f"{where}: ops must be a non-empty list of op names", 'e.g. ops = ["cpu_adam"], or "all"')
    if len(ops) > MAX_OPS:
        raise RecipeError(f"{where}: ops lists {len(ops)} names; DeepSpeed has a few dozen ops",
                          f'list the ops to build (at most {MAX_OPS}), or ops = "all"')  # fmt: skip
    dupes = _repeated(ops)
    if dupes:
        raise RecipeError(f"{where}: ops lists {', '.join(dupes)} more than once", "list each op once")
    return list(ops), False, []


def _repeated(names: Sequence[str]) -> list[str]:
    """Names listed more than once (one pass: a list of 100,000 names is refused at once)."""
    return sorted(name for name, n in collections.Counter(names).items() if n > 1)[:20]


def _archs(value: str | list[str] | None, accelerator: str, where: str) -> tuple[tuple[str, ...], bool]:
    if accelerator != "cuda":
        if value is not None:
            raise RecipeError(f"{where}: arch is only for cuda recipes", 'remove arch, or set accelerator = "cuda"')
        return (), False
    if value is None:
        raise RecipeError(f"{where}: a cuda recipe needs arch", 'e.g. arch = ["9.0"], or arch = "auto" on a GPU node')
    if value == "auto":
        return (), True
    items = [value] if isinstance(value, str) else value
    if not items or not all(isinstance(a, str) for a in items):
        raise RecipeError(f'{where}: arch must be "auto" or a non-empty list of strings', 'e.g. arch = ["8.0", "9.0"]')
    try:
        return normalize_all(items), False
    except RecipeError as exc:
        raise RecipeError(f"{where}: arch {exc.message}", exc.fix) from exc


def _check_table(table: Mapping[str, Any], section: str, where: str) -> None:
    schema = _SCHEMA[section]
    prefix = f"{section}." if section else ""
    for key, value in table.items():
        if key not in schema:
            raise RecipeError(
                f'{where}: unknown key "{prefix}{key}"{did_you_mean(key, list(schema))}',
                f"allowed keys{' in [' + section + ']' if section else ''}: {', '.join(schema)}",
            )
        if not isinstance(value, schema[key]):
            kind = _KIND[schema[key]]
            raise RecipeError(f"{where}: {prefix}{key} must be {kind}", f"write {prefix}{key} as {kind}")
    missing = [k for k in _REQUIRED[section] if k not in table]
    if missing:
        raise RecipeError(
            f"{where}: missing {', '.join(prefix + k for k in missing)}", "see recipes/cpu.toml for a complete recipe"
        )


def _version(text: str, key: str, where: str) -> str:
    try:
        Version(text)
    except InvalidVersion as exc:
        raise RecipeError(f'{where}: {key} "{text}" is not a valid version', 'write it like "2.13.0"') from exc
    return text
