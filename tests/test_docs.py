"""Every command README.md and docs/ show names a command and options that exist, and every link
between the pages lands (issue 31, item 3).

Commands are read where a reader meets them: each line of a shell code block (continuation lines
joined) and each inline code span. A command is `nox -s SESSION [-- OPTIONS]`, `python -m builder
COMMAND [OPTIONS]`, the published node installer and config checker (`tools/ds-node-install.py`,
`tools/ds-config-check.py`) and the test cluster's helper. Each option is looked up in the parser
that would read it, so a renamed or removed option fails here before a reader types it.
"""

from __future__ import annotations

import argparse
import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import builder.resources.config_check.cli as runner_cli
from builder import cli, node

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = ("", "sh", "bash", "console", "shell")
# Sessions that run another builder command than their own name; None: pytest or linters, not the builder.
SESSION_COMMAND: dict[str, str | None] = {
    "slurm-matrix": "build-wheel",
    "tests": None,
    "unit": None,
    "lint": None,
    "gpu": None,
}
START = re.compile(
    r"(?:^|(?<=[\s(;&`$\"]))(?P<cmd>nox -s [\w-]+|python3? -m builder|(?:python3? )?[\w./$-]*tools/ds-node-install\.py"
    r"|(?:python3? )?[\w./$-]*tools/ds-config-check\.py|python3? tests/cluster\.py)"
)
OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
CLUSTER_VERBS = ("up", "down", "images")


@dataclass(frozen=True)
class Command:
    where: str
    program: str  # "nox -s build-wheel", "python -m builder", ...
    rest: str


def snippets(text: str) -> Iterator[str]:
    """Shell lines of code blocks (a trailing backslash joins the next line) and inline code spans."""
    prose: list[str] = []
    block: str | None = None
    pending = ""
    for line in text.splitlines():
        if line.startswith("```"):
            block = None if block is not None else line[3:].strip()
            continue
        if block is None:
            prose.append(line)
        elif block in SHELL:
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            yield pending + line
            pending = ""
    for span in re.findall(r"`([^`]+)`", "\n".join(prose)):
        yield span.replace("\n", " ").replace("\\|", "|")


def commands_in(text: str, name: str) -> Iterator[Command]:
    for snippet in snippets(text):
        found = list(START.finditer(snippet))
        for i, m in enumerate(found):
            end = found[i + 1].start() if i + 1 < len(found) else len(snippet)
            rest = re.split(r"&&|;|\)|\s#\s", snippet[m.end() : end])[0]
            yield Command(f"{name}: `{snippet.strip()[:90]}`", m.group("cmd"), rest)


def commands(page: Path) -> Iterator[Command]:
    return commands_in(page.read_text(encoding="utf-8"), str(page.relative_to(ROOT)))


def sessions() -> set[str]:
    """The noxfile's session names (a decorator's name= or the function's name)."""
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    names: set[str] = set()
    for fn in tree.body:
        if not isinstance(fn, ast.FunctionDef):
            continue
        for deco in fn.decorator_list:
            call = deco if isinstance(deco, ast.Call) else None
            target = call.func if call else deco
            if isinstance(target, ast.Attribute) and target.attr == "session":
                named = [k.value for k in (call.keywords if call else []) if k.arg == "name"]
                names.add(str(named[0].value) if named and isinstance(named[0], ast.Constant) else fn.name)
    return names


def _options(p: argparse.ArgumentParser) -> set[str]:
    return {o for action in p._actions for o in action.option_strings}


def _builder_parsers() -> dict[str, argparse.ArgumentParser]:
    top = cli.parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    parsers: dict[str, argparse.ArgumentParser] = dict(sub.choices)
    parsers["install"] = node.parser()  # `python -m builder install` hands its arguments to the node installer
    parsers["module"] = node.parser(module_only=True)  # `python -m builder module`: the installer's --module mode
    parsers[""] = top
    return parsers


