"""publish, verify, repair and prune a wheelhouse that pip installs from.

Layout:
    wheelhouse/<wheel>                        DeepSpeed wheels, each with <wheel>.metadata (PEP 658)
                                              and <wheel>.smoke.json (the report it passed), and
                                              <wheel>.proof.<16 hex>.json for each GPU proof taken
                                              in (publish --proof, builder.wheelhouse.proofs)
    wheelhouse/<dependency wheel>             DeepSpeed's runtime closure (all but torch), for
                                              nodes that reach only the wheelhouse
    wheelhouse/simple/index.html              PEP 503 root page
    wheelhouse/simple/<project>/index.html    links to ../../<file>#sha256=<digest>
    wheelhouse/tools/ds-node-install.py       the node installer, builder/node/ built into one file
    wheelhouse/manifest.json                  every file above with its sha256 (builder.node's contract)
Every write goes through `files.write_atomic` (temporary name, fsync, mode 0644, rename) under
one file lock (filelock) held for the whole update. Before the files are copied, a journal names
them, so the next publish (or `repair`) can tell what a killed publish left from what someone
else put there: only the former is ever removed.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import platform
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from builder import configs, node, output
from builder.contracts import BuildManifest, SmokeReport
from builder.errors import FolderError, PublishError
from builder.files import copy_atomic, is_temp_name, make_dirs, sha256_of, write_atomic
from builder.node import (
    CONFIG_CHECK,
    IMAGES,
    INSTALLER,
    FileEntry,
    ManifestError,
    SmokeSummary,
    VariantEntry,
    WheelEntry,
    WheelhouseManifest,
    check_variants_json_name,
    check_wheel_name,
    split_variant_name,
    tag_machine,
)
from builder.smoke import load_report, report_path
from builder.wheelhouse import closure, installer, proofs, variants
from builder.wheelhouse.index import (
    write_index,
)
from builder.wheelhouse.layout import (
    DEPS_PREFIX,
    DEPS_SUFFIX,
    JOURNAL,
    LOCKS,
    MANIFEST,
    NOT_BUNDLED,
    _companions,
    is_deps_folder,
    load_manifest,
    locked,
    signed_manifest,
    stamped,
    write_manifest,
)

# Fetches DeepSpeed's runtime closure: (requirements, python tag, folder, log) -> wheel files.
Fetcher = Callable[..., list[Path]]  # (requirements, python_tag, dest, log[, machine])


def manifest_entry(
    name: str, build: BuildManifest, report: SmokeReport, metadata_sha256: str, report_sha256: str, published_at: str
) -> WheelEntry:
    """What the wheelhouse manifest says of one wheel: its build manifest's facts and its smoke result."""
    return WheelEntry(
        name=name,
        sha256=report.sha256,
        version=build.version,
        recipe=build.recipe,
        accelerator=build.accelerator,
        python_tag=build.python_tag,
        torch=build.torch_version,
        cuda=build.torch_cuda,
        archs=build.archs,
        cpu_target=build.cpu_target,
        cpu_flags=build.cpu_flags,
        ops=build.ops,
        narrowed_ops=build.narrowed_ops,
        missing_ops=build.missing_ops,
        host_ops=None if (host := node.host_ops_of(build.data)) is None else tuple(host),
        smoke=SmokeSummary(report.passed, report.finished_at, report.summary_checks()),
        metadata_sha256=metadata_sha256,
        report_sha256=report_sha256,
        published_at=published_at,
    )


def passing_report(wheel: Path) -> SmokeReport:
    """The wheel's smoke report if it passed for exactly these bytes; otherwise PublishError."""
    if not wheel.is_file():
        raise PublishError(f"no such wheel: {wheel}", "pass the path of a built wheel, e.g. build/dist/*.whl")
    try:
        check_wheel_name(wheel.name, "wheel")
    except ManifestError as exc:  # a Cyrillic letter, a space, no tags: not a name a wheelhouse can serve
        raise PublishError(exc.message + " (PEP 427: ASCII letters, digits, '.', '_' and '+', five parts)",
                           "publish the wheel build-wheel made, under the name it gave it") from exc  # fmt: skip
    report = load_report(wheel)
    if report is None:
        raise PublishError(
            f"{wheel.name} has no smoke report", f"run smoke on it first: python -m builder smoke {wheel}"
        )
    if not report.passed:
        raise PublishError(
            f"{wheel.name} failed its smoke tests", f"read {report_path(wheel)}, fix the build and smoke it again"
        )
    if report.wheel != wheel.name or report.sha256 != sha256_of(wheel):
        raise PublishError(f"{wheel.name} changed after it was smoke-tested (sha256 differs)", "smoke it again")
    return report


