"""A wheelhouse nodes can trust (issue 28): the signed manifest, attacked as a co-tenant of a shared
wheelhouse would. Every case is refused by verify, repair, the node installer and the provision
script with its exit code, and nothing is installed or run.

The wheels are FAKE (tests/fakes.py: zips holding what publish and the installer read, pip-installable
where a node installs them); the signatures, ssh-keygen, OpenSSL, pip and the node venvs are real.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from fakes import METADATA, NAME, dep_wheel, fake_wheel, write_wheel

import builder.node.verify as node_verify
from builder import node, signing
from builder.errors import FolderError, TrustError, WheelhouseError
from builder.files import sha256_of
from builder.node import INSTALLER, InstallError, ManifestError
from builder.wheelhouse import installer as bundle
from builder.wheelhouse import publish, verify
from builder.wheelhouse.layout import load_manifest, read_manifest, signed_manifest, write_manifest
from builder.wheelhouse.provision import Host, host_script
from builder.wheelhouse.upkeep import resign

ROOT = Path(__file__).resolve().parents[1]
NO_TORCH = METADATA.replace("Requires-Dist: torch==2.13.0\n", "Requires-Dist: fakedep-a>=1\n")
PLANTED = "import pathlib; pathlib.Path(__import__('os').environ['PLANTED']).write_text('planted line ran')\n"

pytestmark = pytest.mark.spawns


def no_deps(reqs: object, tag: str, dest: Path, log: object) -> list[Path]:
    """A FAKE `pip download`: the closure as one tiny real wheel."""
    return [dep_wheel(dest, "fakedep-a", "1.0")]


@pytest.fixture
def keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> signing.Keys:
    """This test's own build-host key folder and node state (never the session's)."""
    monkeypatch.setenv(signing.KEYS_ENV, str(tmp_path / "keys"))
    monkeypatch.setenv(node.STATE_ENV, str(tmp_path / "node-state"))
    return signing.keys()


@pytest.fixture
def house(tmp_path: Path, keys: signing.Keys) -> Path:
    dist = tmp_path / "dist"
    dist.mkdir()
    target = tmp_path / "house"
    publish([fake_wheel(dist, metadata=NO_TORCH, cpu_target="x86-64")], target, fetch_closure=no_deps)
    assert verify(target) == []
    return target


def builder(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})  # fmt: skip


def installer(house: Path | str, *args: str, python: str = sys.executable, env: dict[str, str] | None = None,
              tool: Path | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """The published node installer, run as a node runs it."""
    tool = tool or Path(str(house)) / INSTALLER
    run_env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    run_env.update(PIP_CONFIG_FILE="/dev/null", PIP_INDEX_URL="http://127.0.0.1:9/simple/", PIP_NO_CACHE_DIR="1",
                   PIP_DISABLE_PIP_VERSION_CHECK="1", **(env or {}))  # fmt: skip
    return subprocess.run([python, str(tool), "--wheelhouse", str(house), "--python", python, *args],
                          capture_output=True, text=True, env=run_env)  # fmt: skip


def forge(house: Path) -> None:
    """The co-tenant's forgery of issue 28: a line planted in the published wheel, and the new sha256
    put into its smoke report and the manifest (wheel and report, and the wheel's size), so every
    hash agrees again."""
    wheel = house / NAME
    with zipfile.ZipFile(wheel) as zf:
        files = {n: zf.read(n) for n in zf.namelist() if not n.endswith("RECORD")}
    files["deepspeed/__init__.py"] = PLANTED.encode()
    write_wheel(wheel, files)
    report = json.loads((house / f"{NAME}.smoke.json").read_text())
    report["sha256"] = sha256_of(wheel)
    (house / f"{NAME}.smoke.json").write_text(json.dumps(report, indent=2) + "\n")
    data = json.loads((house / "manifest.json").read_text())
    data["wheels"][NAME]["sha256"] = sha256_of(wheel)
    data["wheels"][NAME]["size"] = wheel.stat().st_size
    data["wheels"][NAME]["report_sha256"] = sha256_of(house / f"{NAME}.smoke.json")
    (house / "manifest.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def node_python(path: Path) -> str:
    from nodes import node_venv

    return node_venv(path)


def installed(python: str) -> str:
    return subprocess.run([python, "-m", "pip", "list"], capture_output=True, text=True).stdout


# ---------------------------------------------------------------- the forgery of the issue


def test_the_consistent_forgery_is_refused_by_verify_repair_the_node_and_provisioning(
    house: Path, keys: signing.Keys, tmp_path: Path
) -> None:
    key = keys.key().line()
    python = node_python(tmp_path / "node")
    forge(house)
    # A node given no key installs nothing (fail closed, as apt does with an unsigned repository).
    planted = tmp_path / "planted"
    blind = installer(house, python=python)
    assert blind.returncode == 8 and "no key to check the wheelhouse's signature with" in blind.stderr, blind.stderr
    assert "--skip-signature-check" in blind.stderr and "Traceback" not in blind.stderr
    assert "deepspeed" not in installed(python)
    # Told to skip the check, it has only the hashes the folder itself holds: the forgery installs,
    # which is what the flag's name and the warning say.
    blind = installer(house, "--skip-signature-check", python=python)
    assert blind.returncode == 0 and "warning: --skip-signature-check: the manifest's signature is not checked" in (
        blind.stderr
    )
    subprocess.run([python, "-c", "import deepspeed"], env={**os.environ, "PLANTED": str(planted)}, check=True)
    assert planted.read_text() == "planted line ran"
    subprocess.run([python, "-m", "pip", "uninstall", "-y", "-q", "deepspeed"], check=True)
    planted.unlink()

    done = builder("verify", "--wheelhouse", str(house))
    assert done.returncode == 8 and "manifest.json.sig does not match what it signs" in done.stderr
    assert "builder repair" not in done.stderr.split("fix:")[-1]  # the fix is not "repair" for a forgery
    done = builder("repair", "--wheelhouse", str(house))
    assert done.returncode == 8 and "does not match what it signs" in done.stderr
    done = installer(house, "--trust", key, python=python)
    assert done.returncode == 8 and "does not match what it signs" in done.stderr and "Traceback" not in done.stderr
    assert "deepspeed" not in installed(python)
    # The provision script: the signature fails before the installer is even fetched.
    script = tmp_path / "host.sh"
    script.write_text(host_script(Host("n1", python=python), str(house), keys.trust()))
    (house / INSTALLER).write_bytes((house / INSTALLER).read_bytes() + f"\n{PLANTED}".encode())
    done = subprocess.run(["sh", str(script)], capture_output=True, text=True, env={**os.environ,
                          "PLANTED": str(planted)})  # fmt: skip
    assert done.returncode == 8 and "is not signed by a key trusted here" in done.stderr
    assert not planted.exists() and "deepspeed" not in installed(python)


def test_a_node_given_the_key_installs_and_records_the_serial(house: Path, keys: signing.Keys, tmp_path: Path) -> None:
    python = node_python(tmp_path / "node")
    done = installer(house, "--trust", str(keys.trust_file), "--json", python=python)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    manifest = load_manifest(house)
    assert result["installed"] and result["serial"] == manifest.serial == 1
    assert result["signed_by"] == keys.key().fingerprint()
    assert f"manifest signed by {keys.key().fingerprint()}: serial 1, valid until {manifest.expires}" in done.stderr
    assert "deepspeed" in installed(python)
    state = json.loads((tmp_path / "node-state" / "serials.json").read_text())
    assert state[manifest.wheelhouse_id]["serial"] == 1


# ---------------------------------------------------------------- freshness: rollback and expiry


def test_an_older_signed_manifest_replayed_is_refused(house: Path, keys: signing.Keys, tmp_path: Path) -> None:
    old = {n: (house / n).read_bytes() for n in ("manifest.json", "manifest.json.sig", "index.html")}
    assert resign(house).serial == 2
    key = keys.key().line()
    assert installer(house, "--trust", key, "--dry-run").returncode == 0  # the node accepts serial 2
    for name, data in old.items():  # the co-tenant puts serial 1 back: validly signed, but older
        (house / name).write_bytes(data)
    done = installer(house, "--trust", key, "--dry-run")
    assert done.returncode == 8 and "has serial 1, older than serial 2 this node accepted" in done.stderr
    assert "(rollback)" in done.stderr
    problems = verify(house)
    assert any("older than serial 2 this host signed" in p for p in problems)
    with pytest.raises(WheelhouseError, match="rollback"):
        publish([], house)
    # Going back on purpose: adopt re-signs what is there with a serial above every one seen.
    assert resign(house, adopt=True).serial == 3 and verify(house) == []
    assert installer(house, "--trust", key, "--dry-run").returncode == 0


def test_an_expired_manifest_is_refused_until_it_is_re_signed(house: Path, keys: signing.Keys) -> None:
    key = keys.key().line()
    found = read_manifest(house)
    assert found is not None
    past = node.stamp(datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1))
    stale = dataclasses.replace(found[1], serial=found[1].serial + 1, expires=past)
    write_manifest(house, stale, signed_manifest(stale))
    done = installer(house, "--trust", key, "--dry-run")
    assert done.returncode == 8 and f"expired at {past}" in done.stderr and "builder sign" in done.stderr
    assert any(f"expired at {past}" in p for p in verify(house))
    done = builder("sign", "--wheelhouse", str(house), "--days", "7")
    assert done.returncode == 0, done.stderr
    manifest = load_manifest(house)
    assert f"serial {manifest.serial}, valid until {manifest.expires}" in done.stderr
    expires = node.parse_stamp(manifest.expires)
    assert expires is not None and 6 <= (expires - datetime.datetime.now(datetime.UTC)).days <= 7
    assert installer(house, "--trust", key, "--dry-run").returncode == 0 and verify(house) == []
    # The node's own clock decides: a node living after the expiry refuses what a node now accepts.
    later = expires + datetime.timedelta(seconds=1)
    with pytest.raises(ManifestError, match="expired"):
        node.load_verified(str(house), keys.trust(), now=later)


# ---------------------------------------------------------------- who signed, and for what


def test_a_manifest_signed_by_another_key_is_refused(house: Path, keys: signing.Keys, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    ours = keys.key().line()
    monkeypatch.setenv(signing.KEYS_ENV, str(tmp_path / "intruder-keys"))
    (house / "manifest.json.sig").unlink()  # the intruder strips the signature and adopts the files
    resign(house, adopt=True)  # with their own key (its first use made it), over the same files
    intruder = signing.keys().key()
    monkeypatch.setenv(signing.KEYS_ENV, str(tmp_path / "keys"))
    done = installer(house, "--trust", ours, "--dry-run")
    assert done.returncode == 8 and f"made by key {intruder.fingerprint()}, which this node does not trust" in (
        done.stderr
    )
    assert any("which this host does not trust" in p for p in verify(house))  # the build host's own words
    done = builder("verify", "--wheelhouse", str(house), "--trust", intruder.line())  # a person choosing that key
    assert done.returncode == 0 and f"signed by {intruder.fingerprint()}" in done.stderr


def test_a_removed_signature_is_refused_by_a_node_given_a_key(house: Path, keys: signing.Keys) -> None:
    (house / "manifest.json.sig").unlink()
    done = installer(house, "--trust", keys.key().line(), "--dry-run")
    assert done.returncode == 8 and "is not signed" in done.stderr
    assert any("is not signed (no manifest.json.sig)" in p for p in verify(house))
    with pytest.raises(WheelhouseError, match="sign --adopt"):
        load_manifest(house)


def test_a_signature_made_for_another_purpose_is_refused(house: Path, keys: signing.Keys, tmp_path: Path) -> None:
    """The build host's own key, signing manifest.json's bytes, but in git's namespace (as a commit
    signature would be): the purpose is part of what was signed."""
    message = tmp_path / "m"
    message.write_bytes((house / "manifest.json").read_bytes())
    subprocess.run(["ssh-keygen", "-q", "-Y", "sign", "-f", str(keys.private), "-n", "git", str(message)], check=True)
    shutil.copy(f"{message}.sig", house / "manifest.json.sig")
    done = installer(house, "--trust", keys.key().line(), "--dry-run")
    assert done.returncode == 8 and "signature made for another purpose (namespace 'git'" in done.stderr
    assert any("namespace 'git'" in p for p in verify(house))


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"garbage\n", "is not an SSH signature"),
        (b"-----BEGIN SSH SIGNATURE-----\nU1NIU0lH\n-----END SSH SIGNATURE-----\n", "is not an SSH signature"),
        (b"-----BEGIN SSH SIGNATURE-----\n" + b"QUFB" * 40000 + b"\n-----END SSH SIGNATURE-----\n", "limit"),
    ],
    ids=["garbage", "truncated", "huge"],
)
def test_a_garbage_or_huge_signature_is_refused(house: Path, keys: signing.Keys, content: bytes, expected: str) -> None:
    (house / "manifest.json.sig").write_bytes(content)
    done = installer(house, "--trust", keys.key().line(), "--dry-run")
    assert done.returncode == 8 and expected in done.stderr and "Traceback" not in done.stderr
    assert verify(house) != []


# ---------------------------------------------------------------- the key on the build host


def test_a_signing_key_others_can_read_is_refused_and_nothing_is_written(house: Path, keys: signing.Keys,
                                                                          tmp_path: Path) -> None:  # fmt: skip
    before = {p.name: p.read_bytes() for p in house.iterdir() if p.is_file()}
    keys.private.chmod(0o644)
    dist = tmp_path / "dist2"
    dist.mkdir()
    wheel = fake_wheel(dist, name=NAME.replace("0.19.8", "0.19.9"), metadata=NO_TORCH, cpu_target="x86-64")
    done = builder("publish", "--wheelhouse", str(house), str(wheel))
    assert done.returncode == TrustError.exit_code == 13
    assert "can be read or changed by others (mode 644)" in done.stderr and "chmod 600" in done.stderr
    after = {p.name: p.read_bytes() for p in house.iterdir() if p.is_file()}
    assert after.keys() - {".publish.lock"} == before.keys() - {".publish.lock"}
    assert {n: after[n] for n in before if n != ".publish.lock"} == {n: b for n, b in before.items()
                                                                     if n != ".publish.lock"}  # fmt: skip
    keys.private.chmod(0o600)
    assert builder("publish", "--wheelhouse", str(house), str(wheel)).returncode == 0 and verify(house) == []


def test_key_commands_show_rotate_revoke(house: Path, keys: signing.Keys, tmp_path: Path) -> None:
    """Rotation: the new key signs, both are trusted until the old one is revoked; then a manifest
    the old key signed is refused by the host and by a node given the new allowed_signers."""
    old = keys.key()
    shown = builder("key", "show")
    assert shown.returncode == 0 and shown.stdout.strip() == old.line()
    old_signed = {n: (house / n).read_bytes() for n in ("manifest.json", "manifest.json.sig", "index.html")}
    rotated = builder("key", "rotate")
    assert rotated.returncode == 0, rotated.stderr
    new = keys.key()
    assert new != old and set(keys.trust().keys) == {old, new}
    assert verify(house) == []  # the old key's signature is still good during the rotation
    assert resign(house).serial == 2 and node.fingerprint_of(load_manifest(house).signer) == new.fingerprint()
    assert installer(house, "--trust", new.line(), "--dry-run").returncode == 0
    revoked = builder("key", "revoke", old.fingerprint())
    assert revoked.returncode == 0 and old not in keys.trust().keys and old in keys.trust().revoked
    assert f"@revoked {old.line()}" in keys.trust_file.read_text()
    # The old key's (older) manifest put back: the host refuses it, and a node with the new trust file too.
    for name, data in old_signed.items():
        (house / name).write_bytes(data)
    assert any("which this node does not trust" in p or "revoked" in p for p in verify(house))
    node_state = {node.STATE_ENV: str(tmp_path / "fresh-node")}  # a node that never saw serial 2
    done = installer(house, "--trust", str(keys.trust_file), "--dry-run", env=node_state)
    assert done.returncode == 8 and f"made by key {old.fingerprint()}, which is revoked" in done.stderr
    assert builder("key", "revoke", new.fingerprint()).returncode == 13  # never this host's own key


# ---------------------------------------------------------------- the node's tools


def test_a_node_without_ssh_keygen_verifies_with_openssl_or_says_what_to_install(house: Path, keys: signing.Keys,
                                                                                  tmp_path: Path) -> None:  # fmt: skip
    """RHEL 8's OpenSSH 8.0 has no -Y: OpenSSL's Ed25519 check stands in; with neither, exit 9."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "openssl").symlink_to(shutil.which("openssl") or "/usr/bin/openssl")
    no_ssh = {"PATH": str(bin_dir)}
    key = keys.key().line()
    done = installer(house, "--trust", key, "--dry-run", env=no_ssh)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "manifest signed by" in done.stderr
    signed = (house / "manifest.json").read_bytes()
    (house / "manifest.json").write_bytes(signed.replace(b'"recipe": "cpu"', b'"recipe": "cpv"'))
    done = installer(house, "--trust", key, "--dry-run", env=no_ssh)
    assert done.returncode == 8 and "does not match what it signs" in done.stderr
    (house / "manifest.json").write_bytes(signed)
    (bin_dir / "openssl").unlink()  # no openssl command either: libcrypto itself checks (issue 51, item 6)
    done = installer(house, "--trust", key, "--dry-run", env=no_ssh)
    assert done.returncode == 0 and "manifest signed by" in done.stderr, done.stderr[-2000:]
    (house / "manifest.json").write_bytes(signed.replace(b'"recipe": "cpu"', b'"recipe": "cpv"'))
    done = installer(house, "--trust", key, "--dry-run", env=no_ssh)
    assert done.returncode == 8 and "does not match what it signs" in done.stderr
    (house / "manifest.json").write_bytes(signed)
    # With no tool at all (FAKE: each verifier answers that it is missing), exit 9 names what to install.
    sig = (house / "manifest.json.sig").read_bytes()
    with pytest.MonkeyPatch.context() as mp:
        for verifier in ("_verify_ssh_keygen", "_verify_openssl", "_verify_libcrypto"):
            mp.setattr(node_verify, verifier, lambda *a, **k: None)
        with pytest.raises(InstallError, match="cannot check the wheelhouse's signature") as err:
            node.check_signature(signed, sig, keys.trust(), "manifest.json.sig")
    assert err.value.exit_code == 9 and "install OpenSSH 8.1 or newer" in err.value.fix
    script = tmp_path / "host.sh"
    script.write_text(host_script(Host("n1"), str(house), keys.trust()))
    (bin_dir / "mktemp").symlink_to(shutil.which("mktemp") or "/bin/mktemp")
    (bin_dir / "rm").symlink_to(shutil.which("rm") or "/bin/rm")
    (bin_dir / "cat").symlink_to(shutil.which("cat") or "/bin/cat")
    (bin_dir / "python3").symlink_to(sys.executable)
    done = subprocess.run([shutil.which("sh") or "/bin/sh", str(script)], capture_output=True, text=True,
                          env={"PATH": str(bin_dir)})  # fmt: skip
    assert done.returncode == 9 and "ssh-keygen is missing" in done.stderr


