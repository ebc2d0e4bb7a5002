"""Keys and signatures as OpenSSH writes them (`ssh-keygen -Y sign`), and the allowed_signers file
that says which key a node trusts for the wheelhouse namespace, with its time limits.
"""

import base64
import datetime
import hashlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from builder.node.contract import MANIFEST_FILE, InstallError, ManifestError, NoKey
from builder.node.files import open_regular, read_limited

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
KEY_TYPES = ("ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
             "sk-ssh-ed25519@openssh.com")  # fmt: skip
_ARMOR = ("-----BEGIN SSH SIGNATURE-----", "-----END SSH SIGNATURE-----")
ED25519_SPKI = bytes.fromhex("302a300506032b6570032100")  # DER prefix of an Ed25519 public key for OpenSSL


def ssh_string(buf: bytes, pos: int) -> "tuple[bytes, int]":
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
        return ssh_string(self.blob, 0)[0].decode("ascii", errors="replace")

    def line(self) -> str:
        return f"{self.kind} {base64.b64encode(self.blob).decode('ascii')}"

    def fingerprint(self) -> str:
        """As `ssh-keygen -l` prints it: SHA256:<base64 without padding>."""
        return "SHA256:" + base64.b64encode(hashlib.sha256(self.blob).digest()).decode("ascii").rstrip("=")


def key_from_line(kind: str, encoded: str, where: str) -> "PublicKey":
    """A public key from its type and base64 text (a .pub file's first two fields)."""
    try:
        blob = base64.b64decode(encoded, validate=True)
        inner = ssh_string(blob, 0)[0].decode("ascii")
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
        key, pos = ssh_string(blob, 10)
        namespace, pos = ssh_string(blob, pos)
        _, pos = ssh_string(blob, pos)  # reserved
        hash_alg, pos = ssh_string(blob, pos)
        signature, pos = ssh_string(blob, pos)
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
