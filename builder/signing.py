"""The build host's signing key, what it trusts, and the signed statement every manifest carries.

Nodes must not trust the wheelhouse folder (whoever can write it can make every hash agree), so
every write of manifest.json is signed with a key kept on the build host, never in the wheelhouse:
OpenSSH's `ssh-keygen -Y sign` (SSHSIG, the format git uses), which nodes verify with the
ssh-keygen they already have (builder.node). The statement signed is the manifest itself, which
carries a serial that grows with every write, an expiry (DS_BUILDER_SIGN_DAYS, default 28 days),
the wheelhouse's id and the signer's public key.

The key folder (DS_BUILDER_KEYS, else ~/.config/ds-wheel-builder, mode 0700) holds:
    wheelhouse-signing-key(.pub)   the Ed25519 key pair (private half 0600; signing refuses a
                                   key others can read)
    allowed_signers                the keys this host trusts (its own first), `@revoked` lines for
                                   revoked ones: what provision scripts and nodes are given
    signed-serials.json            the last serial this host signed or accepted per wheelhouse id,
                                   so an old manifest put back in place is refused here too
The same key signs op-unit records in a shared unit cache (its own namespace).
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import json
import os
import secrets
import shutil
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from builder import cmd, node, output
from builder.errors import ToolError, TrustError, UsageError
from builder.files import is_system_folder, make_dirs, write_atomic
from builder.node import InstallError, ManifestError, PublicKey, Signature, Trust, WheelhouseManifest

KEYS_ENV = "DS_BUILDER_KEYS"
DAYS_ENV = "DS_BUILDER_SIGN_DAYS"
DEFAULT_DAYS = 28
KEY_FILE = "wheelhouse-signing-key"
TRUST_FILE = "allowed_signers"
SERIALS_FILE = "signed-serials.json"
UNIT_NAMESPACE = "ds-wheel-builder-unit"  # op-unit records; a manifest signature is not one
OFFLINE_NAMESPACE = "ds-wheel-builder-offline"  # a gathered folder's offline.json (builder/offline.py)
SSH_KEYGEN_FIX = "install OpenSSH's client (Debian: apt-get install openssh-client), version 8.1 or newer"


def key_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get(KEYS_ENV):
        return Path(env[KEYS_ENV])
    config = env.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(config) / "ds-wheel-builder"


def sign_days(env: Mapping[str, str] | None = None) -> int:
    text = (os.environ if env is None else env).get(DAYS_ENV, "")
    if not text:
        return DEFAULT_DAYS
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 3660:
        raise UsageError(
            f"{DAYS_ENV}={text[:20]!r} is not a number of days from 1 to 3660",
            f"set {DAYS_ENV} to how many days a signed manifest stays valid (default {DEFAULT_DAYS})",
        )
    return int(text)


@dataclass(frozen=True)
class Keys:
    """The key folder of this build host."""

    folder: Path

    @property
    def private(self) -> Path:
        return self.folder / KEY_FILE

    @property
    def public(self) -> Path:
        return self.folder / f"{KEY_FILE}.pub"

    @property
    def trust_file(self) -> Path:
        return self.folder / TRUST_FILE

    def exists(self) -> bool:
        return self.private.is_file() and self.public.is_file()

    def key(self) -> PublicKey:
        """This host's public key (TrustError when there is none)."""
        try:
            kind, encoded = self.public.read_text(encoding="ascii").split()[:2]
            return node.key_from_line(kind, encoded, str(self.public))
        except (OSError, ValueError, UnicodeDecodeError, InstallError) as exc:
            raise TrustError(f"no usable signing key in {self.folder} ({exc})",
                             "make one: `python -m builder key create`") from exc  # fmt: skip

    def trust(self) -> Trust:
        """The keys this host accepts signatures from, read from allowed_signers exactly as nodes read
        it (an expired line, one scoped to another namespace, a removed one grant nothing here either);
        its own key alone where a key folder predates allowed_signers."""
        check_folder(self)
        own = (self.key(),) if self.exists() and not self.trust_file.is_file() else ()
        try:
            text = self.trust_file.read_text(encoding="utf-8") if self.trust_file.is_file() else ""
            listed = node.parse_trust(text, str(self.trust_file))
        except (OSError, InstallError) as exc:
            raise TrustError(
                f"cannot read {self.trust_file}: {exc}",
                "fix or remove the line it names (`python -m builder key show` lists the keys)",
            ) from exc
        keys = tuple(dict.fromkeys((*own, *listed.keys)))
        return Trust(tuple(k for k in keys if k not in listed.revoked), listed.revoked, listed.ignored)


