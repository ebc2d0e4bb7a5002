"""Parsing `manifest.json` field by field into its records (the one loader of the contract, on the
build host and on nodes), and the build manifest a wheel carries inside it.
"""

import json
import re
import zipfile
from collections.abc import Mapping, Sequence
from typing import Any

from builder.node.contract import (
    ACCELERATORS,
    ARCH_RE,
    BUILD_MANIFEST,
    CHECK_STATUSES,
    CONFIG_CHECK,
    CPU_FLAG_RE,
    CPU_TARGETS,
    INSTALLER,
    LIMITS,
    MANIFEST_FILE,
    MANIFEST_SCHEMA,
    OP_RE,
    PYTHON_TAG_RE,
    SHA256_RE,
    InstallError,
    ManifestError,
)
from builder.node.entries import (
    IMAGES,
    REPORTS,
    FileEntry,
    ImageEntry,
    ProofEntry,
    SmokeSummary,
    VariantEntry,
    WheelEntry,
    WheelhouseManifest,
)
from builder.node.fields import CUDA_RE, ID_RE, KEY_LINE_RE, NAME_RE, STAMP_RE, VERSION_RE, Fields, parse_stamp
from builder.node.files import read_limited, too_big
from builder.node.names import (
    NULL_VARIANT,
    VARIANT_LABEL_RE,
    VARIANT_PROPERTY_RE,
    WheelName,
    check_variants_json_name,
    check_wheel_name,
    public_version,
    split_variant_name,
)
from builder.node.tables import arch_table, host_ops_of, reason_table
from builder.node.trust import fingerprint_of


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
        proofs=parse_proofs(name, f),
    )
    if wheel.version != entry.version:
        raise f.fail("version", f"is {entry.version!r} but the file name says {wheel.version!r}")
    if wheel.python != entry.python_tag:
        raise f.fail("python_tag", f"is {entry.python_tag!r} but the file name says {wheel.python!r}")
    for key, why in label_contradictions(entry):
        raise f.fail(key, why)
    return entry


FINGERPRINT_RE = re.compile(r"^SHA256:[A-Za-z0-9+/]{43}$")  # as ssh-keygen -l prints a key's
GPU_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._()/+-]{0,99}$")
DRIVER_RE = re.compile(r"^\d{1,4}(\.\d{1,4}){0,3}$")
HOST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


def proof_name(wheel: str, sha256: str) -> str:
    """The file a GPU proof is kept in beside its wheel: named by the proof's own sha256, so several
    (an H100 node's, an A100 node's) sit side by side and the same proof twice is one file."""
    return f"{wheel}.proof.{sha256[:16]}.json"


PROOF_NAME_RE = re.compile(r"^(?P<wheel>.+\.whl)\.proof\.[0-9a-f]{16}\.json$")


def proof_wheel(name: str, where: str) -> str:
    """The wheel a proof file's name (<wheel>.proof.<16 hex>.json) is of; ManifestError for any other name."""
    m = PROOF_NAME_RE.match(name)
    if not m:
        raise ManifestError(f"{where}: {name[:80]!r} is not a proof file name (<wheel>.proof.<16 hex>.json)",
                            "the file was edited: run `python -m builder repair`")  # fmt: skip
    check_wheel_name(m["wheel"], where)
    return m["wheel"]


def parse_proofs(wheel: str, f: "Fields") -> "tuple[ProofEntry, ...]":
    """An entry's optional "proofs": file name -> what the proof says; each name the wheel's own."""
    out = []
    for name, value in f.table("proofs", optional=True).items():
        p = Fields(value, f"{f.where}.proofs[{name[:80]}]")
        sha256 = p.text("sha256", SHA256_RE)
        if name != proof_name(wheel, sha256):
            raise f.fail("proofs", f"names {name[:80]!r}, not {proof_name(wheel, sha256)} (the wheel's name and the "
                                   "proof's sha256)")  # fmt: skip
        gpus, caps = p.texts("gpus", GPU_NAME_RE), p.texts("capabilities", ARCH_RE)
        if not gpus or len(gpus) != len(caps):
            raise p.fail("capabilities", "must give one compute capability per GPU, and at least one GPU")
        out.append(ProofEntry(name, sha256, gpus, caps, p.text("driver", DRIVER_RE), p.text("cuda", CUDA_RE),
                              p.text("torch", VERSION_RE), p.text("nccl", DRIVER_RE, optional=True) or "",
                              p.text("finished_at", STAMP_RE), p.text("host", HOST_RE),
                              p.text("signer", FINGERPRINT_RE, optional=True) or ""))  # fmt: skip
    return tuple(sorted(out, key=ProofEntry.order))


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
    if ".".join(public_version(entry.torch).split(".")[:2]) != m["torch"]:
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
    except RecursionError as exc:  # a nested one: a ManifestError, never a traceback (verify, install)
        raise ManifestError(f"{where} is not a manifest (nested too deeply)", "re-publish the wheelhouse") from exc
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
    statement = (top.text("expires", STAMP_RE, optional=True) or "", top.text("wheelhouse_id", ID_RE, optional=True)
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


def embedded_build_manifest(wheel: "zipfile.ZipFile", where: str) -> "dict[str, Any]":
    """The ds_builder.json inside a wheel (the top-level *.dist-info only), as a JSON object."""
    names = [n for n in wheel.namelist() if n.count("/") == 1 and n.endswith(f".dist-info/{BUILD_MANIFEST}")]
    if len(names) != 1:
        raise ManifestError(f"{where} holds {len(names)} {BUILD_MANIFEST} files, not one", "rebuild the wheel")
    try:
        data = json.loads(read_member(wheel, names[0], f"{where}: {names[0]}"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
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
