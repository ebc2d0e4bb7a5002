"""The node installer, and the wheelhouse manifest contract it shares with the build host.

This file runs on cluster nodes that have only Python and pip: it imports nothing but the
standard library and nothing from `builder`, so publish copies it byte for byte into the
wheelhouse (`tools/ds-node-install.py`, hashed in the manifest) and provisioning runs that copy.
The builder imports the contract from here (`load_manifest`, `check_wheel_name`, ...), so the
build host and every node validate `manifest.json` with the same code.

Everything read from a wheelhouse is hostile until checked: the manifest is validated field by
field, a wheel name must parse as a wheel file name (no path separator, no `..`), the chosen
wheel's bytes must match its sha256 (also with --dry-run), and the build manifest embedded in
the wheel must agree with what the manifest says it was built for.

It runs on Python 3.8 and newer (Ubuntu 20.04, Debian 11, RHEL 9; RHEL 8 has python38/python39
beside its platform-python 3.6). Older interpreters get one line saying so: the file parses on
3.6 (no `from __future__ import annotations`: annotations are quoted; no walrus), and the version
check below runs before anything else.
"""

import sys

if sys.version_info < (3, 8):  # noqa: UP036  (written for the interpreters it refuses)
    _script = sys.argv[0] if sys.argv else "ds-node-install.py"
    sys.stderr.write(
        f"error: the DeepSpeed node installer needs Python 3.8 or newer; {sys.executable} is Python "
        f"{sys.version_info[0]}.{sys.version_info[1]}\n  fix: run it with a newer python3 (RHEL 8: dnf install "
        f"python39, then python3.9 {_script} ...)\n"
    )
    sys.exit(9)


import argparse
import base64
import datetime
import errno
import hashlib
import html.parser
import http.client
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

MANIFEST_FILE = "manifest.json"
INSTALLER = "tools/ds-node-install.py"
# builder/resources/config_runner.py, published byte for byte: runs DeepSpeed configs against the
# DeepSpeed installed on a node (install --check-config).
CONFIG_CHECK = "tools/ds-config-check.py"
EXIT_CONFIGS = 14  # a config does not run from the installed wheel
BUILD_MANIFEST = "ds_builder.json"  # inside the wheel's *.dist-info/
MANIFEST_SCHEMA = 4  # 3: each wheel lists its dependency files ("requires"); 4: the signed statement
ACCELERATORS = ("cpu", "cuda")
CPU_TARGETS = ("x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4", "native")
CHECK_STATUSES = ("passed", "failed", "skipped", "upstream")  # upstream: DeepSpeed's own failure, not the wheel's
# CPU features each portable target needs (the ones DeepSpeed's SIMD code uses). "native" has no
# fixed list: such a wheel needs every flag of the machine that built it (recorded in cpu_flags).
TARGET_FLAGS: "dict[str, tuple[str, ...]]" = {
    "x86-64": (),
    "x86-64-v2": ("sse4_2", "popcnt"),
    "x86-64-v3": ("avx2", "fma", "bmi2"),
    "x86-64-v4": ("avx512f", "avx512bw", "avx512dq", "avx512vl"),
}
EXIT_INSTALL = 9  # no wheel fits, a download failed, or the wheelhouse failed a check
EXIT_BAD_WHEELHOUSE = 8
# Everything read from a wheelhouse is read up to a limit far beyond any real one (a manifest of a
# thousand wheels is about 5 MB), so a hostile or damaged file cannot make a node or the build host
# use gigabytes of memory: past the limit it is refused, the limit named.
LIMITS = {
    "manifest": 32 << 20,
    "index page": 8 << 20,
    "wheel": 4 << 30,
    "report": 8 << 20,
    "probe": 1 << 20,
    "signature": 64 << 10,
    "trust": 1 << 20,
    "tool": 8 << 20,
}

# PEP 427 file name: name-version(-build)?-python-abi-platform.whl; no component holds '-'.
_WHEEL_NAME = re.compile(
    r"^(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._]*[A-Za-z0-9])?)-(?P<version>[A-Za-z0-9_.!+]+)"
    r"(?:-(?P<build>\d[A-Za-z0-9_.]*))?-(?P<python>[A-Za-z0-9_.]+)-(?P<abi>[A-Za-z0-9_.]+)"
    r"-(?P<platform>[A-Za-z0-9_.]+)\.whl$"
)
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
PYTHON_TAG_RE = re.compile(r"^cp3\d{1,2}$")
ARCH_RE = re.compile(r"^\d{1,2}\.\d[af]?(\+PTX)?$")
OP_RE = re.compile(r"^[a-z0-9_]{1,64}$")
CPU_FLAG_RE = re.compile(r"^[a-z0-9_.]{1,40}$")


class InstallError(Exception):
    """A problem on the node; `fix` says what to do, `exit_code` is what the process exits with."""

    exit_code = EXIT_INSTALL

    def __init__(self, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.message}\n  fix: {self.fix}" if self.fix else self.message


class ManifestError(InstallError):
    """A wheelhouse file that fails its contract: named with the file and the field."""

    exit_code = EXIT_BAD_WHEELHOUSE


class NoKey(InstallError):
    """Nothing to check the wheelhouse's signature with: refused as a wheelhouse that fails it would be."""

    exit_code = EXIT_BAD_WHEELHOUSE


# ---------------------------------------------------------------- names


@dataclass(frozen=True)
class WheelName:
    project: str  # PEP 503 normalised
    version: str
    python: str
    abi: str
    platform: str


def normalize(name: str) -> str:
    """PEP 503 project name normalisation."""
    return re.sub(r"[-_.]+", "-", name).lower()


def check_wheel_name(name: object, where: str = "wheel name") -> "WheelName":
    """A wheel file name, parsed; ManifestError for anything else (paths, '..', odd characters).

    Only after this is a name safe to join to a folder or a URL.
    """
    if not isinstance(name, str) or "/" in name or "\\" in name or ".." in name or name.startswith("."):
        raise ManifestError(f"{where}: {name!r} is not a wheel file name", "the wheelhouse was edited: re-publish it")
    m = _WHEEL_NAME.match(name)
    if not m:
        raise ManifestError(f"{where}: {name!r} is not a wheel file name", "the wheelhouse was edited: re-publish it")
    return WheelName(normalize(m["name"]), m["version"], m["python"], m["abi"], m["platform"])


def is_wheel_name(name: str) -> bool:
    try:
        check_wheel_name(name)
    except ManifestError:
        return False
    return True


# ---------------------------------------------------------------- the wheelhouse manifest


@dataclass(frozen=True)
class SmokeSummary:
    passed: bool
    finished_at: str
    checks: "Mapping[str, tuple[str, str]]"  # name -> (status, first line of detail)


@dataclass(frozen=True)
class WheelEntry:
    """What manifest.json says of one DeepSpeed wheel; every field also read back from the wheel."""

    name: str
    sha256: str
    version: str
    recipe: str
    accelerator: str
    python_tag: str
    torch: str
    cuda: "str | None"
    archs: "tuple[str, ...]"
    cpu_target: str
    cpu_flags: "tuple[str, ...]"  # the build host's flags, for cpu_target = "native"
    ops: "tuple[str, ...]"
    smoke: "SmokeSummary"
    metadata_sha256: "str | None" = None
    report_sha256: "str | None" = None
    published_at: str = ""
    narrowed_ops: "Mapping[str, tuple[str, ...]]" = field(default_factory=dict)  # op -> the fewer archs it holds
    missing_ops: "Mapping[str, str]" = field(default_factory=dict)  # op the recipe asked for -> why it is not in
    # The dependency files (manifest "dependencies") this wheel installs with, its whole runtime
    # closure but torch; None where an older toolkit published it without the list.
    requires: "tuple[str, ...] | None" = None
    # Ops of a GPU wheel with no device code (cpu_adam, async_io...): host code, whatever the archs.
    # None where an older toolkit published it without the list.
    host_ops: "tuple[str, ...] | None" = None
    # Its size in bytes: a node stops reading past it (a server sending without end); None where an
    # older toolkit published it without one (the generic limit for a wheel applies).
    size: "int | None" = None

    def to_json(self) -> "dict[str, Any]":
        return {
            **({"requires": list(self.requires)} if self.requires is not None else {}),
            **({"host_ops": list(self.host_ops)} if self.host_ops is not None else {}),
            **({"size": self.size} if self.size is not None else {}),
            "sha256": self.sha256,
            "version": self.version,
            "recipe": self.recipe,
            "accelerator": self.accelerator,
            "python_tag": self.python_tag,
            "torch": self.torch,
            "cuda": self.cuda,
            "archs": list(self.archs),
            "cpu_target": self.cpu_target,
            "cpu_flags": list(self.cpu_flags),
            "ops": list(self.ops),
            "narrowed_ops": {op: list(archs) for op, archs in self.narrowed_ops.items()},
            "missing_ops": dict(self.missing_ops),
            "smoke": _smoke_json(self.smoke),
            "metadata_sha256": self.metadata_sha256,
            "report_sha256": self.report_sha256,
            "published_at": self.published_at,
        }


def _smoke_json(smoke: "SmokeSummary") -> "dict[str, Any]":
    return {
        "passed": smoke.passed,
        "finished_at": smoke.finished_at,
        "checks": {n: {"status": s, "detail": d} for n, (s, d) in smoke.checks.items()},
    }


@dataclass(frozen=True)
class FileEntry:
    """A file the wheelhouse serves besides DeepSpeed's wheels (a dependency, the installer)."""

    name: str
    sha256: str
    size: "int | None" = None  # bytes, for the files a node downloads (dependencies); as WheelEntry.size

    def to_json(self) -> "dict[str, Any]":
        return {"sha256": self.sha256, **({"size": self.size} if self.size is not None else {})}


IMAGES = "images"  # OCI archives of CI images, under the wheelhouse (builder.images)
REPORTS = ("coverage.json",)  # reports the wheelhouse keeps beside the wheels: the last matrix run's coverage


@dataclass(frozen=True)
class VariantEntry:
    """A variant wheel (the draft PEPs 817/825): a published CUDA wheel relabelled so that an
    installer that reads variants (uv's preview) picks the build for the node's GPU. Its name is
    the wheel name of `version` plus `-<label>`; its `properties` (empty for the null fallback) are
    also in its dist-info/variant.json and in the `<name>-<version>-variants.json` index file."""

    name: str
    sha256: str
    wheel: str  # the published wheel whose files it carries
    label: str
    properties: "tuple[str, ...]"  # "nvidia :: sm_arch :: 90_real", sorted

    def to_json(self) -> "dict[str, Any]":
        return {"sha256": self.sha256, "wheel": self.wheel, "label": self.label, "properties": list(self.properties)}


@dataclass(frozen=True)
class ImageEntry:
    """What manifest.json says of one CI image: an OCI archive under images/, the image it holds
    (its ID, the config digest `podman images` shows, and the archive's manifest digest), what it
    was built from (base, lock, wheel) and the smoke run inside it."""

    name: str  # images/<file>.oci.tar
    sha256: str  # of the archive file
    image_id: str  # 64 hex: the config digest, the same after podman load / docker load
    digest: str  # sha256:<hex> of the image manifest inside the archive (index.json)
    size: int  # bytes of the archive
    ref: str  # the name it is tagged with inside the archive and after load
    base: str  # the base image as the user named it (or the toolkit's debootstrap base)
    base_id: str  # 64 hex
    lock: str  # locks/<recipe>.lock it was installed from
    lock_sha256: str
    wheel: str  # the DeepSpeed wheel it holds
    python_tag: str
    smoke: "SmokeSummary"
    published_at: str = ""
    # The same root filesystem as a squashfs in Enroot's layout (Slurm's pyxis: srun
    # --container-image=FILE.sqsh): images/<the archive's name less .oci.tar>.sqsh; "" where none.
    squashfs: str = ""
    squashfs_sha256: str = ""
    squashfs_size: int = 0

    def to_json(self) -> "dict[str, Any]":
        squashfs = {"squashfs": {"name": self.squashfs, "sha256": self.squashfs_sha256, "size": self.squashfs_size}}
        return {
            **(squashfs if self.squashfs else {}),
            "sha256": self.sha256,
            "image_id": self.image_id,
            "digest": self.digest,
            "size": self.size,
            "ref": self.ref,
            "base": self.base,
            "base_id": self.base_id,
            "lock": self.lock,
            "lock_sha256": self.lock_sha256,
            "wheel": self.wheel,
            "python_tag": self.python_tag,
            "smoke": _smoke_json(self.smoke),
            "published_at": self.published_at,
        }


@dataclass(frozen=True)
class WheelhouseManifest:
    wheels: "Mapping[str, WheelEntry]" = field(default_factory=dict)
    dependencies: "Mapping[str, FileEntry]" = field(default_factory=dict)  # DeepSpeed's runtime closure
    tools: "Mapping[str, FileEntry]" = field(default_factory=dict)  # path under the wheelhouse -> file
    images: "Mapping[str, ImageEntry]" = field(default_factory=dict)  # images/<file> -> CI image
    reports: "Mapping[str, FileEntry]" = field(default_factory=dict)  # coverage.json of the last matrix run
    variants: "Mapping[str, VariantEntry]" = field(default_factory=dict)  # variant wheels (experimental)
    variant_indexes: "Mapping[str, FileEntry]" = field(default_factory=dict)  # <name>-<version>-variants.json
    # locks/<recipe>.lock, locks/pylock.<recipe>.toml, locks/<recipe>.Containerfile: what `lock` wrote,
    # inside the signed statement like every other file an installer may read.
    locks: "Mapping[str, FileEntry]" = field(default_factory=dict)
    # The signed statement (schema 4): manifest.json.sig signs these bytes, so nodes trust the
    # fields below only after the signature checks out (see "trust" below).
    serial: int = 0  # grows by one with every signed write; a node refuses one older than it saw
    expires: str = ""  # UTC, "2026-12-22T10:00:00Z": a node refuses the manifest after it
    wheelhouse_id: str = ""  # made once, at the first signed write; copies keep it (the serial's scope)
    signer: str = ""  # "ssh-ed25519 AAAA...": the key that signs this manifest (shown on the page)

    def to_json(self) -> str:
        optional: dict[str, Mapping[str, ImageEntry | FileEntry | VariantEntry]] = {
            "images": self.images, "reports": self.reports, "variants": self.variants,
            "variant_indexes": self.variant_indexes, "locks": self.locks,
        }  # fmt: skip
        data = {
            "schema": MANIFEST_SCHEMA,
            "wheels": {n: e.to_json() for n, e in sorted(self.wheels.items())},
            "dependencies": {n: e.to_json() for n, e in sorted(self.dependencies.items())},
            "tools": {n: e.to_json() for n, e in sorted(self.tools.items())},
            **{key: {n: e.to_json() for n, e in sorted(table.items())} for key, table in optional.items() if table},
            **({"serial": self.serial, "expires": self.expires, "wheelhouse_id": self.wheelhouse_id,
                "signer": self.signer} if self.serial else {}),
        }  # fmt: skip
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    def projects(self) -> "dict[str, list[str]]":
        """PEP 503 project -> the file names the index must link for it."""
        out: dict[str, list[str]] = {}
        for name in [*self.wheels, *self.dependencies]:
            out.setdefault(check_wheel_name(name).project, []).append(name)
        for name in self.variants:
            out.setdefault(split_variant_name(name)[0].project, []).append(name)
        for name in self.variant_indexes:
            out.setdefault(check_variants_json_name(name)[0], []).append(name)
        return {p: sorted(names) for p, names in sorted(out.items())}

    def file_sha256(self, name: str) -> str:
        entry = (self.wheels.get(name) or self.dependencies.get(name) or self.variants.get(name)
                 or self.variant_indexes.get(name))  # fmt: skip
        if entry is None:
            raise KeyError(name)
        return entry.sha256


class Fields:
    """Typed access to one JSON object; every failure names the file and the field."""

    def __init__(self, data: object, where: str) -> None:
        if not isinstance(data, dict):
            raise ManifestError(f"{where} is not a JSON object", "re-publish the wheelhouse")
        self.data: dict[str, Any] = data
        self.where = where

    def fail(self, key: str, why: str) -> "ManifestError":
        return ManifestError(f"{self.where}: field {key!r} {why}", "the file was edited or damaged: re-publish it")

    def get(self, key: str, kind: "type | tuple[type, ...]", optional: bool = False) -> Any:
        if key not in self.data:
            if optional:
                return None
            raise self.fail(key, "is missing")
        value = self.data[key]
        if value is None and optional:
            return None
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.fail(key, f"has the wrong type ({type(value).__name__})")
        return value

    def text(self, key: str, pattern: "re.Pattern[str] | None" = None, optional: bool = False) -> Any:
        value = self.get(key, str, optional)
        if value is not None and pattern is not None and not pattern.match(value):
            raise self.fail(key, f"is not valid: {value[:80]!r}")
        return value

    def choice(self, key: str, choices: "Sequence[str]") -> str:
        value: str = self.get(key, str)
        if value not in choices:
            raise self.fail(key, f"is {value[:40]!r}, not one of {', '.join(choices)}")
        return value

    def texts(self, key: str, pattern: "re.Pattern[str]", optional: bool = False) -> "tuple[str, ...]":
        value = self.get(key, list, optional)
        if value is None:
            return ()
        for item in value:
            if not isinstance(item, str) or not pattern.match(item):
                raise self.fail(key, f"holds an invalid item {str(item)[:80]!r}")
        return tuple(value)

    def table(self, key: str, optional: bool = False) -> "dict[str, Any]":
        value = self.get(key, dict, optional)
        return value if value is not None else {}

    def size(self, key: str, limit: int) -> "int | None":
        """An optional size in bytes: a whole number from 1 to `limit`."""
        value: int | None = self.get(key, int, optional=True)
        if value is not None and not 0 < value <= limit:
            raise self.fail(key, f"is {value if abs(value) < 1 << 64 else 'out of range'}, not a size from 1 "
                                 f"to {limit} bytes")  # fmt: skip
        return value


VERSION_RE = re.compile(r"^[A-Za-z0-9.+!_-]{1,80}$")
_ID_RE = re.compile(r"^[0-9a-f]{32}$")
KEY_LINE_RE = re.compile(r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)|sk-ssh-ed25519@openssh\.com) "
                         r"[A-Za-z0-9+/]{20,1400}={0,2}$")  # fmt: skip
