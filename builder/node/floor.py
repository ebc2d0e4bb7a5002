"""The Python the installer runs on, checked before anything else: it runs on Python 3.8 and newer
(Ubuntu 20.04, Debian 11, RHEL 9; RHEL 8 has python38/python39 beside its platform-python 3.6).
Older interpreters get one line saying so: the installer parses on 3.6 (no `from __future__ import
annotations`: annotations are quoted; no walrus), and this check is the first thing it runs.
"""

import sys

if sys.version_info < (3, 8):  # noqa: UP036  (written for the interpreters it refuses)
    _script = sys.argv[0] if sys.argv else "ds-node-install.py"
    sys.stderr.write(
        f"error: the DeepSpeed node installer needs Python 3.8 or newer; {sys.executable} is Python "
        f"{sys.version_info[0]}.{sys.version_info[1]}\n  fix: run it with a newer python3 (RHEL 8: dnf install "
        f"python39, then python3.9 {_script} ...)\n"
    )
    sys.exit(9)