def keys(env: Mapping[str, str] | None = None) -> Keys:
    return Keys(key_dir(env))


def check_private(path: Path) -> None:
    """A private key others can read (or another user owns) signs for them too: refused."""
    st = path.stat()
    if st.st_mode & 0o077:
        raise TrustError(f"the signing key {path} can be read or changed by others (mode {st.st_mode & 0o777:o})",
                         f"chmod 600 {path}; if others could read it, make a new key (`python -m builder key "
                         "rotate`) and revoke this one")  # fmt: skip
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise TrustError(
            f"the signing key {path} belongs to another user (uid {st.st_uid})",
            "sign as the user who owns the key, or make your own (`python -m builder key create`)",
        )


def _check_owned(path: Path, what: str) -> None:
    st = path.stat()
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise TrustError(f"the {what} {path} belongs to another user (uid {st.st_uid}), who decides which keys this "
                         "host trusts", f"use a key folder of your own ({KEYS_ENV}, default "
                         "~/.config/ds-wheel-builder)")  # fmt: skip
    if st.st_mode & 0o022:
        raise TrustError(f"the {what} {path} can be changed by others (mode {st.st_mode & 0o777:o}): anyone could add "
                         "a key this host and its nodes then trust", f"chmod go-w {path}, and check that it lists "
                         "only keys you trust (`python -m builder key show`)")  # fmt: skip


def check_folder(k: Keys) -> None:
    """The key folder kept as ssh keeps ~/.ssh: not a system folder, owned by this user and writable
    by no one else, and so are allowed_signers and the public key; each key file a regular file."""
    resolved = Path(os.path.abspath(k.folder)).resolve()
    if is_system_folder(resolved):
        raise TrustError(f"the key folder {k.folder} is the system folder {resolved}: the signing key and its lock "
                         "would be written there", f"point {KEYS_ENV} at a folder of its own, or unset it for "
                         "~/.config/ds-wheel-builder")  # fmt: skip
    if resolved.exists() and not resolved.is_dir():
        raise TrustError(f"the key folder {k.folder} is not a folder", f"point {KEYS_ENV} at a folder (or unset it)")
    if resolved.is_dir():
        _check_owned(resolved, "key folder")
    why = node.folder_problem(str(k.folder))  # the path as given, every hop: another user's link on the way
    if why:
        raise TrustError(f"the key folder {node.shown(str(k.folder))} cannot be trusted: {why}",
                         f"point {KEYS_ENV} at a folder of your own that only you can write, or unset it")  # fmt: skip
    if not resolved.is_dir():
        return
    for path, what in ((k.trust_file, "allowed_signers file"), (k.public, "public key"), (k.private, "signing key")):
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise TrustError(f"the {what} {path} is not a regular file", f"move {path} away; the toolkit writes it")
        if path.exists() and path != k.private:
            _check_owned(path, what)


def _lock(k: Keys) -> Any:
    from filelock import FileLock  # here: a node running `python -m builder install` has no filelock

    check_folder(k)
    make_dirs(k.folder, mode=0o700)
    return FileLock(str(k.folder / ".lock"))


def create(k: Keys, rotate: bool = False) -> PublicKey:
    """Make the signing key (with rotate, a new one in place of the old, which stays trusted until
    revoked). Its public line is added to allowed_signers."""
    with _lock(k):
        if k.exists() and not rotate:
            raise TrustError(f"{k.private} exists", "`python -m builder key show` prints it; `key rotate` replaces it")
        key = _make(k)
    output.step(f"signing key {k.private} ({key.fingerprint()}); nodes trust it with this line (--trust):")
    output.result(key.line())
    return key


def _make(k: Keys) -> PublicKey:
    """A new key pair in the folder (the lock held), trusted with any old one."""
    old = k.key() if k.exists() else None
    with tempfile.TemporaryDirectory(dir=k.folder, prefix=".new-key.") as tmp:
        new = Path(tmp) / KEY_FILE
        cmd.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"ds-wheel-builder@{os.uname().nodename}",
                 "-f", new], fix=SSH_KEYGEN_FIX)  # fmt: skip
        os.chmod(new, 0o600)
        os.replace(new, k.private)  # the private half first: a kill in between loses no private key
        os.replace(f"{new}.pub", k.public)
    key = k.key()
    _add_trust(k, [key] if old is None else [key, old])
    return key


