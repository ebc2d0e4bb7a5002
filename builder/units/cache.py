"""The unit cache: a built unit's wheel and its record, kept by key, found again by key.

Layout: CACHE/<key>/unit.json and CACHE/<key>/<unit wheel>. A unit enters the cache through a
temporary folder renamed into place, so a reader sees a whole unit or none; one is reused only
after its record's signature (unit.json.sig, by the build host's key or one it trusts) and its
loader pass and the wheel still has the sha256 the record gives. The cache may be shared by several
builders (DS_BUILDER_UNIT_CACHE: a cluster's shared folder, which others may be able to write): a
file lock per key makes the second builder of a unit wait and reuse the first one's.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import socket
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder import output, signing
from builder.errors import BuilderError, FolderError
from builder.files import env_folder, folder_mode, make_dirs, sha256_of, sweep_dead, write_atomic
from builder.node import SHA256_RE, Fields, ManifestError, check_wheel_name, read_bounded
from builder.units.plan import UNIT_SCHEMA, Unit

UNIT_CACHE_ENV = "DS_BUILDER_UNIT_CACHE"
RECORD = "unit.json"
SIGNATURE = "unit.json.sig"  # the record's seal (builder.signing.seal_unit): a cache others can write
# cannot hand this build a unit no trusted host built


# Folders a unit cache must never be (or, for the trees, be inside): the toolkit would write its
# lock files and unit folders there, as root into the system.
def cache_folder(work_cache: Path, env: Mapping[str, str]) -> Path:
    """DS_BUILDER_UNIT_CACHE (shared by several work folders or nodes), else the work folder's cache."""
    if not env.get(UNIT_CACHE_ENV):
        return work_cache / "units"
    return check_cache_path(Path(env[UNIT_CACHE_ENV]))


def check_cache_path(path: Path) -> Path:
    """A shared unit cache the user named, judged by the trust boundary (files.env_folder: not a
    system folder, every link and folder on its way this user's or root's or a shared group's);
    where it leads."""
    named = env_folder({UNIT_CACHE_ENV: str(path)}, UNIT_CACHE_ENV, "lock files and unit folders")
    assert named is not None
    return named.resolve()


@dataclass(frozen=True)
class UnitRecord:
    op: str
    key: str
    wheel: str  # file name beside the record
    sha256: str
    seconds: float  # how long its build took (scheduling and projections read it)
    built_at: str

    def to_json(self, inputs: Mapping[str, Any]) -> str:
        return json.dumps({"schema": UNIT_SCHEMA, "op": self.op, "key": self.key, "wheel": self.wheel,
                           "sha256": self.sha256, "seconds": self.seconds, "built_at": self.built_at,
                           "inputs": inputs}, indent=2, sort_keys=True) + "\n"  # fmt: skip


def load_record(folder: Path) -> UnitRecord:
    """The validated record of the unit in `folder` (ManifestError naming the field otherwise)."""
    path = folder / RECORD
    try:
        data = json.loads(read_bounded(path, "report"))
    except (OSError, ValueError) as exc:
        raise ManifestError(f"{path}: cannot be read as JSON ({exc})", "remove the unit folder: it is rebuilt") from exc
    f = Fields(data, str(path))
    if f.get("schema", int) != UNIT_SCHEMA:
        raise f.fail("schema", f"is not {UNIT_SCHEMA}")
    seconds = f.get("seconds", (int, float))
    wheel = f.get("wheel", str)
    check_wheel_name(wheel, f"{path}: wheel")
    return UnitRecord(f.get("op", str), f.get("key", str), wheel, f.text("sha256", SHA256_RE), float(seconds),
                      f.get("built_at", str))  # fmt: skip


def lookup(cache: Path, unit: Unit) -> tuple[UnitRecord, Path] | None:
    """The cached unit for `unit.key` whose record is signed by a key this host trusts and whose wheel
    has the sha256 it gives; None otherwise (it is built again, and the stale entry replaced)."""
    folder = cache / unit.key
    if not (folder / RECORD).is_file():
        return None
    try:
        signing.check_unit(read_bounded(folder / RECORD, "report"), read_bounded(folder / SIGNATURE, "signature"),
                           str(folder / SIGNATURE))  # fmt: skip
        record = load_record(folder)
    except (OSError, ValueError, ManifestError, BuilderError) as exc:
        output.warn(f"unit {unit.op.name}: the cached record in {folder} is not one this host trusts "
                    f"({getattr(exc, 'message', exc)}): building it again")  # fmt: skip
        return None
    wheel = folder / record.wheel
    if record.key != unit.key or record.op != unit.op.name or not wheel.is_file() or sha256_of(wheel) != record.sha256:
        return None
    return record, wheel


def store(cache: Path, unit: Unit, wheel: Path, seconds: float) -> tuple[UnitRecord, Path]:
    """Put a built unit wheel into the cache (whole or not at all); returns its record and cached path."""
    try:
        return _store(cache, unit, wheel, seconds)
    except OSError as exc:  # a full disk, a cache made read-only: one message, not a thread's traceback
        raise FolderError(
            f"cannot store op unit {unit.op.name} in the unit cache {cache}: {exc.strerror or exc}",
            f"free space there, or point {UNIT_CACHE_ENV} at a folder with room (nothing half-written was kept)",
        ) from exc


def _store(cache: Path, unit: Unit, wheel: Path, seconds: float) -> tuple[UnitRecord, Path]:
    make_dirs(cache)
    record = UnitRecord(unit.op.name, unit.key, wheel.name, sha256_of(wheel), round(seconds, 1),
                        datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))  # fmt: skip
    mine = f".{unit.key}.{socket.gethostname()}."  # this host's and process's: a later store sweeps it if killed
    sweep_dead(cache, mine)
    tmp = Path(tempfile.mkdtemp(dir=cache, prefix=f"{mine}{os.getpid()}-", suffix=".tmp"))
    try:
        shutil.copyfile(wheel, tmp / wheel.name)
        os.chmod(tmp / wheel.name, 0o644)
        text = record.to_json(unit.inputs)
        write_atomic(tmp / RECORD, text)
        write_atomic(tmp / SIGNATURE, signing.seal_unit(text.encode("utf-8")))
        os.chmod(tmp, folder_mode(cache))  # 2775 in a group-shared cache: another member may replace it
        final = cache / unit.key
        if final.exists():  # a stale or damaged entry lookup refused: replaced whole
            shutil.rmtree(final)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return record, final / wheel.name
