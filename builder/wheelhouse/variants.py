"""Wheel variants (experimental; the draft PEPs 817 and 825): each CUDA wheel also published
relabelled by its GPU archs, so an installer that reads variants picks the build for the node.

What uv 0.13.9 accepts, measured (machine.md; tests/test_variants.py): a variant wheel is the
wheel name of a shared version plus `-<label>`, with `*.dist-info/variant.json`; the project page
links `<name>-<version>-variants.json`, whose `$schema` is uv's PEP 825 draft URL (variantlib
0.2.2 writes another one, which uv does not know, so this module writes both files itself); the
`nvidia` namespace uses uv's built-in NVIDIA provider (`sm_arch`, `cuda_version_lower_bound`).

Variants of one version must share it, and build-wheel's versions name their archs
(`+cu130.torch2.14.sm80.sm90`): a variant carries the version without the arch part
(`+cu130.torch2.14`), so `deepspeed==0.19.8+cu130.torch2.14` selects among the arch builds. There
is no null variant: uv takes the null variant exactly where no other fits (no GPU, a GPU older than
every arch, a driver older than the CUDA), and no CUDA build runs there (measured: an sm_90-only
fallback was handed to sm_86, sm_70, no-GPU and CUDA 12.8-driver nodes without a word). Without
one, uv says no variant fits, and the node installer (or a plain wheel) says why.

Planning is pure (`plan`); a variant's bytes are a pure function of its source wheel's bytes
(`variant_bytes`: the same zip entries and times, the dist-info and .data renamed, METADATA's
Version changed, variant.json added, RECORD rewritten), so verify can rebuild and compare them.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from builder.node import (
    VariantEntry,
    WheelEntry,
    check_wheel_name,
    normalize,
)

# The draft schema uv 0.13.9 implements (uv_distribution_types: VARIANT_SCHEMA).
SCHEMA = "https://variants-schema.wheelnext.dev/peps/825/v0.1.1.json"
NAMESPACE = "nvidia"
# Provider discovery (a prototype extension outside PEP 825): uv runs its built-in NVIDIA provider
# for this namespace; other installers would install this plugin.
PROVIDER = {"requires": ["nvidia-variant-provider"], "plugin-api": "nvidia_variant_provider.plugin:NvidiaVariantPlugin"}


@dataclass(frozen=True)
class Planned:
    name: str  # the variant wheel's file name
    wheel: str  # the published wheel it is made from
    version: str  # the shared version it carries
    label: str
    properties: tuple[str, ...]


def _sm(arch: str) -> str:
    major, minor = arch.split("+")[0].split(".")
    return f"{major}{minor}"


def properties_of(entry: WheelEntry) -> tuple[str, ...]:
    """The wheel's variant properties: each arch it holds SASS for (and PTX where it carries it),
    and the CUDA it was built with as the driver's lower bound. Arch-specific archs (9.0a, 10.0f)
    have no provider value and add none."""
    props = set()
    for arch in entry.archs:
        if arch.split("+")[0][-1] in "af":
            continue
        props.add(f"{NAMESPACE} :: sm_arch :: {_sm(arch)}_real")
        if arch.endswith("+PTX"):
            props.add(f"{NAMESPACE} :: sm_arch :: {_sm(arch)}_virtual")
    if not props or not entry.cuda:
        return ()
    major, minor = entry.cuda.split(".")[:2]
    props.add(f"{NAMESPACE} :: cuda_version_lower_bound :: {major}.{minor}")
    return tuple(sorted(props))


def shared_version(version: str) -> str:
    """The version every arch build of one DeepSpeed, torch and CUDA shares: the arch part dropped."""
    public, _, local = version.partition("+")
    kept = [part for part in local.split(".") if not (part.startswith("sm") and part[2:3].isdigit())]
    return f"{public}+{'.'.join(kept)}" if kept else public


def label_of(entry: WheelEntry) -> str:
    """cu130_sm80.sm90: the CUDA and the archs, in the label alphabet [0-9a-z._]."""
    local = entry.version.partition("+")[2].split(".")
    cuda = next((p for p in local if p.startswith("cu")), "cuda")
    archs = ".".join(p for p in local if p.startswith("sm") and p[2:3].isdigit())
    return f"{cuda}_{archs}".lower()


def variant_name(wheel: str, version: str, label: str) -> str:
    w = check_wheel_name(wheel)
    dist = wheel.split("-")[0]
    return f"{dist}-{version}-{w.python}-{w.abi}-{w.platform}-{label}.whl"


def index_name(project: str, version: str) -> str:
    """`<name>-<version>-variants.json`, the file the project page must link for `version`."""
    return f"{normalize(project).replace('-', '_')}-{version}-variants.json"


def plan(wheels: Mapping[str, WheelEntry]) -> dict[str, Planned]:
    """Every variant wheel the published CUDA wheels make: one per wheel with a provider value
    (no null fallback: see the module's docstring)."""
    groups: dict[tuple[str, str, str, str, str], list[WheelEntry]] = {}
    for name, entry in sorted(wheels.items()):
        if entry.accelerator != "cuda" or not entry.smoke.passed or not properties_of(entry):
            continue
        w = check_wheel_name(name)
        groups.setdefault((w.project, shared_version(entry.version), w.python, w.abi, w.platform), []).append(entry)
    out: dict[str, Planned] = {}
    for (_, version, _, _, _), entries in sorted(groups.items()):
        for entry in entries:
            label = label_of(entry)
            name = variant_name(entry.name, version, label)
            out[name] = Planned(name, entry.name, version, label, properties_of(entry))
    return out


def _variant_table(properties: Sequence[str]) -> dict[str, dict[str, list[str]]]:
    table: dict[str, dict[str, list[str]]] = {}
    for prop in properties:
        namespace, feature, value = (part.strip() for part in prop.split("::"))
        table.setdefault(namespace, {}).setdefault(feature, []).append(value)
    return {ns: {f: sorted(v) for f, v in sorted(feats.items())} for ns, feats in sorted(table.items())}


def variants_document(variants: Sequence[Planned | VariantEntry]) -> str:
    """The PEP 825 JSON for these variants: the index file (all of a version's variants) or one
    wheel's dist-info/variant.json (its own alone)."""
    doc = {
        "$schema": SCHEMA,
        "default-priorities": {"namespace": [NAMESPACE]},
        "providers": {NAMESPACE: PROVIDER},
        "variants": {v.label: _variant_table(v.properties) for v in sorted(variants, key=lambda v: v.label)},
    }
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def indexes(planned: Mapping[str, Planned]) -> dict[str, str]:
    """<name>-<version>-variants.json -> its text, for every shared version."""
    by_version: dict[str, list[Planned]] = {}
    for p in planned.values():
        by_version.setdefault(index_name(check_wheel_name(p.wheel).project, p.version), []).append(p)
    out = {}
    for name, variants in sorted(by_version.items()):
        labels: dict[str, Planned] = {}
        for v in variants:  # one label per version (the same label on every platform: same archs)
            labels.setdefault(v.label, v)
        out[name] = variants_document(list(labels.values()))
    return out


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def variant_bytes(source: Path, planned: Planned) -> bytes:
    """The variant wheel made from the published wheel `source`: deterministic, so the same
    source always gives the same bytes (verify rebuilds and compares)."""
    dist = planned.wheel.split("-")[0]
    old_version = check_wheel_name(planned.wheel).version
    renames = {f"{dist}-{old_version}.dist-info/": f"{dist}-{planned.version}.dist-info/",
               f"{dist}-{old_version}.data/": f"{dist}-{planned.version}.data/"}  # fmt: skip
    dist_info = f"{dist}-{planned.version}.dist-info"
    out = io.BytesIO()
    records: list[str] = []
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        last = None
        for info in src.infolist():
            name = info.filename
            for old, new in renames.items():
                if name.startswith(old):
                    name = new + name[len(old) :]
            if name == f"{dist_info}/RECORD":
                last = info
                continue
            data = src.read(info)
            if name == f"{dist_info}/METADATA":
                lines = data.decode("utf-8").split("\n")
                lines = [f"Version: {planned.version}" if line.startswith("Version: ") else line for line in lines]
                data = "\n".join(lines).encode("utf-8")
            copy = zipfile.ZipInfo(name, info.date_time)
            copy.compress_type, copy.external_attr = info.compress_type, info.external_attr
            dst.writestr(copy, data)
            records.append(f"{name},{_record_hash(data)},{len(data)}")
        variant = variants_document([planned]).encode("utf-8")
        stamp = last.date_time if last else (1980, 1, 1, 0, 0, 0)
        extra = zipfile.ZipInfo(f"{dist_info}/variant.json", stamp)
        extra.compress_type, extra.external_attr = zipfile.ZIP_DEFLATED, 0o644 << 16
        dst.writestr(extra, variant)
        records.append(f"{dist_info}/variant.json,{_record_hash(variant)},{len(variant)}")
        record = zipfile.ZipInfo(f"{dist_info}/RECORD", stamp)
        record.compress_type, record.external_attr = zipfile.ZIP_DEFLATED, 0o644 << 16
        dst.writestr(record, "\n".join([*records, f"{dist_info}/RECORD,,"]) + "\n")
    return out.getvalue()


def entries(planned: Mapping[str, Planned], digests: Mapping[str, str]) -> dict[str, VariantEntry]:
    return {n: VariantEntry(n, digests[n], p.wheel, p.label, p.properties) for n, p in sorted(planned.items())}
