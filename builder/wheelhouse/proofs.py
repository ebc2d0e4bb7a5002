"""GPU proofs taken into a wheelhouse (`publish --proof`): each checked against the wheel it names,
kept beside it, and recorded in the signed manifest; and the same rules for `verify`.

A proof is written on a GPU node with no key (builder.proof). What vouches for it on a node is the
build host's signature over the manifest that lists it, so the build host takes in only a proof
of the wheel's own bytes, of GPUs the wheel has code for, that checked every CUDA op and saw no
failure of the wheel's.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from builder import node, output
from builder.contracts import Proof, wheel_failures
from builder.errors import PublishError
from builder.files import sha256_of, write_atomic
from builder.node import (
    ManifestError,
    ProofEntry,
    TooLarge,
    WheelEntry,
    arch_covers,
    read_bounded,
)

# The reason an op's numerics check is skipped where none is written (resources/smoke/wheel.unchecked):
# the op then counts as checked by its load on the GPU.
NO_CHECK_WRITTEN = "no check of what"


def device_ops(entry: WheelEntry) -> list[str]:
    """The wheel's ops with GPU code: all but its host ops (cpu_adam, async_io...)."""
    return [op for op in entry.ops if op not in (entry.host_ops or ())]


def refusals(proof: Proof, entry: WheelEntry) -> list[str]:
    """Why `proof` cannot vouch for the wheel of `entry` (pure; empty: it can)."""
    if proof.wheel != entry.name or proof.sha256 != entry.sha256:
        return [f"it is a proof of {proof.wheel} with sha256 {proof.sha256[:16]}..., not of the {entry.name} the "
                f"wheelhouse holds (sha256 {entry.sha256[:16]}...)"]  # fmt: skip
    if entry.accelerator != "cuda":
        return [f"{entry.name} is a CPU wheel: its smoke already ran every check it has"]
    why = []
    checks = {c.name: c for c in proof.checks}
    for op in device_ops(entry):
        load, numerics = checks.get(f"load:{op}"), checks.get(f"numerics:{op}")
        if load is None or load.status != "passed":
            why.append(f"CUDA op {op} did not load ({load.status if load else 'not checked'})")
        elif (
            numerics is None
            or numerics.status in ("failed", "upstream")
            or (numerics.status == "skipped" and not numerics.detail.startswith(NO_CHECK_WRITTEN))
        ):
            said = f"{numerics.status}: {numerics.detail.splitlines()[0][:160]}" if numerics and numerics.detail else (
                numerics.status if numerics else "not checked")  # fmt: skip
            why.append(f"what CUDA op {op} computes was not checked on the GPU ({said})")
    failed = wheel_failures(proof.checks)
    if failed:
        shown = ", ".join(c.name for c in failed[:6]) + (" ..." if len(failed) > 6 else "")
        why.append(f"the wheel's own checks failed on the GPU: {shown}")
    gpus = proof.facts.gpus
    foreign = sorted({f"{g.capability} ({g.name})" for g in gpus if not arch_covers(entry.archs, g.capability)})
    if foreign:
        why.append(f"it ran on compute capability {', '.join(foreign)}, which {entry.name} holds no code for (archs "
                   f"{', '.join(entry.archs) or 'none'})")  # fmt: skip
    return why


@dataclass(frozen=True)
class ProofFile:
    """A proof file read: what it says, its bytes, and its entry in the manifest (named by their sha256)."""

    proof: Proof
    data: bytes
    entry: ProofEntry


def read_proof(path: Path, unsigned_ok: bool = False) -> ProofFile:
    """A proof file given to publish, validated, and its signature (`path`.sig) checked against the prover
    keys this host trusts (prover.trusted); PublishError naming it otherwise. `unsigned_ok` takes in a
    proof with no signature, recorded so (the page says it rests on the build host's word)."""
    data = _read(path)
    found = load_proof(data, path)
    signer = _signer(path, data, unsigned_ok)
    return dataclasses.replace(found, entry=dataclasses.replace(found.entry, signer=signer))


def _signer(path: Path, data: bytes, unsigned_ok: bool) -> str:
    """The fingerprint of the trusted prover key that signed the proof's bytes ("" where unsigned and
    allowed); PublishError otherwise, saying how to trust the GPU node's key."""
    from builder import prover, signing

    where = Path(f"{path}.sig")
    how = ("if you trust the GPU node that made it: python -m builder key trust --prover '<the key line prove "
           "printed there>', then take it in again; or pass --unsigned-proof to take it in on your own word (the "
           "page then says so)")  # fmt: skip
    try:
        signature = read_bounded(where, "signature")
    except FileNotFoundError:
        if unsigned_ok:
            output.warn(f"{node.shown(path.name)} is taken in unsigned (--unsigned-proof): on this host's word")
            return ""
        said = f"refused the proof {node.shown(str(path))}: it is not signed (no {where.name} beside it)"
        raise PublishError(
            f"{said}, so nothing says which GPU node made it", f"copy the .sig `prove` wrote beside it; {how}"
        ) from None
    except (OSError, TooLarge) as exc:
        raise PublishError(f"cannot read the proof's signature {node.shown(str(where))}: {exc}", how) from exc
    try:
        checked = signing.check(data, signature, node.shown(str(where)), prover.trusted(signing.key_dir()),
                                prover.NAMESPACE)  # fmt: skip
    except ManifestError as exc:
        raise PublishError(f"refused the proof {node.shown(str(path))}: its signature is not one of a prover key "
                           f"this host trusts ({exc.message})", how) from exc  # fmt: skip
    return checked.key.fingerprint()


