"""Wheel and variant file names, read as PEP 427 and the draft PEP 817 write them: a name that does not
parse (a path separator, `..`) is refused before it is used as a path.
"""

import re
from dataclasses import dataclass

from builder.node.contract import WHEEL_NAME_RE, ManifestError


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
    m = WHEEL_NAME_RE.match(name)
    if not m:
        raise ManifestError(f"{where}: {name!r} is not a wheel file name", "the wheelhouse was edited: re-publish it")
    return WheelName(normalize(m["name"]), m["version"], m["python"], m["abi"], m["platform"])


def is_wheel_name(name: str) -> bool:
    try:
        check_wheel_name(name)
    except ManifestError:
        return False
    return True


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


def public_version(version: str) -> str:
    return version.split("+", 1)[0]