def test_the_trust_given_to_a_node_is_checked() -> None:
    with pytest.raises(InstallError, match="no public key on the line"):
        node.parse_trust("ds-wheelhouse not-a-key\n", "trusted")
    with pytest.raises(InstallError, match="is not a public key"):
        node.parse_trust("ssh-ed25519 !!!!\n", "trusted")
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAILF4WHI7T5v/sYCfwHBDEp/UDmc1973dx9ZYD7xGdfok"
    with pytest.raises(InstallError, match="holds no key that may sign now: SHA256:.* is revoked"):
        node.load_trust([f"@revoked {key}"])
    scoped = node.parse_trust(f'x namespaces="git" {key}\n', "t")
    assert scoped.keys == ()  # a key trusted for git signs no wheelhouse
    # Issue 51: each line that grants nothing says why (all three were "holds no key that is not revoked").
    cases = (('namespaces="git"', 'namespaces="git" leaves out ds-wheelhouse'),
             ('valid-before="20200101"', 'valid-before="20200101" has passed (expired)'),
             ('valid-after="20991231"', 'valid-after="20991231" is still to come (not yet valid)'))  # fmt: skip
    for options, why in cases:
        with pytest.raises(InstallError) as err:
            node.load_trust([f"ds-wheelhouse {options} {key}"])
        assert err.value.message.startswith("--trust ds-wheelhouse") and f": {why}" in err.value.message, (
            err.value.message
        )


