"""Checking the manifest's signature against the node's allowed_signers (ssh-keygen -Y verify, else
OpenSSL or libcrypto for Ed25519) and the signed statement: its signer, expiry and serial.
"""

import base64
import datetime
import os
import shutil
import subprocess
from collections.abc import Sequence
from typing import Any

from builder.node.contract import InstallError, ManifestError
from builder.node.entries import WheelhouseManifest
from builder.node.fields import parse_stamp, stamp
from builder.node.files import scratch_dir
from builder.node.trust import DEFAULT_TRUST, ED25519_SPKI, NAMESPACE, Signature, Trust, parse_signature, ssh_string


def _run_verifier(args: "Sequence[str]", stdin: "bytes | None" = None) -> "tuple[int, str] | None":
    """(exit status, output) of a verifying tool; None where it is missing."""
    if shutil.which(args[0]) is None:
        return None
    try:
        done = subprocess.run(list(args), input=stdin, capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.returncode, (done.stdout + done.stderr).decode("utf-8", errors="replace")


def _unsupported(said: str) -> bool:
    return any(w in said.lower() for w in ("unknown option", "illegal option", "usage:", "unknown argument"))


def _verify_ssh_keygen(message: bytes, text: bytes, trust: "Trust", tmp: str, namespace: str) -> "bool | None":
    signers, sig, revoked = (os.path.join(tmp, n) for n in ("allowed_signers", "sig", "revoked"))
    with open(signers, "w", encoding="ascii") as f:
        f.writelines(f'{namespace} namespaces="{namespace}" {k.line()}\n' for k in trust.keys)
    with open(sig, "wb") as f:
        f.write(text)
    args = ["ssh-keygen", "-Y", "verify", "-f", signers, "-I", namespace, "-n", namespace, "-s", sig]
    if trust.revoked:
        with open(revoked, "w", encoding="ascii") as f:
            f.writelines(f"{k.line()}\n" for k in trust.revoked)
        args += ["-r", revoked]
    done = _run_verifier(args, message)
    if done is None or (done[0] != 0 and _unsupported(done[1])):
        return None  # no ssh-keygen, or one older than OpenSSH 8.1 (no -Y)
    return done[0] == 0


def _ed25519(signature: "Signature") -> "tuple[bytes, bytes] | None":
    """The raw Ed25519 public key (32 bytes) and signature (64) of an SSH signature; None for others."""
    kind, pos = ssh_string(signature.key.blob, 0)
    raw_key = ssh_string(signature.key.blob, pos)[0]
    sig_kind, pos = ssh_string(signature.blob, 0)
    raw_sig = ssh_string(signature.blob, pos)[0]
    if kind != b"ssh-ed25519" or sig_kind != b"ssh-ed25519" or len(raw_key) != 32 or len(raw_sig) != 64:
        return None
    return raw_key, raw_sig


def _verify_openssl(message: bytes, signature: "Signature", tmp: str) -> "bool | None":
    """Ed25519 through OpenSSL (for nodes whose OpenSSH predates -Y, RHEL 8's 8.0)."""
    raw = _ed25519(signature)
    if raw is None:
        return None
    raw_key, raw_sig = raw
    pem, data, sig = (os.path.join(tmp, n) for n in ("key.pem", "data", "sig.bin"))
    with open(pem, "w", encoding="ascii") as f:
        der = base64.b64encode(ED25519_SPKI + raw_key).decode("ascii")
        f.write(f"-----BEGIN PUBLIC KEY-----\n{der}\n-----END PUBLIC KEY-----\n")
    with open(data, "wb") as f:
        f.write(signature.signed_data(message))
    with open(sig, "wb") as f:
        f.write(raw_sig)
    done = _run_verifier(["openssl", "pkeyutl", "-verify", "-pubin", "-inkey", pem, "-rawin", "-in", data,
                          "-sigfile", sig])  # fmt: skip
    if done is None:
        return None
    if done[0] == 0 and "Verified Successfully" in done[1]:
        return True
    if "Verification Failure" in done[1]:  # its own word that the signature does not match
        return False
    return None  # it failed otherwise (an option it lacks, a broken install): libcrypto is asked next


_NID_ED25519 = 1087  # OpenSSL's id of Ed25519, the same in 1.1.1 and 3.x


def libcrypto(needs: str) -> "Any":
    """OpenSSL's libcrypto through ctypes, one new enough to have `needs` (1.1.1 or newer for Ed25519),
    its context functions typed; None where none is found. Verifying here and signing a proof
    (builder.prover) both go through it."""
    import ctypes
    import ctypes.util

    for name in (ctypes.util.find_library("crypto"), "libcrypto.so.3", "libcrypto.so.1.1"):
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
            getattr(lib, needs)
        except (OSError, AttributeError):
            continue
        lib.EVP_MD_CTX_new.restype = ctypes.c_void_p
        lib.EVP_MD_CTX_free.argtypes = [ctypes.c_void_p]
        lib.EVP_PKEY_free.argtypes = [ctypes.c_void_p]
        return lib
    return None


def _verify_libcrypto(message: bytes, signature: "Signature") -> "bool | None":
    """Ed25519 through libcrypto itself (ctypes, standard library), for nodes whose OpenSSH has no -Y
    and whose openssl command predates -rawin (OpenSSL 1.1.1: RHEL 8, Debian 11), which verify
    Ed25519 only through EVP_DigestVerify. None where no usable libcrypto is found."""
    import ctypes

    raw = _ed25519(signature)
    if raw is None:
        return None
    raw_key, raw_sig = raw
    lib = libcrypto("EVP_DigestVerify")
    if lib is None:
        return None
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    lib.EVP_PKEY_new_raw_public_key.restype = vp
    lib.EVP_PKEY_new_raw_public_key.argtypes = [ctypes.c_int, vp, ctypes.c_char_p, sz]
    lib.EVP_DigestVerifyInit.argtypes = [vp, vp, vp, vp, vp]
    lib.EVP_DigestVerify.argtypes = [vp, ctypes.c_char_p, sz, ctypes.c_char_p, sz]
    data = signature.signed_data(message)
    pkey = lib.EVP_PKEY_new_raw_public_key(_NID_ED25519, None, raw_key, len(raw_key))
    if not pkey:
        return None
    ctx = lib.EVP_MD_CTX_new()
    try:
        if not ctx or lib.EVP_DigestVerifyInit(ctx, None, None, None, pkey) != 1:
            return None
        return bool(lib.EVP_DigestVerify(ctx, raw_sig, len(raw_sig), data, len(data)) == 1)
    finally:
        if ctx:
            lib.EVP_MD_CTX_free(ctx)
        lib.EVP_PKEY_free(pkey)


def check_signature(message: bytes, text: bytes, trust: "Trust", where: str, namespace: str = NAMESPACE) -> "Signature":
    """The signature of `message` (the exact bytes of manifest.json), checked: made for this
    toolkit's namespace, by a trusted key that is not revoked, over these bytes. Anything else is a
    ManifestError naming the problem (exit 8); no tool to check with is an InstallError (exit 9)."""
    text = text.replace(b"\r\n", b"\n")  # a copy that went through a CRLF tool: the armor's base64 is the same
    sig = parse_signature(text, where)
    fix = ("do not install from it: whoever can write the wheelhouse may have changed it. On the build host run "
           "`python -m builder verify` and re-publish or re-sign (`python -m builder sign`)")  # fmt: skip
    if sig.namespace != namespace:
        raise ManifestError(f"{where} is a signature made for another purpose (namespace {sig.namespace[:40]!r}, "
                            f"not {namespace!r})", fix)  # fmt: skip
    if sig.key in trust.revoked:
        raise ManifestError(
            f"{where} was made by key {sig.key.fingerprint()}, which is revoked",
            "re-sign the wheelhouse on the build host with its current key (`python -m builder sign`)",
        )
    if sig.key not in trust.keys:
        raise ManifestError(f"{where} was made by key {sig.key.fingerprint()}, which this node does not trust "
                            f"(it trusts {trust.describe()})",
                            "if the build host's key was rotated, give the node the new key (--trust, or "
                            f"{DEFAULT_TRUST}); if not, the wheelhouse was forged: do not install from it")  # fmt: skip
    tmp = scratch_dir("ds-verify-")
    try:
        ok = _verify_ssh_keygen(message, text, trust, tmp, namespace)
        if ok is None:
            ok = _verify_openssl(message, sig, tmp)
        if ok is None:
            ok = _verify_libcrypto(message, sig)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if ok is None:
        raise InstallError("this node cannot check the wheelhouse's signature: ssh-keygen is missing or older than "
                           "OpenSSH 8.1 (no -Y), and neither openssl nor libcrypto (1.1.1+) can verify Ed25519",
                           "install OpenSSH 8.1 or newer (openssh-clients on RHEL, openssh-client on Debian) or "
                           "OpenSSL 1.1.1 or newer")  # fmt: skip
    if not ok:
        raise ManifestError(f"{where} does not match what it signs: the file was changed after the build host "
                            f"signed it (key {sig.key.fingerprint()})", fix)  # fmt: skip
    return sig


def check_statement(manifest: "WheelhouseManifest", sig: "Signature", where: str, now: "datetime.datetime") -> None:
    """The signed statement itself: a serial, the signer it names, an expiry not passed."""
    check_signer(manifest, sig, where)
    check_expiry(manifest, where, now)


def check_signer(manifest: "WheelhouseManifest", sig: "Signature", where: str) -> None:
    if not manifest.serial:
        raise ManifestError(f"{where} is signed but carries no serial or expiry (an older toolkit wrote it)",
                            "re-sign it on the build host: `python -m builder sign`")  # fmt: skip
    if manifest.signer != sig.key.line():
        raise ManifestError(f"{where} names signer {manifest.signer[:60]}..., but key {sig.key.fingerprint()} "
                            "signed it", "re-sign it on the build host: `python -m builder sign`")  # fmt: skip


def check_expiry(manifest: "WheelhouseManifest", where: str, now: "datetime.datetime") -> None:
    expires = parse_stamp(manifest.expires)
    if expires is None or expires <= now:
        raise ManifestError(f"{where} expired at {manifest.expires} (serial {manifest.serial}; now {stamp(now)}): "
                            "nobody has re-signed the wheelhouse since",
                            "on the build host: `python -m builder sign --wheelhouse WH` (valid for weeks again); "
                            "if it was re-signed, check this machine's clock")  # fmt: skip
