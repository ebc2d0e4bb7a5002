"""One file from a package, for code that runs where the toolkit is not installed: the node
installer (builder/node/ -> tools/ds-node-install.py) and the scripts another interpreter runs
(builder/resources/smoke/ -> the smoke checks). pip's get-pip.py and virtualenv.pyz are made from
their packages the same way.

The package's modules are laid one after another in the order its `__init__` gives in `BUNDLE`,
each with its imports of the package taken out (what they name is defined above them) and its
`from __future__` imports said once at the top. That is sound because the build checks what makes
it so: every module imports only the standard library (or what `allowed` names: torch in a smoke
venv) and modules before it, by `from <package>.<module> import <names>` at its top level; no two
modules define the same top-level name; nothing is a relative import; the syntax is the oldest
Python the file must parse on.
"""

from __future__ import annotations

import ast
import sys
import textwrap
from collections.abc import Iterable, Sequence
from pathlib import Path

from builder.errors import PublishError

FIX = "keep the package to the rules in builder/bundle.py's docstring"


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


def order_of(folder: Path) -> tuple[str, ...]:
    """BUNDLE of the package's __init__: its modules in the order they build on each other."""
    tree = ast.parse((folder / "__init__.py").read_text(encoding="utf-8"))
    return tuple(
        next(
            ast.literal_eval(st.value)
            for st in tree.body
            if isinstance(st, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "BUNDLE" for t in st.targets)
        )
    )


# Each file built in this process, by everything it is built from: a publish writes and lists both
# tools, and parsing both packages three times was most of a small publish's time (0.35 of 0.43 s).
_BUILT: dict[tuple[object, ...], bytes] = {}


def build(folder: Path, package: str, header: str, python: tuple[int, int] = (3, 6),
          allowed: Iterable[str] = (), order: Sequence[str] | None = None) -> bytes:  # fmt: skip
    """The one file's bytes, or PublishError naming the module and line that breaks a rule above.
    `header` is its docstring; `{order}` in it is replaced by the modules' names. Built once per
    process for the same sources (read again each time, so an edited package is built again)."""
    names = tuple(order) if order is not None else order_of(folder)
    allowed = set(allowed)
    key = (package, header, python, tuple(sorted(allowed)), names,
           tuple((folder / f"{name}.py").read_bytes() for name in names))  # fmt: skip
    if key not in _BUILT:
        _BUILT[key] = _build(folder, package, header, python, allowed, names)
    return _BUILT[key]


def _build(folder: Path, package: str, header: str, python: tuple[int, int], allowed: set[str],
           order: Sequence[str]) -> bytes:  # fmt: skip
    owners: dict[str, tuple[str, tuple[str, ...]]] = {}  # name -> (module, what it is bound to)
    defined: dict[str, set[str]] = {}
    pieces: list[str] = []
    futures: set[str] = set()
    for index, name in enumerate(order):
        path = folder / f"{name}.py"
        text = path.read_text(encoding="utf-8")
        where = f"{package.replace('.', '/')}/{name}.py"

        def fail(line: int, why: str, where: str = where) -> PublishError:
            return PublishError(f"{package} cannot be built into one file: {where}:{line} {why}", FIX)

        try:
            tree = ast.parse(text, filename=where, feature_version=python)
        except SyntaxError as exc:
            raise fail(exc.lineno or 0, f"does not parse as Python {python[0]}.{python[1]} ({exc.msg})") from None
        drop: set[int] = set()
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(node, ast.ImportFrom) and (node.level or not node.module):
                raise fail(node.lineno, "is a relative import")
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if modules == ["__future__"]:  # only at a module's top: anywhere else it does not parse
                futures.update(a.name for a in node.names)
                drop.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
                continue
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
                elif not _is_stdlib(module) and module.split(".")[0] not in allowed:
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
    top = header.format(order=textwrap.fill(", ".join(order), 100))
    if futures:
        top += f"\nfrom __future__ import {', '.join(sorted(futures))}\n"
    return "\n\n".join([top, *pieces]).encode("utf-8")
