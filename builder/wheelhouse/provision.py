"""provision: install the right wheel on many hosts, driven by pdsh (as DeepSpeed's own launcher does).

Each host gets a generated install script; the script fetches the node installer the wheelhouse
publishes (`tools/ds-node-install.py`, builder/node.py byte for byte, standard library only),
runs it only if its sha256 is the one manifest.json records, so hosts need nothing but Python
and pip, and a tampered installer is never executed. `plan_*` functions are pure; `write` and `run` act.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from builder import cmd
from builder.build.source import sha256_of
from builder.errors import BuilderError, WheelhouseError
from builder.files import write_atomic
from builder.node import INSTALLER

_HOST_LINE = re.compile(r"^\s*([A-Za-z0-9._-]+)((?:\s+\w+=\S+)*)\s*$")


@dataclass(frozen=True)
class Host:
    name: str
    slots: int | None = None
    python: str = "python3"  # our extension of DeepSpeed's hostfile: python=/path/to/python


def parse_hostfile(text: str, where: str = "hostfile") -> list[Host]:
    """DeepSpeed's hostfile format: `name slots=N`, one host a line, '#' comments."""
    hosts: list[Host] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _HOST_LINE.match(line)
        if not m:
            raise BuilderError(f"{where}:{number}: cannot read {raw.strip()!r}", "write `hostname slots=8`")
        options = dict(opt.split("=", 1) for opt in m.group(2).split())
        unknown = set(options) - {"slots", "python"}
        if unknown:
            raise BuilderError(
                f"{where}:{number}: unknown option {', '.join(sorted(unknown))}", "use slots= or python="
            )
        slots = int(options["slots"]) if "slots" in options else None
        hosts.append(Host(m.group(1), slots, options.get("python", "python3")))
    if not hosts:
        raise BuilderError(f"{where} lists no hosts", "one host a line: `node1 slots=8`")
    if len({h.name for h in hosts}) != len(hosts):
        raise BuilderError(f"{where} lists a host twice", "list each host once")
    return hosts


# Run by each host's Python: fetch the installer, and keep it only if it has the published sha256.
_FETCH = (
    "import hashlib, sys, urllib.request\n"
    "src, dst, want = sys.argv[1:]\n"
    "if src.startswith(('http://', 'https://')):\n"
    "    data = urllib.request.urlopen(src, timeout=120).read()\n"
    "else:\n"
    "    data = open(src, 'rb').read()\n"
    "if hashlib.sha256(data).hexdigest() != want:\n"
    "    sys.exit(f'error: {src} is not the installer the wheelhouse published (sha256 differs); "
    "run python -m builder verify on the wheelhouse')\n"
    "open(dst, 'wb').write(data)\n"
)


def host_script(host: Host, wheelhouse: str, installer_sha256: str) -> str:
    """The install script for one host: fetch the installer, check its sha256, run it."""
    source = wheelhouse.rstrip("/") + "/" + INSTALLER
    return (
        "#!/bin/sh\n"
        f"# ds-wheel-builder: install the DeepSpeed wheel built for {host.name} from {wheelhouse}\n"
        "set -eu\n"
        f"PY={shlex.quote(host.python)}\n"
        'tmp="$(mktemp -d)"\n'
        "trap 'rm -rf \"$tmp\"' EXIT\n"
        f'"$PY" -c {shlex.quote(_FETCH)} {shlex.quote(source)} "$tmp/install.py" {installer_sha256}\n'
        f'"$PY" "$tmp/install.py" --wheelhouse {shlex.quote(wheelhouse)}\n'
    )


def installer_sha256(wheelhouse_dir: Path) -> str:
    """The sha256 of the installer the wheelhouse publishes, after checking the file against it."""
    from builder.wheelhouse.layout import load_manifest

    manifest = load_manifest(wheelhouse_dir)
    entry = manifest.tools.get(INSTALLER)
    if entry is None:
        raise WheelhouseError(
            f"{wheelhouse_dir} publishes no node installer ({INSTALLER})", "publish a wheel into it (build-wheel)"
        )
    if sha256_of(wheelhouse_dir / INSTALLER) != entry.sha256:
        raise WheelhouseError(
            f"{wheelhouse_dir / INSTALLER} differs from the sha256 in manifest.json: it was changed",
            "run python -m builder verify; re-publish a wheel to restore the installer",
        )
    return entry.sha256


def write(hosts: list[Host], wheelhouse: str, out: Path, digest: str) -> list[Path]:
    """Write provision/<host>.sh for every host (mode 0755)."""
    return [write_atomic(out / f"{h.name}.sh", host_script(h, wheelhouse, digest), mode=0o755) for h in hosts]


def pdsh_command(hosts: list[Host], out: Path, launcher: str) -> list[str]:
    """pdsh over all hosts at once. 'ssh': each script is piped to `sh -s` on its host;
    'local': run each host's script in a local shell (for tests and single-node setups)."""
    names = ",".join(h.name for h in hosts)
    script = shlex.quote(str(out.resolve())) + "/%h.sh"
    remote = f"ssh -o BatchMode=yes %h sh -s < {script}" if launcher == "ssh" else f"sh {script}"
    return ["pdsh", "-S", "-R", "exec", "-f", str(min(len(hosts), 64)), "-w", names, "sh", "-c", remote]


def run(hosts: list[Host], out: Path, launcher: str, log: Path) -> str:
    return cmd.run(
        pdsh_command(hosts, out, launcher),
        log=log,
        fix="install pdsh (apt-get install pdsh) and make sure every host is reachable",
    )