CUDA_RE = re.compile(r"^\d{1,2}\.\d{1,2}(\.\d+)?$")
# A torch build as PyTorch's indexes name it (cpu, cu126, cu130), and where one comes from: an index URL.
TORCH_VARIANT_RE = re.compile(r"^(cpu|cu[1-9][0-9][0-9])$")
# An index URL: printable, no credentials (user:TOKEN@host or ?token=... would be printed, logged and embedded).
INDEX_URL_RE = re.compile(r"^(https?|file)://(?![^/]*@)[^\s\x00-\x1f\x7f?#]{1,400}$")


def url_secret(url: str) -> "str | None":
    """What in `url` may be a secret, in words (None: nothing): a user name or password, a query
    string (?token=..., a signed URL's signature) or a fragment. None of them belongs in a package
    index's or a wheelhouse's URL, and each would be printed, logged and embedded where the URL goes."""
    rest = url.partition("://")[2] if "://" in url else ""
    if "@" in rest.partition("/")[0]:
        return "a user name or password (user:TOKEN@host)"
    if "?" in url:
        return "a query string (?token=..., a signed URL's signature)"
    if "#" in url:
        return "a fragment (#...)"
    return None


def torch_variant(cuda: "str | None") -> str:
    """The build of a torch as PyTorch's indexes name it: cpu, cu126 (CUDA 12.6), cu130."""
    if not cuda:
        return "cpu"
    major, minor = cuda.split(".")[:2]
    return f"cu{major}{minor}"


GLIBC_RE = re.compile(r"^\d{1,2}\.\d{1,3}$")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
STAMP_RE = re.compile(r"^[0-9T:+.\-Z ]{0,40}$")


def arch_table(f: "Fields", key: str) -> "dict[str, tuple[str, ...]]":
    """An optional {op: [arch, ...]} field, every name and arch checked."""
    table = f.table(key, optional=True)
    inner = Fields(table, f"{f.where}.{key}")
    for op in table:
        if not OP_RE.match(op):
            raise f.fail(key, f"holds an invalid op name {op[:80]!r}")
    return {op: inner.texts(op, ARCH_RE) for op in table}


def reason_table(f: "Fields", key: str) -> "dict[str, str]":
    """An optional {op: why} field: valid op names, reasons of text."""
    table = f.table(key, optional=True)
    for op, why in table.items():
        if not OP_RE.match(op):
            raise f.fail(key, f"holds an invalid op name {op[:80]!r}")
        if not isinstance(why, str) or len(why) > 4000:
            raise f.fail(key, f"says of {op} something that is not a short text")
    return dict(table)


def op_rows(
    ops: "Sequence[str]",
    missing: "Mapping[str, str]",
    archs: "Sequence[str]",
    narrowed: "Mapping[str, Sequence[str]]",
    checks: "Mapping[str, tuple[str, str]]",
    host_ops: "Sequence[str]" = (),
) -> "list[dict[str, str]]":
    """One row per op the recipe asked for: built or why not, the archs its code holds, and what
    the smoke found when loading it and checking what it computes (`checks`: name -> (status, detail))."""
    rows = []
    for op in sorted({*ops, *missing}):
        if op in missing:
            rows.append({"op": op, "built": "no", "archs": "-", "loaded": "-", "checked": "-", "why": missing[op]})
            continue
        held = () if op in host_ops else narrowed.get(op, archs)
        load = checks.get(f"load:{op}", ("not run", ""))
        check = checks.get(f"numerics:{op}", ("not run", "no check of what it computes"))
        why = check[1] if check[0] != "passed" else ""
        if load[0] not in ("passed", "not run"):
            why = load[1]
        rows.append({"op": op, "built": "yes", "archs": ";".join(held) or "cpu", "loaded": load[0],
                     "checked": check[0], "why": why})  # fmt: skip
    return rows


def op_table(entry: "WheelEntry") -> "list[dict[str, str]]":
    """The op rows of a published wheel, from its manifest entry and its smoke summary."""
    return op_rows(entry.ops, entry.missing_ops, entry.archs, entry.narrowed_ops, entry.smoke.checks,
                   entry.host_ops or ())  # fmt: skip


def format_op_rows(rows: "Sequence[Mapping[str, str]]") -> "list[str]":
    """The op table as aligned text lines (install --dry-run, build-wheel)."""
    lines = []
    for row in rows:
        why = f"  ({shorten(row['why'], 300)})" if row["why"] else ""
        lines.append(f"op {row['op']:24} built {row['built']:3} archs {row['archs']:10} loaded {row['loaded']:8} "
                     f"checked {row['checked']}{why}")  # fmt: skip
    return lines


CONFIG_MATRIX = "config:matrix/"
CONFIG_SITE = "config:site/"
_OFFLOAD = {"none": "", "cpu": " + CPU offload", "nvme": " + NVMe offload"}
_DTYPE_ORDER = {"fp32": 0, "fp16": 1, "bf16": 2}


def dtypes_of(cells: "Mapping[tuple[int, str, str], str]") -> "list[str]":
    """The dtypes of a config grid, fp32 first."""
    return sorted({d for _, _, d in cells}, key=lambda d: (_DTYPE_ORDER.get(d, 9), d))


def config_category(status: str, detail: str) -> str:
    """What a config check says, in a word or three (the page's grid, install --dry-run)."""
    if status == "passed":
        return "runs"
    if status == "failed":
        return "FAILED"
    if status == "upstream":
        return "fails in DeepSpeed itself"
    if detail.startswith("needs op "):
        return "needs " + detail[len("needs op ") :].split(", which")[0]
    if detail.startswith("not supported by DeepSpeed"):
        return "not supported by DeepSpeed"
    if "torch.compile" in detail:
        return "needs a compiler (torch.compile)"
    if detail.startswith("no GPU visible"):
        return "not run (no GPU)"
    return "skipped"


# The smoke's matrix optimizers in the order people read them (builder.configs runs these).
CONFIG_OPTIMIZERS = ("Adam", "AdamW", "Adagrad", "Lion", "Lamb", "Muon")
_OFFLOAD_ORDER = {"none": 0, "cpu": 1, "nvme": 2}


def _config_order(name: str) -> "tuple[Any, ...]":
    parts = name[len(CONFIG_MATRIX) :].split("/")
    if len(parts) != 4:
        return (99, name)
    optimizer, zero, offload, dtype = parts
    rank = CONFIG_OPTIMIZERS.index(optimizer) if optimizer in CONFIG_OPTIMIZERS else len(CONFIG_OPTIMIZERS)
    return (rank, optimizer, zero, _OFFLOAD_ORDER.get(offload, 9), _DTYPE_ORDER.get(dtype, 9), name)


def config_matrix(checks: "Mapping[str, tuple[str, str]]") -> "dict[str, dict[tuple[int, str, str], str]]":
    """optimizer -> (ZeRO stage, offload, dtype) -> category, from the smoke's matrix checks, in one
    order whatever order the checks come in (the page must render the same from any copy)."""
    grid: dict[str, dict[tuple[int, str, str], str]] = {}
    for name in sorted((n for n in checks if n.startswith(CONFIG_MATRIX)), key=_config_order):
        status, detail = checks[name]
        if not name.startswith(CONFIG_MATRIX):
            continue
        parts = name[len(CONFIG_MATRIX) :].split("/")
        if len(parts) != 4 or not parts[1].startswith("zero") or not parts[1][4:].isdigit():
            continue
        optimizer, zero, offload, dtype = parts
        grid.setdefault(optimizer, {})[(int(zero[4:]), offload, dtype)] = config_category(status, detail)
    return grid


def _stages(stages: "Sequence[int]") -> str:
    ordered = sorted(stages)
    if len(ordered) > 1 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"ZeRO {ordered[0]}-{ordered[-1]}"
    return "ZeRO " + ",".join(map(str, ordered))


def format_configs(checks: "Mapping[str, tuple[str, str]]") -> "list[str]":
    """The config matrix collapsed to a line per optimizer, then one per site config:
    `Adam: runs ZeRO 1-3 + CPU offload; needs fused_adam: ZeRO 0-3`."""
    lines = []
    for optimizer, cells in config_matrix(checks).items():
        dtypes = dtypes_of(cells)
        by_category: dict[str, dict[tuple[str, tuple[str, ...]], list[int]]] = {}
        for (stage, offload, _dtype), category in sorted(cells.items()):
            same = tuple(d for d in dtypes if cells.get((stage, offload, d)) == category)
            group = by_category.setdefault(category, {}).setdefault((offload, same), [])
            if stage not in group:
                group.append(stage)
        parts = []
        for category, groups in by_category.items():
            where = []
            for (offload, same), stages in groups.items():
                only = f" ({', '.join(same)})" if list(same) != dtypes else ""
                where.append(f"{_stages(stages)}{_OFFLOAD.get(offload, ' + ' + offload)}{only}")
            parts.append(f"{category}: {', '.join(dict.fromkeys(where))}")
        lines.append(f"config {optimizer:8} " + "; ".join(parts))
    for name, (status, detail) in sorted(checks.items()):
        if name.startswith(CONFIG_SITE):
            lines.append(
                f"config {name[len(CONFIG_SITE) :]}: {config_category(status, detail)} ({shorten(detail, 200)})"
            )
    return lines


def shorten(text: str, width: int) -> str:
    """`text` on one line, cut at a word (never mid-word) with " ..." where it is longer than `width`."""
    flat = " ".join(text.split())
    if len(flat) <= width:
        return flat
    return flat[: width - 4].rsplit(" ", 1)[0] + " ..."


def host_ops_of(build: "Mapping[str, Any]") -> "list[str] | None":
    """The ops of a GPU build with no device code in their .so (the build manifest's op_archs)."""
    op_archs = build.get("op_archs")
    if not isinstance(op_archs, dict) or not build.get("archs"):
        return None if not isinstance(op_archs, dict) else []
    return sorted(op for op in build.get("ops") or [] if op in op_archs and not op_archs[op])


def parse_wheel_entry(name: str, data: object, where: str) -> "WheelEntry":
    wheel = check_wheel_name(name, f"{where}: wheels")
    f = Fields(data, f"{where}: wheels[{name}]")
    entry = WheelEntry(
        name=name,
        sha256=f.text("sha256", SHA256_RE),
        version=f.text("version", VERSION_RE),
        recipe=f.text("recipe", NAME_RE),
        accelerator=f.choice("accelerator", ACCELERATORS),
        python_tag=f.text("python_tag", PYTHON_TAG_RE),
        torch=f.text("torch", VERSION_RE),
        cuda=f.text("cuda", CUDA_RE, optional=True),
        archs=f.texts("archs", ARCH_RE),
        cpu_target=f.choice("cpu_target", CPU_TARGETS),
        cpu_flags=f.texts("cpu_flags", CPU_FLAG_RE, optional=True),
        ops=f.texts("ops", OP_RE),
        narrowed_ops=arch_table(f, "narrowed_ops"),
        missing_ops=reason_table(f, "missing_ops"),
        smoke=parse_smoke_summary(f),
        metadata_sha256=f.text("metadata_sha256", SHA256_RE, optional=True),
        report_sha256=f.text("report_sha256", SHA256_RE, optional=True),
        published_at=f.text("published_at", STAMP_RE, optional=True) or "",
        requires=_requires(f),
        host_ops=f.texts("host_ops", OP_RE) if "host_ops" in f.data else None,
        size=f.size("size", LIMITS["wheel"]),
    )
    if wheel.version != entry.version:
        raise f.fail("version", f"is {entry.version!r} but the file name says {wheel.version!r}")
    if wheel.python != entry.python_tag:
        raise f.fail("python_tag", f"is {entry.python_tag!r} but the file name says {wheel.python!r}")
    for key, why in label_contradictions(entry):
        raise f.fail(key, why)
    return entry


def parse_smoke_summary(f: "Fields") -> "SmokeSummary":
    """An entry's "smoke" field: each check's status and detail, and a verdict its checks bear out."""
    smoke = Fields(f.get("smoke", dict), f"{f.where}.smoke")
    checks: dict[str, tuple[str, str]] = {}
    for check, value in smoke.table("checks").items():
        c = Fields(value, f"{smoke.where}.checks[{check[:60]}]")
        checks[check] = (c.choice("status", CHECK_STATUSES), c.get("detail", str))
    passed = smoke.get("passed", bool)
    if passed and (
        not any(s == "passed" for s, _ in checks.values()) or any(s == "failed" for s, _ in checks.values())
    ):
        raise smoke.fail("passed", "is true, but its checks do not say so")
    return SmokeSummary(passed, smoke.text("finished_at", STAMP_RE), checks)


# images/<file>.oci.tar: one path component under images/, no leading dot, no '..'.
IMAGE_NAME_RE = re.compile(rf"^{IMAGES}/[A-Za-z0-9][A-Za-z0-9_+-]*(?:\.[A-Za-z0-9_+-]+)*\.oci\.tar$")
LOCK_NAME_RE = re.compile(r"^locks/[A-Za-z0-9][A-Za-z0-9._-]{0,80}\.lock$")
# Every file `lock` writes: the requirements lock, its PEP 751 twin and its Containerfile.
LOCK_FILE_RE = re.compile(
    r"^locks/(?:pylock\.[A-Za-z0-9][A-Za-z0-9._-]{0,80}\.toml|[A-Za-z0-9][A-Za-z0-9._-]{0,80}\.(?:lock|Containerfile))$"
)
SQUASHFS_NAME_RE = re.compile(rf"^{IMAGES}/[A-Za-z0-9][A-Za-z0-9_+-]*(?:\.[A-Za-z0-9_+-]+)*\.sqsh$")
IMAGE_ID_RE = SHA256_RE
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
# An image reference as podman prints it: registry/path:tag, printable and short.
IMAGE_REF_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}$")


def check_image_name(name: object, where: str) -> str:
    """An image archive's manifest key, checked before it is joined to a folder or a URL."""
    if not isinstance(name, str) or ".." in name or not IMAGE_NAME_RE.match(name):
        raise ManifestError(f"{where}: {str(name)[:80]!r} is not an image archive name (images/<name>.oci.tar)",
                            "the wheelhouse was edited: re-publish the image")  # fmt: skip
    return name


def squashfs_name(archive: str) -> str:
    """The squashfs of an image archive: images/<stem>.oci.tar -> images/<stem>.sqsh."""
    return archive[: -len(".oci.tar")] + ".sqsh"


def check_image_file(name: object, where: str) -> str:
    """A file under images/ (an archive or its squashfs), checked before it is joined to a folder."""
    if isinstance(name, str) and ".." not in name and SQUASHFS_NAME_RE.match(name):
        return name
    return check_image_name(name, where)


def image_files(manifest: "WheelhouseManifest") -> "dict[str, str]":
    """Every file the images of the manifest have under images/ -> its sha256."""
    files = {n: e.sha256 for n, e in manifest.images.items()}
    files.update({e.squashfs: e.squashfs_sha256 for e in manifest.images.values() if e.squashfs})
    return files


def parse_image_entry(name: str, data: object, where: str) -> "ImageEntry":
    check_image_name(name, f"{where}: images")
    f = Fields(data, f"{where}: images[{name}]")
    size = f.get("size", int)
    if size <= 0:
        raise f.fail("size", "is not a positive number of bytes")
    squashfs, squashfs_sha256, squashfs_size = "", "", 0
    if "squashfs" in f.data:
        sq = Fields(f.get("squashfs", dict), f"{f.where}.squashfs")
        squashfs = sq.text("name", SQUASHFS_NAME_RE)
        if squashfs != squashfs_name(name):
            raise sq.fail("name", f"is not {squashfs_name(name)}, the squashfs of this archive")
        squashfs_sha256 = sq.text("sha256", SHA256_RE)
        found = sq.size("size", 1 << 40)
        if found is None:
            raise sq.fail("size", "is missing")
        squashfs_size = found
    wheel: str = f.get("wheel", str)
    check_wheel_name(wheel, f"{f.where}.wheel")
    return ImageEntry(
        name=name,
        sha256=f.text("sha256", SHA256_RE),
        image_id=f.text("image_id", IMAGE_ID_RE),
        digest=f.text("digest", DIGEST_RE),
        size=size,
        ref=f.text("ref", IMAGE_REF_RE),
        base=f.text("base", IMAGE_REF_RE),
        base_id=f.text("base_id", IMAGE_ID_RE),
        lock=f.text("lock", LOCK_NAME_RE),
        lock_sha256=f.text("lock_sha256", SHA256_RE),
        wheel=wheel,
        python_tag=f.text("python_tag", PYTHON_TAG_RE),
        smoke=parse_smoke_summary(f),
        published_at=f.text("published_at", STAMP_RE, optional=True) or "",
        squashfs=squashfs,
        squashfs_sha256=squashfs_sha256,
        squashfs_size=squashfs_size,
    )


# A variant wheel's label and properties (the draft PEP 817): `namespace :: feature :: value`.
VARIANT_LABEL_RE = re.compile(r"^[0-9a-z._]{1,64}$")
VARIANT_PROPERTY_RE = re.compile(r"^[a-z0-9_]{1,64} :: [a-z0-9_]{1,64} :: [a-z0-9_.]{1,64}$")
NULL_VARIANT = "null"  # the fallback variant: no properties, taken where no other variant fits
_VARIANTS_JSON = re.compile(r"^(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._]*[A-Za-z0-9])?)-(?P<version>[A-Za-z0-9_.!+]+)"
                            r"-variants\.json$")  # fmt: skip


def split_variant_name(name: object, where: str = "variant wheel name") -> "tuple[WheelName, str]":
    """A variant wheel's file name: the wheel name it extends (parsed) and its label."""
    if not isinstance(name, str) or not name.endswith(".whl") or name.count("-") < 5:
        raise ManifestError(f"{where}: {str(name)[:80]!r} is not a variant wheel name", "re-publish the wheelhouse")
    base, _, label = name[: -len(".whl")].rpartition("-")
    if not VARIANT_LABEL_RE.match(label):
        raise ManifestError(f"{where}: {name[:80]!r} has no valid variant label", "re-publish the wheelhouse")
    return check_wheel_name(f"{base}.whl", where), label


