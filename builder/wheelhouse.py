"""publish, verify, repair and prune a wheelhouse that pip installs from.

Layout:
    wheelhouse/<wheel>                        DeepSpeed wheels, each with <wheel>.metadata (PEP 658)
                                              and <wheel>.smoke.json (the report it passed)
    wheelhouse/<dependency wheel>             DeepSpeed's runtime closure (all but torch), for
                                              nodes that reach only the wheelhouse
    wheelhouse/simple/index.html              PEP 503 root page
    wheelhouse/simple/<project>/index.html    links to ../../<file>#sha256=<digest>
    wheelhouse/tools/ds-node-install.py       the node installer, byte for byte builder/node.py
    wheelhouse/manifest.json                  every file above with its sha256 (builder.node's contract)
Every write goes through `files.write_atomic` (temporary name, fsync, mode 0644, rename) under
one file lock (filelock) held for the whole update. Before the files are copied, a journal names
them, so the next publish (or `repair`) can tell what a killed publish left from what someone
else put there: only the former is ever removed.
"""

from __future__ import annotations

import datetime
import hashlib
import html
import json
import os
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from email.parser import Parser
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import quote, unquote

from filelock import FileLock
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from builder import node
from builder.contracts import BuildManifest, SmokeReport
from builder.errors import PublishError, WheelhouseError
from builder.files import copy_atomic, is_temp_name, make_dirs, write_atomic
from builder.node import (
    INSTALLER,
    MANIFEST_FILE,
    FileEntry,
    ManifestError,
    SmokeSummary,
    WheelEntry,
    WheelhouseManifest,
    check_wheel_name,
    entry_differences,
    normalize,
)
from builder.smoke import load_report, report_path
from builder.source import sha256_of

MANIFEST = MANIFEST_FILE
LOCK = ".publish.lock"
JOURNAL = ".publish-journal.json"
INTERRUPTED = "left by an interrupted publish (run `python -m builder repair` to remove it)"
DOCS = ("README.md",)  # files a person may keep in the wheelhouse folder
LOCKS = "locks"
# Nodes have torch (and recipes pin it); everything else DeepSpeed needs goes into the wheelhouse.
NOT_BUNDLED = ("torch",)

# Fetches DeepSpeed's runtime closure: (requirements, python tag, folder, log) -> wheel files.
Fetcher = Callable[[Sequence[str], str, Path, Path | None], list[Path]]


@dataclass(frozen=True)
class IndexEntry:
    filename: str
    sha256: str
    metadata_sha256: str | None = None  # PEP 658: <wheel>.metadata served beside the wheel


def project_page(project: str, entries: Iterable[IndexEntry]) -> str:
    """The PEP 503 page of one project; files sit two folders up, beside simple/."""
    links = "\n".join(_link(e) for e in sorted(entries, key=lambda e: e.filename))
    return (
        '<!DOCTYPE html>\n<html>\n  <head>\n    <meta name="pypi:repository-version" content="1.0">\n'
        f"    <title>Links for {html.escape(project)}</title>\n  </head>\n  <body>\n"
        f"    <h1>Links for {html.escape(project)}</h1>\n{links}\n  </body>\n</html>\n"
    )


def _link(e: IndexEntry) -> str:
    meta = ""
    if e.metadata_sha256:  # PEP 658 attribute, and its PEP 714 name that newer pips read
        meta = f' data-dist-info-metadata="sha256={e.metadata_sha256}" data-core-metadata="sha256={e.metadata_sha256}"'
    return f'    <a href="../../{quote(e.filename)}#sha256={e.sha256}"{meta}>{html.escape(e.filename)}</a><br/>'