def _line_key(line: str) -> str | None:
    """The `keytype base64` an allowed-signers line names (None: a comment, a blank line)."""
    fields = line.split()
    if not fields or fields[0].startswith("#"):
        return None
    at = next((i for i, t in enumerate(fields) if t in node.KEY_TYPES), None)
    return f"{fields[at]} {fields[at + 1]}" if at is not None and at + 1 < len(fields) else None


def _add_trust(k: Keys, add: Sequence[PublicKey] = (), revoke: Sequence[PublicKey] = ()) -> None:
    """allowed_signers with `add` trusted and `revoke` revoked, every line already there kept as it is
    (an administrator's limits by hand, comments, other principals: `key trust` once rewrote the file
    from what it understood and dropped them). A key already listed is not listed again."""
    old = k.trust_file.read_text("utf-8") if k.trust_file.is_file() else ""
    lines = old.splitlines() or ["# Keys whose signatures this build host and its nodes accept (ds-wheel-builder)."]
    listed = {_line_key(line): line for line in lines if not line.lstrip().startswith("@revoked")}
    revoked = {_line_key(line) for line in lines if line.lstrip().startswith("@revoked")}
    for key in add:
        if key.line() not in listed and key.line() not in revoked:
            lines.append(f'{node.NAMESPACE} namespaces="{node.NAMESPACE},{UNIT_NAMESPACE},{OFFLINE_NAMESPACE}" '
                         f"{key.line()}")  # fmt: skip
    lines += [f"@revoked {key.line()}" for key in revoke if key.line() not in revoked]
    write_atomic(k.trust_file, "\n".join(lines) + "\n", mode=0o644)


def listed_with_options(k: Keys, key: PublicKey) -> str | None:
    """The allowed_signers line (number and text) that lists `key` with options of an administrator's
    (a namespace, a time limit), or None: `key trust` leaves such a line to the hand that wrote it."""
    if not k.trust_file.is_file():
        return None
    for number, line in enumerate(k.trust_file.read_text("utf-8").splitlines(), 1):
        ours = line.startswith(f'{node.NAMESPACE} namespaces="{node.NAMESPACE},{UNIT_NAMESPACE}')
        if _line_key(line) == key.line() and not ours and _options_of(line):
            return f"line {number}: {node.shown(line, 160)}"
    return None


def ensure_key(k: Keys) -> PublicKey:
    """This host's key, made on first use (a new user's first publish), after the permission check."""
    if not k.exists():
        with _lock(k):
            if not k.exists():
                key = _make(k)
                output.note(f"made this build host's signing key {k.private} ({key.fingerprint()}); nodes trust "
                            "it with the line `python -m builder key show` prints")  # fmt: skip
    check_private(k.private)
    return k.key()


def trust_key(k: Keys, line: str) -> PublicKey:
    """Trust another key (a second build host's, or the next one during a rotation). A line with options
    (namespaces=, valid-before=, valid-after=, cert-authority) is refused: allowed_signers gets the
    toolkit's own namespaces for every key it lists, so such a line would lose what it says (a key
    meant for unit seals would sign wheelhouses, an expired key never expire, a CA become a signer)."""
    said = _options_of(line)
    if said:
        raise UsageError(f"the key line carries {said}, which `key trust` would drop: allowed_signers lists every key "
                         "it trusts for the toolkit's own namespaces, with no expiry",
                         "give the plain key line (`python -m builder key show` on that host); to limit a key, "
                         f"revoke it when it must stop signing (`key revoke`), or edit {k.trust_file} by "
                         "hand")  # fmt: skip
    if line.lstrip().startswith("#"):
        raise UsageError(
            "the line given is a comment (it starts with #), not a key line",
            "give the line `python -m builder key show` prints on that host",
        )
    try:
        found = node.parse_trust(line, "key line").keys
    except InstallError as exc:
        raise UsageError(exc.message, "give the line `python -m builder key show` prints on that host") from exc
    if len(found) != 1 or sum(line.split().count(kind) for kind in node.KEY_TYPES) != 1:
        raise UsageError("give exactly one public key line (ssh-ed25519 AAAA...)", "copy it from `key show`")
    with _lock(k):
        if found[0] in k.trust().revoked:
            raise TrustError(f"{found[0].fingerprint()} is revoked on this host: trusting it again would accept "
                             "what a stolen key signs", "make a new key on that host (`key rotate`) and trust that "
                             "one")  # fmt: skip
        limited = listed_with_options(k, found[0])
        if limited:
            raise UsageError(f"{found[0].fingerprint()} is already listed in {k.trust_file} with limits set by hand "
                             f"({limited})", "keep that line as it is, or edit it by hand: `key trust` adds a key "
                             "with no limits and never rewrites another's line")  # fmt: skip
        _add_trust(k, add=found)
    return found[0]


