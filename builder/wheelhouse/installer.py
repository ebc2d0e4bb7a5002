"""The node installer as nodes get it: builder/node/ built into one file, `tools/ds-node-install.py`.

Nodes have only Python and pip, and the file is hashed in the signed manifest, so it must be one
file and the same bytes for the same package. A generated `.py` rather than a zipapp: a site's
administrator reads what runs as root on their nodes (`less tools/ds-node-install.py`), it runs
from a pipe (`curl ... | python3 - ...`), and it parses on Python 3.6 so that an old interpreter
gets the one-line refusal. pip's get-pip.py and virtualenv.pyz are made from their packages the
same way at release time; this is made at publish time.

The modules are laid one after another in the package's BUNDLE order, each with its imports of
the package's own modules taken out (what they name is defined above them), which is sound
because the build checks what makes it so: every module imports only the standard library and
modules before it, by `from builder.node.<module> import <names>` at its top level; no two
modules define the same top-level name; nothing in the package is a relative or a `builder` import.
"""

from __future__ import annotations

import ast
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

from builder.errors import PublishError

PACKAGE = "builder.node"
FOLDER = Path(__file__).resolve().parent.parent / "node"

FIX = "keep builder/node/ to the rules in builder/wheelhouse/installer.py's docstring"
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


def _bound(node: ast.stmt) -> list[tuple[str, tuple[str, ...]]]:
    """The top-level names a statement binds, each with what it binds it to: an import of the
    standard library binds the same thing wherever it is repeated; anything else is its module's own."""
    if isinstance(node, ast.Import):
        return [(a.asname, ("import", a.name)) if a.asname else (a.name.split(".")[0], ("import", a.name.split(".")[0]))
                for a in node.names]  # fmt: skip
    if isinstance(node, ast.ImportFrom):
        return [(a.asname or a.name, ("from", node.module or "", a.name)) for a in node.names]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [(node.name, ("own",))]
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    return [(n.id, ("own",)) for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def _is_stdlib(module: str) -> bool:
    return module.split(".")[0] in sys.stdlib_module_names


def _docstring(tree: ast.Module) -> ast.Expr | None:
    first = tree.body[0] if tree.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return first
    return None


def build(folder: Path = FOLDER, order: Sequence[str] | None = None, package: str = PACKAGE) -> bytes:
    """The installer's bytes, or PublishError naming the module and line that breaks a rule above."""
    if order is None:
        tree = ast.parse((folder / "__init__.py").read_text(encoding="utf-8"))
        order = next(
            ast.literal_eval(st.value)
            for st in tree.body
            if isinstance(st, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "BUNDLE" for t in st.targets)
        )
    owners: dict[str, tuple[str, tuple[str, ...]]] = {}  # name -> (module, what it is bound to)
    defined: dict[str, set[str]] = {}
    pieces = [HEADER.format(order=textwrap.fill(", ".join(order), 100))]
    for index, name in enumerate(order):
        path = folder / f"{name}.py"
        text = path.read_text(encoding="utf-8")
        where = f"{package.replace('.', '/')}/{name}.py"

        def fail(line: int, why: str, where: str = where) -> PublishError:
            return PublishError(f"the node installer cannot be built: {where}:{line} {why}", FIX)

        try:
            tree = ast.parse(text, filename=where, feature_version=(3, 6))
        except SyntaxError as exc:
            raise fail(exc.lineno or 0, f"does not parse as Python 3.6 ({exc.msg})") from None
        drop: set[int] = set()
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(node, ast.ImportFrom) and (node.level or not node.module):
                raise fail(node.lineno, "is a relative import")
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for module in modules:
                if module == package or module.startswith(f"{package}."):
                    sibling = module[len(package) + 1 :]
                    if not isinstance(node, ast.ImportFrom) or node not in tree.body:
                        raise fail(node.lineno, f"imports {module} other than by `from {module} import ...` at its top")
                    if sibling not in order[:index]:
                        raise fail(node.lineno, f"imports {module}, which is not a module before it in BUNDLE")
                    for alias in node.names:
                        if alias.asname or alias.name not in defined[sibling]:
                            raise fail(node.lineno, f"imports {alias.name} from {module}, which does not define it "
                                       "(or renames it)")  # fmt: skip
                    drop.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
                elif not _is_stdlib(module):
                    raise fail(node.lineno, f"imports {module}, which is not in the standard library")
        defined[name] = set()
        for stmt in tree.body:
            if (stmt.lineno in drop) or stmt is _docstring(tree):
                continue
            for bound, what in _bound(stmt):
                seen = owners.get(bound)
                if seen and (seen[1] != what or what == ("own",)):
                    raise fail(stmt.lineno, f"defines {bound}, which {seen[0]}.py defines too")
                owners[bound] = (name, what)
                if what == ("own",):
                    defined[name].add(bound)
        lines = text.splitlines()
        doc = _docstring(tree)
        if doc is not None:
            drop.update(range(doc.lineno, (doc.end_lineno or doc.lineno) + 1))
        summary = ast.literal_eval(doc.value).strip().split("\n\n")[0].split("\n") if doc else []
        body = "\n".join(line for number, line in enumerate(lines, 1) if number not in drop).strip("\n")
        banner = [f"# {'=' * 20} {where}", *(f"# {line.strip()}" for line in summary)]
        pieces.append("\n".join(banner) + "\n\n" + body + "\n")
    return "\n\n".join(pieces).encode("utf-8")