def root_page(projects: Iterable[str]) -> str:
    links = "\n".join(f'    <a href="{quote(p)}/">{html.escape(p)}</a><br/>' for p in sorted(projects))
    return (
        '<!DOCTYPE html>\n<html>\n  <head>\n    <meta name="pypi:repository-version" content="1.0">\n'
        f"    <title>Simple index</title>\n  </head>\n  <body>\n{links}\n  </body>\n</html>\n"
    )


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
        smoke=SmokeSummary(report.passed, report.finished_at, report.summary_checks()),
        metadata_sha256=metadata_sha256,
        report_sha256=report_sha256,
        published_at=published_at,
    )


def passing_report(wheel: Path) -> SmokeReport:
    """The wheel's smoke report if it passed for exactly these bytes; otherwise PublishError."""
    if not wheel.is_file():
        raise PublishError(f"no such wheel: {wheel}", "pass the path of a built wheel, e.g. build/dist/*.whl")
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


def load_manifest(wheelhouse: Path) -> WheelhouseManifest:
    """The wheelhouse's validated manifest (empty when there is none yet)."""
    path = wheelhouse / MANIFEST
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return WheelhouseManifest()
    except OSError as exc:
        raise WheelhouseError(f"cannot read {path}: {exc.strerror}", "check the wheelhouse's permissions") from exc
    try:
        return node.parse_manifest(text, str(path))
    except ManifestError as exc:
        raise WheelhouseError(
            exc.message, "restore manifest.json from a backup, or publish into a new wheelhouse"
        ) from exc


def runtime_requirements(metadata: str) -> list[str]:
    """The wheel's unconditional requirements (no extras) that the wheelhouse must carry."""
    out = []
    for line in Parser().parsestr(metadata).get_all("Requires-Dist") or []:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.marker is not None and "extra" in str(req.marker):
            continue
        if canonicalize_name(req.name) not in NOT_BUNDLED:
            out.append(str(req))
    return sorted(out)