def _options_of(line: str) -> str:
    """What of an allowed-signers line's options (or a marker) stands before its key, in words; "" for
    a plain key line (`keytype base64 [comment]`, or `principals keytype base64`)."""
    fields = line.split()
    at = next((i for i, t in enumerate(fields) if t in node.KEY_TYPES), len(fields))
    before = fields[:at]
    found = [f for f in before if "=" in f or f.lstrip("@").lower().startswith("cert-authority")]
    if len(before) > 1 and not found:
        found = before[1:]
    return ", ".join(repr(f[:60]) for f in found)


def revoke_key(k: Keys, fingerprint: str) -> PublicKey:
    """Revoke a trusted key by its fingerprint: its signatures are refused from now on."""
    with _lock(k):
        trust = k.trust()
        match = [key for key in trust.keys if key.fingerprint() == fingerprint]
        if not match:
            raise TrustError(f"no trusted key has fingerprint {fingerprint[:60]}",
                             "`python -m builder key show` lists the trusted keys")  # fmt: skip
        if k.exists() and match[0] == k.key():
            raise TrustError("that is this host's own signing key", "`key rotate` first, then revoke the old key")
        _add_trust(k, revoke=match)
    return match[0]


def sign(data: bytes, namespace: str, k: Keys | None = None) -> bytes:
    """An SSHSIG signature of `data` by this host's key (made on first use)."""
    k = k or keys()
    ensure_key(k)
    tmp = node.scratch_dir("ds-sign-")  # a kill -9 leaves it: the next sign removes it
    try:
        message = Path(tmp) / "message"
        message.write_bytes(data)
        try:
            cmd.run(["ssh-keygen", "-q", "-Y", "sign", "-f", k.private, "-n", namespace, message],
                    fix=SSH_KEYGEN_FIX)  # fmt: skip
        except ToolError as exc:
            raise _unusable_key(k, exc) from exc
        return (Path(tmp) / "message.sig").read_bytes()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _unusable_key(k: Keys, exc: ToolError) -> TrustError:
    """Why ssh-keygen would not sign: no ssh-keygen, a private key it cannot read, or one that is not
    the public key's pair (what it signed would be refused as another key's)."""
    if shutil.which("ssh-keygen") is None:
        return TrustError(f"cannot sign with {k.private}: {exc.message}", SSH_KEYGEN_FIX)
    asked = cmd.ask(["ssh-keygen", "-y", "-P", "", "-f", str(k.private)], timeout=30)
    if asked.returncode != 0 and "passphrase" in asked.stderr.lower():
        return TrustError(f"the signing key {k.private} is protected by a passphrase: the toolkit signs with no "
                          "terminal to ask for it (provisioning, Slurm jobs)", f"remove the passphrase (ssh-keygen -p "
                          f"-N '' -f {k.private}), or make a key without one (`python -m builder key rotate`) and "
                          "give nodes its line")  # fmt: skip
    derived = asked.stdout.split()[:2] if asked.returncode == 0 else []
    fix = (
        "restore the key pair from a backup, or make a new key (`python -m builder key rotate`) and give nodes its line"
    )
    if not derived:
        return TrustError(f"cannot sign with {k.private}: ssh-keygen cannot use it as a private key (damaged, or "
                          "not an OpenSSH key)", fix)  # fmt: skip
    if derived != k.public.read_text(encoding="ascii", errors="replace").split()[:2]:
        return TrustError(f"the signing key {k.private} is not the pair of {k.public.name}: what it signed would be "
                          "refused as signed by another key", fix)  # fmt: skip
    return TrustError(f"cannot sign with {k.private}: {exc.message}", exc.fix or SSH_KEYGEN_FIX)