def check_variants_json_name(name: object, where: str = "variants index name") -> "tuple[str, str]":
    """`<name>-<version>-variants.json`: its (PEP 503 project, version)."""
    m = _VARIANTS_JSON.match(name) if isinstance(name, str) and ".." not in name else None
    if not m:
        raise ManifestError(f"{where}: {str(name)[:80]!r} is not a <name>-<version>-variants.json name",
                            "re-publish the wheelhouse")  # fmt: skip
    return normalize(m["name"]), m["version"]


def parse_variant_entry(name: str, data: object, where: str, wheels: "Mapping[str, WheelEntry]") -> "VariantEntry":
    wheel_name, label = split_variant_name(name, f"{where}: variants")
    f = Fields(data, f"{where}: variants[{name}]")
    entry = VariantEntry(name, f.text("sha256", SHA256_RE), f.get("wheel", str), f.text("label", VARIANT_LABEL_RE),
                         f.texts("properties", VARIANT_PROPERTY_RE))  # fmt: skip
    source = wheels.get(entry.wheel)
    if source is None:
        raise f.fail("wheel", f"names {entry.wheel[:80]!r}, which no wheel entry lists")
    if entry.label != label:
        raise f.fail("label", f"is {entry.label!r} but the file name says {label!r}")
    if (label == NULL_VARIANT) == bool(entry.properties):
        raise f.fail("properties", "must be empty for the null variant and only for it")
    plain = check_wheel_name(source.name)
    if WheelName(plain.project, wheel_name.version, plain.python, plain.abi, plain.platform) != wheel_name:
        raise f.fail("wheel", f"is {entry.wheel}, another project or platform than {name}")
    return entry


def _requires(f: "Fields") -> "tuple[str, ...] | None":
    """An entry's dependency file names, each a wheel file name; None where the field is absent."""
    if "requires" not in f.data:
        return None
    names = f.get("requires", list)
    for name in names:
        check_wheel_name(name, f"{f.where}.requires")
    return tuple(names)


# The local version label build-wheel stamps: cpu.torch2.13, cu130.torch2.14.sm90 (builder.wheelbuild.plan).
_LABEL = re.compile(r"^(?:(?P<cpu>cpu)|cu(?P<cuda>\d{2,4}))\.torch(?P<torch>\d+\.\d+)(?:\..*)?$")


def label_contradictions(entry: "WheelEntry") -> "list[tuple[str, str]]":
    """Fields that contradict what the wheel's own file name says it was built for (its local label).

    The name is what pip and every reader see; a manifest whose fields say otherwise was edited.
    """
    m = _LABEL.match(entry.version.partition("+")[2])
    if not m:
        return []  # a label this toolkit did not write: nothing to compare
    out = []
    if (entry.accelerator == "cpu") != bool(m["cpu"]):
        out.append(("accelerator", f"is {entry.accelerator!r} but the file name says {entry.version!r}"))
    if m["cuda"] and (not entry.cuda or "".join(entry.cuda.split(".")[:2]) != m["cuda"]):
        out.append(("cuda", f"is {entry.cuda!r} but the file name says CUDA from {entry.version!r}"))
    if ".".join(_public(entry.torch).split(".")[:2]) != m["torch"]:
        out.append(("torch", f"is {entry.torch!r} but the file name says torch {m['torch']}"))
    return out


def _file_entries(
    table: "Mapping[str, Any]", where: str, names_are_wheels: bool, allowed: "Sequence[str]" = (INSTALLER, CONFIG_CHECK)
) -> "dict[str, FileEntry]":
    out = {}
    for name, value in table.items():
        if names_are_wheels:
            check_wheel_name(name, where)
        elif name not in allowed:
            raise ManifestError(f"{where}: unknown file {name[:80]!r}", "re-publish the wheelhouse")
        f = Fields(value, f"{where}[{name}]")
        out[name] = FileEntry(name, f.text("sha256", SHA256_RE), f.size("size", LIMITS["wheel"]))
    return out


def parse_manifest(text: "str | bytes", where: str = MANIFEST_FILE) -> "WheelhouseManifest":
    """Validate a wheelhouse manifest; ManifestError naming the file and field of the first problem."""
    try:
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{where} is not valid JSON ({exc})", "re-publish the wheelhouse") from exc
    top = Fields(data, where)
    schema = top.get("schema", int)
    if schema not in range(1, MANIFEST_SCHEMA + 1):
        raise top.fail("schema", f"is {schema}; this toolkit reads 1 to {MANIFEST_SCHEMA}")
    wheels = {n: parse_wheel_entry(n, v, where) for n, v in top.table("wheels").items()}
    deps = _file_entries(top.table("dependencies", optional=True), f"{where}: dependencies", True)
    tools = _file_entries(top.table("tools", optional=True), f"{where}: tools", False)
    clash = set(wheels) & set(deps)
    if clash:
        raise ManifestError(f"{where}: {sorted(clash)[0]} is listed as a wheel and as a dependency", "re-publish")
    for name, entry in wheels.items():
        unlisted = [n for n in entry.requires or () if n not in deps]
        if unlisted:
            raise ManifestError(f"{where}: wheels[{name}] requires {unlisted[0]!r}, which no dependency entry lists",
                                "the manifest was edited: re-publish the wheelhouse")  # fmt: skip
    images = {n: parse_image_entry(n, v, where) for n, v in top.table(IMAGES, optional=True).items()}
    for name, image in images.items():
        if image.wheel not in wheels:
            raise ManifestError(f"{where}: images[{name}] holds {image.wheel}, which no wheel entry lists",
                                "the manifest was edited: re-publish the image")  # fmt: skip
        if image.python_tag != wheels[image.wheel].python_tag:
            raise ManifestError(f"{where}: images[{name}]: python_tag {image.python_tag!r} is not its wheel's",
                                "the manifest was edited: re-publish the image")  # fmt: skip
    reports = _file_entries(top.table("reports", optional=True), f"{where}: reports", False, REPORTS)
    variants = {n: parse_variant_entry(n, v, where, wheels) for n, v in top.table("variants", optional=True).items()}
    indexes = {}
    for name, value in top.table("variant_indexes", optional=True).items():
        check_variants_json_name(name, f"{where}: variant_indexes")
        indexes[name] = FileEntry(name, Fields(value, f"{where}: variant_indexes[{name}]").text("sha256", SHA256_RE))
    for name in variants:
        wheel_name, _ = split_variant_name(name)
        index = f"{wheel_name.project.replace('-', '_')}-{wheel_name.version}-variants.json"
        if index not in indexes:
            raise ManifestError(f"{where}: variants[{name}] has no {index} in variant_indexes",
                                "the manifest was edited: re-publish with --variants")  # fmt: skip
    clash = set(variants) & (set(wheels) | set(deps))
    if clash:
        raise ManifestError(f"{where}: {sorted(clash)[0]} is listed twice", "re-publish the wheelhouse")
    locks = {}
    for name, value in top.table("locks", optional=True).items():
        if ".." in name or not LOCK_FILE_RE.match(name):
            raise ManifestError(f"{where}: locks: {name[:80]!r} is not a file `lock` writes (locks/<recipe>.lock, "
                                "locks/pylock.<recipe>.toml, locks/<recipe>.Containerfile)",
                                "the manifest was edited: re-run `lock`")  # fmt: skip
        locks[name] = FileEntry(name, Fields(value, f"{where}: locks[{name}]").text("sha256", SHA256_RE))
    serial = top.get("serial", int, optional=True) or 0
    if not 0 <= serial < 1 << 63:
        raise top.fail("serial", "is out of range (0 to 2^63 - 1)")
    statement = (top.text("expires", STAMP_RE, optional=True) or "", top.text("wheelhouse_id", _ID_RE, optional=True)
                 or "", top.text("signer", KEY_LINE_RE, optional=True) or "")  # fmt: skip
    if serial and not all(statement):
        raise top.fail("serial", "is set without expires, wheelhouse_id and signer")
    if serial and parse_stamp(statement[0]) is None:
        raise top.fail("expires", f"is not a UTC time: {statement[0]!r}")
    if statement[2]:
        try:
            fingerprint_of(statement[2])
        except InstallError as exc:
            raise top.fail("signer", "is not a public key") from exc
    return WheelhouseManifest(wheels, deps, tools, images, reports, variants, indexes, locks, serial, *statement)


# ---------------------------------------------------------------- the build manifest inside a wheel