def _build_of(wheel: Path) -> BuildManifest:
    try:
        check_wheel_name(wheel.name, "wheel")
        return BuildManifest.from_wheel(wheel)
    except ManifestError as exc:
        raise PublishError(exc.message, "publish only wheels made by build-wheel") from exc


def other_machine(wheel_name: str) -> str:
    """The machine a wheel is for where it is not this one's (aarch64), else "": its dependencies are
    resolved and fetched for that machine's platform tags."""
    machine = tag_machine(check_wheel_name(wheel_name).platform) or ""
    return "" if machine == platform.machine() else machine


def pip_download_closure(requirements: Sequence[str], python_tag: str, dest: Path, log: Path | None,
                         machine: str = "") -> list[Path]:  # fmt: skip
    """Wheels of `requirements` and everything they need, for `python_tag` (on `machine`: another than this
    one's is asked for by its platform tags), via pip download."""
    from builder import cmd

    version = f"{python_tag[2]}.{python_tag[3:]}"
    tags = closure.node_platforms(machine) if machine and machine != platform.machine() else []
    platforms = [a for tag in tags if tag.startswith("manylinux") for a in ("--platform", tag)]
    cmd.run(
        [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--python-version", version,
         "--implementation", "cp", *platforms, "-d", dest, *requirements],
        log=log,
        fix="the wheelhouse carries DeepSpeed's dependencies for air-gapped nodes: pip must reach an index "
        "that has them (pip config list), or publish from a machine that does",
    )  # fmt: skip
    files = sorted(dest.glob("*.whl"))
    return [f for f in files if check_wheel_name(f.name).project not in NOT_BUNDLED]


def _journal(wheelhouse: Path, files: Mapping[str, str]) -> None:
    write_atomic(wheelhouse / JOURNAL, json.dumps({"files": dict(sorted(files.items()))}, indent=2) + "\n")


def _leftovers(wheelhouse: Path, manifest: WheelhouseManifest) -> tuple[list[Path], list[str]]:
    """What killed publishes left: files to remove, and notes on what is left alone (not ours)."""
    doomed: list[Path] = []
    notes: list[str] = []
    if wheelhouse.is_dir():  # dependency downloads a killed publish left (named by publish alone)
        doomed += [p for p in wheelhouse.iterdir() if is_deps_folder(p.name) and p.is_dir() and not p.is_symlink()]
    for folder in (wheelhouse, wheelhouse / "simple", wheelhouse / "tools", wheelhouse / LOCKS, wheelhouse / IMAGES):
        if folder.is_dir():
            doomed += [p for p in folder.iterdir() if is_temp_name(p.name) and p.is_file()]
    if (wheelhouse / "simple").is_dir():
        for page in (wheelhouse / "simple").iterdir():
            if page.is_dir():
                doomed += [p for p in page.iterdir() if is_temp_name(p.name) and p.is_file()]
    journal = wheelhouse / JOURNAL
    if journal.is_file():
        try:
            files = json.loads(node.read_bounded(journal, "report"))["files"]
            listed = {
                n: e.sha256
                for table in (manifest.wheels, manifest.dependencies, manifest.variants, manifest.variant_indexes)
                for n, e in table.items()
            }
            listed.update({p.name: p.sha256 for e in manifest.wheels.values() for p in e.proofs})
            for name, digest in files.items():
                path = wheelhouse / name
                if name.startswith(f"{LOCKS}/"):
                    if ".." in name or not node.LOCK_FILE_RE.match(name):
                        raise ManifestError(f"{JOURNAL}: {name[:80]!r} is not a lock file name", "")
                    listed_lock = manifest.locks.get(name)
                    if (
                        path.is_file()
                        and not path.is_symlink()
                        and sha256_of(path) == digest
                        and (listed_lock is None or listed_lock.sha256 != digest)
                    ):
                        doomed.append(path)  # the killed `lock` wrote it; the manifest never listed these bytes
                    continue
                if name.startswith(f"{IMAGES}/"):
                    node.check_image_file(name, JOURNAL)
                elif name.endswith("-variants.json"):
                    check_variants_json_name(name, JOURNAL)
                elif name.endswith(".json"):  # a GPU proof (publish --proof): refused here if not one's name
                    node.proof_wheel(name, JOURNAL)
                elif not node.is_wheel_name(name):
                    split_variant_name(name, JOURNAL)
                if name in listed or name in node.image_files(manifest):
                    continue
                # Companions first, the wheel after, the journal last: a cleanup cut short is redone.
                if not path.is_file() or sha256_of(path) == digest:  # the file the killed publish copied
                    doomed += [p for p in (*_companions(wheelhouse, name, None), path) if p.is_file()]
                else:
                    notes.append(f"{name} is not in {MANIFEST} and is not the file a publish wrote: left alone")
        except (ValueError, KeyError, TypeError, AttributeError, ManifestError) as exc:
            notes.append(f"{JOURNAL} is unreadable ({exc}); nothing it names was removed")
        doomed.append(journal)
    return doomed, notes