@pytest.mark.parametrize(
    "options",
    ['namespaces="ds-wheelhouse"', 'namespaces="git"', 'namespaces="ds-*"', 'namespaces="*,!ds-wheelhouse"',
     'valid-before="20200101"', 'valid-after="20991231"', 'valid-after="20200101",valid-before="20991231Z"',
     'valid-after="202001011200Z",namespaces="git,ds-wheelhouse"', "cert-authority", 'cert-authority,namespaces="*"',
     'foo="bar"', "no-touch-required", 'valid-before="2020"', ""],
)  # fmt: skip
def test_allowed_signers_lines_are_read_as_ssh_keygen_reads_them(keys: signing.Keys, tmp_path: Path,
                                                                  options: str) -> None:  # fmt: skip
    """Each line, with the host's real key and a real signature: the toolkit trusts the key exactly
    where `ssh-keygen -Y verify` with the same file accepts the signature, or refuses the line."""
    key = signing.ensure_key(keys)
    message = tmp_path / "message"
    message.write_bytes(b"a manifest\n")
    subprocess.run(["ssh-keygen", "-q", "-Y", "sign", "-f", str(keys.private), "-n", node.NAMESPACE, str(message)],
                   check=True, capture_output=True)  # fmt: skip
    line = f"{node.NAMESPACE} {options} {key.line()}".replace("  ", " ")
    signers = tmp_path / "allowed_signers"
    signers.write_text(line + "\n")
    with message.open("rb") as stdin:
        ssh = subprocess.run(["ssh-keygen", "-Y", "verify", "-f", str(signers), "-I", node.NAMESPACE, "-n",
                              node.NAMESPACE, "-s", f"{message}.sig"], stdin=stdin, capture_output=True,
                             text=True)  # fmt: skip
    try:
        ours = key in node.parse_trust(line, "allowed_signers").keys
    except InstallError as exc:
        assert ssh.returncode != 0, (line, ssh.stdout)  # refused here, and not accepted there either
        assert str(signers) not in exc.message and "allowed_signers:1" in exc.message
        return
    assert ours == (ssh.returncode == 0), (line, ssh.stdout, ssh.stderr)