def embedded_build_manifest(wheel: "zipfile.ZipFile", where: str) -> "dict[str, Any]":
    """The ds_builder.json inside a wheel (the top-level *.dist-info only), as a JSON object."""
    names = [n for n in wheel.namelist() if n.count("/") == 1 and n.endswith(f".dist-info/{BUILD_MANIFEST}")]
    if len(names) != 1:
        raise ManifestError(f"{where} holds {len(names)} {BUILD_MANIFEST} files, not one", "rebuild the wheel")
    try:
        data = json.loads(read_member(wheel, names[0], f"{where}: {names[0]}"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{where}: {BUILD_MANIFEST} is not valid JSON ({exc})", "rebuild the wheel") from exc
    if not isinstance(data, dict):
        raise ManifestError(f"{where}: {BUILD_MANIFEST} is not a JSON object", "rebuild the wheel")
    return data


def read_member(wheel: "zipfile.ZipFile", name: str, where: str) -> bytes:
    """A small file inside a wheel (a manifest, METADATA), refused past the report limit before it is
    inflated: a zip member's declared size is checked, and what is read is capped all the same."""
    limit = LIMITS["report"]
    if wheel.getinfo(name).file_size > limit:
        raise too_big("report", where)
    with wheel.open(name) as member:
        return read_limited(member, "report", where)


def facts_of_build(build: "Mapping[str, Any]") -> "dict[str, Any]":
    """The fields a wheelhouse entry repeats from the wheel's own build manifest."""
    torch: Mapping[str, Any] = build["torch"] if isinstance(build.get("torch"), dict) else {}
    recipe: Mapping[str, Any] = build["recipe"] if isinstance(build.get("recipe"), dict) else {}
    return {
        "version": build.get("version"),
        "recipe": recipe.get("name"),
        "accelerator": build.get("accelerator"),
        "python_tag": build.get("python_tag"),
        "torch": torch.get("version"),
        "cuda": torch.get("cuda"),
        "archs": list(build.get("archs") or []),
        "cpu_target": build.get("cpu_target"),
        "cpu_flags": list(build.get("cpu_flags") or []),
        "ops": list(build.get("ops") or []),
        "narrowed_ops": dict(build.get("narrowed_ops") or {}),
        "missing_ops": dict(build.get("missing_ops") or {}),
        "host_ops": host_ops_of(build),
    }


def entry_differences(entry: "WheelEntry", build: "Mapping[str, Any]") -> "list[str]":
    """Fields where the manifest entry and the wheel's embedded build manifest disagree."""
    mine = {k: v for k, v in entry.to_json().items() if k in facts_of_build({})}
    theirs = facts_of_build(build)
    return [f"{k}: manifest says {mine[k]!r}, the wheel says {theirs[k]!r}" for k in mine if mine[k] != theirs[k]]


# ---------------------------------------------------------------- choosing a wheel


@dataclass(frozen=True)
class Node:
    python_tag: str
    torch: "str | None"
    cuda: "str | None"
    gpus: "tuple[str, ...]" = ()
    cpu_flags: "frozenset[str]" = field(default_factory=frozenset)
    glibc: "str | None" = None  # "2.36"; None where the C library is not glibc or unknown

    def describe(self) -> str:
        gpus = ", ".join(self.gpus) or "none"
        simd = " ".join(sorted(f for f in self.cpu_flags if f.startswith(("avx", "fma", "sse4")))) or "-"
        return (f"python {self.python_tag}, torch {self.torch or 'not installed'}, CUDA {self.cuda or 'none'}, "
                f"GPU compute capabilities {gpus}, CPU {simd}, glibc {self.glibc or 'unknown'}")  # fmt: skip

    def to_json(self) -> "dict[str, Any]":
        return {"python_tag": self.python_tag, "torch": self.torch, "cuda": self.cuda, "gpus": list(self.gpus),
                "cpu_flags": sorted(self.cpu_flags), "glibc": self.glibc}  # fmt: skip


_MANYLINUX = re.compile(r"^manylinux_(\d+)_(\d+)_")
_LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


def glibc_floor(platform_tag: str) -> "tuple[int, int] | None":
    """The glibc (major, minor) a wheel's platform tag needs (manylinux_2_35_x86_64: 2.35); None
    for a plain linux tag, which promises nothing."""
    floors = []
    for tag in platform_tag.split("."):
        m = _MANYLINUX.match(tag)
        if m:
            floors.append((int(m[1]), int(m[2])))
        elif tag.split("_")[0] in _LEGACY_MANYLINUX:
            floors.append(_LEGACY_MANYLINUX[tag.split("_")[0]])
    return min(floors) if floors else None


# The glibc of the releases clusters run, per family, oldest first (each family's first release
# with a glibc >= N is what "glibc N or newer" means there). Sources: each release's glibc package.
OS_GLIBC = (
    ("RHEL", (("7", (2, 17)), ("8", (2, 28)), ("9", (2, 34)), ("10", (2, 39)))),
    ("Debian", (("9", (2, 24)), ("10", (2, 28)), ("11", (2, 31)), ("12", (2, 36)), ("13", (2, 41)))),
    ("Ubuntu", (("16.04", (2, 23)), ("18.04", (2, 27)), ("18.10", (2, 28)), ("20.04", (2, 31)), ("22.04", (2, 35)),
                ("24.04", (2, 39)))),
)  # fmt: skip


def floor_systems(floor: "tuple[int, int]") -> str:
    """The releases a glibc floor reaches, for people: (2, 28) -> "RHEL 8+, Debian 10+, Ubuntu 18.10+"."""
    out = []
    for family, releases in OS_GLIBC:
        first = next((name for name, glibc in releases if glibc >= floor), None)
        if first is not None:
            out.append(f"{family} {first}+")
    return ", ".join(out) or "no release listed here"


def describe_floor(platform_tag: str) -> str:
    """What a wheel's platform tag asks of a node, in words: "glibc 2.28 or newer: RHEL 8+, Debian
    10+, Ubuntu 18.10+"; a plain linux tag promises nothing."""
    floor = glibc_floor(platform_tag)
    if floor is None:
        return "no glibc floor stated (a plain linux tag: it may need the build host's glibc)"
    return f"glibc {floor[0]}.{floor[1]} or newer: {floor_systems(floor)}"


def glibc_mismatch(entry_name: str, node: "Node") -> "str | None":
    """Why a wheel's glibc floor rules this node out (None: it does not)."""
    platform_tag = check_wheel_name(entry_name).platform
    floor = glibc_floor(platform_tag)
    if floor is None or node.glibc is None:
        return None  # pip's own tag check still applies on the node
    have = tuple(int(x) for x in node.glibc.split(".")[:2])
    if have < floor:
        return f"needs {describe_floor(platform_tag)} (built on a newer OS), node has glibc {node.glibc}"
    return None


def _public(version: str) -> str:
    return version.split("+", 1)[0]


def _cc(text: str) -> "tuple[int, int]":
    major, minor = text.split("+")[0].rstrip("af").split(".")
    return int(major), int(minor)


def arch_covers(archs: "Sequence[str]", gpu: str) -> bool:
    """Whether code for `archs` runs on a GPU of capability `gpu`.

    SASS runs on the same major version at an equal or higher minor (sm_80 on 8.6); PTX is
    JIT-compiled by the driver for any newer GPU; 'a' variants run only on their exact GPU.
    """
    want = _cc(gpu)
    for arch in archs:
        have = _cc(arch)
        base = arch.split("+")[0]
        if base.endswith(("a", "f")):
            if have == want:
                return True
        elif have[0] == want[0] and have[1] <= want[1]:
            return True
        elif arch.endswith("+PTX") and have <= want:
            return True
    return False


def cpu_mismatch(entry: "WheelEntry", node: "Node") -> "str | None":
    """Why the wheel's CPU code cannot run on the node's CPU, or None."""
    if entry.cpu_target == "native":
        if not entry.cpu_flags:
            return "CPU ops built with -march=native on a machine whose CPU flags were not recorded"
        if not node.cpu_flags:
            return "CPU ops built with -march=native, and this node's CPU flags are unknown"
        lacking = sorted(set(entry.cpu_flags) - node.cpu_flags)
        if lacking:
            shown = ", ".join(lacking[:8]) + (f" and {len(lacking) - 8} more" if len(lacking) > 8 else "")
            return f"CPU ops built with -march=native on a CPU with {shown}, which this node lacks"
        return None
    lacking = [f for f in TARGET_FLAGS[entry.cpu_target] if node.cpu_flags and f not in node.cpu_flags]
    return f"CPU ops built for {entry.cpu_target}, node CPU lacks {', '.join(lacking)}" if lacking else None


def mismatches(entry: "WheelEntry", node: "Node") -> "list[str]":
    """Why a wheelhouse entry does not fit the node (empty: it fits)."""
    why = []
    if entry.python_tag != node.python_tag:
        why.append(f"built for {entry.python_tag}, node has {node.python_tag}")
    if node.torch and _public(entry.torch) != _public(node.torch):
        why.append(f"built for torch {entry.torch}, node has {node.torch}")
    if entry.accelerator == "cuda":
        if node.torch and not node.cuda:
            why.append("a CUDA wheel, but the node's torch has no CUDA")
        elif node.cuda and entry.cuda and entry.cuda.split(".")[:2] != node.cuda.split(".")[:2]:
            why.append(f"built for CUDA {entry.cuda}, node's torch has CUDA {node.cuda}")
        missing = [g for g in node.gpus if not arch_covers(entry.archs, g)]
        if missing:
            why.append(f"no code for GPU compute capability {', '.join(sorted(set(missing)))} "
                       f"(wheel has {', '.join(entry.archs) or 'none'})")  # fmt: skip
    elif node.gpus:
        why.append("a CPU wheel, but the node has GPUs (DeepSpeed would use its CUDA accelerator and JIT)")
    cpu = cpu_mismatch(entry, node)
    if cpu:
        why.append(cpu)
    glibc = glibc_mismatch(entry.name, node)
    if glibc:
        why.append(glibc)
    if not entry.smoke.passed:
        why.append("its smoke tests did not pass")
    return why


def narrowed_for(entry: "WheelEntry", node: "Node") -> "list[str]":
    """Ops of a fitting wheel that hold no code for one of the node's GPUs (the recipe let them
    build for fewer archs): they would fail to load there, everything else works."""
    out = []
    for op, archs in sorted(entry.narrowed_ops.items()):
        missing = sorted({g for g in node.gpus if not arch_covers(archs, g)})
        if missing:
            out.append(f"op {op} has code only for {', '.join(archs)}, not for this node's GPU {', '.join(missing)}")
    return out


_PEP440 = re.compile(
    r"^v?(?:(?P<epoch>\d+)!)?(?P<release>\d+(?:\.\d+)*)(?:[-_.]?(?P<pre>a|b|rc|alpha|beta|c)[-_.]?(?P<pre_n>\d*))?"
    r"(?:[-_.]?(?:post|rev|r)[-_.]?(?P<post>\d*))?(?:[-_.]?dev[-_.]?(?P<dev>\d*))?(?:\+(?P<local>.*))?$",
    re.IGNORECASE,
)


def version_key(version: str) -> "tuple[Any, ...]":
    """A sort key that orders versions as PEP 440 does (0.19.10 after 0.19.9, 1.0rc1 before 1.0),
    standard library only; a version it cannot read sorts first."""
    m = _PEP440.match(version.strip())
    if not m:
        return (-1,)
    release = [int(x) for x in m["release"].split(".")]
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    pre_rank = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2}
    if m["pre"] is not None:
        pre: tuple[int, int] = (pre_rank[m["pre"].lower()], int(m["pre_n"] or 0))
    elif m["dev"] is not None and m["post"] is None:
        pre = (-1, 0)  # 1.0.dev1 comes before 1.0a1
    else:
        pre = (3, 0)
    post = int(m["post"] or 0) if m["post"] is not None else -1
    dev = int(m["dev"] or 0) if m["dev"] is not None else float("inf")
    parts = [p for p in re.split(r"[-_.]", m["local"] or "") if p]
    local = tuple((1, int(p), "") if p.isdigit() else (0, 0, p.lower()) for p in parts)
    return (0, int(m["epoch"] or 0), tuple(release), pre, post, dev, local)


def choose(manifest: "WheelhouseManifest", node: "Node", ops: "Sequence[str]" = ()) -> "WheelEntry":
    """The newest fitting wheel by version (never by publish time or file-name text); among op sets
    of one target (labelled wheels: +cpu.torch2.13 and +cpu.torch2.13.all) the one with the most ops,
    or with `ops` the ones holding all of them. InstallError listing what the wheelhouse has when none fits."""

    def why_not(e: "WheelEntry") -> "list[str]":
        lacking = [op for op in ops if op not in e.ops]
        return mismatches(e, node) + ([f"lacks op {', '.join(printable(op)[:40] for op in lacking)} (--ops)"]
                                      if lacking else [])  # fmt: skip

    fits = [e for e in manifest.wheels.values() if not why_not(e)]
    if fits:
        exact = [e for e in fits if node.torch and e.torch == node.torch]
        wanted = "cuda" if node.gpus else "cpu"  # a node without GPUs prefers a CPU wheel
        return max(exact or fits, key=lambda e: (e.accelerator == wanted, version_key(e.version.split("+")[0]),
                                                 len(e.ops), version_key(e.version)))  # fmt: skip
    lines = [f"  {name}: {'; '.join(why_not(e))}" for name, e in sorted(manifest.wheels.items())]
    fix = "build one for this node, smoke it and publish it: " + build_for(node)
    fitting = [e for e in manifest.wheels.values() if not mismatches(e, node)]
    if ops and fitting:  # wheels fit the node; none holds every op asked for
        wanted = ", ".join(printable(op)[:40] for op in ops)
        fix = (f"add {wanted} to the recipe of a wheel that fits ({fitting[0].recipe}: ops = [..., {wanted}]), build, "
               "smoke and publish it; or install without --ops (the fitting wheel with the most ops)")  # fmt: skip
    raise InstallError(
        f"no wheel in the wheelhouse fits this node ({node.describe()}); it has:\n" + ("\n".join(lines) or "  nothing"),
        fix,
    )


def build_for(node: "Node") -> str:
    """What a wheel for this node takes, in recipe and build-host terms (the fix of "nothing fits")."""
    parts = [f'python = ["{node.python_tag[2]}.{node.python_tag[3:]}"]']
    if node.torch:
        parts.append(f'[torch] version = "{_public(node.torch)}", variant = "{torch_variant(node.cuda)}"')
    if node.gpus:
        parts.append(f"arch = {json.dumps(sorted(set(node.gpus)))}")
    if node.glibc:
        have = node.glibc.replace(".", "_")
        parts.append(f'platform = "manylinux_{have}" or lower (the default, "manylinux_2_28", reaches glibc 2.28 '
                     f"and newer: {floor_systems((2, 28))})")  # fmt: skip
    return "a recipe with " + "; ".join(parts)


# ---------------------------------------------------------------- probing the node

_NODE_PROBE = r"""
import json, sys
out = {"python_tag": f"cp{sys.version_info[0]}{sys.version_info[1]}", "torch": None, "cuda": None, "gpus": []}
try:
    import torch
    out["torch"], out["cuda"] = torch.__version__, torch.version.cuda
    if torch.cuda.is_available():
        caps = [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())]
        out["gpus"] = [f"{major}.{minor}" for major, minor in caps]
except ImportError:
    pass
try:
    import os
    out["glibc"] = os.confstr("CS_GNU_LIBC_VERSION").split()[-1]
except (AttributeError, ValueError, OSError, IndexError):
    out["glibc"] = None
print(json.dumps(out))
"""


def parse_cpu_flags(cpuinfo: str) -> "frozenset[str]":
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def cpu_flags() -> "frozenset[str]":
    try:
        return parse_cpu_flags(Path("/proc/cpuinfo").read_text())
    except OSError:
        return frozenset()


def parse_node_probe(output: str, flags: "frozenset[str]") -> "Node":
    lines = output.strip().splitlines()
    try:
        data = json.loads(lines[-1]) if lines else None
        f = Fields(data, "the node probe")
        gpus = f.texts("gpus", ARCH_RE)
        return Node(f.text("python_tag", PYTHON_TAG_RE), f.text("torch", VERSION_RE, optional=True),
                    f.text("cuda", CUDA_RE, optional=True), gpus, flags,
                    f.text("glibc", GLIBC_RE, optional=True))  # fmt: skip
    except (ValueError, ManifestError) as exc:
        raise InstallError(
            f"the node probe printed no usable report: {exc}", "pass --python with a working Python"
        ) from exc


def probe_node(python: str) -> "Node":
    """This node's Python, torch, CUDA and GPUs (asked of `python`), and its CPU flags."""
    try:
        done = subprocess.run([python, "-c", _NODE_PROBE], capture_output=True, text=True, errors="replace",
                              check=False)  # fmt: skip
    except OSError as exc:
        raise InstallError(f"cannot run {python}: {exc.strerror}", "pass --python with a working Python") from exc
    if done.returncode != 0:
        raise InstallError(f"cannot run {python}: {done.stderr.strip()[-300:]}", "pass --python with a working Python")
    if len(done.stdout) > LIMITS["probe"]:
        raise InstallError(f"{python} printed {len(done.stdout)} characters for a one-line probe",
                           "pass --python with a plain Python (its startup prints too much)")  # fmt: skip
    return parse_node_probe(done.stdout, cpu_flags())


# ---------------------------------------------------------------- trust: the manifest's signature
#
# The build host signs manifest.json with `ssh-keygen -Y sign` (SSHSIG, the format git uses) in the
# namespace below, into manifest.json.sig. A node given the build host's public key (--trust, an
# allowed-signers file or line) checks that signature before it reads the manifest, then that the
# manifest has not expired and that its serial is not older than the last one it accepted from that
# wheelhouse (a replayed old wheelhouse). It checks with what nodes already have: OpenSSH's
# ssh-keygen (8.1 or newer has -Y), else OpenSSL (1.1.1 or newer verifies Ed25519).

SIGNATURE_FILE = MANIFEST_FILE + ".sig"
NAMESPACE = "ds-wheelhouse"  # a signature made for anything else (git, file, ...) is refused
DEFAULT_TRUST = "/etc/ds-node-install/allowed_signers"  # used when --trust is not given and it exists
STATE_ENV = "DS_NODE_STATE_DIR"  # where a node keeps the serial it last accepted per wheelhouse
TIMEOUT_ENV = "DS_NODE_FETCH_TIMEOUT"  # seconds a download may stall before it fails (default 120)


def fetch_timeout() -> float:
    """How long a download from the wheelhouse may wait for data: a link that goes down fails the
    install cleanly after this long instead of hanging it."""
    text = os.environ.get(TIMEOUT_ENV, "") or "120"
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not 1 <= seconds <= 86400:  # nan and inf fail this too
        raise InstallError(f"{TIMEOUT_ENV}={printable(text)[:40]!r} is not a number of seconds from 1 to 86400",
                           "unset it (120 s), or set it to how long a download may wait for data")  # fmt: skip
    return seconds


SERIALS_FILE = "serials.json"
KEY_TYPES = ("ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
             "sk-ssh-ed25519@openssh.com")  # fmt: skip
_ARMOR = ("-----BEGIN SSH SIGNATURE-----", "-----END SSH SIGNATURE-----")
_ED25519_SPKI = bytes.fromhex("302a300506032b6570032100")  # DER prefix of an Ed25519 public key for OpenSSL


def _ssh_string(buf: bytes, pos: int) -> "tuple[bytes, int]":
    """One SSH wire-format string of `buf` at `pos`, and the position after it."""
    if pos + 4 > len(buf):
        raise ValueError("it ends inside a field")
    size = int.from_bytes(buf[pos : pos + 4], "big")
    if pos + 4 + size > len(buf):
        raise ValueError("a field runs past its end")
    return buf[pos + 4 : pos + 4 + size], pos + 4 + size


def _string(data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + data


@dataclass(frozen=True)
class PublicKey:
    blob: bytes  # SSH wire format: the key type, then the key's own fields

    @property
    def kind(self) -> str:
        return _ssh_string(self.blob, 0)[0].decode("ascii", errors="replace")

    def line(self) -> str:
        return f"{self.kind} {base64.b64encode(self.blob).decode('ascii')}"

    def fingerprint(self) -> str:
        """As `ssh-keygen -l` prints it: SHA256:<base64 without padding>."""
        return "SHA256:" + base64.b64encode(hashlib.sha256(self.blob).digest()).decode("ascii").rstrip("=")


def key_from_line(kind: str, encoded: str, where: str) -> "PublicKey":
    """A public key from its type and base64 text (a .pub file's first two fields)."""
    try:
        blob = base64.b64decode(encoded, validate=True)
        inner = _ssh_string(blob, 0)[0].decode("ascii")
    except (ValueError, UnicodeDecodeError) as exc:
        raise InstallError(f"{where}: {encoded[:40]!r} is not a public key ({exc})",
                           "copy the line `python -m builder key show` prints on the build host") from exc  # fmt: skip
    if inner != kind:
        raise InstallError(f"{where}: the key says it is {inner[:40]!r}, the line says {kind!r}",
                           "copy the line `python -m builder key show` prints on the build host")  # fmt: skip
    return PublicKey(blob)


def fingerprint_of(line: str) -> str:
    """The fingerprint of a key line as the manifest names its signer (`ssh-ed25519 AAAA...`)."""
    kind, _, encoded = line.partition(" ")
    return key_from_line(kind, encoded.split(" ")[0], "signer").fingerprint()


@dataclass(frozen=True)
class Signature:
    """An SSHSIG signature (OpenSSH's PROTOCOL.sshsig): who signed, for what purpose, and the bytes."""

    key: "PublicKey"
    namespace: str
    hash_alg: str
    blob: bytes  # string key type, string signature bytes

    def signed_data(self, message: bytes) -> bytes:
        """What the key really signed: the namespace and the message's hash, framed as SSHSIG does."""
        digest = hashlib.new(self.hash_alg, message).digest()
        return (b"SSHSIG" + _string(self.namespace.encode()) + _string(b"") + _string(self.hash_alg.encode())
                + _string(digest))  # fmt: skip


def parse_signature(text: bytes, where: str) -> "Signature":
    """An armored SSHSIG file, parsed (ManifestError for anything else); nothing is verified yet."""
    lines = text.decode("ascii", errors="replace").strip().splitlines()
    if len(lines) < 3 or lines[0].strip() != _ARMOR[0] or lines[-1].strip() != _ARMOR[1]:
        raise ManifestError(f"{where} is not an SSH signature (no {_ARMOR[0]} ... {_ARMOR[1]} block)",
                            "the signature was damaged or replaced: re-sign on the build host "
                            "(`python -m builder sign`)")  # fmt: skip
    try:
        blob = base64.b64decode("".join(line.strip() for line in lines[1:-1]), validate=True)
        if blob[:6] != b"SSHSIG" or int.from_bytes(blob[6:10], "big") != 1:
            raise ValueError("not SSHSIG version 1")
        key, pos = _ssh_string(blob, 10)
        namespace, pos = _ssh_string(blob, pos)
        _, pos = _ssh_string(blob, pos)  # reserved
        hash_alg, pos = _ssh_string(blob, pos)
        signature, pos = _ssh_string(blob, pos)
        if pos != len(blob):
            raise ValueError("bytes after the signature")
        sig = Signature(PublicKey(key), namespace.decode("utf-8"), hash_alg.decode("ascii"), signature)
        sig.key.kind  # noqa: B018  (a key blob that is not wire format fails here)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{where} is not an SSH signature ({exc})",
                            "the signature was damaged or replaced: re-sign on the build host "
                            "(`python -m builder sign`)") from exc  # fmt: skip
    if sig.hash_alg not in ("sha256", "sha512"):
        raise ManifestError(f"{where} hashes with {sig.hash_alg[:20]!r}, not sha256 or sha512", "re-sign it")
    return sig


@dataclass(frozen=True)
class Trust:
    """The keys a node accepts signatures from, and keys it refuses even where listed (revoked)."""

    keys: "tuple[PublicKey, ...]"
    revoked: "tuple[PublicKey, ...]" = ()
    ignored: "tuple[str, ...]" = ()  # lines that grant nothing now, each with why (expired, another namespace)

    def describe(self) -> str:
        return ", ".join(k.fingerprint() for k in self.keys if k not in self.revoked) or "none"


# One whitespace-free field of an allowed-signers line; double quotes may hold spaces and commas.
_SIGNERS_FIELD = re.compile(r'(?:"[^"]*"|[^\s"])+')
_SIGNERS_OPTION = re.compile(r'([A-Za-z-]+)(?:="([^"]*)")?(?:,|$)')
_SIGNERS_TIME = re.compile(r"^(\d{8})(\d{4})?(\d{2})?(Z?)$")


def _signers_time(value: str, where: str) -> "datetime.datetime":
    """A valid-after/valid-before time as OpenSSH reads it: YYYYMMDD[HHMM[SS]], local time unless Z."""
    m = _SIGNERS_TIME.match(value)
    if not m:
        raise InstallError(f"{where}: {value[:40]!r} is not a time OpenSSH reads (YYYYMMDD[HHMM[SS]][Z])",
                           "write it as 20270101 or 202701011200Z")  # fmt: skip
    try:
        stamp = datetime.datetime.strptime(m[1] + (m[2] or "0000") + (m[3] or "00"), "%Y%m%d%H%M%S")
    except ValueError as exc:
        raise InstallError(f"{where}: {value[:40]!r} is not a date", "write it as 20270101") from exc
    return stamp.replace(tzinfo=datetime.timezone.utc) if m[4] else stamp.astimezone()


def _grants(options: str, where: str, now: "datetime.datetime") -> "str | None":
    """Whether an allowed-signers line's options let its key sign for this toolkit now. Read as
    `ssh-keygen -Y verify` reads them; an option the toolkit cannot honour the same way is refused
    (the OpenSSL path must agree with ssh-keygen line for line). None where it does; else why not."""
    import fnmatch

    why: list[str] = []
    pos = 0
    while pos < len(options):
        m = _SIGNERS_OPTION.match(options, pos)
        if not m or m.end() == pos:
            raise InstallError(f"{where}: cannot read the options {options[:80]!r}",
                               'options are name="value" pairs joined by commas')  # fmt: skip
        pos = m.end()
        name, value = m[1].lower(), m[2]
        if name == "cert-authority":
            raise InstallError(f"{where}: cert-authority: this toolkit does not check SSH certificates, and a "
                               "signature it accepted would then not be one ssh-keygen accepts",
                               "list the build host's public key itself (`python -m builder key show`)")  # fmt: skip
        if name not in ("namespaces", "valid-after", "valid-before") or value is None:
            raise InstallError(f"{where}: option {m[0].rstrip(',')[:60]!r} is not one OpenSSH's allowed_signers "
                               "takes with a value (namespaces=, valid-after=, valid-before=)",
                               "remove it, or write it as name=\"value\"")  # fmt: skip
        if name == "namespaces":
            patterns = [p.strip() for p in value.split(",") if p.strip()]
            denied = any(p.startswith("!") and fnmatch.fnmatchcase(NAMESPACE, p[1:]) for p in patterns)
            if denied or not any(not p.startswith("!") and fnmatch.fnmatchcase(NAMESPACE, p) for p in patterns):
                why.append(f'namespaces="{value[:60]}" leaves out {NAMESPACE}')
        elif name == "valid-after" and now < _signers_time(value, where):
            why.append(f'valid-after="{value[:20]}" is still to come (not yet valid)')
        elif name == "valid-before" and now >= _signers_time(value, where):
            why.append(f'valid-before="{value[:20]}" has passed (expired)')
    return "; ".join(why) or None


def parse_trust(text: str, where: str, now: "datetime.datetime | None" = None) -> "Trust":
    """OpenSSH allowed-signers lines (`principals [options] keytype base64 [comment]`), bare public-key
    lines (`keytype base64 [comment]`, a .pub file), and `@revoked keytype base64` lines. A line whose
    options leave out this toolkit's namespace, or whose key is not valid now (valid-after,
    valid-before), grants nothing; cert-authority and options OpenSSH does not know are refused."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    keys: list[PublicKey] = []
    revoked: list[PublicKey] = []
    ignored: list[str] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        at_line = f"{where}:{number}"
        fields = _SIGNERS_FIELD.findall(line)
        at = next((i for i, t in enumerate(fields) if t in KEY_TYPES), None)
        if at is None or at + 1 >= len(fields):
            if "cert-authority" in line:
                _grants("cert-authority", at_line, now)
            raise InstallError(f"{at_line}: no public key on the line {line[:60]!r}",
                               "give the line `python -m builder key show` prints (ssh-ed25519 AAAA...)")  # fmt: skip
        if at > 2:
            raise InstallError(f"{at_line}: {' '.join(fields[:at])[:80]!r} before the key is not `principals "
                               "[options]`", "one principals field, then one options field at most")  # fmt: skip
        key = key_from_line(fields[at], fields[at + 1], at_line)
        why = _grants(fields[1], at_line, now) if fields[0] != "@revoked" and at >= 2 else None
        if fields[0] == "@revoked":
            revoked.append(key)
        elif why is None:
            keys.append(key)
        else:
            ignored.append(f"{at_line} ({key.fingerprint()}): {why}")
    return Trust(tuple(keys), tuple(revoked), tuple(ignored))


SKIP_FLAG = "--skip-signature-check"


def no_key() -> InstallError:
    """A node given no key installs nothing: fail closed, as apt does with an unsigned repository."""
    return NoKey(
        f"no key to check the wheelhouse's signature with (no --trust, and no {DEFAULT_TRUST}): without one, "
        "whoever can write the wheelhouse decides what this node installs and runs",
        "give the build host's public key (the line `python -m builder key show` prints): --trust 'ssh-ed25519 "
        f"AAAA...' or an allowed-signers file, or put it in {DEFAULT_TRUST}; {SKIP_FLAG} installs without "
        "checking, for a wheelhouse you trust by other means",
    )


def load_trust(values: "Sequence[str]") -> "Trust | None":
    """The node's trust: each --trust value is a file or a key line; with none, DEFAULT_TRUST if
    it exists; None when the node was given no key at all."""
    if not values:
        if not os.path.isfile(DEFAULT_TRUST):
            return None
        values = [DEFAULT_TRUST]
    keys: list[PublicKey] = []
    revoked: list[PublicKey] = []
    ignored: list[str] = []
    for value in values:
        if any(t in value.split() for t in (*KEY_TYPES, "@revoked")):
            trust = parse_trust(value, "--trust")
        else:
            try:
                with open_regular(value) as f:
                    text = read_limited(f, "trust", value).decode("utf-8", errors="replace")
            except ManifestError as exc:
                raise InstallError(f"--trust {value}: {exc.message}",
                                   "pass an allowed-signers file, or the key line itself") from exc  # fmt: skip
            except OSError as exc:
                raise InstallError(
                    f"--trust {value}: cannot read it ({exc.strerror or exc})",
                    "pass an allowed-signers file, or the key line itself (ssh-ed25519 AAAA...)",
                ) from exc
            trust = parse_trust(text, value)
        keys += trust.keys
        revoked += trust.revoked
        ignored += trust.ignored
    if not [k for k in keys if k not in revoked]:
        raise InstallError(f"--trust {' '.join(values)[:200]} holds no key that may sign now: "
                           + no_key_because(Trust(tuple(keys), tuple(revoked), tuple(ignored))),
                           "give the build host's key: the line `python -m builder key show` prints")  # fmt: skip
    return Trust(tuple(keys), tuple(revoked), tuple(ignored))


def no_key_because(trust: "Trust") -> str:
    """Why a trust grants no key, line by line: revoked, expired, not yet valid, another namespace."""
    said = [*trust.ignored, *(f"{k.fingerprint()} is revoked" for k in dict.fromkeys(trust.revoked))]
    return "; ".join(said)[:1200] if said else "it lists no key"


def _run_verifier(args: "Sequence[str]", stdin: "bytes | None" = None) -> "tuple[int, str] | None":
    """(exit status, output) of a verifying tool; None where it is missing."""
    if shutil.which(args[0]) is None:
        return None
    try:
        done = subprocess.run(list(args), input=stdin, capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.returncode, (done.stdout + done.stderr).decode("utf-8", errors="replace")


def _unsupported(said: str) -> bool:
    return any(w in said.lower() for w in ("unknown option", "illegal option", "usage:", "unknown argument"))


def _verify_ssh_keygen(message: bytes, text: bytes, trust: "Trust", tmp: str, namespace: str) -> "bool | None":
    signers, sig, revoked = (os.path.join(tmp, n) for n in ("allowed_signers", "sig", "revoked"))
    with open(signers, "w", encoding="ascii") as f:
        f.writelines(f'{namespace} namespaces="{namespace}" {k.line()}\n' for k in trust.keys)
    with open(sig, "wb") as f:
        f.write(text)
    args = ["ssh-keygen", "-Y", "verify", "-f", signers, "-I", namespace, "-n", namespace, "-s", sig]
    if trust.revoked:
        with open(revoked, "w", encoding="ascii") as f:
            f.writelines(f"{k.line()}\n" for k in trust.revoked)
        args += ["-r", revoked]
    done = _run_verifier(args, message)
    if done is None or (done[0] != 0 and _unsupported(done[1])):
        return None  # no ssh-keygen, or one older than OpenSSH 8.1 (no -Y)
    return done[0] == 0


def _ed25519(signature: "Signature") -> "tuple[bytes, bytes] | None":
    """The raw Ed25519 public key (32 bytes) and signature (64) of an SSH signature; None for others."""
    kind, pos = _ssh_string(signature.key.blob, 0)
    raw_key = _ssh_string(signature.key.blob, pos)[0]
    sig_kind, pos = _ssh_string(signature.blob, 0)
    raw_sig = _ssh_string(signature.blob, pos)[0]
    if kind != b"ssh-ed25519" or sig_kind != b"ssh-ed25519" or len(raw_key) != 32 or len(raw_sig) != 64:
        return None
    return raw_key, raw_sig


def _verify_openssl(message: bytes, signature: "Signature", tmp: str) -> "bool | None":
    """Ed25519 through OpenSSL (for nodes whose OpenSSH predates -Y, RHEL 8's 8.0)."""
    raw = _ed25519(signature)
    if raw is None:
        return None
    raw_key, raw_sig = raw
    pem, data, sig = (os.path.join(tmp, n) for n in ("key.pem", "data", "sig.bin"))
    with open(pem, "w", encoding="ascii") as f:
        der = base64.b64encode(_ED25519_SPKI + raw_key).decode("ascii")
        f.write(f"-----BEGIN PUBLIC KEY-----\n{der}\n-----END PUBLIC KEY-----\n")
    with open(data, "wb") as f:
        f.write(signature.signed_data(message))
    with open(sig, "wb") as f:
        f.write(raw_sig)
    done = _run_verifier(["openssl", "pkeyutl", "-verify", "-pubin", "-inkey", pem, "-rawin", "-in", data,
                          "-sigfile", sig])  # fmt: skip
    if done is None or (done[0] != 0 and _unsupported(done[1])):
        return None
    return done[0] == 0 and "Verified Successfully" in done[1]


_NID_ED25519 = 1087  # OpenSSL's id of Ed25519, the same in 1.1.1 and 3.x


def _verify_libcrypto(message: bytes, signature: "Signature") -> "bool | None":
    """Ed25519 through libcrypto itself (ctypes, standard library), for nodes whose OpenSSH has no -Y
    and whose openssl command predates -rawin (OpenSSL 1.1.1: RHEL 8, Debian 11), which verify
    Ed25519 only through EVP_DigestVerify. None where no usable libcrypto is found."""
    import ctypes
    import ctypes.util

    raw = _ed25519(signature)
    if raw is None:
        return None
    raw_key, raw_sig = raw
    lib = None
    for name in (ctypes.util.find_library("crypto"), "libcrypto.so.3", "libcrypto.so.1.1"):
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
            lib.EVP_DigestVerify  # noqa: B018 (1.1.1 or newer)
            break
        except (OSError, AttributeError):
            lib = None
    if lib is None:
        return None
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    lib.EVP_PKEY_new_raw_public_key.restype = vp
    lib.EVP_PKEY_new_raw_public_key.argtypes = [ctypes.c_int, vp, ctypes.c_char_p, sz]
    lib.EVP_MD_CTX_new.restype = vp
    lib.EVP_DigestVerifyInit.argtypes = [vp, vp, vp, vp, vp]
    lib.EVP_DigestVerify.argtypes = [vp, ctypes.c_char_p, sz, ctypes.c_char_p, sz]
    lib.EVP_MD_CTX_free.argtypes = [vp]
    lib.EVP_PKEY_free.argtypes = [vp]
    data = signature.signed_data(message)
    pkey = lib.EVP_PKEY_new_raw_public_key(_NID_ED25519, None, raw_key, len(raw_key))
    if not pkey:
        return None
    ctx = lib.EVP_MD_CTX_new()
    try:
        if not ctx or lib.EVP_DigestVerifyInit(ctx, None, None, None, pkey) != 1:
            return None
        return bool(lib.EVP_DigestVerify(ctx, raw_sig, len(raw_sig), data, len(data)) == 1)
    finally:
        if ctx:
            lib.EVP_MD_CTX_free(ctx)
        lib.EVP_PKEY_free(pkey)


def check_signature(message: bytes, text: bytes, trust: "Trust", where: str, namespace: str = NAMESPACE) -> "Signature":
    """The signature of `message` (the exact bytes of manifest.json), checked: made for this
    toolkit's namespace, by a trusted key that is not revoked, over these bytes. Anything else is a
    ManifestError naming the problem (exit 8); no tool to check with is an InstallError (exit 9)."""
    text = text.replace(b"\r\n", b"\n")  # a copy that went through a CRLF tool: the armor's base64 is the same
    sig = parse_signature(text, where)
    fix = ("do not install from it: whoever can write the wheelhouse may have changed it. On the build host run "
           "`python -m builder verify` and re-publish or re-sign (`python -m builder sign`)")  # fmt: skip
    if sig.namespace != namespace:
        raise ManifestError(f"{where} is a signature made for another purpose (namespace {sig.namespace[:40]!r}, "
                            f"not {namespace!r})", fix)  # fmt: skip
    if sig.key in trust.revoked:
        raise ManifestError(
            f"{where} was made by key {sig.key.fingerprint()}, which is revoked",
            "re-sign the wheelhouse on the build host with its current key (`python -m builder sign`)",
        )
    if sig.key not in trust.keys:
        raise ManifestError(f"{where} was made by key {sig.key.fingerprint()}, which this node does not trust "
                            f"(it trusts {trust.describe()})",
                            "if the build host's key was rotated, give the node the new key (--trust, or "
                            f"{DEFAULT_TRUST}); if not, the wheelhouse was forged: do not install from it")  # fmt: skip
    tmp = scratch_dir("ds-verify-")
    try:
        ok = _verify_ssh_keygen(message, text, trust, tmp, namespace)
        if ok is None:
            ok = _verify_openssl(message, sig, tmp)
        if ok is None:
            ok = _verify_libcrypto(message, sig)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if ok is None:
        raise InstallError("this node cannot check the wheelhouse's signature: ssh-keygen is missing or older than "
                           "OpenSSH 8.1 (no -Y), and neither openssl nor libcrypto (1.1.1+) can verify Ed25519",
                           "install OpenSSH 8.1 or newer (openssh-clients on RHEL, openssh-client on Debian) or "
                           "OpenSSL 1.1.1 or newer")  # fmt: skip
    if not ok:
        raise ManifestError(f"{where} does not match what it signs: the file was changed after the build host "
                            f"signed it (key {sig.key.fingerprint()})", fix)  # fmt: skip
    return sig


def parse_stamp(text: str) -> "datetime.datetime | None":
    """A UTC time as the manifest writes it (2026-12-22T10:00:00Z), or None."""
    try:
        when = datetime.datetime.strptime(text.replace("+00:00", "Z"), "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return None
    return when.replace(tzinfo=datetime.timezone.utc)


def stamp(when: "datetime.datetime") -> str:
    return when.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_statement(manifest: "WheelhouseManifest", sig: "Signature", where: str, now: "datetime.datetime") -> None:
    """The signed statement itself: a serial, the signer it names, an expiry not passed."""
    check_signer(manifest, sig, where)
    check_expiry(manifest, where, now)


def check_signer(manifest: "WheelhouseManifest", sig: "Signature", where: str) -> None:
    if not manifest.serial:
        raise ManifestError(f"{where} is signed but carries no serial or expiry (an older toolkit wrote it)",
                            "re-sign it on the build host: `python -m builder sign`")  # fmt: skip
    if manifest.signer != sig.key.line():
        raise ManifestError(f"{where} names signer {manifest.signer[:60]}..., but key {sig.key.fingerprint()} "
                            "signed it", "re-sign it on the build host: `python -m builder sign`")  # fmt: skip


def check_expiry(manifest: "WheelhouseManifest", where: str, now: "datetime.datetime") -> None:
    expires = parse_stamp(manifest.expires)
    if expires is None or expires <= now:
        raise ManifestError(f"{where} expired at {manifest.expires} (serial {manifest.serial}; now {stamp(now)}): "
                            "nobody has re-signed the wheelhouse since",
                            "on the build host: `python -m builder sign --wheelhouse WH` (valid for weeks again); "
                            "if it was re-signed, check this machine's clock")  # fmt: skip


def state_dir(env: "Mapping[str, str]") -> "Path":
    """Where this node keeps the serials it accepted: DS_NODE_STATE_DIR, /var/lib for root, else
    the user's state folder."""
    if env.get(STATE_ENV):
        return Path(env[STATE_ENV])
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return Path("/var/lib/ds-node-install")
    return Path(env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")) / (
        "ds-node-install"
    )


def _read_state(folder: "Path", name: str, field: str, kind: type, what: str, after: str) -> "dict[str, Any]":
    """One of this node's records (a JSON object of objects, each with `field` of `kind`); an
    unreadable or malformed one is one message saying what removing it means (`after`)."""
    path = folder / name
    try:
        with open_regular(path) as f:
            data = json.loads(read_limited(f, "report", str(path)))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, ManifestError) as exc:
        raise InstallError(
            f"this node's record of {what} {path} cannot be read ({exc})", f"remove it: {after}"
        ) from exc
    if not isinstance(data, dict) or not all(isinstance(v, dict) and isinstance(v.get(field), kind)
                                             for v in data.values()):  # fmt: skip
        raise InstallError(f"{path} is not this installer's record of {what}", f"remove it: {after}")
    return data


def read_serials(folder: "Path") -> "dict[str, Any]":
    return _read_state(folder, SERIALS_FILE, "serial", int, "accepted serials",
                       "the node then accepts each wheelhouse's current serial again")  # fmt: skip


def check_serial(manifest: "WheelhouseManifest", digest: str, serials: "Mapping[str, Any]", where: str) -> None:
    """Refuse a manifest older than the one this node last accepted from the same wheelhouse."""
    seen = serials.get(manifest.wheelhouse_id)
    if not seen:
        return
    fix = ("do not install from it: restore the current wheelhouse from the build host. To go back on purpose, "
           "re-sign the older wheelhouse there (`python -m builder sign --adopt`): it gets a new serial")  # fmt: skip
    if manifest.serial < seen["serial"]:
        raise ManifestError(f"{where} has serial {manifest.serial}, older than serial {seen['serial']} this node "
                            f"accepted from the same wheelhouse on {str(seen.get('accepted_at'))[:40]}: an old "
                            "manifest was put back (rollback)", fix)  # fmt: skip
    if manifest.serial == seen["serial"] and seen.get("sha256") not in (None, digest):
        raise ManifestError(f"{where} has serial {manifest.serial}, which this node accepted before with other "
                            "contents: two different manifests carry one serial", fix)  # fmt: skip


def remember_serial(folder: "Path", manifest: "WheelhouseManifest", digest: str, sig: "Signature",
                    source: str = "") -> None:  # fmt: skip
    """Record the accepted serial, and which wheelhouse `source` served (each a temporary file renamed
    over the old record)."""
    serials = read_serials(folder)
    now = stamp(datetime.datetime.now(datetime.timezone.utc))
    serials[manifest.wheelhouse_id] = {"serial": manifest.serial, "sha256": digest, "key": sig.key.fingerprint(),
                                       "accepted_at": now}  # fmt: skip
    _write_state(folder, SERIALS_FILE, serials)
    if source:
        sources = read_sources(folder)
        sources[source] = {"wheelhouse_id": manifest.wheelhouse_id, "accepted_at": now}
        _write_state(folder, SOURCES_FILE, sources)


def _write_state(folder: "Path", name: str, data: "Mapping[str, Any]") -> None:
    try:
        os.makedirs(folder, mode=0o755, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, folder / name)
    except OSError as exc:
        raise InstallError(
            f"cannot record the accepted wheelhouse in {folder}: {exc.strerror}",
            f"make {folder} writable, or set {STATE_ENV} to a folder this user can write",
        ) from exc


SOURCES_FILE = "sources.json"  # wheelhouse path or URL -> the wheelhouse id it served


def source_key(base: str) -> str:
    """A wheelhouse's place as the node names it: the URL, or the folder's real path."""
    return base if base.startswith(("http://", "https://")) else os.path.realpath(base)


def read_sources(folder: "Path") -> "dict[str, Any]":
    return _read_state(folder, SOURCES_FILE, "wheelhouse_id", str, "wheelhouse places",
                       "the node then accepts the wheelhouse each place serves now")  # fmt: skip


def check_source(manifest: "WheelhouseManifest", source: str, sources: "Mapping[str, Any]", where: str,
                 expected: "str | None") -> None:  # fmt: skip
    """Refuse another wheelhouse where this node read one before (any manifest the same key ever
    signed, a staging or test wheelhouse, could be swapped in otherwise), unless `expected` names it;
    refuse anything but `expected` where it is given (provision gives it)."""
    if expected is not None:
        if manifest.wheelhouse_id != expected:
            raise ManifestError(f"{where} is wheelhouse {manifest.wheelhouse_id}, not {printable(expected)[:64]} "
                                "(--wheelhouse-id): another wheelhouse signed by the same key was put in its place",
                                "do not install from it: restore the wheelhouse, or run `python -m builder verify` on "
                                "the build host, which prints the id")  # fmt: skip
        return
    seen = sources.get(source)
    if seen and seen["wheelhouse_id"] != manifest.wheelhouse_id:
        raise ManifestError(
            f"{where} is wheelhouse {manifest.wheelhouse_id}, but this node read wheelhouse {seen['wheelhouse_id']} "
            f"from the same place on {str(seen.get('accepted_at'))[:40]}: another wheelhouse signed by the same key "
            "was put in its place (a rollback across wheelhouses)",
            f"do not install from it unless the site replaced it on purpose; then run once with --wheelhouse-id "
            f"{manifest.wheelhouse_id} (`python -m builder verify` on the build host prints it)",
        )


# ---------------------------------------------------------------- reading a wheelhouse


def printable(text: str) -> str:
    """`text` with every character a terminal would act on (ESC, BEL, NUL, ...) shown escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def wheelhouse_base(source: str) -> str:
    """A wheelhouse given as a folder, a file:// URL or an http(s) URL, as a base to fetch from."""
    if any(not c.isprintable() or c.isspace() for c in source) and "://" in source:
        raise InstallError(f"--wheelhouse {printable(source)[:300]}: a URL with a space or a control character",
                           "percent-encode it (a space is %20), or give the folder's path")  # fmt: skip
    try:
        parsed = urllib.parse.urlparse(source)
    except ValueError as exc:
        raise InstallError(f"--wheelhouse {printable(source)[:300]}: not a URL ({exc})",
                           "give a folder, file:///path, or http(s)://host/path/") from exc  # fmt: skip
    if parsed.scheme in ("http", "https"):
        secret = url_secret(source)
        if secret:
            raise InstallError(f"--wheelhouse: the URL holds {secret}, which would be printed and logged, and no "
                               "wheelhouse file is named by it", "name the wheelhouse without it; give credentials "
                               "in ~/.netrc (a token: as the password for the host)")  # fmt: skip
        return source.rstrip("/") + "/"
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise InstallError(f"{source}: a file:// URL must name a local folder", "write file:///path/to/wheelhouse")
        return urllib.request.url2pathname(parsed.path)
    if parsed.scheme and len(parsed.scheme) > 1:
        raise InstallError(
            f"{source}: unsupported scheme {parsed.scheme}://", "use a folder, file://, http:// or https://"
        )
    return source


def too_big(what: str, where: str) -> "ManifestError":
    limit = LIMITS[what]
    shown = f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit >> 10} KiB"
    return ManifestError(
        f"{where} is larger than the {shown} limit for a {what}: no real wheelhouse has one that large",
        "the file is damaged or hostile: run `python -m builder verify` on the wheelhouse and re-publish it",
    )


def read_limited(stream: "IO[bytes]", what: str, where: str) -> bytes:
    """All of `stream`, or ManifestError once it passes the limit for `what` (nothing more is read)."""
    data = stream.read(LIMITS[what] + 1)
    if len(data) > LIMITS[what]:
        raise too_big(what, where)
    return data


class TooLarge(ValueError):
    """A file past its limit (LIMITS); a ValueError, as unreadable JSON is, wherever files are parsed."""


class NotAFile(OSError):
    """A path that is not a regular file (a FIFO would block a reader forever, /dev/zero never ends)."""


def open_regular(path: "str | Path") -> "IO[bytes]":
    """`path` opened for reading, only if it is a regular file: opened without blocking (a FIFO with
    no writer would hang), checked with fstat, then read as usual. NotAFile names what it is."""
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a folder" if stat.S_ISDIR(mode) else "a device"
                    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else
                    "not a regular file")  # fmt: skip
            raise NotAFile(f"{path} is {kind}, not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bounded(path: "Path", what: str) -> bytes:
    """A local file another machine or job wrote, a regular file, up to the limit for `what`
    (TooLarge past it; NotAFile for a FIFO, a folder or a device)."""
    with open_regular(path) as f:
        try:
            return read_limited(f, what, str(path))
        except ManifestError as exc:
            raise TooLarge(exc.message) from exc


def fetch(base: str, name: str, what: str = "manifest") -> bytes:
    """A file of the wheelhouse at `base`, up to the limit for `what`; `name` must be one this
    module checked or a fixed name."""
    data = bytearray()
    with _opened(base, name) as (source, where):
        _copy(source, what, where, data.extend)
    return bytes(data)


MIN_RATE = 64 << 10  # bytes a second a download keeps on average once past its first timeout


def download(base: str, name: str, what: str, folder: str, size: "int | None" = None) -> "tuple[str, str]":
    """A file of the wheelhouse streamed to folder/name while it is hashed (never held in memory):
    (its path, its sha256). `name` must be one this module checked; `size`, where the signed
    manifest gives one, is the most that is read."""
    target = os.path.join(folder, name)
    with _opened(base, name) as (source, where), open(target, "wb") as out:
        return target, _copy(source, what, where, out.write, size)


def _copy(source: "Any", what: str, where: str, write: "Any", expected: "int | None" = None) -> str:
    """Everything `source` gives, handed to `write` as it comes; its sha256. Past the `expected`
    size (the signed manifest's) or else the limit for `what`, or slower on average than MIN_RATE
    once past the first timeout (a server dripping a byte at a time, which no per-read timeout
    catches), it fails; each read waits at most the timeout."""
    digest, size = hashlib.sha256(), 0
    timeout, start = fetch_timeout(), time.monotonic()
    read = getattr(source, "read1", source.read)  # returns what one read brought: a drip cannot stall it
    try:
        while True:
            chunk = read(1 << 20)
            if not chunk:
                return digest.hexdigest()
            size += len(chunk)
            if expected is not None and size > expected:
                raise ManifestError(f"{where} is longer than the {expected} bytes the signed manifest gives it "
                                    "(stopped reading there)", "the wheelhouse copy or its server is damaged or "
                                    "hostile: run `python -m builder verify` on the wheelhouse")  # fmt: skip
            if size > LIMITS[what]:
                raise too_big(what, where)
            elapsed = time.monotonic() - start
            if elapsed > timeout + size / MIN_RATE:
                raise InstallError(f"{where}: {size} bytes in {elapsed:.0f} s, less than {MIN_RATE >> 10} KiB/s on "
                                   "average: the download would not finish", "check the network and the wheelhouse's "
                                   "server, then run the install again (nothing was installed)")  # fmt: skip
            digest.update(chunk)
            write(chunk)
    except InstallError:
        raise
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise _unreadable(where, exc) from exc


class _opened:
    """A wheelhouse file open for reading, and where it is (for messages): an HTTP response, or a
    local file that must be a regular file. Every way of failing to open is one InstallError."""

    def __init__(self, base: str, name: str) -> None:
        self.base, self.name = base, name
        self.source: Any = None

    def __enter__(self) -> "tuple[Any, str]":
        if self.base.startswith(("http://", "https://")):
            where = self.base + "/".join(urllib.parse.quote(part) for part in self.name.split("/"))
            try:
                self.source = urllib.request.urlopen(where, timeout=fetch_timeout())
            except urllib.error.HTTPError as exc:
                exc.close()
                raise InstallError(f"{where}: HTTP {exc.code} {exc.reason}",
                                   "run `verify` on the served wheelhouse") from exc  # fmt: skip
            except (OSError, http.client.HTTPException, ValueError) as exc:
                raise _unreadable(where, exc) from exc
            return self.source, where
        where = str(Path(self.base) / self.name)
        try:
            self.source = open_regular(where)
        except NotAFile as exc:
            raise ManifestError(
                f"{exc}: the wheelhouse was damaged or tampered with",
                "run `python -m builder verify` on it; restore or re-publish it",
            ) from exc
        except OSError as exc:
            raise InstallError(f"cannot read {where}: {exc.strerror or exc}",
                               "check the wheelhouse path; run `verify` on it") from exc  # fmt: skip
        return self.source, where

    def __exit__(self, *exc: object) -> None:
        if self.source is not None:
            self.source.close()


def _unreadable(where: str, exc: BaseException) -> InstallError:
    """A server or link that failed mid-way (refused, timed out, a malformed reply): one message."""
    reason = getattr(exc, "reason", None) or exc
    text = printable(" ".join(str(reason).split()))[:200] or type(exc).__name__
    return InstallError(f"cannot fetch {printable(where)[:300]}: {text}",
                        "check the wheelhouse URL, its server and the network, then run the install again (nothing "
                        "was installed)")  # fmt: skip


class _RootLinks(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: "list[tuple[str, str | None]]") -> None:
        if tag == "a":
            self.hrefs.append(dict(attrs).get("href") or "")


def unlisted_projects(root_page: str, manifest: "WheelhouseManifest") -> "list[str]":
    """Projects the index's root page links that the manifest does not list (an injected project)."""
    parser = _RootLinks()
    parser.feed(root_page)
    known = {f"{urllib.parse.quote(p)}/" for p in manifest.projects()}
    return sorted(h for h in parser.hrefs if h not in known)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def scratch_dir(prefix: str, parent: "str | None" = None) -> str:
    """A temporary folder named for this process (<prefix><pid>-...), after removing this user's
    folders of that prefix whose process is gone: a kill -9 runs no cleanup, the next run does."""
    try:
        parent = parent or tempfile.gettempdir()
    except OSError as exc:  # no writable temporary folder anywhere Python looks
        raise InstallError(f"no writable temporary folder ({exc.strerror or exc})",
                           "set TMPDIR to a folder this user can write") from exc  # fmt: skip
    try:
        names = os.listdir(parent)
    except OSError:
        names = []
    for name in names:
        pid = name[len(prefix) :].split("-", 1)[0] if name.startswith(prefix) else ""
        path = os.path.join(parent, name)
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if st.st_uid == os.getuid() and not os.path.islink(path) and os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
    try:
        return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent)
    except OSError as exc:
        raise InstallError(f"cannot make a temporary folder in {parent}: {exc.strerror or exc}",
                           "set TMPDIR to a folder this user can write") from exc  # fmt: skip