def _clean(wheelhouse: Path, manifest: WheelhouseManifest) -> list[str]:
    doomed, notes = _leftovers(wheelhouse, manifest)
    for path in doomed:
        if path.name == JOURNAL:
            continue
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
        output.note(f"removed {path.relative_to(wheelhouse)}, left by an interrupted publish")
    if any(p.name == JOURNAL for p in doomed):
        # The killed publish may have rewritten the index and the page before its manifest: both are
        # made again from the manifest before the journal (the sign of an unfinished publish) goes.
        if (wheelhouse / MANIFEST).is_file():
            write_index(wheelhouse, manifest)
        (wheelhouse / JOURNAL).unlink(missing_ok=True)
    for note in notes:
        output.note(f"note: {note}")
    return [str(p.relative_to(wheelhouse)) for p in doomed]


def publish(
    wheels: Iterable[Path],
    wheelhouse: Path,
    log: Path | None = None,
    fetch_closure: Fetcher = pip_download_closure,
    variants: bool = False,
) -> list[Path]:
    """Copy each smoke-passed wheel (with its dependencies) into the wheelhouse, then rewrite index and manifest.

    Everything happens under the wheelhouse's file lock, so concurrent publishers each see the
    others' entries. A killed publish leaves the previous index and manifest whole; what it had
    copied is removed by the next publish, which the journal makes safe.
    """
    checked = [(w, passing_report(w), _build_of(w)) for w in wheels]  # refuse before writing anything
    _writable(wheelhouse)
    with locked(wheelhouse):
        manifest = load_manifest(wheelhouse)
        _clean(wheelhouse, manifest)
        wheels_now = dict(manifest.wheels)
        for wheel, report, _ in checked:
            target = wheelhouse / wheel.name
            known = wheels_now.get(wheel.name)
            if (known and known.sha256 != report.sha256) or (
                not known and target.exists() and sha256_of(target) != report.sha256
            ):
                raise PublishError(
                    f"the wheelhouse already has a different {wheel.name}",
                    "a published file name is never reused: bump the build string, or prune the old wheel",
                )
        journal = {w.name: r.sha256 for w, r, _ in checked}
        _journal(wheelhouse, journal)
        try:
            published = _publish_files(wheelhouse, checked, manifest, wheels_now, journal, log, fetch_closure,
                                       variants)  # fmt: skip
        except BaseException as exc:
            # A failed publish (no index reachable, a clash, Ctrl-C) removes what it copied, by its
            # journal, against the manifest on disk now: nothing half-published stays behind.
            _undo(wheelhouse, exc)
            raise
        (wheelhouse / JOURNAL).unlink(missing_ok=True)
    return published


