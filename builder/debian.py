"""Debian's tools as the toolkit runs them: the mirror the host's apt uses, and debootstrap's progress.

Low in the house: the build root (buildroot) and the image base (images) both make Debian trees.
"""

from __future__ import annotations

import re
from pathlib import Path

DEFAULT_MIRROR = "http://deb.debian.org/debian"


def host_mirror(sources: Path = Path("/etc/apt"), suite: str = "bookworm") -> str:
    """The Debian mirror the host's apt uses (deb822 .sources or sources.list), else deb.debian.org."""
    candidates = [*sorted(sources.glob("sources.list.d/*.sources")), sources / "sources.list"]
    candidates += sorted(sources.glob("sources.list.d/*.list"))
    for path in candidates:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for stanza in re.split(r"\n\s*\n", text):
            uris = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
            if uris and re.search(rf"^Suites:.*\b{suite}\b", stanza, re.M) and "security" not in uris[1]:
                return uris[1]
        for line in text.splitlines():
            m = re.match(rf"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+{suite}\s", line.strip())
            if m and "security" not in m[1]:
                return m[1]
    return DEFAULT_MIRROR


def debootstrap_stage(line: str) -> str | None:
    """debootstrap's stages (not its one line per package retrieved, validated or unpacked)."""
    per_package = ("I: Retrieving ", "I: Validating ", "I: Extracting ", "I: Unpacking ", "I: Configuring ")
    return line[3:] if line.startswith("I: ") and not line.startswith(per_package) else None
