"""What a node remembers between runs: the serial it last accepted per wheelhouse (a replayed older
manifest is refused) and which wheelhouse id each source served.
"""

import datetime
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from builder.node.contract import InstallError, ManifestError
from builder.node.entries import WheelhouseManifest
from builder.node.fields import stamp
from builder.node.files import open_regular, printable, read_limited
from builder.node.paths import folder_problem, tree_problem
from builder.node.trust import Signature

STATE_ENV = "DS_NODE_STATE_DIR"  # where a node keeps the serial it last accepted per wheelhouse
SERIALS_FILE = "serials.json"


def state_dir(env: "Mapping[str, str]") -> "Path":
    """Where this node keeps the serials it accepted: DS_NODE_STATE_DIR, /var/lib for root, else
    the user's state folder; refused (InstallError) where another user could change it: whoever can
    delete serials.json turns the rollback protection off."""
    if env.get(STATE_ENV):
        folder = Path(env[STATE_ENV])
    elif hasattr(os, "geteuid") and os.geteuid() == 0:
        folder = Path("/var/lib/ds-node-install")
    else:
        folder = Path(env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")) / (
            "ds-node-install"
        )
    why = _unsafe_state(folder)
    if why:
        named = f"{STATE_ENV}={printable(str(folder))}" if env.get(STATE_ENV) else f"this node's state folder {folder}"
        raise InstallError(f"{named} cannot hold what this node accepted: {why}; another user could delete "
                           f"{SERIALS_FILE} and an older signed wheelhouse would be accepted again (rollback)",
                           f"point {STATE_ENV} at a folder only you (or root) can write, e.g. "
                           "/var/lib/ds-node-install")  # fmt: skip
    return folder


def _unsafe_state(folder: "Path") -> "str | None":
    """The trust boundary's folder check of the path, then its records: this user's or root's,
    written by no one else."""
    why = folder_problem(str(folder), written_into_files=True)
    if why:
        return why
    if not folder.is_dir():
        return None  # made by the installer
    return tree_problem(str(folder))  # its records: this user's or root's, written by no one else


def _read_state(folder: "Path", name: str, field: str, kind: type, what: str, after: str) -> "dict[str, Any]":
    """One of this node's records (a JSON object of objects, each with `field` of `kind`); an
    unreadable or malformed one is one message saying what removing it means (`after`)."""
    path = folder / name
    try:
        with open_regular(path) as f:
            data = json.loads(read_limited(f, "report", str(path)))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, ManifestError, RecursionError) as exc:  # a nested one: refused, not a traceback
        said = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise InstallError(
            f"this node's record of {what} {path} cannot be read ({said})", f"remove it: {after}"
        ) from exc
    if not isinstance(data, dict) or not all(isinstance(v, dict) and isinstance(v.get(field), kind)
                                             for v in data.values()):  # fmt: skip
        raise InstallError(f"{path} is not this installer's record of {what}", f"remove it: {after}")
    return data


def read_serials(folder: "Path") -> "dict[str, Any]":
    return _read_state(folder, SERIALS_FILE, "serial", int, "accepted serials",
                       "the node then accepts each wheelhouse's current serial again")  # fmt: skip


def check_serial(manifest: "WheelhouseManifest", digest: str, serials: "Mapping[str, Any]", where: str) -> None:
    """Refuse a manifest older than the one this node last accepted from the same wheelhouse."""
    seen = serials.get(manifest.wheelhouse_id)
    if not seen:
        return
    fix = ("do not install from it: restore the current wheelhouse from the build host. To go back on purpose, "
           "re-sign the older wheelhouse there (`python -m builder sign --adopt`): it gets a new serial")  # fmt: skip
    if manifest.serial < seen["serial"]:
        raise ManifestError(f"{where} has serial {manifest.serial}, older than serial {seen['serial']} this node "
                            f"accepted from the same wheelhouse on {str(seen.get('accepted_at'))[:40]}: an old "
                            "manifest was put back (rollback)", fix)  # fmt: skip
    if manifest.serial == seen["serial"] and seen.get("sha256") not in (None, digest):
        raise ManifestError(f"{where} has serial {manifest.serial}, which this node accepted before with other "
                            "contents: two different manifests carry one serial", fix)  # fmt: skip


def remember_serial(folder: "Path", manifest: "WheelhouseManifest", digest: str, sig: "Signature",
                    source: str = "") -> None:  # fmt: skip
    """Record the accepted serial, and which wheelhouse `source` served (each a temporary file renamed
    over the old record)."""
    serials = read_serials(folder)
    now = stamp(datetime.datetime.now(datetime.timezone.utc))
    serials[manifest.wheelhouse_id] = {"serial": manifest.serial, "sha256": digest, "key": sig.key.fingerprint(),
                                       "accepted_at": now}  # fmt: skip
    _write_state(folder, SERIALS_FILE, serials)
    if source:
        sources = read_sources(folder)
        sources[source] = {"wheelhouse_id": manifest.wheelhouse_id, "accepted_at": now}
        _write_state(folder, SOURCES_FILE, sources)


def _write_state(folder: "Path", name: str, data: "Mapping[str, Any]") -> None:
    try:
        os.makedirs(folder, mode=0o755, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, folder / name)
    except OSError as exc:
        raise InstallError(
            f"cannot record the accepted wheelhouse in {folder}: {exc.strerror}",
            f"make {folder} writable, or set {STATE_ENV} to a folder this user can write",
        ) from exc


SOURCES_FILE = "sources.json"  # wheelhouse path or URL -> the wheelhouse id it served


def source_key(base: str) -> str:
    """A wheelhouse's place as the node names it: the URL, or the folder's real path."""
    return base if base.startswith(("http://", "https://")) else os.path.realpath(base)


def read_sources(folder: "Path") -> "dict[str, Any]":
    return _read_state(folder, SOURCES_FILE, "wheelhouse_id", str, "wheelhouse places",
                       "the node then accepts the wheelhouse each place serves now")  # fmt: skip


def check_source(manifest: "WheelhouseManifest", source: str, sources: "Mapping[str, Any]", where: str,
                 expected: "str | None") -> None:  # fmt: skip
    """Refuse another wheelhouse where this node read one before (any manifest the same key ever
    signed, a staging or test wheelhouse, could be swapped in otherwise), unless `expected` names it;
    refuse anything but `expected` where it is given (provision gives it)."""
    if expected is not None:
        if manifest.wheelhouse_id != expected:
            raise ManifestError(f"{where} is wheelhouse {manifest.wheelhouse_id}, not {printable(expected)[:64]} "
                                "(--wheelhouse-id): another wheelhouse signed by the same key was put in its place",
                                "do not install from it: restore the wheelhouse, or run `python -m builder verify` on "
                                "the build host, which prints the id")  # fmt: skip
        return
    seen = sources.get(source)
    if seen and seen["wheelhouse_id"] != manifest.wheelhouse_id:
        raise ManifestError(
            f"{where} is wheelhouse {manifest.wheelhouse_id}, but this node read wheelhouse {seen['wheelhouse_id']} "
            f"from the same place on {str(seen.get('accepted_at'))[:40]}: another wheelhouse signed by the same key "
            "was put in its place (a rollback across wheelhouses)",
            f"do not install from it unless the site replaced it on purpose; then run once with --wheelhouse-id "
            f"{manifest.wheelhouse_id} (`python -m builder verify` on the build host prints it)",
        )
