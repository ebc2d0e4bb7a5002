"""serve: the wheelhouse over HTTP, with the standard library's HTTP server, handing out nothing else.

The wheelhouse is already a static PEP 503 tree (index pages, wheels, PEP 658 .metadata files),
so a static server is all pip needs, and unlike pypiserver it has no fallback to PyPI to turn
off: nodes can only ever get what was published. Standard library only, like `install`.

Anyone who can write to a shared wheelhouse could plant a symlink (`x.whl -> /etc/shadow`,
`simple/rootfs -> /`), and the stock handler follows links and lists folders. This one serves a
file only when the file it really opened is a regular file inside the wheelhouse (checked on the
open descriptor, so a link swapped in after the check is caught too), lists no folder (a folder
gets its index.html or nothing), hands out no hidden file (the publish lock and journal), and logs
each refusal with the reason.
"""

from __future__ import annotations

import errno
import http.server
import os
import stat
import sys
import urllib.parse
from pathlib import Path
from typing import Any

from builder import output
from builder.errors import BuilderError, ToolError


def resolve_request(root: Path, url_path: str) -> tuple[Path | None, str]:
    """The file a request names inside `root` (lexically, no link followed yet), or None and why (pure)."""
    path = urllib.parse.unquote(urllib.parse.urlsplit(url_path).path)
    parts = [p for p in path.split("/") if p]
    if any(p in (".", "..") or p.startswith(".") or "\\" in p or "\0" in p for p in parts):
        return None, "a hidden file or a path that climbs out of the wheelhouse"
    if not parts or path.endswith("/"):
        parts.append("index.html")  # a folder is served as its index page, never as a listing
    return root.joinpath(*parts), ""


def open_inside(root: Path, candidate: Path) -> tuple[int | None, str]:
    """An open descriptor of `candidate` when what was opened is a regular file under `root`."""
    try:
        fd = os.open(candidate, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        return None, f"cannot open it ({exc.strerror})"
    try:
        real = Path(os.readlink(f"/proc/self/fd/{fd}")) if os.path.exists("/proc/self/fd") else candidate.resolve()
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PermissionError("not a regular file (folders are not listed)")
        if real != root and root not in real.parents:
            raise PermissionError(f"a link to {real}, outside the wheelhouse")
    except OSError as exc:
        os.close(fd)
        return None, str(exc.args[0] if isinstance(exc, PermissionError) else exc.strerror)
    return fd, ""


class WheelhouseHandler(http.server.SimpleHTTPRequestHandler):
    """GET/HEAD of regular files inside the wheelhouse; 404 with the reason logged for the rest."""

    root: Path  # resolved wheelhouse folder, set by `handler_for`
    timeout = 30  # seconds a client may stay silent (idle, or a request sent a byte at a time): its thread ends

    def send_head(self) -> Any:
        candidate, why = resolve_request(self.root, self.path)
        fd = None
        if candidate is not None:
            fd, why = open_inside(self.root, candidate)
        if fd is None:
            output.warn(f"serve: refused {self.path[:200]!r}: {why}")
            self.send_error(404, "Not found in the wheelhouse")
            return None
        f = os.fdopen(fd, "rb")
        size = os.fstat(fd).st_size
        self.send_response(200)
        self.send_header("Content-type", self.guess_type(str(candidate)))
        self.send_header("Content-Length", str(size))
        self.end_headers()
        return f

    def list_directory(self, path: Any) -> None:  # never reached through send_head; refused all the same
        self.send_error(404, "Folders are not listed")

    def log_message(self, format: str, *args: Any) -> None:
        output.note(f"serve: {self.address_string()} {format % args}")


class WheelhouseServer(http.server.ThreadingHTTPServer):
    """One thread a client; a client that goes away mid-download (a node killed, pip interrupted) is
    one line in the log, not a traceback. A backlog for hundreds of nodes connecting at once, and a
    client that stays silent past the handler's timeout loses its thread."""

    daemon_threads = True
    request_queue_size = 1024  # the listen backlog (socketserver's default is 5): a cluster's nodes at once

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, (BrokenPipeError, ConnectionResetError, TimeoutError)):
            output.note(f"serve: {client_address[0]} went away mid-transfer ({type(exc).__name__})")
            return
        super().handle_error(request, client_address)


def handler_for(wheelhouse: Path) -> type[WheelhouseHandler]:
    return type("Handler", (WheelhouseHandler,), {"root": wheelhouse.resolve()})


def serve(wheelhouse: Path, bind: str, port: int) -> None:
    if not (wheelhouse / "simple" / "index.html").is_file():
        raise BuilderError(f"{wheelhouse} has no simple/index.html", "publish a wheel into it first")
    try:
        server = WheelhouseServer((bind, port), handler_for(wheelhouse))
    except (OSError, OverflowError) as exc:
        raise ToolError(
            f"cannot listen on {bind}:{port}: {getattr(exc, 'strerror', None) or exc}",
            "pass --port with a free port (or stop what is using this one)"
            if getattr(exc, "errno", None) == errno.EADDRINUSE
            else "pass --bind with an address of this machine",
        ) from exc
    with server:
        host, real_port = str(server.server_address[0]), int(server.server_address[1])
        output.step(f"serving {wheelhouse.resolve()} at http://{host}:{real_port}/ (regular files inside it only)")
        output.note(f"  pip install --index-url http://{host}:{real_port}/simple/ deepspeed==<version>")
        output.note(
            f"  python -m builder install --wheelhouse http://{host}:{real_port}/ "
            '--trust "$(python -m builder key show)"  (the checked path: the signature, then every file)'
        )
        server.serve_forever()
