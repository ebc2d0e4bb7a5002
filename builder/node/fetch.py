"""Getting a wheelhouse's files from a folder, file:// or http(s) URL: bounded, streamed to disk while
hashed, with a deadline for a download that stalls.
"""

import hashlib
import html.parser
import http.client
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.node.contract import LIMITS, InstallError, ManifestError
from builder.node.entries import WheelhouseManifest
from builder.node.fields import url_secret
from builder.node.files import NotAFile, open_regular, printable, too_big
from builder.node.trust import Signature

TIMEOUT_ENV = "DS_NODE_FETCH_TIMEOUT"  # seconds a download may stall before it fails (default 120)


def fetch_timeout() -> float:
    """How long a download from the wheelhouse may wait for data: a link that goes down fails the
    install cleanly after this long instead of hanging it."""
    text = os.environ.get(TIMEOUT_ENV, "") or "120"
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not 1 <= seconds <= 86400:  # nan and inf fail this too
        raise InstallError(f"{TIMEOUT_ENV}={printable(text)[:40]!r} is not a number of seconds from 1 to 86400",
                           "unset it (120 s), or set it to how long a download may wait for data")  # fmt: skip
    return seconds


def wheelhouse_base(source: str) -> str:
    """A wheelhouse given as a folder, a file:// URL or an http(s) URL, as a base to fetch from."""
    if any(not c.isprintable() or c.isspace() for c in source) and "://" in source:
        raise InstallError(f"--wheelhouse {printable(source)[:300]}: a URL with a space or a control character",
                           "percent-encode it (a space is %20), or give the folder's path")  # fmt: skip
    try:
        parsed = urllib.parse.urlparse(source)
    except ValueError as exc:
        raise InstallError(f"--wheelhouse {printable(source)[:300]}: not a URL ({exc})",
                           "give a folder, file:///path, or http(s)://host/path/") from exc  # fmt: skip
    if parsed.scheme in ("http", "https"):
        secret = url_secret(source)
        if secret:
            raise InstallError(f"--wheelhouse: the URL holds {secret}, which would be printed and logged, and no "
                               "wheelhouse file is named by it", "name the wheelhouse without it; give credentials "
                               "in ~/.netrc (a token: as the password for the host)")  # fmt: skip
        return source.rstrip("/") + "/"
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise InstallError(f"{source}: a file:// URL must name a local folder", "write file:///path/to/wheelhouse")
        return urllib.request.url2pathname(parsed.path)
    if parsed.scheme and len(parsed.scheme) > 1:
        raise InstallError(
            f"{source}: unsupported scheme {parsed.scheme}://", "use a folder, file://, http:// or https://"
        )
    return source


def fetch(base: str, name: str, what: str = "manifest") -> bytes:
    """A file of the wheelhouse at `base`, up to the limit for `what`; `name` must be one this
    module checked or a fixed name."""
    data = bytearray()
    with _opened(base, name) as (source, where):
        _copy(source, what, where, data.extend)
    return bytes(data)


MIN_RATE = 64 << 10  # bytes a second a download keeps on average once past its first timeout


def download(base: str, name: str, what: str, folder: str, size: "int | None" = None) -> "tuple[str, str]":
    """A file of the wheelhouse streamed to folder/name while it is hashed (never held in memory):
    (its path, its sha256). `name` must be one this module checked; `size`, where the signed
    manifest gives one, is the most that is read."""
    target = os.path.join(folder, name)
    with _opened(base, name) as (source, where), open(target, "wb") as out:
        return target, _copy(source, what, where, out.write, size)


