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
import socket
import stat
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

from builder import output
from builder.errors import BuilderError, ToolError
from builder.node import printable


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
    server: Any  # the WheelhouseServer that holds the head deadline

    def handle_one_request(self) -> None:
        """Each request's head (its line and headers) within the server's head deadline, however
        slowly it arrives: the timeout above is per silent period, and 800 clients dripping a byte
        every 25 s held 800 threads for as long as they liked."""
        deadline = self.server if isinstance(self.server, WheelhouseServer) else None  # another server: none
        if deadline is not None:
            deadline.watch(self.connection)
        try:
            super().handle_one_request()
        finally:
            if deadline is not None:
                deadline.unwatch(self.connection)

    def parse_request(self) -> bool:
        done = super().parse_request()
        if isinstance(self.server, WheelhouseServer):
            self.server.unwatch(self.connection)  # the head is in: the transfer is the timeout's alone
        return done

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
    head_deadline = 60.0  # seconds from a request's first byte awaited to its last header

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._heads: dict[Any, float] = {}
        self._heads_lock = threading.Lock()
        self._closed = threading.Event()
        super().__init__(*args, **kwargs)  # binds: a busy port raises here, and closes what it made
        threading.Thread(target=self._reap, daemon=True, name="serve-head-deadline").start()

    def server_close(self) -> None:
        self._closed.set()
        super().server_close()

    def watch(self, sock: Any) -> None:
        with self._heads_lock:
            self._heads[sock] = time.monotonic() + self.head_deadline

    def unwatch(self, sock: Any) -> None:
        with self._heads_lock:
            self._heads.pop(sock, None)

    def _reap(self) -> None:
        """Once a second: shut the connections whose request head is past its deadline (their handler's
        read then ends and its thread with it)."""
        while not self._closed.wait(min(1.0, self.head_deadline / 4)):
            now = time.monotonic()
            with self._heads_lock:
                late = [sock for sock, deadline in self._heads.items() if deadline < now]
                for sock in late:
                    del self._heads[sock]
            for sock in late:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                output.note(f"serve: closed a connection whose request head took over {self.head_deadline:g} s")

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
        raise BuilderError(f"{printable(str(wheelhouse))} has no simple/index.html", "publish a wheel into it first")
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
        output.step(f"serving {printable(str(wheelhouse.resolve()))} at http://{host}:{real_port}/ (regular files "
                    "inside it only)")  # fmt: skip
        output.note(f"  pip install --index-url http://{host}:{real_port}/simple/ deepspeed==<version>")
        output.note(
            f"  python -m builder install --wheelhouse http://{host}:{real_port}/ "
            '--trust "$(python -m builder key show)"  (the checked path: the signature, then every file)'
        )
        server.serve_forever()
