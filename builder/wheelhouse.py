"""publish: smoke-tested wheels into a wheelhouse that pip installs from.

Layout:
    wheelhouse/<wheel files>
    wheelhouse/simple/index.html              PEP 503 root page
    wheelhouse/simple/<project>/index.html    links to ../../<wheel>#sha256=<digest>
    wheelhouse/manifest.json                  what each wheel was built for and what it passed
The index is rendered by two small pure functions (tested, and parsed by pip in the tests) rather
than a dependency, because node-side installs must work with the standard library alone.
Every file is written to a temporary name and renamed into place, under a file lock
(filelock, a maintained cross-platform lock) held for the whole publish.
"""

from __future__ import annotations

import datetime
import hashlib
import html
import json
import os
import re
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from filelock import FileLock
from packaging.utils import parse_wheel_filename

from builder.errors import PublishError
from builder.smoke import SmokeReport, report_path
from builder.source import sha256_of
from builder.wheelfile import read_manifest

MANIFEST = "manifest.json"
LOCK = ".publish.lock"


@dataclass(frozen=True)
class IndexEntry:
    filename: str
    sha256: str
    metadata_sha256: str | None = None  # PEP 658: <wheel>.metadata served beside the wheel


def normalize(name: str) -> str:
    """PEP 503 project name normalisation."""
    return re.sub(r"[-_.]+", "-", name).lower()


def project_page(project: str, entries: Iterable[IndexEntry]) -> str:
    """The PEP 503 page of one project; wheels sit two folders up, beside simple/."""
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


def manifest_entry(build: Mapping[str, Any], report: SmokeReport) -> dict[str, Any]:
    """What the wheelhouse manifest says of one wheel, from its build manifest and smoke report."""
    return {
        "sha256": report.sha256,
        "version": build["version"],
        "recipe": build["recipe"]["name"],
        "accelerator": build["accelerator"],
        "python_tag": build["python_tag"],
        "torch": build["torch"]["version"],
        "cuda": build["torch"]["cuda"],
        "archs": build["archs"],
        "cpu_target": build.get("cpu_target", "native"),
        "ops": build["ops"],
        "smoke": {
            "passed": report.passed,
            "finished_at": report.finished_at,
            "checks": {
                c.name: {"status": c.status, "detail": c.detail.splitlines()[0] if c.detail else ""}
                for c in report.checks
            },
        },
    }


def passing_report(wheel: Path) -> SmokeReport:
    """The wheel's smoke report if it passed for exactly these bytes; otherwise PublishError."""
    path = report_path(wheel)
    if not path.is_file():
        raise PublishError(
            f"{wheel.name} has no smoke report", f"run smoke on it first: python -m builder smoke {wheel}"
        )
    report = SmokeReport.from_json(path.read_text(encoding="utf-8"))
    if not report.passed:
        raise PublishError(f"{wheel.name} failed its smoke tests", f"read {path}, fix the build and smoke it again")
    if report.sha256 != sha256_of(wheel):
        raise PublishError(f"{wheel.name} changed after it was smoke-tested (sha256 differs)", "smoke it again")
    return report