_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F] if chr(c) not in "\n\t"}


def say(message: str) -> None:
    """Progress for the person at the node (stdout is kept for --json); control characters a path,
    an op name or a server's words may carry are shown escaped, never sent to the terminal."""
    print(str(message).translate(_CONTROL), file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Verified:
    """What the signature check found: who signed which manifest (None fields: not checked)."""

    manifest: "WheelhouseManifest"
    digest: str  # sha256 of manifest.json's bytes
    signature: "Signature | None" = None


def _signed_manifest(base: str, trust: "Trust | None", where: str) -> "tuple[bytes, Signature | None]":
    """manifest.json's bytes, checked against manifest.json.sig when the node trusts a key. A publish
    renames the manifest and then its signature: a check that fails is tried again (up to three
    times, half a second apart) only while either file is changing."""
    data = fetch(base, MANIFEST_FILE)
    if trust is None:
        return data, None
    sig_where = f"{base.rstrip('/')}/{SIGNATURE_FILE}"
    for attempt in range(3):
        try:
            text = fetch(base, SIGNATURE_FILE, "signature")
        except InstallError as exc:
            missing = "HTTP 404" in exc.message or "No such file" in exc.message
            if isinstance(exc, ManifestError) or not missing:
                raise
            raise ManifestError(f"{where} is not signed: the wheelhouse has no {SIGNATURE_FILE}, and this node "
                                "installs only from signed wheelhouses (it was given a key)",
                                "publish with this toolkit (every write signs the manifest), or re-sign on the "
                                "build host: `python -m builder sign`; an unsigned copy may have been put in its "
                                "place") from exc  # fmt: skip
        try:
            return data, check_signature(data, text, trust, sig_where)
        except ManifestError:
            if attempt == 2:
                raise
            time.sleep(0.5)
            again = fetch(base, MANIFEST_FILE)
            if again == data and fetch(base, SIGNATURE_FILE, "signature") == text:
                raise
            data = again
    raise AssertionError("unreachable")


def load_wheelhouse(base: str) -> "WheelhouseManifest":
    """The validated manifest of a wheelhouse, its signature not checked (see load_verified)."""
    return load_verified(base, None).manifest


def load_verified(
    base: str, trust: "Trust | None", now: "datetime.datetime | None" = None, expected_id: "str | None" = None
) -> "Verified":
    """The validated manifest of a wheelhouse whose index lists nothing the manifest does not; with
    `trust`, only after its signature checks out, and only if it is signed, fresh and not older
    than what this node accepted before (the caller records it once installed)."""
    where = f"{base.rstrip('/')}/{MANIFEST_FILE}"
    data, sig = _signed_manifest(base, trust, where)
    manifest = parse_manifest(data, where)
    digest = hashlib.sha256(data).hexdigest()
    if sig is not None:
        check_statement(manifest, sig, where, now or datetime.datetime.now(datetime.timezone.utc))
        check_serial(manifest, digest, read_serials(state_dir(os.environ)), where)
        check_source(manifest, source_key(base), read_sources(state_dir(os.environ)), where, expected_id)
    try:
        root = fetch(base, "simple/index.html", "index page").decode("utf-8")
    except (InstallError, UnicodeDecodeError) as exc:
        raise ManifestError(f"the wheelhouse's simple/index.html cannot be read: {exc}", "re-publish it") from exc
    extra = unlisted_projects(root, manifest)
    if extra:
        raise ManifestError(
            f"simple/index.html of {base} links projects the manifest does not list: {', '.join(extra)[:300]}",
            "someone added them to the index: run `python -m builder verify` on the wheelhouse",
        )
    return Verified(manifest, digest, sig)


def checked_wheel(base: str, entry: "WheelEntry", folder: str) -> str:
    """The wheel downloaded into `folder`, after its sha256 and its embedded build manifest agree
    with the entry; its path."""
    path, digest = download(base, entry.name, "wheel", folder, entry.size)
    if digest != entry.sha256:
        raise ManifestError(
            f"{entry.name} from {base} has sha256 {digest}, the manifest says {entry.sha256}",
            "the wheelhouse copy is damaged or was tampered with: run `python -m builder verify` on it",
        )
    try:
        with zipfile.ZipFile(path) as zf:
            build = embedded_build_manifest(zf, entry.name)
    except zipfile.BadZipFile as exc:
        raise ManifestError(f"{entry.name} is not a zip file", "re-publish it") from exc
    differ = entry_differences(entry, build)
    if differ:
        raise ManifestError(
            f"manifest.json disagrees with {entry.name}'s own build manifest:\n    " + "\n    ".join(differ),
            "manifest.json was edited: run `python -m builder verify` on the wheelhouse and re-publish",
        )
    return path


def checked_dependencies(base: str, manifest: "WheelhouseManifest", entry: "WheelEntry", folder: str) -> "list[str]":
    """The dependency files the wheel installs with, downloaded into `folder`, each checked against
    its manifest sha256; their names."""
    if entry.requires is None:
        raise ManifestError(
            f"manifest.json does not say which dependency files {entry.name} needs (published by an older toolkit)",
            "publish any wheel into the wheelhouse again with this toolkit: it records them for every wheel",
        )
    for name in entry.requires:
        _, digest = download(base, name, "wheel", folder, manifest.dependencies[name].size)
        want = manifest.dependencies[name].sha256
        if digest != want:
            raise ManifestError(
                f"{name} from {base} has sha256 {digest}, the manifest says {want}",
                "the wheelhouse copy is damaged or was tampered with: run `python -m builder verify` on it",
            )
    return list(entry.requires)


def hashed_requirements(files: "Mapping[str, str]") -> str:
    """A pip requirements file pinning every file (name -> sha256) by version and hash: in pip's
    hash-checking mode nothing else can be installed, from anywhere."""
    lines = []
    for name, digest in sorted(files.items()):
        wheel = check_wheel_name(name)
        lines.append(f"{wheel.project}=={wheel.version} --hash=sha256:{digest}")
    return "\n".join(lines) + "\n"


def images_of(manifest: "WheelhouseManifest", wheel: str) -> "list[ImageEntry]":
    """The published CI images holding this wheel, newest first."""
    found = [i for i in manifest.images.values() if i.wheel == wheel]
    return sorted(found, key=lambda i: (i.published_at, i.name), reverse=True)


def install(
    wheelhouse: str,
    python: str,
    dry_run: bool = False,
    pip_args: "Sequence[str]" = (),
    trust: "Trust | None" = None,
    ops: "Sequence[str]" = (),
    skip_signature_check: bool = False,
    wheelhouse_id: "str | None" = None,
    module: "str | None" = None,
    modulefiles: "str | None" = None,
    replace_module: bool = False,
) -> "dict[str, Any]":
    """Pick, fetch, check and pip-install the wheel for this node, with its dependencies from the
    wheelhouse alone (hash-checked; no index is asked); returns what was done. With `trust`, the
    manifest is read only after its signature, expiry and serial check out. With `module` (a
    prefix), the wheel and its lock go into an Lmod module there instead (install_module)."""
    base = wheelhouse_base(wheelhouse)
    if trust is None and not skip_signature_check:
        raise no_key()
    verified = load_verified(base, trust, expected_id=wheelhouse_id)
    manifest = verified.manifest
    if verified.signature is None:
        say(
            f"warning: {SKIP_FLAG}: the manifest's signature is not checked, so whoever can write the "
            "wheelhouse decides what is installed (give the build host's key: `python -m builder key show`)"
        )
    else:
        say(f"==> manifest signed by {verified.signature.key.fingerprint()}: serial {manifest.serial}, valid "
            f"until {manifest.expires}")  # fmt: skip
    node = probe_node(python)
    say(f"==> node: {node.describe()}")
    entry = choose(manifest, node, ops)
    say(f"==> chosen: {entry.name} (torch {entry.torch}, archs {', '.join(entry.archs) or '-'}, "
        f"ops {', '.join(entry.ops)})")  # fmt: skip
    floor = describe_floor(check_wheel_name(entry.name).platform)
    say(f"    needs {floor}")
    for line in narrowed_for(entry, node):
        say(f"warning: {line}")
    table = op_table(entry)
    for line in format_op_rows(table):
        say(f"    {line}")
    for line in format_configs(entry.smoke.checks):
        say(f"    {line}")
    tmp = scratch_dir("ds-install-")
    try:
        if module is None:
            return _fetch_and_install(base, manifest, entry, node, verified, python, dry_run, pip_args, floor, table,
                                      tmp)  # fmt: skip
        checked_wheel(base, entry, tmp)
        _accept(base, manifest, verified)
        folder = modulefiles or os.path.join(module, "modulefiles")
        done = install_module(base, manifest, entry, python, module, folder, replace_module, dry_run, tmp)
        return {"wheel": entry.name, "sha256": entry.sha256, "node": node.to_json(), "floor": floor, **done}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _accept(base: str, manifest: "WheelhouseManifest", verified: "Verified") -> None:
    """A manifest accepted (a dry run too): an older one is refused from now on."""
    if verified.signature is not None:
        remember_serial(state_dir(os.environ), manifest, verified.digest, verified.signature, source_key(base))


def _fetch_and_install(base: str, manifest: "WheelhouseManifest", entry: "WheelEntry", node: "Node",
                       verified: "Verified", python: str, dry_run: bool, pip_args: "Sequence[str]", floor: str,
                       table: "Any", tmp: str) -> "dict[str, Any]":  # fmt: skip
    """The chosen wheel and its dependencies downloaded into `tmp` and checked, then pip-installed
    from there alone (unless a dry run)."""
    checked_wheel(base, entry, tmp)
    deps = checked_dependencies(base, manifest, entry, tmp)
    say(f"==> {entry.name}: sha256 {entry.sha256[:16]}... verified, build manifest agrees; "
        f"{len(deps)} dependency wheels verified")  # fmt: skip
    images = images_of(manifest, entry.name)
    for image in images:
        smoke = "passed" if image.smoke.passed else "FAILED"
        say(f"==> CI image of this wheel: {image.name} ({image.ref}, ID {image.image_id[:12]}, "
            f"{image.size / 1e6:.0f} MB; smoke {smoke}): podman load -i <wheelhouse>/{image.name}")  # fmt: skip
        if image.squashfs:
            say(f"==> Slurm container image of this wheel: {image.squashfs} ({image.squashfs_size / 1e6:.0f} MB, "
                f"Enroot's layout): srun --container-image=<wheelhouse>/{image.squashfs} ...")  # fmt: skip
    result = {"wheel": entry.name, "sha256": entry.sha256, "node": node.to_json(), "installed": False, "floor": floor,
              "dependencies": sorted(deps), "ops_without_code_for_this_gpu": narrowed_for(entry, node),
              "missing_ops": dict(entry.missing_ops), "op_table": table,
              "configs": {n[len("config:"):]: {"status": s, "means": config_category(s, d), "detail": d}
                          for n, (s, d) in sorted(entry.smoke.checks.items()) if n.startswith("config:")},
              "images": [{"name": i.name, "ref": i.ref, "image_id": i.image_id, "digest": i.digest, "size": i.size,
                          **({"squashfs": i.squashfs, "squashfs_size": i.squashfs_size} if i.squashfs else {})}
                         for i in images],
              "module": f"{MODULE}/{module_version(entry)}"}  # fmt: skip
    say(
        f"==> as an Lmod module: {MODULE}/{module_version(entry)} (install it once on a shared tree: add "
        "--module PREFIX)"
    )
    _accept(base, manifest, verified)
    if verified.signature is not None:
        result["signed_by"] = verified.signature.key.fingerprint()
        result["serial"] = manifest.serial
    if dry_run:
        return result
    _check_pip(python)
    pins = {entry.name: entry.sha256, **{n: manifest.dependencies[n].sha256 for n in deps}}
    requirements = os.path.join(tmp, "requirements.txt")
    with open(requirements, "w", encoding="utf-8") as f:
        f.write(hashed_requirements(pins))
    # Only the checked files: no index (an air-gapped node has none), pip's hash-checking mode.
    cmd = [python, "-m", "pip", "install", "--no-index", "--find-links", tmp, "--require-hashes",
           *pip_args, "-r", requirements]  # fmt: skip
    say(f"+ {' '.join(cmd)}")
    code, said = _run_pip(cmd)
    if code != 0:
        raise InstallError(f"pip could not install {entry.name} (exit {code})", _pip_fix(said, python, entry))
    say(f"==> installed {entry.name}")
    return {**result, "installed": True}


def check_configs(base: str, manifest: "WheelhouseManifest", python: str, files: "Sequence[str]",
                  timeout: float = 180.0) -> "tuple[int, list[dict[str, Any]]]":  # fmt: skip
    """Run `files` (DeepSpeed configs) against the DeepSpeed installed for `python`, with the
    wheelhouse's config checker, checked against the sha256 of the manifest (verified before)."""
    tool = manifest.tools.get(CONFIG_CHECK)
    if tool is None:
        raise InstallError(f"the wheelhouse publishes no config checker ({CONFIG_CHECK})",
                           "publish into it with a toolkit that has check-config")  # fmt: skip
    data = fetch(base, CONFIG_CHECK, "tool")
    digest = hashlib.sha256(data).hexdigest()
    if digest != tool.sha256:
        raise ManifestError(f"{CONFIG_CHECK} from {base} has sha256 {digest}, the manifest says {tool.sha256}",
                            "the wheelhouse copy is damaged or was tampered with: run `verify` on it")  # fmt: skip
    folder = scratch_dir("ds-config-check-")
    try:
        script = os.path.join(folder, "ds-config-check.py")
        with open(script, "wb") as f:
            f.write(data)
        ext = os.path.join(folder, "torch_extensions")
        os.mkdir(ext)
        env = {**os.environ, "TORCH_EXTENSIONS_DIR": ext}
        cmd = [python, script, "--json", "--timeout", str(timeout), *[os.path.abspath(f) for f in files]]
        say(f"+ {' '.join(cmd)}")
        done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env, cwd=folder, check=False)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    try:
        results = json.loads(done.stdout)
    except ValueError:
        raise InstallError(f"the config checker exited {done.returncode} without a report",
                           "read its output above; is DeepSpeed installed for this Python?") from None  # fmt: skip
    for r in results:
        say(f"config {r['status']:14} {r['name']}: {r.get('means', '')}")
    return (0 if all(r.get("status") == "passed" for r in results) else EXIT_CONFIGS), results