# ---------------------------------------------------------------- over HTTP, and copies


class Swapping(http.server.SimpleHTTPRequestHandler):
    """A proxy on the path to the wheelhouse that hands out a forged wheel and manifest (its own
    consistent forgery) and passes everything else through."""

    forged: ClassVar[dict[str, bytes]] = {}

    def do_GET(self) -> None:
        name = self.path.lstrip("/").replace("%2B", "+")
        if name in self.forged:
            body = self.forged[name]
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        super().do_GET()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def swapping_proxy(house: Path, tmp_path: Path) -> Iterator[str]:
    copy = tmp_path / "forged"
    shutil.copytree(house, copy)
    forge(copy)
    Swapping.forged = {n: (copy / n).read_bytes() for n in (NAME, f"{NAME}.smoke.json", "manifest.json")}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: Swapping(*a, directory=str(house)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_proxy_swapping_the_wheel_and_manifest_is_refused(swapping_proxy: str, keys: signing.Keys,
                                                            tmp_path: Path) -> None:  # fmt: skip
    tool = tmp_path / "ds-node-install.py"
    tool.write_bytes(bundle.build())
    done = installer(swapping_proxy, "--trust", keys.key().line(), "--dry-run", tool=tool)
    assert done.returncode == 8 and "does not match what it signs" in done.stderr
    assert f"==> chosen: {NAME}" not in done.stderr


def test_the_build_host_reads_its_allowed_signers_as_nodes_do(house: Path, keys: signing.Keys) -> None:
    """Issue 51, item 5: verify and sign on the build host trusted the host's own key whatever its
    allowed_signers line said; with that line expired, scoped to git, or removed, verify passed a
    wheelhouse that nodes and `ssh-keygen -Y verify` refuse. Now it reads the file as they do."""
    line = keys.trust_file.read_text()
    own = next(t for t in line.splitlines() if t.startswith(node.NAMESPACE))
    assert verify(house) == []
    for options in ('valid-before="20200101"', 'namespaces="git"', None):
        changed = "" if options is None else own.replace(own.split()[1], options, 1)
        keys.trust_file.write_text(line.replace(own, changed))
        problems = verify(house)
        assert problems and any("not trusted" in p or "no key" in p or "signed by" in p for p in problems), (
            options,
            problems,
        )
        node_said = installer(house, "--trust", str(keys.trust_file), "--dry-run")  # a node refuses it too
        assert node_said.returncode == 9 and "holds no key that may sign now" in node_said.stderr, node_said.stderr
    keys.trust_file.write_text(line)
    assert verify(house) == []


def test_a_full_disk_is_one_message_with_its_exit_code_and_nothing_half_written(
    keys: signing.Keys, tmp_path: Path
) -> None:
    """Issue 51, item 9: sign, publish and lock on a full wheelhouse ended in a raw OSError traceback
    (ENOSPC from the atomic write), exit 1. A wheelhouse on a tmpfs of 2 MiB, filled to the last block."""
    if os.getuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a small filesystem needs root to mount a tmpfs")
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(small)], check=True)
    try:
        dist = tmp_path / "dist"
        dist.mkdir()
        house = small / "house"
        publish([fake_wheel(dist, metadata=NO_TORCH, cpu_target="x86-64")], house, fetch_closure=no_deps)
        before = {p.relative_to(house): p.read_bytes() for p in house.rglob("*") if p.is_file()}
        filler = small / "filler"
        with open(filler, "wb") as f:  # every free block taken
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass
        done = builder("sign", "--wheelhouse", str(house))
        assert done.returncode == 10, (done.returncode, done.stderr[-2000:])
        assert "No space left on device; nothing half-written was left there" in done.stderr
        assert "df -h" in done.stderr and "Traceback" not in done.stderr
        another = fake_wheel(dist, name=NAME.replace("0.19.8", "0.19.9"), metadata=NO_TORCH, payload=b"x" * 4096)
        with pytest.raises(FolderError, match="No space left on device; nothing half-written") as err:
            publish([another], house, fetch_closure=no_deps)
        assert err.value.exit_code == 10
        after = {p.relative_to(house): p.read_bytes() for p in house.rglob("*") if p.is_file()}
        assert {k: v for k, v in after.items() if k.name != ".publish.lock"} == {
            k: v for k, v in before.items() if k.name != ".publish.lock"
        }  # nothing half-written, nothing lost
        filler.unlink()
        assert verify(house) == []
    finally:
        subprocess.run(["umount", str(small)], check=False)


@pytest.mark.integration
def test_a_node_with_openssl_111_and_no_ssh_keygen_checks_the_signature(house: Path, keys: signing.Keys,
                                                                        tmp_path: Path) -> None:  # fmt: skip
    """Issue 51, item 6: RHEL 8-class nodes (OpenSSH 8.0: no -Y) could check no signature: the
    installer ran `openssl pkeyutl -verify -rawin`, and -rawin arrived in OpenSSL 3.0 (1.1.1: "unknown
    option -rawin", exit 9 for a good wheelhouse). It now verifies Ed25519 through libcrypto itself
    (EVP_DigestVerify, 1.1.1+). On the Debian 11 node image (OpenSSL 1.1.1w) with ssh-keygen hidden:
    a good wheelhouse passes, a forged one is refused."""
    import cluster

    why = cluster.missing()
    if why:
        pytest.skip(why)
    root = cluster.ensure_image("bullseye", tmp_path / "image.log")
    said = subprocess.run(["chroot", str(root), "openssl", "version"], capture_output=True, text=True).stdout
    assert said.startswith("OpenSSL 1.1.1"), said
    tool = tmp_path / "tool"
    tool.mkdir()
    (tool / "ds-node-install.py").write_bytes(bundle.build())

    def on_the_node(wheelhouse: Path) -> subprocess.CompletedProcess[str]:
        scratch = tmp_path / "node-tmp"
        scratch.mkdir(exist_ok=True)
        script = (f"set -e; mount --make-rprivate /; mount --bind /dev/null {root}/usr/bin/ssh-keygen; "
                  f"mount --bind -o ro {wheelhouse} {root}/mnt; mount --bind -o ro {tool} {root}/media; "
                  f"mount --bind {scratch} {root}/tmp; "  # the node's state and temporary files: not the image's
                  f"exec chroot {root} env -i PATH=/usr/bin:/bin HOME=/tmp TMPDIR=/tmp DS_NODE_STATE_DIR=/tmp/state "
                  f"/opt/python3.11/bin/python3.11 /media/ds-node-install.py --wheelhouse /mnt "
                  f"--python /opt/python3.11/bin/python3.11 --trust '{keys.key().line()}' --dry-run")  # fmt: skip
        return subprocess.run(["unshare", "--mount", "sh", "-c", script], capture_output=True, text=True)

    good = on_the_node(house)
    assert good.returncode == 0 and f"==> chosen: {NAME}" in good.stderr, good.stderr[-3000:]
    forged = tmp_path / "forged"
    shutil.copytree(house, forged)
    forge(forged)
    bad = on_the_node(forged)
    assert bad.returncode == 8 and "does not match what it signs" in bad.stderr, bad.stderr[-3000:]


