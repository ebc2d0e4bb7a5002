"""The PEP 503 index: two small pure renderers and the writer that regenerates simple/ from the manifest.

Written here rather than by a dependency because the node installer reads it with the standard
library alone; pip parses it in the integration tests.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import quote

from builder.files import is_temp_name, write_atomic
from builder.node import (
    WheelhouseManifest,
)
from builder.wheelhouse.page import write_page


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


def write_index(wheelhouse: Path, manifest: WheelhouseManifest) -> None:
    """Rewrite simple/ from the files the manifest lists (removing pages of projects it no longer
    has), and the page people read (index.html), which shows the same manifest."""
    write_page(wheelhouse, manifest)
    simple = wheelhouse / "simple"
    projects = manifest.projects()
    for project, names in projects.items():
        entries = [
            IndexEntry(n, manifest.file_sha256(n), manifest.wheels[n].metadata_sha256 if n in manifest.wheels else None)
            for n in names
        ]
        write_atomic(simple / project / "index.html", project_page(project, entries))
    write_atomic(simple / "index.html", root_page(projects))
    for stale in simple.iterdir():  # projects whose last file was pruned, or a killed publish's page
        if stale.is_dir() and not stale.is_symlink() and stale.name not in projects:
            inside = list(stale.iterdir())
            # Only what this toolkit writes there: the page, a page half-written by a killed publish
            # (its temporary name), or nothing yet (killed between the folder and the page).
            if all(p.is_file() and (p.name == "index.html" or is_temp_name(p.name)) for p in inside):
                for p in inside:
                    p.unlink()
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