def _check_pip(python: str) -> None:
    done = subprocess.run([python, "-m", "pip", "--version"], capture_output=True, check=False)
    if done.returncode != 0:
        raise InstallError(f"{python} has no pip: the installer installs the checked wheels with pip",
                           f"install pip for it ({python} -m ensurepip, or the OS package python3-pip), or pass "
                           "--python with an interpreter that has pip")  # fmt: skip


def _run_pip(cmd: "Sequence[str]", env: "Mapping[str, str] | None" = None) -> "tuple[int, str]":
    """pip's exit status and its output, shown as it comes (on stderr: stdout is for --json)."""
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    assert proc.stdout is not None
    tail: list[str] = []
    for raw in proc.stdout:
        line = raw.decode("utf-8", errors="replace")
        sys.stderr.write(line)
        tail = [*tail[-200:], line]
    return proc.wait(), "".join(tail)


def _pip_fix(said: str, python: str, entry: "WheelEntry") -> str:
    """The fix for the failure pip's output shows (read-only site-packages, no torch, ...)."""
    if "Read-only file system" in said or "Permission denied" in said or "EACCES" in said:
        return (
            f"{python} cannot write its site-packages (read-only or another user's): run as the user who "
            "owns that environment, or pass --python with a virtual environment this user can write"
        )
    if "torch" in said and any(
        w in said for w in ("Could not find a version", "No matching distribution", "--require-hashes")
    ):
        return f"the node needs the wheel's torch installed first: pip install torch=={_public(entry.torch)}"
    if "No space left" in said:
        return "free disk space on the node and run the installer again"
    return "read pip's output above; run the installer again with --debug for more"


