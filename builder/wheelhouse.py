"""publish: smoke-tested wheels into a wheelhouse that pip installs from.

Layout:
    wheelhouse/<wheel files>
    wheelhouse/simple/index.html              PEP 503 root page
    wheelhouse/simple/<project>/index.html    links to ../../<wheel>#sha256=<digest>
    wheelhouse/manifest.json                  what each wheel was built for and what it passed
The index is rendered by two small pure functions (tested, and parsed by pip in the tests) rather
than a dependency, because node-side installs must work with the standard library alone.
Every file is written to a temporary name and renamed into place.
"""

from __future__ import annotations

import datetime
import html
import json
import re
import shutil
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from packaging.utils import parse_wheel_filename

from builder.errors import PublishError
from builder.smoke import SmokeReport, report_path
from builder.source import sha256_of
from builder.wheelfile import read_manifest

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class IndexEntry:
    filename: str
    sha256: str


def normalize(name: str) -> str:
    """PEP 503 project name normalisation."""
    return re.sub(r"[-_.]+", "-", name).lower()


def project_page(project: str, entries: Iterable[IndexEntry]) -> str:
    """The PEP 503 page of one project; wheels sit two folders up, beside simple/."""
    links = "\n".join(
        f'    <a href="../../{quote(e.filename)}#sha256={e.sha256}">{html.escape(e.filename)}</a><br/>'
        for e in sorted(entries, key=lambda e: e.filename)
    )
    return (
        '<!DOCTYPE html>\n<html>\n  <head>\n    <meta name="pypi:repository-version" content="1.0">\n'
        f"    <title>Links for {html.escape(project)}</title>\n  </head>\n  <body>\n"
        f"    <h1>Links for {html.escape(project)}</h1>\n{links}\n  </body>\n</html>\n"
    )


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
    """Copy each smoke-passed wheel into the wheelhouse, then rewrite the index and manifest."""
    wheels = list(wheels)
    checked = [(w, passing_report(w)) for w in wheels]  # refuse before writing anything
    wheelhouse.mkdir(parents=True, exist_ok=True)
    manifest = load_manifest(wheelhouse)
    published = []
    for wheel, report in checked:
        target = wheelhouse / wheel.name
        if target.exists():
            if sha256_of(target) != report.sha256:
                raise PublishError(
                    f"the wheelhouse already has a different {wheel.name}",
                    "a published file name is never reused: bump the build string or remove the old wheel with prune",
                )
            print(f"  {wheel.name} is already published (same sha256)", file=sys.stderr)
        else:
            tmp = wheelhouse / f".{wheel.name}.tmp"
            shutil.copyfile(wheel, tmp)
            tmp.replace(target)
            print(f"  published {target}", file=sys.stderr)
        entry = manifest_entry(read_manifest(wheel), report)
        entry["published_at"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        manifest["wheels"][wheel.name] = entry
        published.append(target)
    write_index(wheelhouse, manifest)
    _write(wheelhouse / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return published


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
        by_project.setdefault(project, []).append(IndexEntry(filename, entry["sha256"]))
    simple = wheelhouse / "simple"
    for project, entries in by_project.items():
        _write(simple / project / "index.html", project_page(project, entries))
    _write(simple / "index.html", root_page(by_project))


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