def pip_download_closure(requirements: Sequence[str], python_tag: str, dest: Path, log: Path | None) -> list[Path]:
    """Wheels of `requirements` and everything they need, for `python_tag`, via pip download."""
    from builder import cmd

    version = f"{python_tag[2]}.{python_tag[3:]}"
    cmd.run(
        [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--python-version", version,
         "--implementation", "cp", "-d", dest, *requirements],
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
    for folder in (wheelhouse, wheelhouse / "simple", wheelhouse / "tools", wheelhouse / LOCKS):
        if folder.is_dir():
            doomed += [p for p in folder.iterdir() if is_temp_name(p.name) and p.is_file()]
    if (wheelhouse / "simple").is_dir():
        for page in (wheelhouse / "simple").iterdir():
            if page.is_dir():
                doomed += [p for p in page.iterdir() if is_temp_name(p.name) and p.is_file()]
    journal = wheelhouse / JOURNAL
    if journal.is_file():
        try:
            files = json.loads(journal.read_text(encoding="utf-8"))["files"]
            listed = {
                **{n: e.sha256 for n, e in manifest.wheels.items()},
                **{n: e.sha256 for n, e in manifest.dependencies.items()},
            }
            for name, digest in files.items():
                check_wheel_name(name, JOURNAL)
                path = wheelhouse / name
                if name in listed or not path.is_file():
                    continue
                if sha256_of(path) == digest:  # the very file the killed publish copied
                    doomed += [p for p in (path, *_companions(wheelhouse, name)) if p.is_file()]
                else:
                    notes.append(f"{name} is not in {MANIFEST} and is not the file a publish wrote: left alone")
        except (ValueError, KeyError, TypeError, AttributeError, ManifestError) as exc:
            notes.append(f"{JOURNAL} is unreadable ({exc}); nothing it names was removed")
        doomed.append(journal)
    return doomed, notes


def _companions(wheelhouse: Path, name: str) -> list[Path]:
    return [wheelhouse / f"{name}.metadata", wheelhouse / f"{name}.smoke.json"]


def _clean(wheelhouse: Path, manifest: WheelhouseManifest, say: Callable[[str], None]) -> list[str]:
    doomed, notes = _leftovers(wheelhouse, manifest)
    for path in doomed:
        path.unlink(missing_ok=True)
        if path.name != JOURNAL:
            say(f"  removed {path.relative_to(wheelhouse)}, left by an interrupted publish")
    for note in notes:
        say(f"  note: {note}")
    return [str(p.relative_to(wheelhouse)) for p in doomed]


def _say(message: str) -> None:
    print(message, file=sys.stderr)


def publish(
    wheels: Iterable[Path], wheelhouse: Path, log: Path | None = None, fetch_closure: Fetcher = pip_download_closure
) -> list[Path]:
    """Copy each smoke-passed wheel (with its dependencies) into the wheelhouse, then rewrite index and manifest.

    Everything happens under the wheelhouse's file lock, so concurrent publishers each see the
    others' entries. A killed publish leaves the previous index and manifest whole; what it had
    copied is removed by the next publish, which the journal makes safe.
    """
    checked = [(w, passing_report(w), _build_of(w)) for w in wheels]  # refuse before writing anything
    _writable(wheelhouse)
    published = []
    with FileLock(str(wheelhouse / LOCK)):
        manifest = load_manifest(wheelhouse)
        _clean(wheelhouse, manifest, _say)
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
        _journal(wheelhouse, {w.name: r.sha256 for w, r, _ in checked})
        deps = dict(manifest.dependencies)
        for wheel, report, build in checked:
            target = wheelhouse / wheel.name
            if target.is_file() and sha256_of(target) == report.sha256:
                _say(f"  {wheel.name} is already published (same sha256)")
                os.chmod(target, 0o644)
            else:
                copy_atomic(wheel, target)
                _say(f"  published {target}")
            metadata = wheel_metadata(target)
            write_atomic(wheelhouse / f"{wheel.name}.metadata", metadata)
            report_text = report_path(wheel).read_bytes()
            write_atomic(wheelhouse / f"{wheel.name}.smoke.json", report_text)
            previous = wheels_now.get(wheel.name)
            wheels_now[wheel.name] = manifest_entry(
                wheel.name, build, report, hashlib.sha256(metadata).hexdigest(),
                hashlib.sha256(report_text).hexdigest(), previous.published_at if previous else _now(),
            )  # fmt: skip
            deps.update(_closure(wheelhouse, metadata.decode("utf-8"), build.python_tag, deps, log, fetch_closure))
            published.append(target)
        tools = {INSTALLER: FileEntry(INSTALLER, _publish_installer(wheelhouse))}
        manifest = WheelhouseManifest(wheels_now, deps, tools)
        write_index(wheelhouse, manifest)
        _write_manifest(wheelhouse, manifest)
        (wheelhouse / JOURNAL).unlink(missing_ok=True)
    return published


def _closure(
    wheelhouse: Path, metadata: str, python_tag: str, have: Mapping[str, FileEntry], log: Path | None, fetch: Fetcher
) -> dict[str, FileEntry]:
    """DeepSpeed's runtime dependencies for this wheel, copied into the wheelhouse (only what is missing)."""
    wanted = runtime_requirements(metadata)
    present = {check_wheel_name(n).project for n in have if python_tag in n or "-py3-" in n or "-py2.py3-" in n}
    missing = [r for r in wanted if normalize(Requirement(r).name) not in present]
    if not missing:
        return {}
    _say(f"  fetching DeepSpeed's runtime dependencies for {python_tag}: {', '.join(missing)}")
    added: dict[str, FileEntry] = {}
    make_dirs(wheelhouse)
    with tempfile.TemporaryDirectory(dir=wheelhouse, prefix=".deps-") as tmp:
        for path in fetch(missing, python_tag, Path(tmp), log):
            digest = sha256_of(path)
            target = wheelhouse / path.name
            old = have.get(path.name)
            if old and old.sha256 != digest:
                raise PublishError(
                    f"the wheelhouse already has a different {path.name}", "files are never replaced: prune it first"
                )
            if not old:
                if target.exists() and sha256_of(target) != digest:
                    raise PublishError(f"{target} exists and is not the file pip downloaded", "move it away")
                copy_atomic(path, target)
            added[path.name] = FileEntry(path.name, digest)
    _say(f"  the wheelhouse carries {len(added)} dependency wheels for {python_tag}")
    return added


def _write_manifest(wheelhouse: Path, manifest: WheelhouseManifest) -> None:
    """The one writer of manifest.json; what it writes must pass the loader every reader uses."""
    text = manifest.to_json()
    node.parse_manifest(text, "the manifest about to be written")
    write_atomic(wheelhouse / MANIFEST, text)


def installer_source() -> bytes:
    """The node installer exactly as shipped (builder/node.py), published byte for byte."""
    return Path(node.__file__).read_bytes()


def _publish_installer(wheelhouse: Path) -> str:
    data = installer_source()
    write_atomic(wheelhouse / INSTALLER, data)
    return hashlib.sha256(data).hexdigest()


def wheel_metadata(wheel: Path) -> bytes:
    """The wheel's core metadata (its dist-info/METADATA), served as <wheel>.metadata (PEP 658)."""
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        return zf.read(name)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _writable(wheelhouse: Path) -> None:
    try:
        make_dirs(wheelhouse)
        probe = tempfile.TemporaryFile(dir=wheelhouse)
        probe.close()
    except OSError as exc:
        raise PublishError(
            f"cannot write to the wheelhouse {wheelhouse}: {exc.strerror}",
            "pass --wheelhouse with a folder you can write (and --work-dir, if the checkout is read-only)",
        ) from exc


def write_index(wheelhouse: Path, manifest: WheelhouseManifest) -> None:
    """Rewrite simple/ from the files the manifest lists; remove pages of projects it no longer has."""
    simple = wheelhouse / "simple"
    projects = manifest.projects()
    for project, names in projects.items():
        entries = [
            IndexEntry(n, manifest.file_sha256(n), manifest.wheels[n].metadata_sha256 if n in manifest.wheels else None)
            for n in names
        ]
        write_atomic(simple / project / "index.html", project_page(project, entries))
    write_atomic(simple / "index.html", root_page(projects))
    for stale in simple.iterdir():  # projects whose last file was pruned: pages this toolkit wrote
        if stale.is_dir() and stale.name not in projects and [p.name for p in stale.iterdir()] == ["index.html"]:
            (stale / "index.html").unlink()
            stale.rmdir()


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[dict[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.links.append(dict(attrs))


def parse_links(page: str) -> list[dict[str, str | None]]:
    """The anchors of an index page, with their attributes."""
    parser = _Links()
    parser.feed(page)
    return parser.links


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def verify(wheelhouse: Path) -> list[str]:
    """Everything wrong with a wheelhouse; empty only when every file is listed, linked and hash-checked.

    Every manifest field that can be recomputed is: a wheel's facts from its embedded build
    manifest, its smoke result from the report published beside it.
    """
    if not wheelhouse.is_dir():
        return [f"{wheelhouse} does not exist or is not a folder"]
    if not (wheelhouse / MANIFEST).is_file():
        return [f"{wheelhouse} has no {MANIFEST}: nothing was published there"]
    try:
        manifest = load_manifest(wheelhouse)
    except WheelhouseError as exc:
        return [exc.message]
    problems: list[str] = []
    if not manifest.wheels:
        problems.append(f"{MANIFEST} lists no DeepSpeed wheel: the wheelhouse is empty")
    for name, entry in sorted(manifest.wheels.items()):
        problems += _verify_wheel(wheelhouse, name, entry)
    for name, dep in sorted({**manifest.dependencies, **manifest.tools}.items()):
        path = wheelhouse / name
        if not path.is_file():
            problems.append(f"{name}: listed in {MANIFEST} but missing")
        elif sha256_of(path) != dep.sha256:
            problems.append(f"{name}: sha256 differs from {MANIFEST} (tampered or replaced)")
    problems += _verify_tree(wheelhouse, manifest)
    problems += _verify_index(wheelhouse, manifest)
    return problems


def _verify_wheel(wheelhouse: Path, name: str, entry: WheelEntry) -> list[str]:
    wheel = wheelhouse / name
    if not wheel.is_file():
        return [f"{name}: listed in {MANIFEST} but missing"]
    problems = []
    if sha256_of(wheel) != entry.sha256:
        problems.append(f"{name}: sha256 differs from {MANIFEST} (tampered or replaced)")
    else:  # the wheel's bytes are the published ones: its own build manifest is the truth
        try:
            build = BuildManifest.from_wheel(wheel)
            problems += [f"{name}: {d}" for d in entry_differences(entry, build.data)]
        except ManifestError as exc:
            problems.append(f"{name}: {exc.message}")
    for suffix, digest in ((".metadata", entry.metadata_sha256), (".smoke.json", entry.report_sha256)):
        path = wheelhouse / f"{name}{suffix}"
        if digest is None:
            problems.append(f"{name}: {MANIFEST} records no sha256 for {name}{suffix} (published by an older toolkit)")
        elif not path.is_file():
            problems.append(f"{name}{suffix}: missing")
        elif sha256_of(path) != digest:
            problems.append(f"{name}{suffix}: sha256 differs from {MANIFEST}")
        elif suffix == ".smoke.json":
            problems += _verify_report(path, name, entry)
    return problems


def _verify_report(path: Path, name: str, entry: WheelEntry) -> list[str]:
    try:
        report = SmokeReport.from_json(path.read_bytes(), path.name)
    except ManifestError as exc:
        return [exc.message]
    problems = []
    if report.wheel != name or report.sha256 != entry.sha256:
        problems.append(f"{path.name}: the report is for other bytes than {name}")
    if report.passed != entry.smoke.passed or dict(report.summary_checks()) != dict(entry.smoke.checks):
        problems.append(f"{name}: the smoke result in {MANIFEST} differs from {path.name}")
    return problems


def _verify_tree(wheelhouse: Path, manifest: WheelhouseManifest) -> list[str]:
    """Files nobody listed: leftovers of a killed publish, and anything put there by hand."""
    known = {MANIFEST, LOCK, "simple", "tools", LOCKS, *DOCS}
    for name in manifest.wheels:
        known |= {name, f"{name}.metadata", f"{name}.smoke.json"}
    known |= set(manifest.dependencies)
    problems = []
    interrupted = INTERRUPTED
    for path in sorted(wheelhouse.iterdir()):
        if path.name == JOURNAL or is_temp_name(path.name):
            problems.append(f"{path.name}: {interrupted}")
        elif path.name not in known:
            problems.append(f"{path.name}: in the wheelhouse but not in {MANIFEST}")
    tools = wheelhouse / "tools"
    if tools.is_dir():
        for path in sorted(tools.iterdir()):
            rel = f"tools/{path.name}"
            if rel not in manifest.tools:
                problems.append(f"{rel}: {interrupted if is_temp_name(path.name) else 'not in ' + MANIFEST}")
    locks = wheelhouse / LOCKS
    if locks.is_dir():
        for path in sorted(locks.iterdir()):
            if not (path.is_file() and path.suffix in (".lock", ".Containerfile")):
                problems.append(f"{LOCKS}/{path.name}: not a lock or Containerfile written by `lock`")
    return problems


def _verify_index(wheelhouse: Path, manifest: WheelhouseManifest) -> list[str]:
    problems: list[str] = []
    simple = wheelhouse / "simple"
    projects = manifest.projects()
    root_text = _read_text(simple / "index.html")
    if root_text is None:
        return ["simple/index.html: missing or unreadable"]
    root_links = [a.get("href") or "" for a in parse_links(root_text)]
    for project in projects:
        if f"{quote(project)}/" not in root_links:
            problems.append(f"simple/index.html does not list {project}")
    problems += [
        f"simple/index.html links {href!r}, a project {MANIFEST} does not list"
        for href in root_links
        if href not in {f"{quote(p)}/" for p in projects}
    ]
    if simple.is_dir():
        for path in sorted(simple.iterdir()):
            if path.name == "index.html":
                continue
            if is_temp_name(path.name):
                problems.append(f"simple/{path.name}: {INTERRUPTED}")
            elif not path.is_dir() or path.name not in projects:
                problems.append(f"simple/{path.name}: not a project {MANIFEST} lists")
            else:
                for p in sorted(path.iterdir()):
                    if p.name == "index.html":
                        continue
                    what = INTERRUPTED if is_temp_name(p.name) else "a file no publish wrote"
                    problems.append(f"simple/{path.name}/{p.name}: {what}")
    for project, names in projects.items():
        text = _read_text(simple / project / "index.html")
        if text is None:
            problems.append(f"simple/{project}/index.html: missing")
            continue
        seen: dict[str, tuple[str, str | None]] = {}
        for a in parse_links(text):
            href = a.get("href") or ""
            target, _, fragment = href.partition("#")
            if not target.startswith("../../") or "/" in target[len("../../") :]:
                problems.append(f"simple/{project}/index.html: link {href[:120]!r} points outside the wheelhouse")
                continue
            seen[unquote(target[len("../../") :])] = (fragment, a.get("data-dist-info-metadata"))
        for name in names:
            if name not in seen:
                problems.append(f"simple/{project}/index.html: no link to {name}")
                continue
            fragment, meta_attr = seen.pop(name)
            if fragment != f"sha256={manifest.file_sha256(name)}":
                problems.append(f"simple/{project}/index.html: wrong hash for {name}")
            wheel = manifest.wheels.get(name)
            if wheel and wheel.metadata_sha256 and meta_attr != f"sha256={wheel.metadata_sha256}":
                problems.append(f"simple/{project}/index.html: wrong metadata hash for {name}")
        problems += [f"simple/{project}/index.html: links {n}, which {MANIFEST} does not list" for n in seen]
    return problems


def repair(wheelhouse: Path) -> list[str]:
    """Remove what interrupted publishes left and rewrite the index from the manifest; what was removed."""
    if not (wheelhouse / MANIFEST).is_file():
        raise WheelhouseError(f"{wheelhouse} has no {MANIFEST}", "pass --wheelhouse with a published wheelhouse")
    with FileLock(str(wheelhouse / LOCK)):
        manifest = load_manifest(wheelhouse)
        removed = _clean(wheelhouse, manifest, _say)
        write_index(wheelhouse, manifest)
    return removed


def prune(wheelhouse: Path, recipe_names: Iterable[str], keep: Iterable[str], dry_run: bool = False) -> list[str]:
    """Remove wheels built from no current recipe and pinned by no lock; returns their names.

    Only names from the validated manifest are ever joined to the wheelhouse path.
    """
    recipes, pinned = set(recipe_names), set(keep)
    if not (wheelhouse / MANIFEST).is_file():
        raise WheelhouseError(f"{wheelhouse} has no {MANIFEST}", "pass --wheelhouse with a published wheelhouse")
    with FileLock(str(wheelhouse / LOCK)):
        manifest = load_manifest(wheelhouse)
        doomed = [n for n, e in sorted(manifest.wheels.items()) if e.recipe not in recipes and n not in pinned]
        if dry_run or not doomed:
            return doomed
        kept = {n: e for n, e in manifest.wheels.items() if n not in doomed}
        manifest = replace(manifest, wheels=kept)
        # Index and manifest first, files after: a wheel is never linked while it is missing.
        write_index(wheelhouse, manifest)
        _write_manifest(wheelhouse, manifest)
        for name in doomed:
            for path in (wheelhouse / name, *_companions(wheelhouse, name)):
                path.unlink(missing_ok=True)
    return doomed