# ---------------------------------------------------------------- Lmod module (install --module)
#
# A site's shared software tree gets the wheel with everything its lock pins (torch included) in a
# venv made with the node's Python, and a Lua modulefile for Lmod pointing at it. The venv's folder
# is named for the lock (a second install of the same lock is a no-op; another lock gets its own
# folder), and the modulefile is written last, in one rename: users see the old module or the new
# one, never a half-installed one, and jobs still running from the old folder keep their files.

EXIT_MODULE = 16  # the module cannot be installed where asked (see ModuleError)
MODULE = "deepspeed"
MODULE_MARK = "-- deepspeed module, written by ds-wheel-builder"  # a modulefile's first line: ours
MODULE_RECORD = "ds-module.json"  # in the venv's folder, written last: the install is complete
MODULE_PARTIAL = ".ds-module-partial"  # in a venv folder being made: a leftover this installer may remove
LMOD_INITS = ("/usr/share/lmod/lmod/init/bash", "/opt/apps/lmod/lmod/init/bash", "/usr/local/lmod/lmod/init/bash")
# Folders of the system (and everything below the trees): no folder the toolkit writes may be one.
SYSTEM_FOLDERS = ("/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/media", "/mnt", "/opt",
                  "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/usr/local", "/var",
                  "/var/tmp", "/var/lib")  # fmt: skip
SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc", "/run", "/sbin", "/sys",
                "/usr/bin", "/usr/include", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libexec", "/usr/sbin",
                "/usr/share")  # fmt: skip
_LOCK_REQ = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+)\s*\\?$")
_LOCK_HASH = re.compile(r"^\s*--hash=sha256:(?P<digest>[0-9a-f]{64})\s*$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class ModuleError(InstallError):
    """The module cannot be installed where asked: the prefix or modulefile folder is unsafe or
    not writable, another lock's module holds that version, Lmod or venv is missing, or the module
    does not load and list its ops."""

    exit_code = EXIT_MODULE


def is_system_folder(resolved: str, home: str = "") -> bool:
    """Whether a resolved path is a system folder, inside a system tree, or the user's home itself."""
    home = home or os.path.realpath(os.path.expanduser("~"))
    inside = any(resolved == t or resolved.startswith(t + "/") for t in SYSTEM_TREES)
    return resolved in SYSTEM_FOLDERS or resolved == home or inside


def parse_lock(text: str, where: str) -> "tuple[str, dict[str, str]]":
    """The wheel a lock was written for (its first line) and its pins: requirement -> sha256. Only
    `name==version` lines, each with its hash: no option (--find-links, --index-url), path or URL.
    ValueError names the file and the line."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("# Lock for "):
        raise ValueError(f"{where} is not a lock written by `lock` (no '# Lock for' line)")
    wheel = lines[0][len("# Lock for ") :].split(",")[0]
    pins: dict[str, str] = {}
    pending: str | None = None
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        req, digest = _LOCK_REQ.match(line.strip()), _LOCK_HASH.match(line)
        if pending is None and req:
            pending = f"{normalize(req['name'])}=={req['version']}"
        elif pending is not None and digest:
            pins[pending] = digest["digest"]
            pending = None
        else:
            raise ValueError(f"{where}, line {number}: {line.strip()[:80]!r} is not a pinned requirement with its hash")
    if pending is not None or not pins:
        raise ValueError(f"{where} pins {f'{pending} without a hash' if pending is not None else 'no file'}")
    return wheel, pins


def module_version(entry: "WheelEntry") -> str:
    """The module's version: the wheel's, and its Python (one lock per wheel, one wheel per Python)."""
    return f"{entry.version}-py{entry.python_tag[2]}.{entry.python_tag[3:]}"


def _lua(text: str) -> str:
    """A Lua string literal of `text` (paths and names the installer checked: no control characters)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _lua_long(text: str) -> str:
    level = 0
    while f"]{'=' * level}]" in text:
        level += 1
    return f"[{'=' * level}[\n{text}\n]{'=' * level}]"


def render_modulefile(entry: "WheelEntry", root: str, lock: str, lock_sha256: str, python: str) -> str:
    """The Lua modulefile of one installed lock (pure). It only sets the environment: nothing is
    written at load, and `module unload` (or purge) undoes every line."""
    version = module_version(entry)
    py = f"{entry.python_tag[2]}.{entry.python_tag[3:]}"
    ops = ", ".join(entry.ops) or "none"
    archs = ", ".join(entry.archs) or "-"
    helptext = (
        f"DeepSpeed {entry.version} for Python {py} with torch {entry.torch}, its ops prebuilt: nothing is\n"
        f"compiled at first use, and no compiler is needed.\n"
        f"  ops: {ops}\n"
        f"  accelerator: {entry.accelerator}; GPU archs: {archs}\n"
        f"  needs {describe_floor(check_wheel_name(entry.name).platform)}\n"
        f"  installed from {lock} (sha256 {lock_sha256}), every file checked by sha256\n"
        f"  files: {root} (Python: {python})"
    )
    return "\n".join([
        MODULE_MARK,
        f"-- {MODULE}/{version}: {entry.name}",
        f"-- lock: {lock} sha256 {lock_sha256}",
        "-- Installing another lock at this version writes a new folder, then replaces this file in one rename.",
        f"local root = {_lua(root)}",
        'whatis("Name: DeepSpeed")',
        f"whatis({_lua('Version: ' + entry.version)})",
        f"whatis({_lua(f'Python {py}, torch {entry.torch}, accelerator {entry.accelerator}')})",
        f"whatis({_lua('Prebuilt ops: ' + ops)})",
        f"help({_lua_long(helptext)})",
        f'conflict("{MODULE}")',
        'prepend_path("PATH", pathJoin(root, "bin"))',
        'setenv("VIRTUAL_ENV", root)',
        'setenv("PYTHONNOUSERSITE", "1")  -- packages in ~/.local do not shadow the module\'s',
        "",
    ])  # fmt: skip


def modulefile_lock(path: str) -> "str | None":
    """The lock sha256 a modulefile of ours names; None where there is none. ModuleError where the
    file is not ours (never replaced) or not a regular file."""
    if os.path.islink(path) or (os.path.exists(path) and not os.path.isfile(path)):
        raise ModuleError(f"{path} is not a regular file (a link, a folder, a device): it is not a modulefile this "
                          "installer wrote", "move it away, or install into another --modulefiles folder")  # fmt: skip
    if not os.path.exists(path):
        return None
    with open_regular(path) as f:
        text = f.read(64 << 10).decode("utf-8", errors="replace")
    lines = text.splitlines()
    found = [line for line in lines[:4] if line.startswith("-- lock: ")]
    if not lines or lines[0] != MODULE_MARK or not found:
        raise ModuleError(f"{path} exists and was not written by this installer", "move it away (it is not ours "
                          "to replace), or install into another --modulefiles folder")  # fmt: skip
    digest = found[0].rsplit(" ", 1)[-1]
    return digest if SHA256_RE.match(digest) else None


def unsafe_folder(path: str) -> "str | None":
    """What makes a folder unsafe to install into (None: nothing): a folder of the system, or on
    its way a link another user made, a folder another user owns, or one any user may write
    without the sticky bit (as OpenSSH checks the path of a user's keys)."""
    path = os.path.abspath(path)
    if any(c in path for c in "\n\r\t\x00"):
        return f"{path!r} holds a control character"
    if is_system_folder(os.path.realpath(path)):
        return f"{path} is a system folder (or inside one)"
    me, parts, current = os.geteuid(), [p for p in path.split("/") if p], "/"
    for part in parts:
        current = os.path.join(current, part)
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            return None  # made by the installer from here on
        except OSError as exc:
            return f"{current} cannot be read ({exc.strerror})"
        if os.path.islink(current):
            if st.st_uid not in (0, me):
                return f"{current} is a link made by another user (uid {st.st_uid}): it decides where files go"
            continue
        if st.st_uid not in (0, me):
            return f"{current} belongs to another user (uid {st.st_uid}), who could move what is below it"
        if st.st_mode & 0o002 and not st.st_mode & 0o1000:
            return f"{current} is writable by every user (and not sticky): anyone could replace what is below it"
    return None


def check_module_folders(prefix: str, modulefiles: str) -> None:
    """The prefix and the modulefile folder are safe and writable, or ModuleError says why."""
    for what, folder in (("--module prefix", prefix), ("modulefile folder", modulefiles)):
        why = unsafe_folder(folder)
        if why:
            raise ModuleError(f"the {what} {folder} is unsafe: {why}", "install into a folder for site software "
                              "that root or you own, e.g. /shared/software, with --modulefiles beside it")  # fmt: skip
        existing = os.path.abspath(folder)
        while not os.path.exists(existing):
            existing = os.path.dirname(existing)
        if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
            raise ModuleError(f"the {what} {folder} cannot be written by this user ({existing} is not a writable "
                              "folder)", "run as the user who owns the site's software tree, or name a folder this "
                              "user may write")  # fmt: skip
    for folder in (modulefiles, os.path.join(modulefiles, MODULE)):
        if os.path.isdir(folder) and os.stat(folder).st_mode & 0o022:
            raise ModuleError(f"the modulefile folder {folder} is writable by other users: any of them could put a "
                              "module there that every user then loads", f"chmod go-w {folder}")  # fmt: skip


def find_lmod(env: "Mapping[str, str]") -> str:
    """Lmod's bash init script (LMOD_PKG's, else where distributions put it)."""
    pkg = env.get("LMOD_PKG", "")
    for path in ([os.path.join(pkg, "init", "bash")] if pkg else []) + list(LMOD_INITS):
        if os.path.isfile(path):
            return path
    raise ModuleError(f"Lmod is not installed here (no {' or '.join(LMOD_INITS[:1])}, LMOD_PKG unset): the module "
                      "is loaded with Lmod before it is published", "install Lmod (Debian/Ubuntu: apt-get install "
                      "lmod; RHEL: dnf install Lmod), or set LMOD_PKG to its folder")  # fmt: skip


def clean_env(env: "Mapping[str, str]") -> "dict[str, str]":
    """The environment pip and venv run in for a module: none of this user's pip settings (an index,
    find-links), Python path or user site, so the module holds the lock's files and nothing else; file
    times fixed (SOURCE_DATE_EPOCH), so byte-compiled files are the same on every install."""
    dropped = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "VIRTUAL_ENV")
    kept = {k: v for k, v in env.items() if not k.startswith("PIP_") and k not in dropped}
    return {**kept, "SOURCE_DATE_EPOCH": "0", "PIP_CONFIG_FILE": os.devnull, "PYTHONNOUSERSITE": "1"}


def _make_folder(path: str) -> None:
    """mkdir -p with 0755 whatever the umask: the tree is read by every user, written by its owner."""
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for folder in reversed(missing):
        try:
            os.mkdir(folder)
        except FileExistsError:
            continue
        os.chmod(folder, 0o755)


def _read_only_for_others(root: str) -> None:
    """Every file readable by all, nothing writable but by its owner (pip honours the umask only)."""
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            if os.path.islink(path):
                continue
            mode = os.lstat(path).st_mode & 0o7777
            want = (mode | 0o444 | (0o111 if mode & 0o100 or name in dirs else 0)) & ~0o022
            if want != mode:
                os.chmod(path, want)
    os.chmod(root, 0o755)


