"""The package as pip installs it: every folder of builder/ that holds code is a listed package.

CI installs the builder into the nox session (not editable): a folder missing from pyproject's
package list is missing there (builder/units once was: four test modules failed to import).
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_code_folder_is_a_listed_package() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "builder").rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert folders == listed, (
        f"pyproject.toml's packages lack {sorted(folders - listed)}, list {sorted(listed - folders)}"
    )


def imports_of(root: Path) -> dict[str, set[str]]:
    """builder module -> the builder modules it imports, at the top or inside a function (a lazy
    import is an arrow all the same: it only hides the circle until that function runs)."""
    modules = {}
    for path in sorted((root / "builder").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("builder"):
                for alias in node.names:  # `from builder import node` imports the module builder.node
                    full = f"{node.module}.{alias.name}"
                    found.add(full if full in modules else str(node.module))
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.startswith("builder")}
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan): each holds an import circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_module_of_builder_imports_itself_through_others() -> None:
    """A contract several rooms read lives below all of them (builder.results, builder.DEFAULT_RECIPE)."""
    assert circles(imports_of(ROOT)) == []
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the check can fail


def rooms_of(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The same arrows between rooms: a folder of builder/ or a top-level module (builder.units.cache
    lives in the room units, builder.smoke in smoke); arrows within a room are left out."""

    def room(module: str) -> str:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 else parts[0]

    out: dict[str, set[str]] = {}
    for module, found in graph.items():
        out.setdefault(room(module), set()).update(room(m) for m in found if room(m) != room(module))
    return out


def test_rooms_import_one_way() -> None:
    """Issue 50: no circle between rooms, function-level imports counted. Ten rooms were one circle:
    buildroot needed images' podman wrapper (now builder.podman, a tool of the machine like cmd), the
    recipe needed wheelbuild's arch and glibc tables (builder.archs, builder.glibc), wheelbuild's
    orchestration needed units while units needed wheelbuild's parts (the orchestration is builder.build),
    and the wheelhouse needed images' archive reader and Containerfile (wheelhouse.archive, lockfile).
    Where a lower room needs something from a higher one, that thing moves down or is handed in."""
    assert circles(rooms_of(imports_of(ROOT))) == []
    assert circles(rooms_of({"builder.a.x": {"builder.b"}, "builder.b": {"builder.a.y"}, "builder.a.y": set()})) == [
        ["a", "b"]
    ]  # the check can fail


def test_no_module_is_over_600_lines() -> None:
    """Issue 50: a module a newcomer can read (node.py had grown to 3,000 lines, 14% of the code):
    a module past 600 lines is split by noun. The node installer and the resource scripts that run
    as one file are packages built into it (builder/bundle.py)."""
    long = {p.relative_to(ROOT).as_posix(): n for p in (ROOT / "builder").rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 600}  # fmt: skip
    assert long == {}


def test_the_architecture_page_names_every_room() -> None:
    """Issue 50: docs/architecture.md is the page a newcomer reads first; a room it does not name in
    its floor table (`room`) has no stated job and no stated floor."""
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = [line for line in page.splitlines() if line.startswith("| ") and "`" in line]
    named = {word for line in table for word in line.split("|")[2].replace(",", " ").split() if word.startswith("`")}
    rooms = set(rooms_of(imports_of(ROOT))) - {"builder"}
    assert sorted(r for r in rooms if f"`{r}`" not in named) == []
