"""The files that cross a stage on the build host: the build manifest inside a wheel, the smoke report.

Each is one frozen dataclass with one writer (`to_json`) and one loader (`from_json`) that checks
the schema version and every field the next stage relies on, and names the file and the field
when one is wrong. The wheelhouse manifest and the node facts are in `builder.node`, because the
node installer must read them with the standard library alone; the field checks are shared.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import zipfile
from collections.abc import Mapping, Sequence
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
    ProofEntry,
    arch_table,
    check_wheel_name,
    embedded_build_manifest,
    link_secret,
    parse_stamp,
    proof_name,
    reason_table,
)
from builder.node.entries import describe_gpus
from builder.node.manifest import DRIVER_RE, GPU_NAME_RE, HOST_RE

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
        return summarize(self.checks)


def summarize(checks: Sequence[Check]) -> dict[str, tuple[str, str]]:
    """name -> (status, first line of detail) (pure)."""
    return {c.name: (c.status, c.detail.splitlines()[0] if c.detail else "") for c in checks}


def verdict(checks: tuple[Check, ...] | list[Check]) -> bool:
    """Passed only if something ran and nothing failed; a skip is reported, never a pass on its own."""
    return any(c.status == "passed" for c in checks) and not any(c.status == "failed" for c in checks)


# A failed check whose detail starts so was judged DeepSpeed's own by the reference run (builder.reference):
# not the wheel's failure.
OWN_FAILURE = "DeepSpeed's own failure"


def wheel_failures(checks: Sequence[Check]) -> list[Check]:
    """The failed checks that are the wheel's (or the toolkit's): all but DeepSpeed's own (pure)."""
    return [c for c in checks if c.status == "failed" and not c.detail.startswith(OWN_FAILURE)]


# The GPU proof: an in-toto v1 Statement (the format PEP 740's attestations and SLSA provenance carry),
# its subject the wheel, its predicate what `prove` ran on a GPU node. The predicate type is the
# toolkit's own, versioned: a new version is a new type, refused by this loader by name.
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PROOF_TYPE_PREFIX = "urn:ds-wheel-builder:gpu-proof:"
PROOF_TYPE = PROOF_TYPE_PREFIX + "v1"
_SHORT = re.compile(r"^[^\x00-\x1f\x7f]{0,300}$")
_PY = re.compile(r"^\d\.\d{1,2}\.\d{1,3}[a-z0-9+]{0,8}$")  # 3.12.3, 3.14.0a1+ (a build from a checkout)
# A proof's bounds: a node holds a few GPUs (a GB200 node 4, an HGX 8), the smoke about 200 checks. Six
# proofs of 43,000 GPUs each made a 35 MB manifest nothing could read any more.
MAX_GPUS = 64
MAX_CHECKS = 2000
MAX_DETAIL = 16 << 10  # characters of one check's detail
_CHECK_NAME = re.compile(r"^[^\x00-\x1f\x7f]{1,200}$")


@dataclass(frozen=True)
class Gpu:
    name: str
    capability: str  # "9.0"
    memory_mib: int


@dataclass(frozen=True)
class GpuFacts:
    """The node a proof ran on: what torch saw of its GPUs, the driver NVML or nvidia-smi gave, the
    CUDA runtime and NCCL torch was built with."""

    gpus: tuple[Gpu, ...]
    driver: str
    cuda: str
    torch: str
    nccl: str  # "" where torch has none
    python: str
    host: str

    def describe(self) -> str:
        """ "NVIDIA H200 (9.0), driver 580.65, CUDA 13.0, torch 2.11.0": what a proof's entry says it ran on."""
        return describe_gpus([g.name for g in self.gpus], [g.capability for g in self.gpus], self.driver, self.cuda,
                             self.torch)  # fmt: skip