def _write_file(path: str, data: str) -> None:
    """Write `path` in one rename, readable by all (a modulefile users may be loading right now)."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), 0o644)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def prove_module(modulefiles: str, version: str, entry: "WheelEntry", root: str, tmp: str) -> "list[str]":
    """Load the module with Lmod in a clean shell whose home is an empty folder, as a user would;
    its python must be the module's and ds_report must list every op of the wheel [YES]. The lines
    it checked."""
    init = find_lmod(os.environ)
    home = os.path.join(tmp, "home")
    os.makedirs(home, exist_ok=True)
    script = ('. "$0" && module use "$1" && module load "$2" && python -c "import sys, deepspeed; print(\'prefix=\' '
              '+ sys.prefix)" && ds_report')  # fmt: skip
    env = {"HOME": home, "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "USER": "ds-module-check",
           "TMPDIR": tmp}  # fmt: skip
    done = subprocess.run(["bash", "--noprofile", "--norc", "-c", script, init, modulefiles, f"{MODULE}/{version}"],
                          capture_output=True, env=env, timeout=600)  # fmt: skip
    said = _ANSI.sub("", (done.stdout + done.stderr).decode("utf-8", errors="replace"))
    lines = said.splitlines()
    prefixes = [line[len("prefix=") :] for line in lines if line.startswith("prefix=")]
    if done.returncode != 0 or [os.path.realpath(p) for p in prefixes] != [os.path.realpath(root)]:
        raise ModuleError(f"{MODULE}/{version} did not load and run with Lmod (exit {done.returncode}): "
                          f"{' | '.join(lines[-4:])[-600:]}", "nothing was published; fix what it says and "
                          "install again")  # fmt: skip
    installed = {}
    for line in lines:
        m = re.match(r"^([a-z0-9_]+)\s*\.{3,}\s*\[(YES|NO)\]", line.strip())
        if m:
            installed[m.group(1)] = m.group(2)
    missing = [op for op in entry.ops if installed.get(op) != "YES"]
    if missing:
        raise ModuleError(f"ds_report under {MODULE}/{version} does not list {', '.join(missing)} as installed "
                          "[YES]", "the wheel's ops did not load from the module's files: read ds_report's output "
                          f"({' | '.join(lines[-3:])[-300:]})")  # fmt: skip
    written = sorted(os.listdir(home))
    if written:
        raise ModuleError(f"loading {MODULE}/{version} and running it wrote into the user's home: "
                          f"{', '.join(written[:5])}", "nothing was published; read the modulefile and report "
                          "this")  # fmt: skip
    return [f"python {prefixes[0]}/bin/python"] + [f"{op} [YES]" for op in entry.ops]


def module_runs_here(root: str) -> str:
    """Why the module's venv does not run on this node ("" where it does): its python (a link to the
    interpreter it was made with, on the node that made it) missing here, or failing to import
    DeepSpeed. A shared tree is read by nodes of several OSes: a module made on a Debian 12 host with
    /usr/bin/python3.11 answered "already installed" on a Debian 11 node that has no such file."""
    python = os.path.join(root, "bin", "python")
    if not os.path.exists(python):  # a dangling link: its interpreter is not on this node
        target = os.readlink(python) if os.path.islink(python) else python
        return f"its python is {target}, which this node does not have"
    try:
        done = subprocess.run([python, "-c", "import deepspeed"], capture_output=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"its python {python} does not start here ({exc})"
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", errors="replace").strip().splitlines()
        return (
            f"its python {python} cannot import DeepSpeed here ({printable(said[-1])[:200] if said else 'no output'})"
        )
    return ""


def install_module(base: str, manifest: "WheelhouseManifest", entry: "WheelEntry", python: str, prefix: str,
                   modulefiles: str, replace: bool, dry_run: bool, tmp: str) -> "dict[str, Any]":  # fmt: skip
    """The chosen wheel and its lock's files, checked, installed as an Lmod module (see above)."""
    prefix, modulefiles = os.path.abspath(prefix), os.path.abspath(modulefiles)
    check_module_folders(prefix, modulefiles)
    version = module_version(entry)
    locks = {}
    for rel, listed in sorted(manifest.locks.items()):
        if not rel.endswith(".lock"):
            continue
        os.makedirs(os.path.join(tmp, os.path.dirname(rel)), exist_ok=True)  # locks/<name>.lock, checked names
        path, digest = download(base, rel, "report", tmp, listed.size)
        if digest != listed.sha256:
            raise ManifestError(f"{rel} from {base} has sha256 {digest}, the manifest says {listed.sha256}",
                                "the wheelhouse copy is damaged or was tampered with: run `python -m builder "
                                "verify` on it")  # fmt: skip
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        try:
            wheel, pins = parse_lock(text, rel)
        except ValueError as exc:
            raise ManifestError(str(exc), "write the lock again on the build host: python -m builder lock") from exc
        if wheel == entry.name:
            locks[rel] = (path, digest, pins)
    if not locks:
        raise ModuleError(f"the wheelhouse has no lock for {entry.name}: a module holds the wheel with everything "
                          "its lock pins (torch included)", f"on the build host: python -m builder lock --wheel "
                          f"{entry.name}")  # fmt: skip
    lock = sorted(locks)[0]
    lock_path, lock_sha, pins = locks[lock]
    served = {e.sha256: n for n, e in list(manifest.wheels.items()) + list(manifest.dependencies.items())}
    missing = [req for req, digest in sorted(pins.items()) if digest not in served]
    if missing:
        raise ManifestError(f"{lock} pins {len(missing)} file(s) the wheelhouse does not serve: "
                            f"{', '.join(missing[:5])}", "write the lock again on the build host: python -m "
                            f"builder lock --wheel {entry.name}")  # fmt: skip
    root = os.path.join(prefix, MODULE, version, lock_sha[:12])
    modulefile = os.path.join(modulefiles, MODULE, f"{version}.lua")
    result = {"module": f"{MODULE}/{version}", "modulefile": modulefile, "root": root, "lock": lock,
              "lock_sha256": lock_sha, "installed": False}  # fmt: skip
    current = modulefile_lock(modulefile)
    done = os.path.isfile(os.path.join(root, MODULE_RECORD))
    if current == lock_sha and done:
        why = module_runs_here(root)
        if why:
            raise ModuleError(f"{MODULE}/{version} is installed from {lock}, but it does not run on this node: {why}",
                              "a module's venv runs the Python it was made with, at that path: install a module per "
                              "interpreter path (another --prefix and --modulefiles for these nodes, made here with "
                              f"--python {python}), or put that Python at the same path on every node")  # fmt: skip
        say(f"==> {MODULE}/{version} is already installed from {lock} (sha256 {lock_sha[:16]}...): nothing to do")
        say(f"==> installed {entry.name}")  # in place: what provision reads
        return {**result, "installed": True, "unchanged": True}
    if current is not None and current != lock_sha and not replace:
        raise ModuleError(f"{modulefile} is the module of another lock at version {version} (sha256 {current[:16]}..."
                          f", not {lock_sha[:16]}...)", "pass --replace-module to switch it to this lock (its old "
                          "folder stays for jobs still using it), or publish the change as a new version")  # fmt: skip
    say(f"==> module {MODULE}/{version}: {len(pins)} files of {lock}, into {root}; modulefile {modulefile}")
    if dry_run:
        return result
    started = time.monotonic()
    _make_folder(os.path.dirname(root))
    if os.path.exists(root) and not done:
        if not os.path.isfile(os.path.join(root, MODULE_PARTIAL)):
            raise ModuleError(f"{root} exists and was not made by this installer", "move it away; it is not ours")
        say(f"    removing {root}: an install that was interrupted")
        shutil.rmtree(root)
    made = not done
    try:
        if made:
            _make_folder(root)
            with open(os.path.join(root, MODULE_PARTIAL), "w", encoding="utf-8") as f:
                f.write(f"being installed by pid {os.getpid()}\n")
            files = os.path.join(tmp, "files")
            os.makedirs(files)
            for digest in sorted(pins.values()):
                name = served[digest]
                size = manifest.wheels[name].size if name in manifest.wheels else manifest.dependencies[name].size
                _, got = download(base, name, "wheel", files, size)
                if got != digest:
                    raise ManifestError(f"{name} from {base} has sha256 {got}, {lock} and the manifest say {digest}",
                                        "the wheelhouse copy is damaged or was tampered with: run `python -m "
                                        "builder verify` on it")  # fmt: skip
            say(f"==> {len(pins)} files of {lock} verified by sha256; making the venv with {python}")
            old = os.umask(0o022)
            try:
                venv = subprocess.run([python, "-m", "venv", root], capture_output=True, text=True, check=False,
                                      env=clean_env(os.environ))  # fmt: skip
                if venv.returncode != 0:
                    raise ModuleError(f"{python} -m venv failed: {venv.stderr.strip()[-400:]}",
                                      f"install venv for {python} (Debian/Ubuntu: apt-get install python3-venv), "
                                      "or pass --python with one that has it")  # fmt: skip
                env = clean_env(os.environ)
                cmd = [os.path.join(root, "bin", "python"), "-m", "pip", "install", "--no-index", "--no-cache-dir",
                       "--disable-pip-version-check", "--require-hashes", "--find-links", files, "-r",
                       lock_path]  # fmt: skip
                say(f"+ {' '.join(cmd)}")
                code, said = _run_pip(cmd, env)
                if code != 0:
                    raise ModuleError(f"pip could not install {lock} into {root} (exit {code})",
                                      _pip_fix(said, python, entry))  # fmt: skip
            finally:
                os.umask(old)
            shutil.copyfile(lock_path, os.path.join(root, "ds-module.lock"))
            _read_only_for_others(root)
        proof_dir = os.path.join(tmp, "modulefiles")
        os.makedirs(os.path.join(proof_dir, MODULE))
        text = render_modulefile(entry, root, lock, lock_sha, python)
        with open(os.path.join(proof_dir, MODULE, f"{version}.lua"), "w", encoding="utf-8") as f:
            f.write(text)
        checked = prove_module(proof_dir, version, entry, root, tmp)
        say(f"==> {MODULE}/{version} loads with Lmod: {'; '.join(checked)}")
        if made:
            record = {"module": f"{MODULE}/{version}", "wheel": entry.name, "lock": lock, "lock_sha256": lock_sha,
                      "python": python, "files": {served[d]: d for d in pins.values()}}  # fmt: skip
            _write_file(os.path.join(root, MODULE_RECORD), json.dumps(record, indent=1, sort_keys=True) + "\n")
            os.unlink(os.path.join(root, MODULE_PARTIAL))
    except BaseException:
        if made and os.path.isfile(os.path.join(root, MODULE_PARTIAL)):
            shutil.rmtree(root, ignore_errors=True)  # ours, half-made: nothing points at it
        raise
    _make_folder(os.path.dirname(modulefile))
    _write_file(modulefile, text)  # last: from here on users load the new one
    size = sum(os.lstat(os.path.join(d, n)).st_size for d, _, names in os.walk(root) for n in names)
    say(
        f"==> published {MODULE}/{version}: {modulefile} -> {root} ({size / 1e6:.0f} MB, "
        f"{time.monotonic() - started:.0f} s); users run: module use {modulefiles} && module load {MODULE}/{version}"
    )
    say(f"==> installed {entry.name}")
    return {**result, "installed": True, "size": size, "checked": checked}


def parser(prog: "str | None" = None, module_only: bool = False) -> argparse.ArgumentParser:
    """The installer's options (also read by the docs test, which checks every command the docs show)."""
    p = argparse.ArgumentParser(
        prog=prog,
        description="On a node: detect Python, torch, CUDA, GPU compute capabilities and CPU features, pick the "
        "wheel built for them from a wheelhouse's manifest, check its sha256 and build manifest, and pip-install "
        "it. Standard library and pip only.",
        epilog=f"Exit codes: {EXIT_BAD_WHEELHOUSE} the wheelhouse failed a check (a file's sha256, the manifest's "
        f"signature, expiry or serial); {EXIT_INSTALL} no wheel fits, a download failed, pip failed, or this node "
        "has no tool to check signatures with (ssh-keygen -Y or openssl). A download that stalls fails after "
        f"{TIMEOUT_ENV} seconds (default 120), nothing installed. {EXIT_MODULE} the Lmod module cannot be "
        "installed (an unsafe or unwritable prefix, another lock's module at that version, Lmod or venv missing, "
        "a module that does not load).",
    )
    p.add_argument("--wheelhouse", required=True, metavar="PATH_OR_URL", help="folder, file:// or http(s):// URL")
    p.add_argument("--python", default=sys.executable, help="the node's Python (default: this one)")
    p.add_argument("--dry-run", action="store_true", help="choose and check the wheel, install nothing")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    p.add_argument("--pip-arg", dest="pip_args", action="append", default=[], metavar="ARG", help="extra pip argument")
    p.add_argument("--trust", action="append", default=[], metavar="KEY_OR_FILE",
                   help="the build host's public key (the line `python -m builder key show` prints) or an "
                   "allowed-signers file; repeat for several. The manifest is then read only if its signature "
                   f"(manifest.json.sig) is by one of them, it has not expired, and its serial is not older than "
                   f"the last one this node accepted (kept in {STATE_ENV}, default /var/lib/ds-node-install for "
                   f"root). Default: {DEFAULT_TRUST} where it exists")  # fmt: skip
    p.add_argument("--wheelhouse-id", metavar="ID",
                   help="the wheelhouse this must be (its id: `python -m builder verify` prints it; provision passes "
                   "it). Without it, a place (folder or URL) that served one wheelhouse is refused if it serves "
                   "another")  # fmt: skip
    p.add_argument(SKIP_FLAG, action="store_true",
                   help="install without checking the manifest's signature when no key is given (by default a "
                   "node given no key refuses: whoever can write the wheelhouse would decide what it "
                   "runs)")  # fmt: skip
    p.add_argument("--ops", default="", metavar="OP,OP",
                   help="choose a wheel holding these ops (where the wheelhouse has several op sets of one target, "
                   "e.g. cpu and cpu-all; default: the fitting wheel with the most ops)")  # fmt: skip
    p.add_argument("--check-config", dest="check_configs", action="append", default=[], metavar="CONFIG",
                   help="after installing (or with --dry-run, against what is installed), run this DeepSpeed config "
                   "(JSON, or .py of one dict) with the wheelhouse's config checker: initialize and a few steps, no "
                   f"compile at first use allowed; repeat for several. Exit {EXIT_CONFIGS} unless all run")  # fmt: skip
    p.add_argument("--prefix" if module_only else "--module", dest="module", metavar="PREFIX",
                   required=module_only,
                   help=("instead of installing into --python's environment: " if not module_only else "")
                   + f"install the wheel with everything its lock pins (torch included) as an Lmod module: a venv "
                   f"made with --python under PREFIX/{MODULE}/<version>/<lock id>, readable by every user, and the "
                   f"modulefile MODULEFILES/{MODULE}/<version>.lua, written last once the module has loaded with "
                   "Lmod and ds_report lists every op [YES]. Run it once for a shared tree, not on every node; the "
                   f"same lock again does nothing. Exit {EXIT_MODULE} where it cannot")  # fmt: skip
    p.add_argument(
        "--modulefiles",
        metavar="MODULEFILES",
        help="the folder users `module use` (default: PREFIX/modulefiles); not writable by others",
    )
    p.add_argument("--replace-module", action="store_true",
                   help="switch a module of another lock at the same version to this lock (a new folder, then "
                   "the modulefile replaced in one rename; the old folder stays for running jobs)")  # fmt: skip
    p.add_argument("--debug", action="store_true", help="show a traceback on errors")
    return p


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds: every temporary folder is removed, pip or a config run killed


# A write that found no room: a full disk, a quota, a read-only mount (builder.files reads it too).
NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG)


def no_room(exc: OSError, module: bool) -> InstallError:
    """A full disk, a quota or a read-only mount met while installing: one message with what to do."""
    where = exc.filename or "the target folder"
    if exc.errno == errno.EROFS and module:
        fix = (f"{where} is on a read-only mount here: install the module from a node that mounts the tree "
               "read-write (its file server)")  # fmt: skip
    elif exc.errno == errno.EROFS:
        fix = f"{where} is read-only: install where it can be written"
    else:
        fix = f"free space where {where} is (df -h), or raise the quota, then run it again"
    said = f"cannot write {where}: {exc.strerror or exc}"
    return ModuleError(said, fix) if module else InstallError(said, fix)


def main(argv: "Sequence[str] | None" = None, prog: "str | None" = None, module_only: bool = False) -> int:
    import signal

    p = parser(prog, module_only)
    args = p.parse_args(argv)
    import threading

    if threading.current_thread() is threading.main_thread():  # signal handlers live there only
        signal.signal(signal.SIGTERM, _terminated)
    ops = [op.strip() for op in args.ops.split(",") if op.strip()]
    try:
        trust = load_trust(args.trust)
        result = install(args.wheelhouse, args.python, args.dry_run, args.pip_args, trust, ops,
                         args.skip_signature_check, args.wheelhouse_id, args.module, args.modulefiles,
                         args.replace_module)  # fmt: skip
    except (InstallError, OSError) as caught:
        if args.debug or (isinstance(caught, OSError) and caught.errno not in NO_ROOM):
            raise
        exc = caught if isinstance(caught, InstallError) else no_room(caught, bool(args.module))
        say(f"error: {exc}")
        if args.json:
            print(json.dumps({"error": exc.message, "fix": exc.fix, "exit_code": exc.exit_code}))
        return exc.exit_code
    code = 0
    if args.check_configs:
        try:
            base = wheelhouse_base(args.wheelhouse)
            verified = load_verified(base, trust, expected_id=args.wheelhouse_id)
            python = os.path.join(result["root"], "bin", "python") if args.module else args.python
            code, result["configs_checked"] = check_configs(base, verified.manifest, python,
                                                            args.check_configs)  # fmt: skip
        except InstallError as exc:
            say(f"error: {exc}")
            return exc.exit_code
        if code:
            bad = [r["name"] for r in result["configs_checked"] if r.get("status") != "passed"]
            say(f"error: {len(bad)} config(s) do not run from the installed wheel: {', '.join(bad)}")
    if args.json:
        print(json.dumps(result, indent=2))
    return code


if __name__ == "__main__":
    sys.exit(main())