def _publish_files(
    wheelhouse: Path,
    checked: Sequence[tuple[Path, SmokeReport, BuildManifest]],
    manifest: WheelhouseManifest,
    wheels_now: dict[str, WheelEntry],
    journal: dict[str, str],
    log: Path | None,
    fetch_closure: Fetcher,
    variants: bool = False,
) -> list[Path]:
    """Copy the wheels, their companions and dependencies (and make the variant wheels, in a
    wheelhouse that has them or with `variants`), then write index and manifest (the journal
    already names every file this copies, so a kill at any point is undone)."""
    published = []
    deps = dict(manifest.dependencies)
    for wheel, report, build in checked:
        target = wheelhouse / wheel.name
        if target.is_file() and sha256_of(target) == report.sha256:
            output.note(f"{wheel.name} is already published (same sha256)")
            os.chmod(target, 0o644)
        else:
            copy_atomic(wheel, target)
            output.note(f"published {target}")
        metadata = wheel_metadata(target)
        write_atomic(wheelhouse / f"{wheel.name}.metadata", metadata)
        report_text = report_path(wheel).read_bytes()
        write_atomic(wheelhouse / f"{wheel.name}.smoke.json", report_text)
        previous = wheels_now.get(wheel.name)
        machine = other_machine(wheel.name)
        requires = _closure(wheelhouse, metadata.decode("utf-8"), build.python_tag, deps, journal, log, fetch_closure,
                            machine)  # fmt: skip
        wheels_now[wheel.name] = dataclasses.replace(
            manifest_entry(wheel.name, build, report, hashlib.sha256(metadata).hexdigest(),
                           hashlib.sha256(report_text).hexdigest(), previous.published_at if previous else _now()),
            requires=requires,
            size=target.stat().st_size,
        )  # fmt: skip
        published.append(target)
    for name, entry in list(wheels_now.items()):  # entries an older toolkit published without the list
        if entry.requires is None and (wheelhouse / f"{name}.metadata").is_file():
            machine = other_machine(name)
            found = closure.resolve(
                closure.requirements_of((wheelhouse / f"{name}.metadata").read_text("utf-8"), entry.python_tag, (),
                                        machine),
                entry.python_tag, deps, lambda n: wheel_metadata(wheelhouse / n).decode("utf-8"), machine,
            )  # fmt: skip
            if not found.missing:
                wheels_now[name] = dataclasses.replace(entry, requires=found.files)
    tools = {name: FileEntry(name, _publish_tool(wheelhouse, name)) for name in tool_sources()}
    manifest = dataclasses.replace(manifest, wheels=wheels_now, dependencies=deps, tools=tools)
    stale: list[Path] = []
    if variants or manifest.variants:
        manifest, stale = sync_variants(wheelhouse, manifest, journal)
    commit(wheelhouse, manifest)
    _remove(stale)
    return published


def take_in_proofs(wheelhouse: Path, files: Sequence[Path], unsigned_ok: bool = False) -> list[str]:
    """publish --proof: each GPU proof checked against the wheel the wheelhouse holds (all refused
    before anything is written), kept beside it, and recorded in the signed manifest; their names."""
    if not (wheelhouse / MANIFEST).is_file():
        raise PublishError(f"{wheelhouse} holds no wheelhouse ({MANIFEST}) to take proofs into",
                           "publish the wheel first (publish --proof takes proofs into the wheelhouse that holds "
                           "it)")  # fmt: skip
    _writable(wheelhouse)
    with locked(wheelhouse):
        manifest = load_manifest(wheelhouse)
        _clean(wheelhouse, manifest)
        taken = proofs.accepted(wheelhouse, dict(manifest.wheels), files, unsigned_ok)
        _journal(wheelhouse, {found.entry.name: found.entry.sha256 for found in taken})
        try:
            names = proofs.write_proofs(wheelhouse, taken)
            commit(wheelhouse, dataclasses.replace(manifest, wheels=proofs.with_proofs(dict(manifest.wheels), taken)))
        except BaseException as exc:
            _undo(wheelhouse, exc)
            raise
        (wheelhouse / JOURNAL).unlink(missing_ok=True)
    return names


def commit(wheelhouse: Path, manifest: WheelhouseManifest, days: int | None = None) -> WheelhouseManifest:
    """The next signed statement, the index and the page, then the signed manifest: every write
    of a wheelhouse ends here, so a kill in between leaves the previous manifest whole (and
    signed) and the journal naming what is out of step."""
    manifest = stamped(wheelhouse, manifest, days)
    signed = signed_manifest(manifest)  # first: a key that cannot sign leaves the wheelhouse as it was
    write_index(wheelhouse, manifest)
    write_manifest(wheelhouse, manifest, signed)
    return manifest


