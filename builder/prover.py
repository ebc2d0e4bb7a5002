"""A GPU node's prover key: what signs the proofs `prove` writes there, so the build host trusts a proof
for who made it, not for whoever carried the file (its content_sha256 is a plain digest anyone editing
it recomputes).

The key is an Ed25519 pair in the toolkit's key folder (`prover-key`, OpenSSH's format, 0600, and its
`.pub`), made on first use. It signs in its own namespace (ds-wheel-builder-proof: a proof signature is
never a manifest's or a unit's) with what the node has, as nodes already verify: `ssh-keygen -Y sign`
where it is, else libcrypto itself through ctypes (a GPU image with no OpenSSH client). Both write and
read the same key file, and the signature is SSHSIG either way: ssh-keygen -Y verify checks it.
The build host trusts prover keys by name (`key trust --prover`, in `allowed_provers` beside its
allowed_signers) and its own.
"""

from __future__ import annotations

import base64
import ctypes
import hashlib
import os
import secrets
import shutil
import socket
from pathlib import Path
from typing import Any

from builder import cmd, node
from builder.errors import TrustError, UsageError
from builder.files import make_dirs, write_atomic

NAMESPACE = "ds-wheel-builder-proof"
KEY_FILE = "prover-key"
TRUST_FILE = "allowed_provers"  # the prover keys the build host takes proofs from (allowed_signers lines)
_NID_ED25519 = 1087
_ARMOR_KEY = ("-----BEGIN OPENSSH PRIVATE KEY-----", "-----END OPENSSH PRIVATE KEY-----")
_ARMOR_SIG = ("-----BEGIN SSH SIGNATURE-----", "-----END SSH SIGNATURE-----")
_NO_TOOL = (
    "neither ssh-keygen (OpenSSH 8.1+) nor a libcrypto that signs Ed25519 (OpenSSL 1.1.1+) is on this node",
    "install OpenSSH's client or OpenSSL's library (Debian: apt-get install openssh-client)",
)


def key_path(folder: Path) -> Path:
    return folder / KEY_FILE


