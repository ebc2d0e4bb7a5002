"""The node installer as nodes get it: builder/node/ built into one file, `tools/ds-node-install.py`.

Nodes have only Python and pip, and the file is hashed in the signed manifest, so it must be one
file and the same bytes for the same package. A generated `.py` rather than a zipapp: a site's
administrator reads what runs as root on their nodes (`less tools/ds-node-install.py`), it runs
from a pipe (`curl ... | python3 - ...`), and it parses on Python 3.6 so that an old interpreter
gets the one-line refusal. pip's get-pip.py and virtualenv.pyz are made from their packages the
same way at release time; this is made at publish time.

builder/bundle.py lays the package's modules one after another (its docstring says why that is
sound, and what it checks), parsed as Python 3.6 and with the standard library only.
"""

from __future__ import annotations

from pathlib import Path

from builder import bundle

PACKAGE = "builder.node"
FOLDER = Path(__file__).resolve().parent.parent / "node"

HEADER = '''"""The DeepSpeed node installer, and the wheelhouse manifest contract it shares with the build host.

GENERATED when a wheel is published, by builder/wheelhouse/installer.py, from the toolkit's
package builder/node/: edit the package, not this file. The same package gives the same bytes,
which the wheelhouse's signed manifest hashes. Its modules, in order:
{order}.

It runs on cluster nodes that have only Python 3.8+ and pip and imports nothing but the standard
library. Everything read from a wheelhouse is hostile until checked: the manifest is validated
field by field, a wheel name must parse as a wheel file name (no path separator, no `..`), the
chosen wheel's bytes must match its sha256 (also with --dry-run), and the build manifest embedded
in the wheel must agree with what the manifest says it was built for. `--help` says the rest.
"""
'''


def build(folder: Path = FOLDER) -> bytes:
    """The installer's bytes (PublishError where the package breaks bundle's rules)."""
    return bundle.build(folder, PACKAGE, HEADER, python=(3, 6))