def publish(wheels: Iterable[Path], wheelhouse: Path) -> list[Path]:
    """Copy each smoke-passed wheel into the wheelhouse, then rewrite the index and manifest.

    Everything happens under the wheelhouse's file lock, so concurrent publishers each see the
    others' entries; each file is written under a unique temporary name and renamed into place,
    so a killed publish leaves the previous index and manifest whole.
    """
    checked = [(w, passing_report(w)) for w in wheels]  # refuse before writing anything
    wheelhouse.mkdir(parents=True, exist_ok=True)
    published = []
    with FileLock(str(wheelhouse / LOCK)):
        manifest = load_manifest(wheelhouse)
        for wheel, report in checked:
            target = wheelhouse / wheel.name
            if target.exists():
                if sha256_of(target) != report.sha256:
                    raise PublishError(
                        f"the wheelhouse already has a different {wheel.name}",
                        "a published file name is never reused: bump the build string, or prune the old wheel",
                    )
                print(f"  {wheel.name} is already published (same sha256)", file=sys.stderr)
            else:
                _copy_atomic(wheel, target)
                print(f"  published {target}", file=sys.stderr)
            metadata = wheel_metadata(target)
            _write_bytes(wheelhouse / f"{wheel.name}.metadata", metadata)
            entry = manifest_entry(read_manifest(target), report)
            entry["metadata_sha256"] = hashlib.sha256(metadata).hexdigest()
            previous = manifest["wheels"].get(wheel.name, {})
            entry["published_at"] = previous.get("published_at") or _now()
            manifest["wheels"][wheel.name] = entry
            published.append(target)
        write_index(wheelhouse, manifest)
        _write(wheelhouse / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return published


def wheel_metadata(wheel: Path) -> bytes:
    """The wheel's core metadata (its dist-info/METADATA), served as <wheel>.metadata (PEP 658)."""
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        return zf.read(name)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _copy_atomic(source: Path, target: Path) -> None:
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        shutil.copyfile(source, tmp)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_manifest(wheelhouse: Path) -> dict[str, Any]:
    path = wheelhouse / MANIFEST
    if not path.is_file():
        return {"schema": 1, "wheels": {}}
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def write_index(wheelhouse: Path, manifest: Mapping[str, Any]) -> None:
    """Rewrite simple/ from the wheels the manifest lists."""
    by_project: dict[str, list[IndexEntry]] = {}
    for filename, entry in manifest["wheels"].items():
        project = normalize(str(parse_wheel_filename(filename)[0]))
        by_project.setdefault(project, []).append(IndexEntry(filename, entry["sha256"], entry.get("metadata_sha256")))
    simple = wheelhouse / "simple"
    for project, entries in by_project.items():
        _write(simple / project / "index.html", project_page(project, entries))
    _write(simple / "index.html", root_page(by_project))
    for stale in simple.iterdir():  # projects whose last wheel was pruned
        if stale.is_dir() and stale.name not in by_project:
            shutil.rmtree(stale)


def _write(path: Path, text: str) -> None:
    _write_bytes(path, text.encode("utf-8"))


def _write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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


def verify(wheelhouse: Path) -> list[str]:
    """Everything wrong with a wheelhouse: tampered or missing wheels and metadata, index drift."""
    problems: list[str] = []
    try:
        manifest = load_manifest(wheelhouse)
    except (OSError, ValueError) as exc:
        return [f"{MANIFEST} cannot be read: {exc}"]
    listed = manifest.get("wheels", {})
    for name, entry in sorted(listed.items()):
        wheel = wheelhouse / name
        if not wheel.is_file():
            problems.append(f"{name}: listed in {MANIFEST} but missing")
            continue
        if sha256_of(wheel) != entry["sha256"]:
            problems.append(f"{name}: sha256 differs from {MANIFEST} (tampered or replaced)")
        meta = wheelhouse / f"{name}.metadata"
        if entry.get("metadata_sha256"):
            if not meta.is_file():
                problems.append(f"{name}.metadata: missing")
            elif hashlib.sha256(meta.read_bytes()).hexdigest() != entry["metadata_sha256"]:
                problems.append(f"{name}.metadata: sha256 differs from {MANIFEST}")
    for wheel in sorted(wheelhouse.glob("*.whl")):
        if wheel.name not in listed:
            problems.append(f"{wheel.name}: in the wheelhouse but not in {MANIFEST}")
    by_project: dict[str, dict[str, dict[str, Any]]] = {}
    for name, entry in listed.items():
        by_project.setdefault(normalize(str(parse_wheel_filename(name)[0])), {})[name] = entry
    simple = wheelhouse / "simple"
    root = simple / "index.html"
    root_links = {a.get("href") for a in parse_links(root.read_text())} if root.is_file() else set()
    for project, entries in sorted(by_project.items()):
        if f"{quote(project)}/" not in root_links:
            problems.append(f"simple/index.html does not list {project}")
        page = simple / project / "index.html"
        if not page.is_file():
            problems.append(f"simple/{project}/index.html: missing")
            continue
        seen = {}
        for a in parse_links(page.read_text()):
            href = a.get("href") or ""
            path, _, fragment = href.partition("#")
            seen[unquote(path.rsplit("/", 1)[-1])] = (fragment, a.get("data-dist-info-metadata"))
        for name, entry in sorted(entries.items()):
            if name not in seen:
                problems.append(f"simple/{project}/index.html: no link to {name}")
                continue
            fragment, meta_attr = seen.pop(name)
            if fragment != f"sha256={entry['sha256']}":
                problems.append(f"simple/{project}/index.html: wrong hash for {name}")
            if entry.get("metadata_sha256") and meta_attr != f"sha256={entry['metadata_sha256']}":
                problems.append(f"simple/{project}/index.html: wrong metadata hash for {name}")
        problems.extend(f"simple/{project}/index.html: links {name}, which {MANIFEST} does not list" for name in seen)
    return problems


def prune(wheelhouse: Path, recipe_names: Iterable[str], keep: Iterable[str], dry_run: bool = False) -> list[str]:
    """Remove wheels built from no current recipe and pinned by no lock; returns their names."""
    recipes, pinned = set(recipe_names), set(keep)
    with FileLock(str(wheelhouse / LOCK)):
        manifest = load_manifest(wheelhouse)
        doomed = [
            name for name, entry in sorted(manifest["wheels"].items())
            if entry["recipe"] not in recipes and name not in pinned
        ]  # fmt: skip
        if dry_run or not doomed:
            return doomed
        for name in doomed:
            del manifest["wheels"][name]
        # Index and manifest first, files after: a wheel is never linked while it is missing.
        write_index(wheelhouse, manifest)
        _write(wheelhouse / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        for name in doomed:
            (wheelhouse / name).unlink(missing_ok=True)
            (wheelhouse / f"{name}.metadata").unlink(missing_ok=True)
    return doomed