def problems(found: list[Command], known_sessions: set[str]) -> list[str]:
    """What is wrong with each command: an unknown session, builder command or option."""
    builder = _builder_parsers()
    out = []
    for c in found:
        if c.program.startswith("nox -s "):
            session = c.program.split()[-1]
            if session not in known_sessions:
                out.append(f"{c.where}: no nox session {session!r}")
                continue
            command = SESSION_COMMAND.get(session, session)
            rest = " " + re.sub(r"[\[\]]", " ", c.rest)  # usage brackets: `[-- --json]`
            _, dashes, after = rest.partition(" -- ")
            if command is None or not dashes:
                continue
            parser, words = builder[command], after
        elif "-m builder" in c.program:
            words = c.rest.strip()
            first = words.split()[0] if words.split() else ""
            name = "" if not first or first.startswith("-") else first
            if name.isupper() or name.startswith(("<", "[")):  # a placeholder: `python -m builder COMMAND`
                continue
            if name not in builder:
                out.append(f"{c.where}: no builder command {name!r}")
                continue
            parser, words = builder[name], words[len(name) :]
        elif c.program.endswith("ds-node-install.py"):
            parser, words = node.parser(), c.rest
        elif c.program.endswith("ds-config-check.py"):
            parser, words = runner_cli.parser(), c.rest
        else:  # tests/cluster.py VERB FOLDER
            verb = (c.rest.split() or [""])[0]
            if not set(verb.split("|")) <= set(CLUSTER_VERBS):
                out.append(f"{c.where}: tests/cluster.py has no {verb!r} (it takes {', '.join(CLUSTER_VERBS)})")
            continue
        out += [f"{c.where}: {o} is not an option of {parser.prog}" for o in OPTION.findall(words)
                if o not in _options(parser)]  # fmt: skip
    return out


def test_every_command_in_readme_and_docs_exists() -> None:
    found = [c for page in PAGES for c in commands(page)]
    assert not problems(found, sessions()), "\n".join(problems(found, sessions()))
    # The check reads what it should: the pages show many commands, and the README names every session.
    assert len(found) > 60 and len({c.program for c in found}) > 15, len(found)
    readme = {c.program for c in commands(ROOT / "README.md")}
    assert {f"nox -s {s}" for s in sessions()} <= readme, sorted({f"nox -s {s}" for s in sessions()} - readme)


def test_the_command_check_fails_on_what_does_not_exist() -> None:
    text = (
        "```sh\nnox -s build-wheel -- --recipe R --no-such-option\n"
        "python -m builder verify \\\n  --trust K --trsut K\n```\n"
        "Run `nox -s biuld-wheel` or `python -m builder publsh`, then `python3 wheelhouse/tools/ds-node-install.py "
        "--wheelhouse W --dryrun` and `python tests/cluster.py start F`; `nox -s verify [-- --jsn]`.\n"
    )
    said = "\n".join(problems(list(commands_in(text, "example")), sessions()))
    for wrong in ("--no-such-option is not an option of python -m builder build-wheel",
                  "--trsut is not an option of python -m builder verify", "no nox session 'biuld-wheel'",
                  "no builder command 'publsh'", "--dryrun is not an option", "tests/cluster.py has no 'start'",
                  "--jsn is not an option of python -m builder verify"):  # fmt: skip
        assert wrong in said, said
    assert "--recipe is not" not in said and "--trust is not" not in said


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"(?ms)^```.*?^```", "", page.read_text(encoding="utf-8"))
    return {slug(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def broken_links(page: Path) -> list[str]:
    text = re.sub(r"(?ms)^```.*?^```", "", page.read_text(encoding="utf-8"))
    out = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+://|^mailto:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            out.append(f"{page.name}: {target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            out.append(f"{page.name}: {target}: no heading #{anchor} there")
    return out


def test_every_link_between_the_pages_lands(tmp_path: Path) -> None:
    broken = [b for page in PAGES for b in broken_links(page)]
    assert not broken, "\n".join(broken)
    linked = set(re.findall(r"\]\(docs/([\w.-]+\.md)\)", (ROOT / "README.md").read_text()))
    assert linked == {p.name for p in PAGES[1:]}, "every docs page is linked from the README"
    bad = tmp_path / "bad.md"
    bad.write_text("# Top\n[a](nowhere.md) [b](#top) [c](#missing) [d](https://example.org/x)\n")
    assert broken_links(bad) == ["bad.md: nowhere.md: no such file", "bad.md: #missing: no heading #missing there"]