@dataclass(frozen=True)
class Proof:
    """`<wheel>.proof.json`: the GPU checks a wheel passed on one node, bound to its bytes by sha256.

    Written on a GPU node with no key (there is none there): the build host's signature covers it
    once `publish --proof` takes it in. Its `content_sha256` (over the rest, canonical JSON) tells a
    proof changed after it was written, by hand or in a damaged copy."""

    wheel: str
    sha256: str
    facts: GpuFacts
    checks: tuple[Check, ...]
    started_at: str
    finished_at: str
    seconds: float
    toolkit: str
    source: str  # the wheelhouse the wheel was fetched from, as given

    @property
    def passed(self) -> bool:
        return any(c.status == "passed" for c in self.checks) and not wheel_failures(self.checks)

    def statement(self) -> dict[str, Any]:
        f = self.facts
        predicate = {
            "gpus": [asdict(g) for g in f.gpus], "driver": f.driver, "cuda": f.cuda, "torch": f.torch,
            "nccl": f.nccl or None, "python": f.python, "host": f.host, "toolkit": self.toolkit,
            "wheelhouse": self.source, "started_at": self.started_at, "finished_at": self.finished_at,
            "seconds": self.seconds, "passed": self.passed, "checks": [asdict(c) for c in self.checks],
        }  # fmt: skip
        return {"_type": STATEMENT_TYPE, "subject": [{"name": self.wheel, "digest": {"sha256": self.sha256}}],
                "predicateType": PROOF_TYPE, "predicate": predicate}  # fmt: skip

    def to_json(self) -> str:
        data = self.statement()
        data["predicate"]["content_sha256"] = content_digest(data)
        return json.dumps(data, indent=2) + "\n"

    def entry(self, sha256: str) -> ProofEntry:
        """What the wheelhouse manifest says of this proof, kept in a file of sha256 `sha256`."""
        f = self.facts
        return ProofEntry(proof_name(self.wheel, sha256), sha256, tuple(g.name for g in f.gpus),
                          tuple(g.capability for g in f.gpus), f.driver, f.cuda, f.torch, f.nccl, self.finished_at,
                          f.host)  # fmt: skip

    @classmethod
    def from_json(cls, text: str | bytes, where: str) -> Proof:
        fix = "run `python -m builder prove` on the GPU node again and take in the file it writes"
        data = strict_json(text, where, fix)
        top = Fields(data, where)
        if top.get("_type", str) != STATEMENT_TYPE:
            raise top.fail("_type", f"is not {STATEMENT_TYPE} (an in-toto v1 Statement)")
        kind: str = top.get("predicateType", str)
        if kind != PROOF_TYPE:
            said = (
                f"is {kind[:80]!r}, a version this toolkit does not read (it reads {PROOF_TYPE})"
                if kind.startswith(PROOF_TYPE_PREFIX)
                else f"is {kind[:80]!r}, not a GPU proof ({PROOF_TYPE})"
            )
            raise top.fail("predicateType", said)  # fmt: skip
        subjects = top.get("subject", list)
        if len(subjects) != 1:
            raise top.fail("subject", f"names {len(subjects)} files, not the one wheel")
        subject = Fields(subjects[0], f"{where}: subject[0]")
        wheel: str = subject.get("name", str)
        check_wheel_name(wheel, f"{where}: subject[0].name")
        sha256 = Fields(subject.get("digest", dict), f"{where}: subject[0].digest").text("sha256", SHA256_RE)
        p = Fields(top.get("predicate", dict), f"{where}: predicate")
        gpus = []
        if len(p.get("gpus", list)) > MAX_GPUS:
            raise p.fail("gpus", f"lists {len(p.data['gpus'])} GPUs, more than the {MAX_GPUS} a node holds")
        if len(p.get("checks", list)) > MAX_CHECKS:
            raise p.fail("checks", f"lists {len(p.data['checks'])} checks, more than the {MAX_CHECKS} prove runs")
        for i, item in enumerate(p.get("gpus", list)):
            g = Fields(item, f"{where}: predicate.gpus[{i}]")
            memory = g.get("memory_mib", int)
            if not 0 <= memory < 1 << 32:
                raise g.fail("memory_mib", "is out of range")
            gpus.append(Gpu(g.text("name", GPU_NAME_RE), g.text("capability", ARCH_RE), memory))
        if not gpus:
            raise p.fail("gpus", "is empty: the proof ran on no GPU")
        checks = []
        for i, item in enumerate(p.get("checks", list)):
            c = Fields(item, f"{where}: predicate.checks[{i}]")
            detail: str = c.get("detail", str)
            if len(detail) > MAX_DETAIL:
                raise c.fail("detail", f"is {len(detail)} characters long, more than {MAX_DETAIL}")
            checks.append(Check(c.text("name", _CHECK_NAME), c.choice("status", CHECK_STATUSES), detail))
        seconds = p.get("seconds", (int, float))
        if not math.isfinite(seconds) or seconds < 0:
            raise p.fail("seconds", f"is {seconds!r}, not a finite number of seconds from 0 up")
        started, finished = (parse_stamp(p.text(key, STAMP_RE)) for key in ("started_at", "finished_at"))
        for key, when in (("started_at", started), ("finished_at", finished)):
            if when is None:
                raise p.fail(key, f"is {p.data[key][:40]!r}, not a time as prove writes it (2026-11-28T15:00:00Z)")
        if started is not None and finished is not None and finished < started:
            raise p.fail("finished_at", "is before started_at")
        facts = GpuFacts(tuple(gpus), p.text("driver", DRIVER_RE), p.text("cuda", CUDA_RE), p.text("torch", VERSION_RE),
                         p.text("nccl", DRIVER_RE, optional=True) or "", p.text("python", _PY),
                         p.text("host", HOST_RE))  # fmt: skip
        proof = cls(wheel, sha256, facts, tuple(checks), p.text("started_at", STAMP_RE),
                    p.text("finished_at", STAMP_RE), float(seconds), p.text("toolkit", _SHORT),
                    p.text("wheelhouse", _SHORT))  # fmt: skip
        if p.get("passed", bool) != proof.passed:
            raise p.fail("passed", f"is {p.data['passed']}, but its checks say {proof.passed}: the proof was changed "
                                   "after it was written")  # fmt: skip
        sealed = p.text("content_sha256", SHA256_RE)
        if sealed != content_digest(data):
            raise ManifestError(f"{where} was changed after `prove` wrote it: its content_sha256 does not match what "
                                "it holds", fix)  # fmt: skip
        return proof