def test_an_unsigned_wheelhouse_with_an_older_page_is_adopted_not_sent_in_a_loop(house: Path) -> None:
    """Issue 51, item 11: an unsigned wheelhouse whose page an older version rendered: verify said
    `sign --adopt`, adopt refused the page and said re-publish or repair, repair refused the unsigned
    manifest and said `sign --adopt`. The page is a view of the manifest: adopt renders it again."""
    (house / "manifest.json.sig").unlink()
    page = house / "index.html"
    page.write_text(page.read_text().replace("</body>", "<p>rendered by an older toolkit</p></body>"))
    said = builder("verify", "--wheelhouse", str(house))
    assert said.returncode == 8 and "sign --adopt" in said.stderr.split("fix:")[-1], said.stderr
    done = builder("sign", "--adopt", "--wheelhouse", str(house))
    assert done.returncode == 0, done.stderr
    assert "index.html is not what this toolkit renders (an older one wrote it): written again" in done.stderr
    assert "older toolkit</p>" not in page.read_text() and verify(house) == []


def test_a_copied_wheelhouse_verifies_and_installs_unchanged(house: Path, keys: signing.Keys, tmp_path: Path) -> None:
    """Sites rsync a wheelhouse to each cluster's share: the copy, signature included, is valid as is."""
    copy = tmp_path / "elsewhere" / "mirror"
    shutil.copytree(house, copy)
    assert verify(copy) == []
    done = builder("verify", "--wheelhouse", str(copy), "--trust", keys.key().line())
    assert done.returncode == 0, done.stderr
    assert installer(copy, "--trust", keys.key().line(), "--dry-run").returncode == 0


# ---------------------------------------------------------------- the shared unit cache


