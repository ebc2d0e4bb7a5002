"""Where a wheelhouse keeps what, its manifest's one reader and one writer, and its lock.

wheelhouse/<wheel> with <wheel>.metadata (PEP 658), <wheel>.smoke.json and its GPU proofs; the dependency wheels;
simple/ (PEP 503); tools/ds-node-install.py; locks/; manifest.json (builder.node's contract).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock

from builder import node, output, signing
from builder.errors import PublishError, WheelhouseError
from builder.files import is_temp_name, write_atomic
from builder.node import (
    IMAGES,
    LOCK_NAME_RE,
    MANIFEST_FILE,
    ManifestError,
    Signature,
    Trust,
    WheelEntry,
    WheelhouseManifest,
)

MANIFEST = MANIFEST_FILE

SIGNATURE = node.SIGNATURE_FILE  # manifest.json.sig: ssh-keygen -Y sign of manifest.json's bytes
SIG_PENDING = f".{SIGNATURE}.pending.tmp"  # the next signature, staged before the manifest is renamed

LOCK = ".publish.lock"

JOURNAL = ".publish-journal.json"

INTERRUPTED = "left by an interrupted publish (run `python -m builder repair` to remove it)"

DOCS = ("README.md",)  # files a person may keep in the wheelhouse folder

LOCKS = "locks"

# The folder a publish downloads DeepSpeed's dependencies into, inside the wheelhouse (same file
# system): `.deps.<random>.tmp`, and `.deps-<random>` as older versions named it. A killed publish
# leaves it behind; the next publish and repair remove it.
DEPS_PREFIX, DEPS_SUFFIX = ".deps.", ".tmp"
_DEPS_FOLDER = re.compile(r"^\.deps[-.][A-Za-z0-9_]{8}(\.tmp)?$")


def is_deps_folder(name: str) -> bool:
    return bool(_DEPS_FOLDER.match(name))


# Nodes have torch (and recipes pin it); everything else DeepSpeed needs goes into the wheelhouse.
NOT_BUNDLED = ("torch",)


def read_manifest(wheelhouse: Path) -> tuple[bytes, WheelhouseManifest] | None:
    """manifest.json's bytes and what they say, validated field by field but not yet trusted (its
    signature unchecked); None when there is none yet. `load_manifest` is what writers use."""
    path = wheelhouse / MANIFEST
    try:
        with node.open_regular(path) as f:
            data = node.read_limited(f, "manifest", str(path))
    except FileNotFoundError:
        return None
    except node.NotAFile as exc:
        raise WheelhouseError(
            f"{exc}: the wheelhouse was damaged or tampered with",
            "restore manifest.json from the build host, or publish into a new wheelhouse",
        ) from exc
    except OSError as exc:
        raise WheelhouseError(f"cannot read {path}: {exc.strerror}", "check the wheelhouse's permissions") from exc
    except ManifestError as exc:
        raise WheelhouseError(exc.message, exc.fix) from exc
    try:
        return data, node.parse_manifest(data, str(path))
    except ManifestError as exc:
        raise WheelhouseError(
            exc.message, "restore manifest.json from a backup, or publish into a new wheelhouse"
        ) from exc


def load_manifest(wheelhouse: Path, trust: Trust | None = None) -> WheelhouseManifest:
    """The wheelhouse's manifest, validated and signed by a key this host trusts (or `trust`), not
    older than what this host signed before; empty when there is none yet. Everything the toolkit
    builds on a wheelhouse (publish, lock, image, prune, repair, provision) starts here."""
    found = read_manifest(wheelhouse)
    if found is None:
        return WheelhouseManifest()
    check_signed(wheelhouse, *found, trust)
    return found[1]


def changed_since_signed(own: node.PublicKey) -> str:
    """The fix where this host's own signature fails: the manifest changed after this host signed it
    (verify's fix once sent the host that signed to itself)."""
    return (
        f"this host signed it, with its own key ({own.fingerprint()}), and {MANIFEST} was changed since: put "
        f"back the {MANIFEST} this host wrote (a backup or another copy of the wheelhouse), or publish the wheels "
        "into a new wheelhouse; nothing re-signs a manifest whose signature fails"
    )


def signed_by(path: Path, key: node.PublicKey) -> bool:
    """Whether the signature file at `path` names `key` as its signer (read only to choose a fix)."""
    try:
        return node.parse_signature(node.read_bounded(path, "signature"), str(path)).key == key
    except (OSError, ManifestError, node.TooLarge):
        return False


def check_signed(
    wheelhouse: Path, data: bytes, manifest: WheelhouseManifest, trust: Trust | None = None, rollback: bool = False
) -> Signature:
    """manifest.json's signature by a trusted key (this host's allowed_signers, or `trust`), and a
    serial not below the last one this host signed or accepted for that wheelhouse (unless
    `rollback`: going back on purpose)."""
    k = signing.keys()
    trust = trust if trust is not None else k.trust()
    path = wheelhouse / SIGNATURE
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise WheelhouseError(f"{path} is not a regular file (a link, a FIFO, a folder or a device): the wheelhouse "
                              "was damaged or tampered with", "restore the wheelhouse from the build host that "
                              "signed it, or re-sign it there (`python -m builder sign`)")  # fmt: skip
    if not path.is_file():
        raise WheelhouseError(f"{wheelhouse / MANIFEST} is not signed (no {SIGNATURE}): an older toolkit published "
                              "it, or someone put an unsigned manifest in its place",
                              "check it with `python -m builder verify`; if it is what you published, sign it: "
                              f"`python -m builder sign --adopt --wheelhouse {wheelhouse}`")  # fmt: skip
    # This host's own key missing from its trust (its line expired, scoped to another namespace such as
    # git's, or removed): the fix is here, not a wheelhouse "restored from the build host" (this is it).
    own = k.key() if k.exists() else None
    restore = (f"this host's own key ({own.fingerprint()}) is not trusted by its {k.trust_file}: put its line back "
               '(`python -m builder key trust "$(python -m builder key show)"`)' if own is not None
               and own not in trust.keys else "")  # fmt: skip
    if not trust.keys:
        why = f"its lines grant nothing here: {'; '.join(trust.ignored)[:400]}" if trust.ignored else "it lists none"
        raise WheelhouseError(f"{wheelhouse} is signed, but this host trusts no key ({k.trust_file}: {why})",
                              restore or "trust the key that signs it: `python -m builder key trust 'ssh-ed25519 "
                              "AAAA...'` (or pass --trust to verify)")  # fmt: skip
    try:
        sig = signing.check(data, node.read_bounded(path, "signature"), str(path), trust)
        node.check_signer(manifest, sig, str(wheelhouse / MANIFEST))
    except ManifestError as exc:
        if own is not None and signed_by(path, own) and "does not match" in exc.message:
            raise WheelhouseError(exc.message, changed_since_signed(own)) from exc
        if restore:
            raise WheelhouseError(
                exc.message.replace("this node", "this host"),
                f"{restore}; if another host signs this wheelhouse, trust its key instead",
            ) from exc
        if node.DEFAULT_TRUST not in exc.fix:
            raise WheelhouseError(exc.message, exc.fix) from exc
        raise WheelhouseError(exc.message.replace("this node", "this host"),  # the node's words, said on the build host
                              "if the build host's key was rotated, trust the new one here (`python -m builder key "
                              "trust 'ssh-ed25519 AAAA...'`); if not, the wheelhouse was forged: do not install from "
                              "it") from exc  # fmt: skip
    except (OSError, node.TooLarge) as exc:
        raise WheelhouseError(f"cannot read {path}: {exc}", "re-sign the wheelhouse: `python -m builder sign`") from exc
    floor = signing.last_serial(k, manifest.wheelhouse_id)
    if manifest.serial < floor and not rollback:
        raise WheelhouseError(f"{wheelhouse / MANIFEST} has serial {manifest.serial}, older than serial {floor} this "
                              "host signed or accepted for the same wheelhouse: an old manifest was put back "
                              "(rollback)", "restore the current wheelhouse from a backup; to go back on purpose, "
                              f"`python -m builder sign --adopt --wheelhouse {wheelhouse}`")  # fmt: skip
    return sig


def _companions(wheelhouse: Path, name: str, entry: WheelEntry | None) -> list[Path]:
    """The files kept beside a wheel: its metadata, its smoke report, the GPU proofs its entry lists."""
    proofs = [wheelhouse / p.name for p in entry.proofs] if entry is not None else []
    return [wheelhouse / f"{name}.metadata", wheelhouse / f"{name}.smoke.json", *proofs]


def stamped(wheelhouse: Path, manifest: WheelhouseManifest, days: int | None = None) -> WheelhouseManifest:
    """The manifest with its next signed statement (serial, expiry, id, signer), before the index
    and page that show it are written."""
    return signing.statement(manifest, signing.keys(), days, wheelhouse)


def signed_manifest(manifest: WheelhouseManifest) -> tuple[str, bytes]:
    """A stamped manifest's text, checked by the loader every reader uses, and its signature: made
    before anything of the wheelhouse is written, so a key that cannot sign changes nothing."""
    if not manifest.serial:
        raise AssertionError("a manifest is signed once stamped (layout.stamped)")
    text = manifest.to_json()
    size = len(text.encode("utf-8"))
    if size > node.LIMITS["manifest"]:  # nodes, publish, repair, prune, sign and verify would all refuse it
        raise PublishError(f"the manifest would be {size / (1 << 20):.1f} MiB, past the "
                           f"{node.LIMITS['manifest'] >> 20} MiB every reader of it allows: nothing was written",
                           "take in fewer or smaller proofs, or prune old wheels from the wheelhouse")  # fmt: skip
    node.parse_manifest(text, "the manifest about to be written")
    return text, signing.sign(text.encode("utf-8"), node.NAMESPACE)


def write_manifest(wheelhouse: Path, manifest: WheelhouseManifest, signed: tuple[str, bytes]) -> None:
    """The one writer of manifest.json, and its signature (`signed_manifest`). The signature is
    staged first (SIG_PENDING), the manifest renamed into place, then the signature: a kill in
    between leaves a staged signature that `locked` finishes, so a killed publish never leaves a
    manifest nobody can verify."""
    text, signature = signed
    write_atomic(wheelhouse / SIG_PENDING, signature)
    write_atomic(wheelhouse / MANIFEST, text)
    os.replace(wheelhouse / SIG_PENDING, wheelhouse / SIGNATURE)
    signing.remember(signing.keys(), manifest, wheelhouse)


def _finish_signature(wheelhouse: Path) -> None:
    """A signature staged by a publish killed between its two renames: put in place if it signs the
    manifest there (it is checked like any signature), else removed."""
    pending = wheelhouse / SIG_PENDING
    if pending.is_symlink() or not pending.is_file():
        return
    found = read_manifest(wheelhouse)
    try:
        if found is not None:
            signing.check(found[0], node.read_bounded(pending, "signature"), str(pending), signing.keys().trust())
            os.replace(pending, wheelhouse / SIGNATURE)
            output.note(f"finished the signature an interrupted publish left ({SIGNATURE})")
            return
    except (ManifestError, OSError, node.TooLarge):
        pass
    pending.unlink(missing_ok=True)


def symlinked_folders(wheelhouse: Path) -> list[str]:
    """Folders inside the wheelhouse that are symlinks: writing through them would write elsewhere."""
    found = []
    for rel in ("simple", "tools", LOCKS, IMAGES, LOCK, JOURNAL, MANIFEST, SIGNATURE, SIG_PENDING, "index.html",
                *node.REPORTS):  # fmt: skip
        if (wheelhouse / rel).is_symlink():
            found.append(rel)
    simple = wheelhouse / "simple"
    if simple.is_dir() and not simple.is_symlink():
        found += [f"simple/{p.name}" for p in simple.iterdir() if p.is_symlink()]
    return found


@contextlib.contextmanager
def locked(wheelhouse: Path) -> Iterator[None]:
    """The wheelhouse's publish lock, after checking that nothing it writes through is a symlink.

    A lock file or folder that is a symlink would make the toolkit open, truncate or write files
    outside the wheelhouse (as root: any file); such a wheelhouse is refused.
    """
    links = symlinked_folders(wheelhouse)
    if links:
        raise WheelhouseError(
            f"{wheelhouse} holds symlinks where the toolkit writes: {', '.join(links)}",
            "replace them with real files and folders (the toolkit never writes through a link)",
        )
    with FileLock(str(wheelhouse / LOCK)):
        _finish_signature(wheelhouse)
        yield


def lock_headers(wheelhouse: Path, manifest: WheelhouseManifest) -> dict[str, str]:
    """locks/<name>.lock -> the wheel it was written for (its first line), for every lock the signed
    manifest lists that is a regular file with a lock's name and a wheel's name in its header."""
    found: dict[str, str] = {}
    folder = wheelhouse / LOCKS
    if not folder.is_dir() or folder.is_symlink():
        return found
    for path in sorted(folder.glob("*.lock")):
        rel = f"{LOCKS}/{path.name}"
        if rel not in manifest.locks or path.is_symlink() or not path.is_file() or not LOCK_NAME_RE.match(rel):
            continue
        with open(path, "rb") as f:
            first = f.read(4096).decode("utf-8", errors="replace").partition("\n")[0]
        wheel = first.removeprefix("# Lock for ").split(",")[0]
        if first.startswith("# Lock for ") and node.is_wheel_name(wheel):
            found[rel] = wheel
    return found


def publish_traces(wheelhouse: Path) -> bool:
    """Whether a publish ever ran in `wheelhouse` (its lock, journal or temporary names are there)."""
    if not wheelhouse.is_dir():
        return False
    return any(
        p.name in (JOURNAL, LOCK) or is_temp_name(p.name) or is_deps_folder(p.name) for p in wheelhouse.iterdir()
    )
