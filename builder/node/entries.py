"""The wheelhouse manifest's records (`WheelhouseManifest` and its wheel, file, variant and image
entries): typed, frozen, made only by `manifest.parse_manifest`.
"""

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from builder.node.contract import MANIFEST_SCHEMA
from builder.node.names import check_variants_json_name, check_wheel_name, split_variant_name


@dataclass(frozen=True)
class SmokeSummary:
    passed: bool
    finished_at: str
    checks: "Mapping[str, tuple[str, str]]"  # name -> (status, first line of detail)


def describe_gpus(gpus: "Sequence[str]", capabilities: "Sequence[str]", driver: str, cuda: str, torch: str) -> str:
    """A node's GPUs and software for people: "8x NVIDIA H200 (9.0), driver 580.65, CUDA 13.0, torch 2.11.0"."""
    kinds: dict[str, int] = {}
    for i, gpu in enumerate(gpus):
        kind = f"{gpu} ({capabilities[i]})"
        kinds[kind] = kinds.get(kind, 0) + 1
    shown = ", ".join(f"{n}x {k}" if n > 1 else k for k, n in kinds.items())
    return f"{shown}, driver {driver}, CUDA {cuda}, torch {torch.split('+')[0]}"


@dataclass(frozen=True)
class ProofEntry:
    """A GPU proof of one wheel (`prove` on a GPU node, taken in by `publish --proof`): the statement
    file kept beside the wheel, its sha256, and what it says of the node it ran on."""

    name: str  # <wheel>.proof.<16 hex>.json
    sha256: str
    gpus: "tuple[str, ...]"  # each GPU's name, "NVIDIA H200"
    capabilities: "tuple[str, ...]"  # each GPU's compute capability, "9.0", in the same order
    driver: str
    cuda: str  # the CUDA runtime torch was built with
    torch: str
    nccl: str  # "" where torch has none
    finished_at: str
    host: str
    signer: str = ""  # the fingerprint of the GPU node's prover key that signed it; "" taken in unsigned

    def describe(self) -> str:
        """For people: "proven on NVIDIA H200 (9.0), driver 580.65, CUDA 13.0, torch 2.11.0, on 2026-11-28"."""
        ran_on = describe_gpus(self.gpus, self.capabilities, self.driver, self.cuda, self.torch)
        return f"proven on {ran_on}" + (f", on {self.finished_at[:10]}" if self.finished_at else "")

    def vouched(self) -> str:
        """Who vouches for it, for people: the node's prover key, or the build host's word alone."""
        if self.signer:
            return f"signed by its node's prover key {self.signer}"
        return "unsigned: taken in on the build host's word (publish --unsigned-proof)"

    def order(self) -> "tuple[str, str]":
        """Where it goes among a wheel's proofs: oldest first, then by name (as manifest.json is read back)."""
        return self.finished_at, self.name

    def to_json(self) -> "dict[str, Any]":
        return {"sha256": self.sha256, "gpus": list(self.gpus), "capabilities": list(self.capabilities),
                "driver": self.driver, "cuda": self.cuda, "torch": self.torch,
                **({"nccl": self.nccl} if self.nccl else {}), "finished_at": self.finished_at,
                "host": self.host, **({"signer": self.signer} if self.signer else {})}  # fmt: skip


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
    # The GPU proofs taken in for it (publish --proof), oldest first: empty where none.
    proofs: "tuple[ProofEntry, ...]" = ()

    def to_json(self) -> "dict[str, Any]":
        return {
            **({"requires": list(self.requires)} if self.requires is not None else {}),
            **({"proofs": {p.name: p.to_json() for p in self.proofs}} if self.proofs else {}),
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
