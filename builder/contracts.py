"""The files that cross a stage on the build host: the build manifest inside a wheel, the smoke report.

Each is one frozen dataclass with one writer (`to_json`) and one loader (`from_json`) that checks
the schema version and every field the next stage relies on, and names the file and the field
when one is wrong. The wheelhouse manifest and the node facts are in `builder.node`, because the
node installer must read them with the standard library alone; the field checks are shared.
"""

from __future__ import annotations

import json
import re
import zipfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from builder.node import (
    ACCELERATORS,
    ARCH_RE,
    BUILD_MANIFEST,
    CHECK_STATUSES,
    CPU_FLAG_RE,
    CPU_TARGETS,
    CUDA_RE,
    INDEX_URL_RE,
    NAME_RE,
    OP_RE,
    PYTHON_TAG_RE,
    SHA256_RE,
    STAMP_RE,
    TORCH_VARIANT_RE,
    VERSION_RE,
    Fields,
    ManifestError,
    arch_table,
    check_wheel_name,
    embedded_build_manifest,
    link_secret,
    reason_table,
)

BUILD_SCHEMA = 1
SMOKE_SCHEMA = 1
_FLAG = CPU_FLAG_RE
_ANY = re.compile(r"^.{0,200}$", re.DOTALL)


@dataclass(frozen=True)
class BuildManifest:
    """`*.dist-info/ds_builder.json`: what a wheel was built from and for.

    The typed fields are what smoke, publish, verify and the node installer rely on; `data` is the
    whole document as written (toolchain, flags, sizes, build key inputs), kept for people.
    """

    version: str
    recipe: str
    recipe_torch: str  # the recipe's torch: a version or "system"
    accelerator: str
    python_tag: str
    torch_version: str
    torch_cuda: str | None
    archs: tuple[str, ...]
    cpu_target: str
    cpu_flags: tuple[str, ...]
    ops: tuple[str, ...]
    source_sha256: str
    build_key: str | None
    data: Mapping[str, Any]
    narrowed_ops: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    missing_ops: Mapping[str, str] = field(default_factory=dict)  # op asked for -> why it is not in the wheel
    torch_variant: str | None = None  # the recipe's named torch build (cpu, cu130): the smoke installs the same
    torch_index: str | None = None  # the recipe's own index for it (a site's mirror)
    # site configs that fail for DeepSpeed's own reason: config file -> {"reason", "link"?} (the recipe's)
    known_failures: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> BuildManifest:
        f = Fields(dict(data), where)
        schema = f.get("schema", int)
        if schema != BUILD_SCHEMA:
            raise f.fail("schema", f"is {schema}; this toolkit reads {BUILD_SCHEMA}")
        recipe = Fields(f.get("recipe", dict), f"{where}: recipe")
        torch = Fields(f.get("torch", dict), f"{where}: torch")
        source = Fields(f.get("source", dict), f"{where}: source")
        return cls(
            version=f.text("version", VERSION_RE),
            recipe=recipe.text("name", NAME_RE),
            recipe_torch=recipe.text("torch", VERSION_RE),
            accelerator=f.choice("accelerator", ACCELERATORS),
            python_tag=f.text("python_tag", PYTHON_TAG_RE),
            torch_version=torch.text("version", VERSION_RE),
            torch_cuda=torch.text("cuda", CUDA_RE, optional=True),
            archs=f.texts("archs", ARCH_RE),
            cpu_target=f.choice("cpu_target", CPU_TARGETS),
            cpu_flags=f.texts("cpu_flags", _FLAG, optional=True),
            ops=f.texts("ops", OP_RE),
            source_sha256=source.text("sha256", SHA256_RE),
            build_key=f.text("build_key", re.compile(r"^[0-9a-f]{8,64}$"), optional=True),
            data=dict(data),
            narrowed_ops=arch_table(f, "narrowed_ops"),
            missing_ops=reason_table(f, "missing_ops"),
            torch_variant=torch.text("variant", TORCH_VARIANT_RE, optional=True),
            torch_index=torch.text("index", INDEX_URL_RE, optional=True),
            known_failures=known_table(f),
        )

    def to_json(self) -> str:
        return json.dumps(self.data, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_wheel(cls, wheel: Path) -> BuildManifest:
        where = f"{wheel.name}: {BUILD_MANIFEST}"
        try:
            with zipfile.ZipFile(wheel) as zf:
                return cls.from_dict(embedded_build_manifest(zf, wheel.name), where)
        except zipfile.BadZipFile as exc:
            raise ManifestError(f"{wheel.name} is not a zip file", "rebuild it") from exc
        except OSError as exc:
            raise ManifestError(f"cannot read {wheel}: {exc.strerror}", "pass the path of a built wheel") from exc


_LINK = re.compile(r"^https?://[^\s<>\"']{1,500}$")
_REASON = re.compile(r"^[^\x00-\x1f\x7f]{1,500}$")


def known_table(f: Fields) -> dict[str, dict[str, str]]:
    """The manifest's optional known_failures: each a config it embeds, a short reason, an http(s) link."""
    table = f.table("known_failures", optional=True)
    configs: dict[str, Any] = f.data["configs"] if isinstance(f.data.get("configs"), dict) else {}
    out = {}
    for name, entry in table.items():
        e = Fields(entry, f"{f.where}: known_failures[{name[:60]!r}]")
        if name not in configs:
            raise f.fail("known_failures", f"names {name[:60]!r}, which is not one of its configs")
        reason, link = e.text("reason", _REASON), e.text("link", _LINK, optional=True)
        if link and (secret := link_secret(link)) is not None:
            raise e.fail("link", f"holds {secret}")
        out[name] = {"reason": reason, **({"link": link} if link else {})}
    return out


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # passed | failed | skipped | upstream (DeepSpeed's own failure, shown without the wheel)
    detail: str = ""


@dataclass(frozen=True)
class SmokeReport:
    """`<wheel>.smoke.json`: each check's result, bound to the exact bytes tested by their sha256."""

    wheel: str
    sha256: str
    passed: bool
    checks: tuple[Check, ...]
    seconds: float
    finished_at: str

    def to_json(self) -> str:
        return json.dumps({"schema": SMOKE_SCHEMA, **asdict(self)}, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes, where: str) -> SmokeReport:
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ManifestError(f"{where} is not valid JSON ({exc})", "run smoke on the wheel again") from exc
        f = Fields(data, where)
        schema = f.get("schema", int, optional=True)
        if schema not in (None, SMOKE_SCHEMA):
            raise f.fail("schema", f"is {schema}; this toolkit reads {SMOKE_SCHEMA}")
        checks = []
        for i, item in enumerate(f.get("checks", list)):
            c = Fields(item, f"{where}: checks[{i}]")
            checks.append(Check(c.text("name", _ANY), c.choice("status", CHECK_STATUSES), c.get("detail", str)))
        seconds = f.get("seconds", (int, float))
        wheel: str = f.get("wheel", str)
        check_wheel_name(wheel, f"{where}: wheel")
        report = cls(
            wheel=wheel,
            sha256=f.text("sha256", SHA256_RE),
            passed=f.get("passed", bool),
            checks=tuple(checks),
            seconds=float(seconds),
            finished_at=f.text("finished_at", STAMP_RE),
        )
        if report.passed != verdict(report.checks):
            raise f.fail("passed", f"is {report.passed}, but its checks say {verdict(report.checks)}")
        return report

    def summary_checks(self) -> dict[str, tuple[str, str]]:
        """name -> (status, first line of detail), as the wheelhouse manifest keeps them."""
        return {c.name: (c.status, c.detail.splitlines()[0] if c.detail else "") for c in self.checks}


def verdict(checks: tuple[Check, ...] | list[Check]) -> bool:
    """Passed only if something ran and nothing failed; a skip is reported, never a pass on its own."""
    return any(c.status == "passed" for c in checks) and not any(c.status == "failed" for c in checks)
