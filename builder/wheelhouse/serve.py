"""serve: the wheelhouse over HTTP, with the standard library's static file server.

The wheelhouse is already a static PEP 503 tree (index pages, wheels, PEP 658 .metadata files),
so a static server is all pip needs, and unlike pypiserver it has no fallback to PyPI to turn
off: nodes can only ever get what was published. Standard library only, like `install`.
"""

from __future__ import annotations

import errno
import functools
import http.server
from pathlib import Path

from builder import output
from builder.errors import BuilderError, ToolError


def serve(wheelhouse: Path, bind: str, port: int) -> None:
    if not (wheelhouse / "simple" / "index.html").is_file():
        raise BuilderError(f"{wheelhouse} has no simple/index.html", "publish a wheel into it first")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(wheelhouse))
    try:
        server = http.server.ThreadingHTTPServer((bind, port), handler)
    except OSError as exc:
        raise ToolError(
            f"cannot listen on {bind}:{port}: {exc.strerror}",
            "pass --port with a free port (or stop what is using this one)"
            if exc.errno == errno.EADDRINUSE
            else "pass --bind with an address of this machine",
        ) from exc
    with server:
        host, real_port = str(server.server_address[0]), int(server.server_address[1])
        output.step(f"serving {wheelhouse.resolve()} at http://{host}:{real_port}/")
        output.note(f"  pip install --index-url http://{host}:{real_port}/simple/ deepspeed==<version>")
        output.note(f"  python -m builder install --wheelhouse http://{host}:{real_port}/")
        server.serve_forever()