def test_a_unit_cache_entry_no_trusted_key_signed_is_built_again(tmp_path: Path, keys: signing.Keys) -> None:
    """A co-tenant rewrites a cached unit's wheel and recomputes its record's sha256: the record's
    signature no longer holds, so the unit is not taken from the cache."""
    from test_units import plan_for, unit_wheel

    from builder.units import cache
    from builder.units.plan import plan_units

    (unit,), _ = plan_units(plan_for("cpu_lion"), {}, 2, None)
    store = tmp_path / "units"
    record, cached = cache.store(store, unit, unit_wheel(tmp_path / "built", "cpu_lion"), 12.0)
    assert cache.lookup(store, unit) == (record, cached)
    with zipfile.ZipFile(cached, "a") as zf:  # other shared-object bytes in the cached unit wheel
        zf.writestr("deepspeed/ops/adam/planted.so", b"\x7fELF planted")
    data = json.loads((store / unit.key / "unit.json").read_text())
    data["sha256"] = hashlib.sha256(cached.read_bytes()).hexdigest()
    (store / unit.key / "unit.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    assert cache.lookup(store, unit) is None
    (store / unit.key / "unit.json.sig").unlink()
    assert cache.lookup(store, unit) is None  # unsigned: the same


def test_without_ssh_keygen_units_are_sealed_by_a_secret_and_a_planted_one_is_built_again(
    tmp_path: Path, keys: signing.Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 49: a GPU image with no OpenSSH client builds with --no-publish. Its units are sealed
    with an HMAC by a secret in the key folder (0600): reused by this host; a co-tenant's planted
    entry (its own seal, no seal, an SSH signature that cannot be checked here) is built again."""
    from test_units import plan_for, unit_wheel

    from builder.units import cache
    from builder.units.plan import plan_units

    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no ssh-keygen, no openssl
    assert shutil.which("ssh-keygen") is None
    (unit,), _ = plan_units(plan_for("cpu_lion"), {}, 2, None)
    store = tmp_path / "units"
    record, cached = cache.store(store, unit, unit_wheel(tmp_path / "built", "cpu_lion"), 12.0)
    secret = keys.folder / signing.UNIT_SECRET_FILE
    assert secret.stat().st_mode & 0o777 == 0o600 and len(secret.read_bytes()) == 32
    assert not keys.private.exists()  # no signing key was made (nor could be)
    seal = (store / unit.key / "unit.json.sig").read_bytes()
    assert seal.startswith(b"ds-wheel-builder unit seal hmac-sha256 ")
    assert cache.lookup(store, unit) == (record, cached)
    # A planted wheel with its sha256 in the record: the seal no longer holds.
    with zipfile.ZipFile(cached, "a") as zf:
        zf.writestr("deepspeed/ops/lion/planted.py", b"import os")
    data = json.loads((store / unit.key / "unit.json").read_text())
    data["sha256"] = hashlib.sha256(cached.read_bytes()).hexdigest()
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    (store / unit.key / "unit.json").write_text(text)
    assert cache.lookup(store, unit) is None
    # Sealed with another secret (the planter's own key folder): refused too.
    import hmac

    forged = (
        b"ds-wheel-builder unit seal hmac-sha256 " + hmac.new(b"x" * 32, text.encode(), "sha256").hexdigest().encode()
    )
    (store / unit.key / "unit.json.sig").write_bytes(forged + b"\n")
    assert cache.lookup(store, unit) is None
    (store / unit.key / "unit.json.sig").write_bytes(
        b"-----BEGIN SSH SIGNATURE-----\nAAAA\n-----END SSH SIGNATURE-----\n"
    )
    assert cache.lookup(store, unit) is None  # an SSH signature nothing here can check: built again, no traceback
    # A secret others can read is refused, with the fix.
    secret.chmod(0o644)
    with pytest.raises(TrustError, match="others can read it") as err:
        signing.seal_unit(b"x", keys)
    assert f"remove {secret}" in err.value.fix


def test_a_unit_cache_in_a_system_folder_or_behind_another_users_link_is_refused(tmp_path: Path) -> None:
    from builder.units.cache import UNIT_CACHE_ENV, cache_folder

    link = tmp_path / "cache-link"
    link.symlink_to("/")
    for path in (link, Path("/"), Path("/usr/lib"), Path("/etc"), Path.home()):
        with pytest.raises(FolderError, match="(is|leads to) the system folder"):
            cache_folder(tmp_path, {UNIT_CACHE_ENV: str(path)})
    assert FolderError.exit_code == 10
    mine = tmp_path / "shared" / "units"
    assert cache_folder(tmp_path, {UNIT_CACHE_ENV: str(mine)}) == mine
    if os.getuid() == 0:  # a link another user made (chown of the link itself needs root)
        other = tmp_path / "their-link"
        other.symlink_to(tmp_path / "shared")
        os.lchown(other, 65534, 65534)
        with pytest.raises(FolderError, match="a link made by another user"):
            cache_folder(tmp_path, {UNIT_CACHE_ENV: str(other / "units")})


@pytest.mark.parametrize("version", ["3.6", "3.7", "3.8", "3.9"])
def test_the_installer_on_the_pythons_nodes_have(house: Path, keys: signing.Keys, version: str) -> None:
    """Issue 30 item 4: the oldest Python the node installer supports is 3.8 (Ubuntu 20.04; Debian 11
    and RHEL 9 have 3.9; RHEL 8 has python39 beside its platform-python 3.6). On 3.8 and 3.9 it
    checks the signed manifest and says why nothing fits (the wheel is for cp311); on 3.6 and 3.7 one
    line says what it needs, never a SyntaxError. Real interpreters (pyenv), skipped where absent."""
    from builder.errors import ToolError
    from builder.targets import find_interpreter

    try:
        python = str(find_interpreter(version).path)
    except ToolError:
        pytest.skip(f"no Python {version} on this machine (pyenv install {version} to run this case)")
    done = installer(house, "--dry-run", "--trust", keys.key().line(), python=python)
    assert done.returncode == 9, done.stderr
    assert "Traceback" not in done.stderr and "SyntaxError" not in done.stderr
    if version in ("3.6", "3.7"):
        assert done.stderr == (f"error: the DeepSpeed node installer needs Python 3.8 or newer; {python} is Python "
                               f"{version}\n  fix: run it with a newer python3 (RHEL 8: dnf install python39, then "
                               f"python3.9 {house / INSTALLER} ...)\n")  # fmt: skip
        return
    tag = "cp3" + version.split(".")[1]
    assert f"==> manifest signed by {keys.key().fingerprint()}" in done.stderr
    assert f"error: no wheel in the wheelhouse fits this node (python {tag}, " in done.stderr
    assert f"{NAME}: built for cp311, node has {tag}" in done.stderr


# ---------------------------------------------------------------- locks inside the signed statement (issue 38)


def _locks(house: Path) -> dict[str, str]:
    """What `lock` writes for the published wheel: its lock, the PEP 751 twin and the Containerfile."""
    from builder.wheelhouse.lockfile import render_containerfile, render_lock, render_pylock, served_files

    files = served_files(load_manifest(house))
    return {"locks/cpu.lock": render_lock(NAME, files), "locks/pylock.cpu.toml": render_pylock(NAME, files),
            "locks/cpu.Containerfile": render_containerfile("docker.io/library/python:3.11-slim", "locks/cpu.lock",
                                                            NAME)}  # fmt: skip


def _planted(tmp_path: Path) -> tuple[Path, str]:
    """A wheel named as the served dependency, outside the wheelhouse, with other bytes."""
    evil = tmp_path / "evil"
    evil.mkdir()
    wheel = dep_wheel(evil, "fakedep-a", "1.0", requires=("planted",))
    return wheel, sha256_of(wheel)


def test_locks_are_signed_and_a_lock_pointing_outside_is_refused_by_verify_and_adopt(
    house: Path, keys: signing.Keys, tmp_path: Path
) -> None:
    """The co-tenant's edit of issue 38: the pylock's dependency pointed at a planted wheel outside the
    wheelhouse (with its true hash), a --find-links line added to the lock, a lock nobody wrote. Every
    lock `lock` wrote is in the signed manifest, so each edit is a hash the signature does not cover."""
    from builder.wheelhouse.extras import publish_locks

    publish_locks(house, _locks(house))
    manifest = load_manifest(house)
    assert sorted(manifest.locks) == ["locks/cpu.Containerfile", "locks/cpu.lock", "locks/pylock.cpu.toml"]
    assert verify(house) == []
    wheel, digest = _planted(tmp_path)
    pylock = house / "locks" / "pylock.cpu.toml"
    text = pylock.read_text()
    served = manifest.dependencies["fakedep_a-1.0-py3-none-any.whl"].sha256
    pylock.write_text(text.replace('path = "../fakedep_a-1.0-py3-none-any.whl"', f'path = "../../evil/{wheel.name}"')
                      .replace(served, digest))  # fmt: skip
    lock = house / "locks" / "cpu.lock"
    lock.write_text(lock.read_text() + f"--find-links {wheel.parent}\n")
    (house / "locks" / "other.lock").write_text(f"# Lock for {NAME}, written by ds-wheel-builder.\n")
    problems = verify(house)
    assert "locks/pylock.cpu.toml: sha256 differs from manifest.json (tampered or replaced)" in problems
    assert "locks/cpu.lock: sha256 differs from manifest.json (tampered or replaced)" in problems
    assert any(p.startswith("locks/other.lock: not in manifest.json") for p in problems), problems
    done = builder("verify", "--wheelhouse", str(house))
    assert done.returncode == 8 and "pylock.cpu.toml" in done.stderr
    with pytest.raises(WheelhouseError, match="does not check out against its manifest"):
        resign(house, adopt=True)  # the signature is good: the files are not what it covers
    # The consistent forgery: the manifest lists the edited locks' hashes, so its signature fails,
    # and adopt, which once signed exactly this, refuses it.
    data = json.loads((house / "manifest.json").read_text())
    for rel in ("locks/pylock.cpu.toml", "locks/cpu.lock", "locks/other.lock"):
        data["locks"][rel] = {"sha256": sha256_of(house / rel)}
    (house / "manifest.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    done = builder("sign", "--adopt", "--wheelhouse", str(house))
    assert done.returncode == 8, done.stderr
    assert "its signature does not check out here" in done.stderr and "never one whose signature fails" in done.stderr
    done = builder("verify", "--wheelhouse", str(house))
    assert done.returncode == 8 and "does not match what it signs" in done.stderr
    assert "--adopt" not in done.stderr.split("fix:")[-1]  # a failing signature is never pointed at adopt
    assert "planted" not in (house / "manifest.json.sig").read_text()


@pytest.mark.parametrize(
    ("rel", "edit", "said"),
    [
        ("locks/pylock.cpu.toml", lambda t: t.replace('path = "../fakedep', 'path = "/srv/evil/fakedep'),
         "is not the wheelhouse's ../fakedep_a-1.0-py3-none-any.whl"),
        ("locks/pylock.cpu.toml", lambda t: t.replace('path = "../fakedep_a-1.0-py3-none-any.whl"',
                                                      'url = "https://evil.example/fakedep_a-1.0-py3-none-any.whl"'),
         "a wheel with url (a URL or a source outside it)"),
        ("locks/pylock.cpu.toml", lambda t: t.replace('[[packages.wheels]]', '[packages.sdist]\nurl = "x"\n\n'
                                                      '[[packages.wheels]]', 1), "sdist (only wheels"),
        ("locks/pylock.cpu.toml", lambda t: re.sub(r'sha256 = "[0-9a-f]{8}', 'sha256 = "00000000', t, count=1),
         "is not the served file's"),
        ("locks/cpu.lock", lambda t: t + "--find-links /srv/evil\n", "'--find-links /srv/evil' is not a pinned"),
        ("locks/cpu.lock", lambda t: t + "https://evil.example/x.whl\n", "'https://evil.example/x.whl' is not a"),
        ("locks/cpu.lock", lambda t: re.sub(r"sha256:[0-9a-f]{8}", "sha256:00000000", t, count=1),
         "which no served file has"),
        ("locks/cpu.lock", lambda t: t + "einops==0.8.1 \\\n    --hash=sha256:" + "e" * 64 + "\n",
         "pins einops==0.8.1 to sha256 eeeeeeeeeeeeeeee..., which no served file has"),
    ],
)  # fmt: skip
def test_each_lock_is_read_back_pin_by_pin_against_the_manifest(
    house: Path, keys: signing.Keys, rel: str, edit: Any, said: str
) -> None:
    """What verify reads in a lock the manifest lists (the check behind the signature: a lock written
    by a toolkit with a bug, or by a build host that was itself fooled, still cannot reach outside)."""
    from builder.wheelhouse.lockfile import lock_problems

    texts = _locks(house)
    manifest = load_manifest(house)
    assert lock_problems(rel, texts[rel], manifest) == []
    problems = lock_problems(rel, edit(texts[rel]), manifest)
    assert any(said in p for p in problems), problems


# ---------------------------------------------------------------- the key folder, kept as ssh keeps ~/.ssh (issue 38)


def _key_cli(folder: Path | str, *args: str) -> subprocess.CompletedProcess[str]:
    return builder("key", *args, env={signing.KEYS_ENV: str(folder)})


def test_a_key_folder_others_can_write_is_refused_before_anything_is_signed(keys: signing.Keys, house: Path) -> None:
    """A folder 0777 (anyone could add a key to allowed_signers), then an allowed_signers 0666: sign,
    verify and key show refuse (exit 13), naming the file and chmod."""
    keys.folder.chmod(0o777)
    done = builder("sign", "--wheelhouse", str(house), env={signing.KEYS_ENV: str(keys.folder)})
    assert done.returncode == 13 and f"the key folder {keys.folder} can be changed by others (mode 777)" in done.stderr
    assert f"chmod go-w {keys.folder}" in done.stderr and "Traceback" not in done.stderr
    keys.folder.chmod(0o700)
    keys.trust_file.chmod(0o666)
    for args in (("sign", "--wheelhouse", str(house)), ("verify", "--wheelhouse", str(house)), ("key", "show")):
        done = builder(*args, env={signing.KEYS_ENV: str(keys.folder)})
        assert done.returncode == 13, (args, done.stderr)
        assert "allowed_signers file" in done.stderr and "(mode 666)" in done.stderr, done.stderr
    keys.trust_file.chmod(0o644)
    assert builder("verify", "--wheelhouse", str(house), env={signing.KEYS_ENV: str(keys.folder)}).returncode == 0


def test_a_key_folder_that_is_a_system_folder_a_file_or_holds_a_folder_for_a_key_is_refused(tmp_path: Path) -> None:
    link = tmp_path / "keys-link"
    link.symlink_to("/")
    before = set(os.listdir("/"))
    done = _key_cli(link, "create")
    assert done.returncode == 13 and "is the system folder /" in done.stderr, done.stderr
    assert set(os.listdir("/")) == before  # no key, no lock file written into /
    plain = tmp_path / "a-file"
    plain.write_text("not a folder\n")
    done = _key_cli(plain, "create")
    assert done.returncode == 13 and "is not a folder" in done.stderr and "Traceback" not in done.stderr
    assert plain.read_text() == "not a folder\n"
    folder = tmp_path / "keys"
    assert _key_cli(folder, "create").returncode == 0
    public = (folder / "wheelhouse-signing-key.pub").read_bytes()
    (folder / "wheelhouse-signing-key").unlink()
    (folder / "wheelhouse-signing-key").mkdir()  # a folder where the private key belongs
    done = _key_cli(folder, "create")
    assert done.returncode == 13 and "is not a regular file" in done.stderr and "Traceback" not in done.stderr
    assert (folder / "wheelhouse-signing-key.pub").read_bytes() == public  # nothing made, nothing overwritten


def test_a_damaged_or_mismatched_private_key_is_named_as_such(keys: signing.Keys, house: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    assert _key_cli(other, "create").returncode == 0
    private = keys.private.read_bytes()
    shutil.copy(other / "wheelhouse-signing-key", keys.private)  # another key's private half
    done = builder("sign", "--wheelhouse", str(house), env={signing.KEYS_ENV: str(keys.folder)})
    assert done.returncode == 13 and "is not the pair of wheelhouse-signing-key.pub" in done.stderr, done.stderr
    keys.private.write_bytes(b"-----BEGIN OPENSSH PRIVATE KEY-----\ngarbage\n-----END OPENSSH PRIVATE KEY-----\n")
    done = builder("sign", "--wheelhouse", str(house), env={signing.KEYS_ENV: str(keys.folder)})
    assert done.returncode == 13 and "ssh-keygen cannot use it as a private key" in done.stderr, done.stderr
    assert "install OpenSSH" not in done.stderr and "Traceback" not in done.stderr
    keys.private.write_bytes(private)
    keys.private.chmod(0o600)
    assert builder("verify", "--wheelhouse", str(house), env={signing.KEYS_ENV: str(keys.folder)}).returncode == 0


def test_key_commands_say_what_is_wrong_with_the_right_exit_code(keys: signing.Keys, house: Path,
                                                                  tmp_path: Path) -> None:  # fmt: skip
    """key rotate with no key (13), key revoke with no fingerprint (2), key trust of garbage or of two
    keys on one line (2), key trust of a revoked key (13, it stays revoked)."""
    empty = tmp_path / "empty-keys"
    done = _key_cli(empty, "rotate")
    assert done.returncode == 13 and "no signing key" in done.stderr
    done = _key_cli(keys.folder, "revoke")
    assert done.returncode == 2 and "needs the key's fingerprint" in done.stderr
    done = _key_cli(keys.folder, "trust", "garbage")
    assert done.returncode == 2 and "no public key on the line" in done.stderr and "Traceback" not in done.stderr
    other = tmp_path / "other"
    assert _key_cli(other, "create").returncode == 0
    line = (other / "wheelhouse-signing-key.pub").read_text().split()[:2]
    done = _key_cli(keys.folder, "trust", " ".join([*line, *keys.key().line().split()]))
    assert done.returncode == 2 and "exactly one public key line" in done.stderr
    assert _key_cli(keys.folder, "trust", " ".join(line)).returncode == 0
    fingerprint = node.key_from_line(line[0], line[1], "t").fingerprint()
    assert _key_cli(keys.folder, "revoke", fingerprint).returncode == 0
    done = _key_cli(keys.folder, "trust", " ".join(line))
    assert done.returncode == 13 and "is revoked on this host" in done.stderr and "now trusts" not in done.stderr
    assert node.key_from_line(line[0], line[1], "t") in keys.trust().revoked


def test_a_crlf_copy_of_a_good_signature_verifies(house: Path, keys: signing.Keys) -> None:
    """A copy that went through a tool writing CRLF line ends: the same base64, so the same signature."""
    sig = house / "manifest.json.sig"
    sig.write_bytes(sig.read_bytes().replace(b"\n", b"\r\n"))
    assert verify(house) == []
    done = installer(house, "--trust", keys.key().line(), "--dry-run")
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_build_host_is_told_its_own_fix_for_a_key_it_does_not_trust(house: Path, keys: signing.Keys,
                                                                        tmp_path: Path) -> None:  # fmt: skip
    done = builder("verify", "--wheelhouse", str(house), env={signing.KEYS_ENV: str(tmp_path / "another-host")})
    assert done.returncode == 8
    assert "/etc/ds-node-install" not in done.stderr, done.stderr


# ---------------------------------------------------------------- rollback across wheelhouses (issue 38)


def _other_house(tmp_path: Path) -> Path:
    """Another wheelhouse (a staging one), signed by the same key: its own id, serial 1."""
    dist = tmp_path / "dist-staging"
    dist.mkdir()
    other = tmp_path / "staging"
    publish([fake_wheel(dist, metadata=NO_TORCH, cpu_target="x86-64")], other, fetch_closure=no_deps)
    return other


def test_a_node_refuses_another_wheelhouse_where_it_read_one_unless_told(
    house: Path, keys: signing.Keys, tmp_path: Path
) -> None:
    """The node read wheelhouse P at a place; staging wheelhouse S (same key, another id, serial 1) is
    copied into that place: refused, naming both ids; --wheelhouse-id S accepts it once, on purpose;
    --wheelhouse-id P refuses S."""
    key = keys.key().line()
    first = installer(house, "--trust", key, "--dry-run")
    assert first.returncode == 0, first.stderr[-2000:]
    p_id = load_manifest(house).wheelhouse_id
    staging = _other_house(tmp_path)
    s_id = load_manifest(staging).wheelhouse_id
    assert s_id != p_id
    tool = tmp_path / "installer.py"
    shutil.copy(house / INSTALLER, tool)
    shutil.rmtree(house)
    shutil.copytree(staging, house)
    done = installer(house, "--trust", key, "--dry-run", tool=tool)
    assert done.returncode == 8, done.stderr[-2000:]
    assert f"is wheelhouse {s_id}, but this node read wheelhouse {p_id} from the same place" in done.stderr
    assert f"--wheelhouse-id {s_id}" in done.stderr
    done = installer(house, "--trust", key, "--dry-run", "--wheelhouse-id", p_id, tool=tool)
    assert done.returncode == 8 and f"not {p_id} (--wheelhouse-id)" in done.stderr
    done = installer(house, "--trust", key, "--dry-run", "--wheelhouse-id", s_id, tool=tool)
    assert done.returncode == 0, done.stderr[-2000:]
    assert installer(house, "--trust", key, "--dry-run", tool=tool).returncode == 0  # that place now serves S


def test_a_copy_is_not_written_into_until_it_is_a_wheelhouse_of_its_own(
    house: Path, keys: signing.Keys, tmp_path: Path
) -> None:
    """Two copies of one wheelhouse keep one id: written into, each would be a 'rollback' of the
    other. The build host refuses to sign into the copy, saying how to make it a wheelhouse of its
    own (`sign --new-id`); then both verify and both can be written."""
    mirror = tmp_path / "mirror"
    shutil.copytree(house, mirror)
    assert verify(mirror) == []
    done = builder("sign", "--wheelhouse", str(mirror), env={signing.KEYS_ENV: str(keys.folder)})
    assert done.returncode == 13 and f"{mirror} is a copy of wheelhouse" in done.stderr, done.stderr
    assert f"sign --new-id --wheelhouse {mirror}" in done.stderr
    done = builder("sign", "--new-id", "--wheelhouse", str(mirror), env={signing.KEYS_ENV: str(keys.folder)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert load_manifest(mirror).wheelhouse_id != load_manifest(house).wheelhouse_id
    for folder in (house, mirror):
        assert builder("sign", "--wheelhouse", str(folder), env={signing.KEYS_ENV: str(keys.folder)}).returncode == 0
        assert verify(folder) == []


def test_provision_tells_each_node_which_wheelhouse_to_accept(house: Path, keys: signing.Keys) -> None:
    script = host_script(Host("n1"), str(house), keys.trust(), wheelhouse_id=load_manifest(house).wheelhouse_id)
    assert f"--wheelhouse-id {load_manifest(house).wheelhouse_id}" in script


def test_the_build_hosts_own_key_missing_from_its_trust_is_named_with_its_fix(house: Path, keys: signing.Keys) -> None:
    """Issue 57, item 7: the host's own allowed_signers line expired, scoped to git, or removed: verify and
    sign said the file "lists none" and told the build host to restore the wheelhouse from the build host
    (itself). Now each names the lines and the fix: put this host's line back."""
    from builder.wheelhouse import layout

    own = keys.key()
    data = (house / "manifest.json").read_bytes()
    manifest = load_manifest(house)
    other = signing.Keys(keys.folder.parent / "other-keys")
    keys.folder.parent.joinpath("other-keys").mkdir(mode=0o700)
    stranger = signing.create(other)
    for text in (f'ds-wheelhouse valid-before="20200101" {own.line()}\n',
                 f'ds-wheelhouse namespaces="git" {own.line()}\n',
                 f"ds-wheelhouse {stranger.line()}\n"):  # fmt: skip
        keys.trust_file.write_text(text)
        with pytest.raises(WheelhouseError) as err:
            layout.check_signed(house, data, manifest)
        assert "lists none" not in err.value.message, err.value.message
        assert f"this host's own key ({own.fingerprint()}) is not trusted" in err.value.fix
        assert "key trust" in err.value.fix and "restore the wheelhouse from the build host" not in err.value.fix
        if "stranger" not in text and "valid-before" in text:
            assert "grant nothing here" in err.value.message


def test_an_openssl_that_fails_otherwise_is_not_read_as_a_forgery(house: Path, keys: signing.Keys,
                                                                   tmp_path: Path) -> None:  # fmt: skip
    """Issue 57, item 7: a node whose openssl command failed without saying "unknown option" reported a
    good wheelhouse as forged ("does not match what it signs"). Only openssl's own "Verification Failure"
    means a forgery; any other failure hands the check to libcrypto. FAKE openssl: a broken install."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "openssl").write_text("#!/bin/sh\necho 'openssl: error while loading shared libraries' >&2\nexit 1\n")
    (bin_dir / "openssl").chmod(0o755)
    (bin_dir / "sh").symlink_to(shutil.which("sh") or "/bin/sh")
    done = installer(house, "--trust", keys.key().line(), "--dry-run", env={"PATH": str(bin_dir)})
    assert done.returncode == 0 and "manifest signed by" in done.stderr, done.stderr[-2000:]
    assert "does not match what it signs" not in done.stderr