UNIT_SECRET_FILE = "unit-seal-secret"  # in the key folder, 0600: seals op-unit records where ssh-keygen is absent
SECRET_BYTES = 32
_SEAL = b"ds-wheel-builder unit seal hmac-sha256 "


def seal_unit(data: bytes, k: Keys | None = None) -> bytes:
    """The seal of an op-unit or header record in a cache others may write: an SSHSIG signature by
    this host's key where ssh-keygen is here (hosts that trust the key accept it); else an
    HMAC-SHA256 with a secret kept beside the key, which only this user (or a host sharing the key
    folder) can make or check. A GPU node as it comes (no OpenSSH client) so builds with --no-publish
    as safely; signing a wheelhouse still needs ssh-keygen."""
    k = k or keys()
    if shutil.which("ssh-keygen") is None:
        return _SEAL + hmac.new(_unit_secret(k, make=True) or b"", data, hashlib.sha256).hexdigest().encode() + b"\n"
    return sign(data, UNIT_NAMESPACE, k)


def check_unit(data: bytes, seal: bytes, where: str, k: Keys | None = None) -> None:
    """A record's seal (seal_unit) checked: TrustError, ManifestError or ToolError when it is not one
    this host made or trusts (the unit is then built again)."""
    k = k or keys()
    if not seal.startswith(_SEAL):
        check(data, seal, where, k.trust(), UNIT_NAMESPACE)
        return
    secret = _unit_secret(k, make=False)
    want = _SEAL + hmac.new(secret, data, hashlib.sha256).hexdigest().encode() + b"\n" if secret else b""
    if not secret or not hmac.compare_digest(seal, want):
        raise TrustError(f"{where} is not sealed by this host's secret ({k.folder / UNIT_SECRET_FILE})",
                         "remove the entry: it is built again")  # fmt: skip


def _unit_secret(k: Keys, make: bool) -> bytes | None:
    """The key folder's unit secret (32 random bytes, 0600, this user's), made on first use."""
    path = k.folder / UNIT_SECRET_FILE
    if not path.exists():
        if not make:
            return None
        with _lock(k):
            if not path.exists():
                write_atomic(path, secrets.token_bytes(SECRET_BYTES), mode=0o600)
                output.note(f"no ssh-keygen here: op units are sealed with the secret {path} instead of signed")
    if path.is_symlink() or not path.is_file():
        raise TrustError(f"the unit secret {path} is not a regular file", f"move {path} away; the toolkit writes it")
    st = path.stat()
    if st.st_mode & 0o077 or (hasattr(os, "getuid") and st.st_uid != os.getuid()):
        raise TrustError(f"the unit secret {path} is another user's or others can read it "
                         f"(mode {st.st_mode & 0o777:o})",
                         f"remove {path} (a new one is made; the units it sealed are built again)")  # fmt: skip
    if st.st_size != SECRET_BYTES:
        # A short secret makes every seal forgeable (1 byte: 256 tries); an empty one rebuilt every unit
        # while blaming the cache. Only what the toolkit makes is used.
        raise TrustError(f"the unit secret {path} is {st.st_size} bytes, not the {SECRET_BYTES} random bytes the "
                         "toolkit makes: a short secret lets anyone forge a unit's seal",
                         f"remove {path} (or run `python -m builder key rotate`): a new one is made, and the units "
                         "the old one sealed are built again")  # fmt: skip
    return path.read_bytes()


def check_unit_secret_place(k: Keys) -> None:
    """Where the unit secret goes is a file or nothing, checked before `key rotate` changes anything (a
    folder there once let it rotate the key, then fail)."""
    path = k.folder / UNIT_SECRET_FILE
    if path.is_dir() and not path.is_symlink():
        raise TrustError(f"the unit secret {path} is a folder, not the file the toolkit writes",
                         f"move {path} away, then rotate again: nothing was changed")  # fmt: skip


def new_unit_secret(k: Keys) -> Path | None:
    """On `key rotate`: a new unit secret in place of the old one, where there is one (the units the
    old one sealed are then built again, as with a new key)."""
    path = k.folder / UNIT_SECRET_FILE
    if not path.exists() and not path.is_symlink():
        return None
    check_unit_secret_place(k)
    with _lock(k):
        path.unlink()
        write_atomic(path, secrets.token_bytes(SECRET_BYTES), mode=0o600)
    return path


