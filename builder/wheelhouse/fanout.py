"""Many nodes installing from one served wheelhouse at once: what a site's web server must bear.

Each node is reached over ssh (the cluster's ssh config) and runs its share of the installs at
once: the node installer the wheelhouse publishes, fetched from the URL, with --dry-run, which
does everything an install does but pip's unpacking: the manifest's signature checked with the
trusted key, the wheel and every dependency wheel fetched and each sha256 checked against the
signed manifest. Every install's JSON result is checked here against the manifest again. Used by
`bench --cluster` (nginx vs `serve`, side by side) and by the cluster test. `node_script` and
`check` are pure; `run` acts.
"""

from __future__ import annotations

import concurrent.futures
import json
import shlex
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder import cmd, output
from builder.node import INSTALLER, Fields, ManifestError


@dataclass(frozen=True)
class Fanout:
    url: str
    installs: int
    ok: int
    seconds: float  # from the first install started to the last one finished, on every node
    median_install: float  # one install's own time, the median
    problems: tuple[str, ...]
    files: tuple[str, ...] = ()  # what one install fetched: the wheel it chose and its dependencies
    megabytes: float = 0.0  # downloads only: what all of them fetched

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "installs": self.installs, "ok": self.ok, "seconds": round(self.seconds, 2),
                "median_install_s": round(self.median_install, 2), "problems": list(self.problems),
                "files": list(self.files), "megabytes": round(self.megabytes, 1)}  # fmt: skip


# Downloads only: fetch each named file from the wheelhouse and check its sha256 (what an install
# fetches, without its Python and torch start-up), a JSON line with the bytes and any mismatch.
_FETCH = """import hashlib, json, sys, urllib.parse, urllib.request
url, got, bad = sys.argv[1], 0, []
for item in sys.argv[2:]:
    name, sha = item.split("=")
    data = urllib.request.urlopen(url + "/" + urllib.parse.quote(name), timeout=120).read()
    got += len(data)
    if hashlib.sha256(data).hexdigest() != sha:
        bad.append(name)
print(json.dumps({"bytes": got, "bad": bad}))
"""


def node_script(python: str, url: str, count: int, trust_line: str, files: dict[str, str] | None = None) -> str:
    """The shell script one node runs: fetch the installer, start `count` dry-run installs at
    once, wait for all, print one JSON line with each one's exit status, times and result. With
    `files` (name -> sha256), each of the `count` fetches those files and checks them instead."""
    q = shlex.quote
    if files is None:
        one = ('DS_NODE_STATE_DIR="$tmp/state$i" "$PY" "$tmp/install.py" --wheelhouse "$URL" --dry-run --json '
               '--trust "$KEY"')  # fmt: skip
    else:
        one = '"$PY" "$tmp/fetch.py" "$URL" ' + " ".join(q(f"{n}={h}") for n, h in sorted(files.items()))
    return "\n".join([
        "set -eu",
        'tmp="$(mktemp -d)"',
        "trap 'rm -rf \"$tmp\"' EXIT",
        f"PY={q(python)}; URL={q(url)}; N={count}; KEY={q(trust_line)}",
        '"$PY" -c "import sys, urllib.request as u; open(sys.argv[2], \'wb\').write(u.urlopen(sys.argv[1]).read())"'
        f' "$URL/{INSTALLER}" "$tmp/install.py"',
        "cat > \"$tmp/fetch.py\" <<'DS_FETCH'",
        _FETCH.rstrip("\n"),
        "DS_FETCH",
        "i=0",
        'while [ "$i" -lt "$N" ]; do',
        f'  ( s=$(date +%s%N); rc=0; {one} > "$tmp/$i.json" 2> "$tmp/$i.err" || rc=$?; '
        'echo "$rc $s $(date +%s%N)" > "$tmp/$i.rc" ) &',
        "  i=$((i + 1))",
        "done",
        "wait",
        '"$PY" - "$tmp" "$N" <<\'DS_FANOUT\'',
        "import json, sys",
        "tmp, n = sys.argv[1], int(sys.argv[2])",
        "rows = []",
        "for i in range(n):",
        "    rc, start, end = open(f'{tmp}/{i}.rc').read().split()",
        "    row = {'rc': int(rc), 'start': int(start) / 1e9, 'end': int(end) / 1e9,",
        "           'err': open(f'{tmp}/{i}.err').read()[-2000:]}",
        "    try:  # what the installer chose and checked, from its JSON (the rest of it is long)",
        "        said = json.load(open(f'{tmp}/{i}.json'))",
        "        row['out'] = {k: said.get(k) for k in ('wheel', 'sha256', 'dependencies', 'bytes', 'bad')}",
        "    except ValueError as exc:",
        "        row['out'] = 'not JSON: ' + str(exc)",
        "    rows.append(row)",
        "print(json.dumps(rows))",
        "DS_FANOUT",
        "",
    ])  # fmt: skip