def sync_variants(
    wheelhouse: Path, manifest: WheelhouseManifest, journal: dict[str, str] | None = None
) -> tuple[WheelhouseManifest, list[Path]]:
    """Make the variant wheels and variants.json files the manifest's CUDA wheels call for, and
    return the manifest listing them with the variant files it no longer lists (removed by the
    caller once the manifest is written)."""
    planned = variants.plan(manifest.wheels)
    docs = variants.indexes(planned)
    ours: dict[str, VariantEntry | FileEntry] = {**manifest.variants, **manifest.variant_indexes}
    for name in [*planned, *docs]:
        path = wheelhouse / name
        if path.is_symlink() or (path.exists() and name not in ours):
            raise PublishError(f"{path} exists and is not a variant file a publish wrote", "move it away")

    def write(name: str, data: bytes) -> str:
        """A derived file, written unless the listed one already holds these bytes; a new name is
        journaled first (a killed publish's new files are removed by the next one)."""
        digest = hashlib.sha256(data).hexdigest()
        path = wheelhouse / name
        if name in ours and path.is_file() and sha256_of(path) == digest:
            return digest
        if journal is not None and name not in ours:
            journal[name] = digest
            _journal(wheelhouse, journal)
        write_atomic(path, data)
        output.note(f"wrote {name}")
        return digest

    digests = {name: write(name, variants.variant_bytes(wheelhouse / p.wheel, p)) for name, p in planned.items()}
    index_files = {name: FileEntry(name, write(name, text.encode())) for name, text in docs.items()}
    stale = [wheelhouse / n for n in ours if n not in planned and n not in docs]
    new = dataclasses.replace(manifest, variants=variants.entries(planned, digests), variant_indexes=index_files)
    return new, stale


