"""Run by a provision script on each node, before anything else: fetch files of the wheelhouse.

`manifest WH DIR` fetches manifest.json and manifest.json.sig into DIR (the script verifies the
signature with ssh-keygen next); `installer WH DIR` fetches tools/ds-node-install.py into
DIR/install.py only if it has the sha256 DIR/manifest.json (verified by then) lists. Standard
library only, and Python 3.6 syntax: it runs under the node's own python3. Exit 8: the wheelhouse
failed a check; 9: it could not be read.
"""

import hashlib
import json
import os
import sys
import urllib.request
from typing import NoReturn

# The node installer's own setting (builder/node/fetch.py TIMEOUT_ENV): how long a download may stall.
try:
    TIMEOUT = max(1.0, float(os.environ.get("DS_NODE_FETCH_TIMEOUT", "120")))
except ValueError:
    TIMEOUT = 120.0
LIMITS = {"manifest.json": 32 << 20, "manifest.json.sig": 64 << 10, "tools/ds-node-install.py": 8 << 20}


def fail(code: int, message: str) -> NoReturn:
    sys.stderr.write("error: " + message + "\n")
    sys.exit(code)


def get(base: str, name: str) -> bytes:
    source = base.rstrip("/") + "/" + name
    limit = LIMITS[name]
    try:
        if source.startswith(("http://", "https://")):
            stream = urllib.request.urlopen(source, timeout=TIMEOUT)
        else:
            stream = open(source[len("file://") :] if source.startswith("file://") else source, "rb")
        with stream:
            data = stream.read(limit + 1)
    except (OSError, ValueError) as exc:
        if name == "manifest.json.sig":  # an unsigned wheelhouse (or one whose signature was removed)
            fail(
                8,
                f"cannot fetch {source}: {exc}; this node installs only from a signed wheelhouse (on the build host: "
                "`python -m builder sign`)",
            )
        fail(9, f"cannot fetch {source}: {exc}")
    if len(data) > limit:
        fail(8, f"{source} is larger than {limit} bytes: damaged or hostile")
    return data


def main() -> None:
    mode, base, folder = sys.argv[1:]
    if mode == "manifest":
        for name in ("manifest.json", "manifest.json.sig"):
            with open(os.path.join(folder, name), "wb") as f:
                f.write(get(base, name))
        return
    with open(os.path.join(folder, "manifest.json"), "rb") as f:
        manifest = json.loads(f.read().decode("utf-8"))
    try:
        want = manifest["tools"]["tools/ds-node-install.py"]["sha256"]
    except (KeyError, TypeError):
        fail(8, f"the signed manifest of {base} lists no node installer")
    data = get(base, "tools/ds-node-install.py")
    if hashlib.sha256(data).hexdigest() != want:
        fail(
            8,
            "{}/tools/ds-node-install.py is not the installer the signed manifest lists (sha256 differs): it "
            "was not run; run `python -m builder verify` on the build host".format(base.rstrip("/")),
        )
    with open(os.path.join(folder, "install.py"), "wb") as f:
        f.write(data)


if __name__ == "__main__":
    main()
