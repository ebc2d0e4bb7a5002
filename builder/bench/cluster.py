"""bench --cluster: installs at once on the namespace cluster, against nginx and against `serve`."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from builder.bench.common import _report
from builder.errors import ToolError


def bench_cluster(folder: Path, out: Path, installs: int = 64, dry_runs: int | None = None) -> dict[str, Any]:
    """`installs` nodes' worth of installs at once from a test cluster's nodes (tests/cluster.py:
    FOLDER/cluster.json, its ssh config, the wheelhouse in its shared folder), against nginx on
    its web node and against `serve` on this host, one after the other in the same run: the node
    installer's dry run (`dry_runs` of them, default `installs`), then the downloads alone."""
    import socket
    import subprocess

    from builder import signing
    from builder.wheelhouse import fanout
    from builder.wheelhouse.layout import load_manifest

    state, nodes = _cluster_state(folder)
    house = folder / "shared" / "wheelhouse"
    load_manifest(house)  # its signature and form checked before anything is asked of it
    manifest = json.loads((house / "manifest.json").read_text(encoding="utf-8"))
    key = signing.keys().key().line()
    out.mkdir(parents=True, exist_ok=True)
    log = out / "bench-cluster.log"
    ssh = folder / "ssh" / "config"
    with socket.socket() as s:
        s.bind((state["host_addr"], 0))
        port = int(s.getsockname()[1])
    server = subprocess.Popen(
        [sys.executable, "-m", "builder", "serve", "--wheelhouse", str(house), "--bind", state["host_addr"],
         "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=log.open("a"),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while socket.socket().connect_ex((state["host_addr"], port)) != 0:
            if time.monotonic() > deadline or server.poll() is not None:
                raise ToolError(f"serve did not start on {state['host_addr']}:{port}", f"read {log}")
            time.sleep(0.2)
        urls = {"nginx": f"http://{state['web']}/wheelhouse", "serve": f"http://{state['host_addr']}:{port}"}
        runs = installs if dry_runs is None else dry_runs
        nginx = fanout.run(ssh, nodes, urls["nginx"], runs, key, manifest, log)
        served = fanout.run(ssh, nodes, urls["serve"], runs, key, manifest, log)
        # The same files without the installer's Python and torch start-up: the servers alone.
        files = nginx.files or served.files
        nginx_dl = fanout.run(ssh, nodes, urls["nginx"], installs, key, manifest, log, files)
        served_dl = fanout.run(ssh, nodes, urls["serve"], installs, key, manifest, log, files)
    finally:
        server.terminate()
        server.wait(timeout=30)
    result = {"installs": installs, "nodes": [n for n, _ in nodes], "nginx": nginx.to_json(),
              "serve": served.to_json(), "nginx_downloads": nginx_dl.to_json(), "serve_downloads": served_dl.to_json(),
              "ratios": {"serve_vs_nginx": served.seconds / max(nginx.seconds, 1e-9),
                         "serve_vs_nginx_downloads": served_dl.seconds / max(nginx_dl.seconds, 1e-9)}}  # fmt: skip
    return _report(out / "bench-cluster", result, render_cluster(result))


def _cluster_state(folder: Path) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """The test cluster's cluster.json, checked: its build-host address, web node and the nodes
    with torch (name, python) that installs run from (names go to ssh, the address to a bind)."""
    import ipaddress
    import re

    from builder.node import Fields, ManifestError

    where = folder / "cluster.json"
    try:
        f = Fields(json.loads(where.read_text(encoding="utf-8")), str(where))
        name, python = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$"), re.compile(r"^/[A-Za-z0-9._/+-]{1,200}$")
        addr = f.text("host_addr")
        ipaddress.ip_address(addr)
        state = {"host_addr": addr, "web": f.text("web", name)}
        nodes = []
        for node, entry in Fields(f.get("nodes", dict), f"{where}: nodes").data.items():
            n = Fields(entry, f"{where}: nodes.{node}")
            if not name.match(str(node)):
                raise n.fail("name", f"is not a node name: {str(node)[:40]!r}")
            if n.get("torch", bool, optional=True):
                nodes.append((str(node), n.text("python", python)))
    except (OSError, ValueError, ManifestError) as exc:
        raise ToolError(f"{where} is not a test cluster's state: {exc}",
                        "bring one up with `python tests/cluster.py up FOLDER`, pass that FOLDER") from exc  # fmt: skip
    if not nodes:
        raise ToolError(f"{where} lists no node with torch to install from", "use the cluster tests/cluster.py makes")
    return state, nodes


def render_cluster(result: dict[str, Any]) -> str:
    nodes = result["nodes"]
    files = result["nginx_downloads"]["files"]
    rows = [f"At once from {len(nodes)} nodes ({', '.join(nodes)}), against nginx (Debian's, the wheelhouse as a "
            "static folder) and `python -m builder serve`, in the same run:", "",
            "| what each does | server | all done in | one (median) | sha256 right | ratio |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    install = "the node installer's dry run (signature, manifest, wheel and dependencies fetched and checked)"
    download = f"download the {len(files)} files an install fetches and check each sha256"
    for key, what, ratio in (("", install, "serve_vs_nginx"), ("_downloads", download, "serve_vs_nginx_downloads")):
        for server in ("nginx", "serve"):
            r = result[server + key]
            mb = f", {r['megabytes']:.0f} MB" if r.get("megabytes") else ""
            tail = f"serve {result['ratios'][ratio]:.2f}x nginx" if server == "serve" else ""
            rows.append(f"| {what} | {server} | {r['seconds']:.1f} s{mb} | {r['median_install_s']:.1f} s | "
                        f"{r['ok']}/{r['installs']} | {tail} |")  # fmt: skip
    return "\n".join([*rows, ""])