def check(data: bytes, signature: bytes, where: str, trust: Trust, namespace: str = node.NAMESPACE) -> Signature:
    """`signature` of `data` checked against `trust` with the nodes' own check (ssh-keygen -Y verify)."""
    try:
        return node.check_signature(data, signature, trust, where, namespace)
    except ManifestError:
        raise
    except InstallError as exc:  # no ssh-keygen or openssl that can verify
        raise ToolError(exc.message, exc.fix) from exc


# ---------------------------------------------------------------- the signed statement


def statement(
    manifest: WheelhouseManifest, k: Keys, days: int | None = None, where: Path | None = None
) -> WheelhouseManifest:
    """`manifest` with its next statement: a serial above its own and above any this host signed for
    that wheelhouse, a new expiry, this host's key as signer (and an id, at the first signed write).
    A copy of a wheelhouse this host publishes elsewhere is refused: written into, the two would
    each look like a rollback of the other (`sign --new-id` makes the copy a wheelhouse of its own)."""
    key = ensure_key(k)
    if where is not None and manifest.wheelhouse_id:
        _check_not_a_copy(k, manifest.wheelhouse_id, where)
    now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    expires = now + datetime.timedelta(days=days if days is not None else sign_days())
    serial = max(manifest.serial, last_serial(k, manifest.wheelhouse_id)) + 1
    return replace(manifest, serial=serial, expires=node.stamp(expires),
                   wheelhouse_id=manifest.wheelhouse_id or uuid.uuid4().hex, signer=key.line())  # fmt: skip


def _check_not_a_copy(k: Keys, wheelhouse_id: str, where: Path) -> None:
    here = str(where.resolve())
    at = _records(k).get(wheelhouse_id, {}).get("at")
    if not at or at == here:
        return
    try:
        theirs = json.loads(node.read_bounded(Path(at) / "manifest.json", "manifest")).get("wheelhouse_id")
    except (OSError, ValueError, AttributeError):
        theirs = None
    if theirs != wheelhouse_id:
        return  # the wheelhouse moved here: this is it now
    raise TrustError(
        f"{here} is a copy of wheelhouse {wheelhouse_id}, which this host publishes at {at}: written into, each "
        "would look like a rollback of the other to the nodes and to this host",
        f"publish into {at} and copy it again (rsync), or make this copy a wheelhouse of its own: `python -m "
        f"builder sign --new-id --wheelhouse {here}` (nodes that read it are then told it is another wheelhouse)",
    )


def _records(k: Keys) -> dict[str, dict[str, Any]]:
    """wheelhouse id -> {"serial": the last serial this host signed or accepted, "at": where it signed it}."""
    path = k.folder / SERIALS_FILE
    try:
        data = json.loads(node.read_bounded(path, "report"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise TrustError(
            f"{path} cannot be read ({exc})", "remove it: this host then accepts each wheelhouse's current serial again"
        ) from exc
    if not isinstance(data, dict):
        raise TrustError(f"{path} is not a record of serials", "remove it")
    out: dict[str, dict[str, Any]] = {}
    for i, record in data.items():
        if isinstance(record, int):  # written before records said where
            out[i] = {"serial": record}
        elif isinstance(record, dict) and isinstance(record.get("serial"), int):
            out[i] = {"serial": record["serial"], **({"at": record["at"]} if isinstance(record.get("at"), str) else {})}
    return out


def last_serial(k: Keys, wheelhouse_id: str) -> int:
    return int(_records(k).get(wheelhouse_id, {}).get("serial", 0)) if wheelhouse_id else 0


def remember(k: Keys, manifest: WheelhouseManifest, where: Path | None = None) -> None:
    """Record the serial this host signed or accepted (never lowering it), and where it signed it."""
    with _lock(k):
        records = _records(k)
        record = records.get(manifest.wheelhouse_id, {})
        record["serial"] = max(int(record.get("serial", 0)), manifest.serial)
        if where is not None:
            record["at"] = str(where.resolve())
        records[manifest.wheelhouse_id] = record
        write_atomic(k.folder / SERIALS_FILE, json.dumps(records, indent=2, sort_keys=True) + "\n", mode=0o600)