def shares(count: int, nodes: int) -> list[int]:
    """`count` installs over `nodes` nodes, as even as they go (pure)."""
    return [count // nodes + (1 if i < count % nodes else 0) for i in range(nodes)]


def parse_rows(node: str, got: list[Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """A node's rows, as its script printed them: what another machine wrote, so each is checked
    (exit status, times, result) and a row that is not one is a problem, never a figure (pure)."""
    rows, problems = [], []
    for i, item in enumerate(got):
        try:
            f = Fields(item, f"{node}: row {i}")
            rows.append({"rc": f.get("rc", int), "start": float(f.get("start", (int, float))),
                         "end": float(f.get("end", (int, float))), "err": f.get("err", str),
                         "out": f.get("out", (dict, str))})  # fmt: skip
        except ManifestError as exc:
            problems.append(exc.message)
    return rows, problems


def check(rows: list[dict[str, Any]], wheels: dict[str, str], deps: dict[str, str], fetched: bool = False) -> list[str]:
    """What is wrong with any install's result: its exit status, the wheel it chose and that
    wheel's and its dependencies' sha256 against the signed manifest's; with `fetched` (downloads
    only), any file whose sha256 did not match (pure)."""
    problems = []
    for i, row in enumerate(rows):
        if row.get("rc") != 0:
            problems.append(f"install {i} exited {row.get('rc')}: {str(row.get('err', '')).strip()[-300:]}")
            continue
        if fetched:
            out = row.get("out")
            bad = out.get("bad") if isinstance(out, dict) else None
            if bad != []:
                problems.append(f"install {i}: files whose sha256 did not match: {bad}")
            continue
        try:
            f = Fields(row.get("out"), f"install {i}")
            wheel, sha = f.get("wheel", str), f.get("sha256", str)
            dependencies = f.get("dependencies", list)
        except ManifestError as exc:
            problems.append(f"install {i}: its result is not the installer's JSON ({exc})")
            continue
        if wheels.get(wheel) != sha:
            problems.append(f"install {i} chose {wheel} with sha256 {sha}: the manifest says {wheels.get(wheel)}")
        elif set(dependencies) - set(deps):
            problems.append(f"install {i} verified dependencies the manifest does not list: {dependencies}")
    return problems


def run(ssh_config: Path, nodes: list[tuple[str, str]], url: str, count: int, trust_line: str,
        manifest: dict[str, Any], log: Path, files: tuple[str, ...] = ()) -> Fanout:  # fmt: skip
    """`count` dry-run installs at once from `nodes` ((name, python) pairs), against `url`; with
    `files` (names the manifest lists), `count` downloads of those files instead."""
    wheels = {name: str(entry.get("sha256")) for name, entry in manifest.get("wheels", {}).items()}
    deps = {name: str(entry.get("sha256")) for name, entry in manifest.get("dependencies", {}).items()}
    wanted = {n: {**deps, **wheels}[n] for n in files} if files else None
    what = f"downloads of {len(files)} files" if files else "installs"
    output.step(f"{count} {what} at once from {len(nodes)} nodes against {url}")

    def one(node: tuple[str, str], share: int) -> tuple[str, Any]:
        script = node_script(node[1], url, share, trust_line, wanted)
        done = cmd.ask(["ssh", "-F", str(ssh_config), node[0], "sh -s"], timeout=900, stdin=script)
        with log.open("a", encoding="utf-8") as f:
            f.write(f"+ ssh {node[0]} (fanout {share} x {url})\nexit {done.returncode}\n{done.stderr[-4000:]}\n")
        return node[0], done

    started = time.time()
    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    with concurrent.futures.ThreadPoolExecutor(len(nodes)) as pool:
        for name, done in pool.map(one, nodes, shares(count, len(nodes))):
            try:
                got = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
            except (ValueError, IndexError):
                got = None
            if not isinstance(got, list):
                problems.append(f"{name}: no results (exit {done.returncode}): {done.stderr.strip()[-300:]}")
                continue
            checked, bad = parse_rows(name, got)
            rows += checked
            problems += bad
    problems += check(rows, wheels, deps, fetched=bool(files))
    first = min((float(r["start"]) for r in rows), default=started)
    last = max((float(r["end"]) for r in rows), default=time.time())
    each = [float(r["end"]) - float(r["start"]) for r in rows]
    ok = len(rows) - sum(1 for p in problems if p.startswith("install "))
    sample: dict[str, Any] = next((r["out"] for r in rows if r.get("rc") == 0 and isinstance(r.get("out"), dict)), {})
    got = tuple(files) or tuple(
        [str(sample.get("wheel")), *map(str, sample.get("dependencies") or [])] if sample else []
    )
    megabytes = sum(int(r["out"].get("bytes") or 0) for r in rows if isinstance(r.get("out"), dict)) / 1e6
    return Fanout(url, count, ok, last - first, statistics.median(each) if each else 0.0, tuple(problems), got,
                  megabytes)  # fmt: skip