def _remove(paths: Iterable[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


def _closure(
    wheelhouse: Path,
    metadata: str,
    python_tag: str,
    deps: dict[str, FileEntry],
    journal: dict[str, str],
    log: Path | None,
    fetch: Fetcher,
    machine: str = "",
) -> tuple[str, ...]:
    """The dependency files this wheel installs with on a node of `machine` (default: this one), fetching
    into the wheelhouse only what none of its files meets (`deps` and the journal are updated); an index
    is asked only then."""
    wanted = closure.requirements_of(metadata, python_tag, (), machine)

    def metadata_of(name: str) -> str:
        return wheel_metadata(wheelhouse / name).decode("utf-8")

    found = closure.resolve(wanted, python_tag, deps, metadata_of, machine)
    if not found.missing:
        return found.files
    output.note(f"fetching DeepSpeed's runtime dependencies for {python_tag}: {', '.join(found.missing)}")
    make_dirs(wheelhouse)
    with tempfile.TemporaryDirectory(dir=wheelhouse, prefix=DEPS_PREFIX, suffix=DEPS_SUFFIX) as tmp:
        got = fetch(list(found.missing), python_tag, Path(tmp), log, machine) if machine else fetch(
            list(found.missing), python_tag, Path(tmp), log)  # fmt: skip
        fetched = {path.name: (path, sha256_of(path)) for path in got}
        for name, (_, digest) in fetched.items():
            old = deps.get(name)
            if old and old.sha256 != digest:
                raise PublishError(
                    f"the wheelhouse already has a different {name}", "files are never replaced: prune it first"
                )
            if not old and (wheelhouse / name).exists() and sha256_of(wheelhouse / name) != digest:
                raise PublishError(f"{wheelhouse / name} exists and is not the file pip downloaded", "move it away")
        new = {name: digest for name, (_, digest) in fetched.items() if name not in deps}
        journal.update(new)
        _journal(wheelhouse, journal)  # named before copied: a kill from here on is undone
        for name in new:
            copy_atomic(fetched[name][0], wheelhouse / name)
            deps[name] = FileEntry(name, new[name], (wheelhouse / name).stat().st_size)
    found = closure.resolve(wanted, python_tag, deps, metadata_of, machine)
    if found.missing:
        raise PublishError(
            f"the dependencies fetched for {python_tag} do not meet {', '.join(found.missing)}",
            "check the index pip uses (pip config list): it must offer wheels of them for this Python",
        )
    output.note(f"the wheelhouse carries {len(new)} new dependency wheels for {python_tag} "
                f"({len(found.files)} in this wheel's closure)")  # fmt: skip
    return found.files


def add_files(wheelhouse: Path, files: Sequence[Path], why: str) -> list[str]:
    """Put these files (wheels and sdists a lock pins, torch's among them) into the wheelhouse as
    dependencies, under the publish lock and its journal; the names added. A file of that name
    with other bytes is refused, never replaced."""
    fetched = {path.name: (path, sha256_of(path)) for path in files}
    for name in fetched:
        check_wheel_name(name, why)
    _writable(wheelhouse)
    with locked(wheelhouse):
        manifest = load_manifest(wheelhouse)
        _clean(wheelhouse, manifest)
        known = {**{n: e.sha256 for n, e in manifest.wheels.items()},
                 **{n: e.sha256 for n, e in manifest.dependencies.items()}}  # fmt: skip
        for name, (_, digest) in fetched.items():
            if name in known and known[name] != digest:
                raise PublishError(f"the wheelhouse already has a different {name}", "files are never replaced")
            if name not in known and (wheelhouse / name).exists() and sha256_of(wheelhouse / name) != digest:
                raise PublishError(f"{wheelhouse / name} exists and is not the file {why} pins", "move it away")
        new = {name: digest for name, (_, digest) in fetched.items() if name not in known}
        if not new:
            return []
        _journal(wheelhouse, new)
        try:
            for name in new:
                copy_atomic(fetched[name][0], wheelhouse / name)
            deps = {**manifest.dependencies,
                    **{n: FileEntry(n, d, (wheelhouse / n).stat().st_size) for n, d in new.items()}}  # fmt: skip
            commit(wheelhouse, dataclasses.replace(manifest, dependencies=deps))
        except BaseException as exc:
            _undo(wheelhouse, exc)
            raise
        (wheelhouse / JOURNAL).unlink(missing_ok=True)
    return sorted(new)


def installer_source() -> bytes:
    """The node installer as shipped: builder/node/ built into one file (wheelhouse.installer), the
    same bytes for the same package."""
    return installer.build()


def tool_sources() -> dict[str, bytes]:
    """tools/ of a wheelhouse: the node installer and the config checker (resources/config_check/),
    each built into one file from its package (the same package, the same bytes)."""
    return {INSTALLER: installer_source(), CONFIG_CHECK: configs.checker_source()}


def _publish_tool(wheelhouse: Path, name: str) -> str:
    data = tool_sources()[name]
    write_atomic(wheelhouse / name, data)
    return hashlib.sha256(data).hexdigest()


def wheel_metadata(wheel: Path) -> bytes:
    """The wheel's core metadata (its dist-info/METADATA), served as <wheel>.metadata (PEP 658)."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            name = next(n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
            return node.read_member(zf, name, f"{wheel.name}: {name}")
    except (OSError, zipfile.BadZipFile, StopIteration) as exc:
        raise PublishError(
            f"{wheel} is not a wheel with a METADATA file ({type(exc).__name__}: {exc})",
            "run `python -m builder verify` on the wheelhouse: the file was damaged or replaced",
        ) from exc
    except ManifestError as exc:
        raise PublishError(exc.message, exc.fix) from exc


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _undo(wheelhouse: Path, exc: BaseException) -> None:
    """After a failed update, remove what it copied (its journal names it). A wheelhouse that
    refuses writes midway (a share gone read-only, a full disk) cannot be cleaned now: the signed
    manifest nodes read is still the one it had, and the error raised here says to run repair once
    it can be written (the journal tells repair what to remove). Other failures are the caller's."""
    try:
        _clean(wheelhouse, load_manifest(wheelhouse))
    except OSError:
        pass  # it cannot be written now: repair will, by the journal
    if isinstance(exc, OSError):
        raise PublishError(
            f"the wheelhouse {wheelhouse} refused a write during the update ({exc.strerror or exc}: {exc.filename}); "
            "its signed manifest, what nodes read, is still the one it had",
            f"make it writable again (a share gone read-only, a full disk), then run `python -m builder repair "
            f"--wheelhouse {wheelhouse}` and publish again",
        ) from exc


def _writable(wheelhouse: Path) -> None:
    try:
        make_dirs(wheelhouse)
        probe = tempfile.TemporaryFile(dir=wheelhouse)
        probe.close()
    except OSError as exc:
        raise FolderError(
            f"cannot write to the wheelhouse {wheelhouse}: {exc.strerror}",
            "pass --wheelhouse with a folder you can write (and --work-dir, if the checkout is read-only)",
        ) from exc