def _string(data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + data


def _libcrypto() -> Any:
    """libcrypto with Ed25519 signing (node.libcrypto, which verifying uses too); None where there is none."""
    lib = node.libcrypto("EVP_DigestSign")
    if lib is None:
        return None
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    lib.EVP_PKEY_new_raw_private_key.restype = vp
    lib.EVP_PKEY_new_raw_private_key.argtypes = [ctypes.c_int, vp, ctypes.c_char_p, sz]
    lib.EVP_PKEY_get_raw_public_key.argtypes = [vp, ctypes.c_char_p, ctypes.POINTER(sz)]
    lib.EVP_DigestSignInit.argtypes = [vp, vp, vp, vp, vp]
    lib.EVP_DigestSign.argtypes = [vp, ctypes.c_char_p, ctypes.POINTER(sz), ctypes.c_char_p, sz]
    return lib


def _ed25519(lib: Any, seed: bytes, message: bytes | None) -> tuple[bytes, bytes]:
    """The public key of `seed`, and the signature of `message` (b"" where None), by libcrypto."""
    pkey = lib.EVP_PKEY_new_raw_private_key(_NID_ED25519, None, seed, len(seed))
    if not pkey:
        raise TrustError("libcrypto refused the prover key", "make a new one: remove the prover-key files")
    ctx = None
    try:
        size = ctypes.c_size_t(32)
        public = ctypes.create_string_buffer(32)
        if lib.EVP_PKEY_get_raw_public_key(pkey, public, ctypes.byref(size)) != 1:
            raise TrustError("libcrypto could not read the prover key's public half", "remove the prover-key files")
        if message is None:
            return public.raw, b""
        ctx = lib.EVP_MD_CTX_new()
        sig, sig_size = ctypes.create_string_buffer(64), ctypes.c_size_t(64)
        if (not ctx or lib.EVP_DigestSignInit(ctx, None, None, None, pkey) != 1
                or lib.EVP_DigestSign(ctx, sig, ctypes.byref(sig_size), message, len(message)) != 1):  # fmt: skip
            raise TrustError("libcrypto could not sign with the prover key", "remove the prover-key files")
        return public.raw, sig.raw[: sig_size.value]
    finally:
        if ctx:
            lib.EVP_MD_CTX_free(ctx)
        lib.EVP_PKEY_free(pkey)


def _openssh_private(seed: bytes, public: bytes, comment: str) -> str:
    """An unencrypted Ed25519 key in OpenSSH's own format (PROTOCOL.key), as ssh-keygen writes one."""
    blob = _string(b"ssh-ed25519") + _string(public)
    check = secrets.token_bytes(4)
    inner = check + check + blob + _string(seed + public) + _string(comment.encode())
    inner += bytes(range(1, 8 - len(inner) % 8 + 1)) if len(inner) % 8 else b""
    whole = b"openssh-key-v1\0" + _string(b"none") + _string(b"none") + _string(b"") + (1).to_bytes(4, "big")
    whole += _string(blob) + _string(inner)
    text = base64.b64encode(whole).decode("ascii")
    return "\n".join([_ARMOR_KEY[0], *(text[i : i + 70] for i in range(0, len(text), 70)), _ARMOR_KEY[1]]) + "\n"


def _read_seed(path: Path) -> bytes:
    """The Ed25519 seed of an unencrypted OpenSSH key file (what ssh-keygen and this module write)."""
    lines = path.read_text(encoding="ascii").strip().splitlines()
    try:
        whole = base64.b64decode("".join(lines[1:-1]), validate=True)
        if lines[0] != _ARMOR_KEY[0] or not whole.startswith(b"openssh-key-v1\0"):
            raise ValueError("not an OpenSSH private key")
        pos = len(b"openssh-key-v1\0")
        cipher, pos = node.ssh_string(whole, pos)
        _, pos = node.ssh_string(whole, pos)  # kdf
        _, pos = node.ssh_string(whole, pos)  # kdf options
        pos += 4  # the number of keys: one
        _, pos = node.ssh_string(whole, pos)  # the public key
        inner, pos = node.ssh_string(whole, pos)
        if cipher != b"none":
            raise ValueError("it is protected by a passphrase")
        at = 8
        kind, at = node.ssh_string(inner, at)
        _, at = node.ssh_string(inner, at)
        private, at = node.ssh_string(inner, at)
        if kind != b"ssh-ed25519" or len(private) != 64:
            raise ValueError("not an Ed25519 key")
        return private[:32]
    except (ValueError, IndexError) as exc:
        raise TrustError(f"the prover key {path} cannot be used here ({exc})",
                         f"remove {path} and its .pub: the next `prove` makes a new one (trust it on the build "
                         "host again)") from exc  # fmt: skip


def ensure(folder: Path) -> node.PublicKey:
    """This node's prover key (made on first use: ssh-keygen where present, else libcrypto), its public half."""
    private = key_path(folder)
    public = Path(f"{private}.pub")
    if not (private.is_file() and public.is_file()):
        make_dirs(folder, mode=0o700)
        comment = f"ds-wheel-builder-prover@{socket.gethostname()}"
        for path in (private, public):
            path.unlink(missing_ok=True)
        if shutil.which("ssh-keygen"):
            cmd.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", private])
        else:
            lib = _libcrypto()
            if lib is None:
                raise TrustError(f"a proof is signed by this node's prover key, and {_NO_TOOL[0]}", _NO_TOOL[1])
            seed = secrets.token_bytes(32)
            raw, _ = _ed25519(lib, seed, None)
            write_atomic(private, _openssh_private(seed, raw, comment), mode=0o600)
            line = f"ssh-ed25519 {base64.b64encode(_string(b'ssh-ed25519') + _string(raw)).decode()} {comment}"
            write_atomic(public, line + "\n")
        os.chmod(private, 0o600)
    if os.stat(private).st_mode & 0o077:
        raise TrustError(f"the prover key {private} can be read by others", f"chmod 600 {private}, or remove it and "
                         "its .pub for a new one")  # fmt: skip
    kind, encoded = public.read_text(encoding="ascii").split()[:2]
    return node.key_from_line(kind, encoded, str(public))


def sign(data: bytes, folder: Path) -> bytes:
    """An armored SSHSIG signature of `data` by this node's prover key, in the proofs' namespace."""
    key = ensure(folder)
    private = key_path(folder)
    if shutil.which("ssh-keygen"):
        tmp = node.scratch_dir("ds-prove-sign-")
        try:
            message = Path(tmp) / "proof"
            message.write_bytes(data)
            cmd.run(["ssh-keygen", "-q", "-Y", "sign", "-f", private, "-n", NAMESPACE, message])
            return (Path(tmp) / "proof.sig").read_bytes()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    lib = _libcrypto()
    if lib is None:
        raise TrustError(f"a proof is signed by this node's prover key, and {_NO_TOOL[0]}", _NO_TOOL[1])
    digest = hashlib.sha512(data).digest()
    signed = b"SSHSIG" + _string(NAMESPACE.encode()) + _string(b"") + _string(b"sha512") + _string(digest)
    _, raw = _ed25519(lib, _read_seed(private), signed)
    blob = b"SSHSIG" + (1).to_bytes(4, "big") + _string(key.blob) + _string(NAMESPACE.encode()) + _string(b"")
    blob += _string(b"sha512") + _string(_string(b"ssh-ed25519") + _string(raw))
    text = base64.b64encode(blob).decode("ascii")
    return ("\n".join([_ARMOR_SIG[0], *(text[i : i + 76] for i in range(0, len(text), 76)), _ARMOR_SIG[1]])
            + "\n").encode("ascii")  # fmt: skip


def trusted(folder: Path) -> node.Trust:
    """The prover keys this build host takes proofs from: allowed_provers, and its own prover key."""
    listed = folder / TRUST_FILE
    try:
        text = listed.read_text(encoding="utf-8") if listed.is_file() else ""
        trust = node.parse_trust(text, str(listed))
    except (OSError, node.InstallError) as exc:
        raise TrustError(f"cannot read {listed}: {exc}", f"fix or remove the line it names in {listed}") from exc
    own = Path(f"{key_path(folder)}.pub")
    keys = list(trust.keys)
    if own.is_file():
        kind, encoded = own.read_text(encoding="ascii").split()[:2]
        keys.append(node.key_from_line(kind, encoded, str(own)))
    return node.Trust(tuple(k for k in dict.fromkeys(keys) if k not in trust.revoked), trust.revoked, trust.ignored)


def trust_prover(folder: Path, line: str) -> node.PublicKey:
    """`key trust --prover LINE`: a GPU node's prover key, appended to allowed_provers (every line there kept)."""
    try:
        found = node.parse_trust(line, "prover key line").keys
    except node.InstallError as exc:
        raise UsageError(exc.message, "give the line `prove` prints on the GPU node (ssh-ed25519 AAAA...)") from exc
    if len(found) != 1:
        raise UsageError("give exactly one public key line (ssh-ed25519 AAAA...)", "copy it from `prove`'s output")
    listed = folder / TRUST_FILE
    old = listed.read_text(encoding="utf-8") if listed.is_file() else "# GPU nodes' prover keys (ds-wheel-builder)\n"
    if found[0] not in node.parse_trust(old, str(listed)).keys:
        make_dirs(folder, mode=0o700)
        write_atomic(listed, old.rstrip("\n") + f"\nprover {found[0].line()}\n", mode=0o644)
    return found[0]