def _copy(source: "Any", what: str, where: str, write: "Any", expected: "int | None" = None) -> str:
    """Everything `source` gives, handed to `write` as it comes; its sha256. Past the `expected`
    size (the signed manifest's) or else the limit for `what`, or slower on average than MIN_RATE
    once past the first timeout (a server dripping a byte at a time, which no per-read timeout
    catches), it fails; each read waits at most the timeout."""
    digest, size = hashlib.sha256(), 0
    timeout, start = fetch_timeout(), time.monotonic()
    read = getattr(source, "read1", source.read)  # returns what one read brought: a drip cannot stall it
    try:
        while True:
            chunk = read(1 << 20)
            if not chunk:
                if expected is not None and size < expected:  # a dropped connection, not a forgery
                    said = f"{where}: the download stopped after {size} of its {expected} bytes"
                    raise InstallError(
                        f"{said} (the connection or the server ended it early)",
                        "check the network and the wheelhouse's server, then run the install again",
                    )
                return digest.hexdigest()
            size += len(chunk)
            if expected is not None and size > expected:
                raise ManifestError(f"{where} is longer than the {expected} bytes the signed manifest gives it "
                                    "(stopped reading there)", "the wheelhouse copy or its server is damaged or "
                                    "hostile: run `python -m builder verify` on the wheelhouse")  # fmt: skip
            if size > LIMITS[what]:
                raise too_big(what, where)
            elapsed = time.monotonic() - start
            if elapsed > timeout + size / MIN_RATE:
                raise InstallError(f"{where}: {size} bytes in {elapsed:.0f} s, less than {MIN_RATE >> 10} KiB/s on "
                                   "average: the download would not finish", "check the network and the wheelhouse's "
                                   "server, then run the install again (nothing was installed)")  # fmt: skip
            digest.update(chunk)
            write(chunk)
    except InstallError:
        raise
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise _unreadable(where, exc) from exc


class _HttpOnly(urllib.request.HTTPRedirectHandler):
    """Redirects followed within http and https only: urllib follows one to ftp:// or file:// by default,
    and a wheelhouse served over HTTP never sends a node to read a local file or an FTP server."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
        scheme = urllib.parse.urlsplit(newurl).scheme.lower()
        if scheme not in ("http", "https"):
            said = f"{req.full_url}: the server redirects to {printable(newurl)[:200]}, not an http(s) URL"
            raise InstallError(said, "serve the wheelhouse over http or https only (check the server or proxy)")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_OPENER = urllib.request.build_opener(_HttpOnly)


class _opened:
    """A wheelhouse file open for reading, and where it is (for messages): an HTTP response, or a
    local file that must be a regular file. Every way of failing to open is one InstallError."""

    def __init__(self, base: str, name: str) -> None:
        self.base, self.name = base, name
        self.source: Any = None

    def __enter__(self) -> "tuple[Any, str]":
        if self.base.startswith(("http://", "https://")):
            where = self.base + "/".join(urllib.parse.quote(part) for part in self.name.split("/"))
            try:
                self.source = _OPENER.open(where, timeout=fetch_timeout())
            except urllib.error.HTTPError as exc:
                exc.close()
                raise InstallError(f"{where}: HTTP {exc.code} {exc.reason}",
                                   "run `verify` on the served wheelhouse") from exc  # fmt: skip
            except (OSError, http.client.HTTPException, ValueError) as exc:
                raise _unreadable(where, exc) from exc
            return self.source, where
        where = str(Path(self.base) / self.name)
        try:
            self.source = open_regular(where)
        except NotAFile as exc:
            raise ManifestError(
                f"{exc}: the wheelhouse was damaged or tampered with",
                "run `python -m builder verify` on it; restore or re-publish it",
            ) from exc
        except OSError as exc:
            raise InstallError(f"cannot read {where}: {exc.strerror or exc}",
                               "check the wheelhouse path; run `verify` on it") from exc  # fmt: skip
        return self.source, where

    def __exit__(self, *exc: object) -> None:
        if self.source is not None:
            self.source.close()


def _unreadable(where: str, exc: BaseException) -> InstallError:
    """A server or link that failed mid-way (refused, timed out, a malformed reply): one message."""
    reason = getattr(exc, "reason", None) or exc
    text = printable(" ".join(str(reason).split()))[:200] or type(exc).__name__
    return InstallError(f"cannot fetch {printable(where)[:300]}: {text}",
                        "check the wheelhouse URL, its server and the network, then run the install again (nothing "
                        "was installed)")  # fmt: skip


class _RootLinks(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: "list[tuple[str, str | None]]") -> None:
        if tag == "a":
            self.hrefs.append(dict(attrs).get("href") or "")


def unlisted_projects(root_page: str, manifest: "WheelhouseManifest") -> "list[str]":
    """Projects the index's root page links that the manifest does not list (an injected project)."""
    parser = _RootLinks()
    parser.feed(root_page)
    known = {f"{urllib.parse.quote(p)}/" for p in manifest.projects()}
    return sorted(h for h in parser.hrefs if h not in known)


@dataclass(frozen=True)
class Verified:
    """What the signature check found: who signed which manifest (None fields: not checked)."""

    manifest: "WheelhouseManifest"
    digest: str  # sha256 of manifest.json's bytes
    signature: "Signature | None" = None