def _read(path: Path) -> bytes:
    fix = "pass the <wheel>.proof.json that `python -m builder prove` wrote on the GPU node"
    try:
        return read_bounded(path, "report")
    except FileNotFoundError:
        raise PublishError(f"no such proof: {path}", fix) from None
    except (OSError, TooLarge) as exc:
        raise PublishError(f"cannot read the proof {path}: {exc}", fix) from exc


def load_proof(data: bytes, path: Path) -> ProofFile:
    """A proof's bytes, validated, with its entry in the manifest; PublishError naming `path` otherwise.
    What is kept is the statement as prove writes it (Proof.to_json), whatever the file's indentation
    or key order: one statement, one file and one manifest entry."""
    try:
        proof = Proof.from_json(data, str(path))
    except ManifestError as exc:
        raise PublishError(f"refused the proof {node.shown(str(path))}: {exc.message}", exc.fix) from exc
    canonical = proof.to_json().encode("utf-8")
    return ProofFile(proof, canonical, proof.entry(hashlib.sha256(canonical).hexdigest()))


def accepted(wheelhouse: Path, entries: dict[str, WheelEntry], files: Sequence[Path],
             unsigned_ok: bool = False) -> list[ProofFile]:  # fmt: skip
    """Each proof read, its signature checked, and checked against the wheel the wheelhouse holds (its bytes
    too); PublishError for the first refused, before anything is written."""
    out = []
    for path in files:
        found = read_proof(path, unsigned_ok)
        proof = found.proof
        entry = entries.get(proof.wheel) or next((e for e in entries.values() if e.sha256 == proof.sha256), None)
        if entry is None:
            raise PublishError(f"refused the proof {path}: it is a proof of {proof.wheel}, which {wheelhouse} does not "
                               "hold", "publish the wheel first, or take the proof into the wheelhouse that holds "
                               "it")  # fmt: skip
        why = refusals(proof, entry)
        if not why and sha256_of(wheelhouse / entry.name) != entry.sha256:
            why = [f"{entry.name} in {wheelhouse} is not the published file (sha256 differs): run verify"]
        if why:
            raise PublishError(f"refused the proof {path} for {entry.name}: " + "; ".join(why),
                               "prove the published wheel on a node of the GPUs it is built for (`python -m builder "
                               "prove --wheelhouse ...`) and take in that proof; a failure of the wheel's is fixed in "
                               "the build")  # fmt: skip
        out.append(found)
    return out


MAX_PROOFS = 16  # per wheel: a node of each GPU kind a site runs, proven again after a driver update


def with_proofs(entries: dict[str, WheelEntry], taken: Sequence[ProofFile]) -> dict[str, WheelEntry]:
    """The wheel entries with each proof recorded (pure): one entry per proof file, several per wheel, at
    most MAX_PROOFS (PublishError beyond: the manifest every node reads stays small)."""
    out = dict(entries)
    for found in taken:
        entry = out[found.proof.wheel]
        kept = tuple(p for p in entry.proofs if p.name != found.entry.name)
        if len(kept) >= MAX_PROOFS:
            raise PublishError(f"{entry.name} has {len(kept)} GPU proofs already, the most a wheel keeps",
                               f"a wheel keeps at most {MAX_PROOFS}: the ones there already vouch for it; a new build "
                               "of the wheel starts with none")  # fmt: skip
        out[entry.name] = dataclasses.replace(entry, proofs=tuple(sorted((*kept, found.entry), key=ProofEntry.order)))
    return out


def write_proofs(wheelhouse: Path, taken: Sequence[ProofFile]) -> list[str]:
    """The proof files beside their wheels, as given (their bytes are what the manifest hashes)."""
    for found in taken:
        write_atomic(wheelhouse / found.entry.name, found.data)
        output.note(f"took in {found.entry.name}: {found.entry.describe()}")
    return [found.entry.name for found in taken]


def verify_proofs(wheelhouse: Path, entry: WheelEntry) -> list[str]:
    """verify: every proof the manifest lists for a wheel is there, is the file it hashed, is bound to the
    wheel's bytes, says what the manifest says of it, and would be taken in today."""
    problems = []
    for listed in entry.proofs:
        path = wheelhouse / listed.name
        if path.is_symlink() or not path.is_file():
            why = ("a link, not the file publish wrote" if path.is_symlink() else "missing" if not path.exists()
                   else "not a regular file (a FIFO, a folder or a device in its place)")  # fmt: skip
            problems.append(f"{listed.name}: {why}")
            continue
        try:
            data = _read(path)
            if hashlib.sha256(data).hexdigest() != listed.sha256:
                problems.append(f"{listed.name}: sha256 differs from manifest.json")
                continue
            found = load_proof(data, path)
        except PublishError as exc:
            problems.append(exc.message)
            continue
        if dataclasses.replace(found.entry, signer=listed.signer) != listed:  # the signer: the manifest's word
            problems.append(f"{listed.name}: manifest.json says otherwise of the proof than the file does")
        problems += [f"{listed.name}: {why}" for why in refusals(found.proof, entry)]
    return problems