def strict_json(text: str | bytes, where: str, fix: str) -> Any:
    """JSON read strictly, as a signed or hashed file must be: UTF-8 only (json.loads guesses UTF-16 and
    32 from bytes), no key twice in one object (which one counts differs between readers), no NaN or
    Infinity (not JSON), nesting within Python's limits; ManifestError naming `where` otherwise."""

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in pairs]
        twice = sorted({k for k in keys if keys.count(k) > 1})
        if twice:
            raise ValueError(f"key {twice[0][:40]!r} appears twice in one object")
        return dict(pairs)

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON number")

    try:
        decoded = text.decode("utf-8") if isinstance(text, bytes) else text
        return json.loads(decoded, object_pairs_hook=no_duplicates, parse_constant=no_constant)
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{where} is not UTF-8 ({str(exc)[:120]})", fix) from exc
    except (ValueError, RecursionError) as exc:
        raise ManifestError(f"{where} is not valid JSON ({str(exc)[:200]})", fix) from exc


def content_digest(statement: Mapping[str, Any]) -> str:
    """sha256 of a statement as canonical JSON (sorted keys, no spaces, ASCII), its predicate's
    content_sha256 left out."""
    predicate = {k: v for k, v in statement.get("predicate", {}).items() if k != "content_sha256"}
    text = json.dumps({**statement, "predicate": predicate}, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()
