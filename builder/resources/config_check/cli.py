"""The config checker's command line: a spec of configs in, the results after the MARKER line out."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from builder.resources.config_check.jit import MARKER
from builder.resources.config_check.outcome import explain
from builder.resources.config_check.pool import default_jobs, run
from builder.resources.config_check.rank import run_launched
from builder.resources.config_check.screen import read_config_file


def seconds_arg(text: str) -> float:
    """A time limit: a finite number of seconds above 0, at most 86400 (inf and nan are refused)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 86400:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a number of seconds above 0, at most 86400")
    return value


def parser() -> argparse.ArgumentParser:
    """The checker's options (also read by the docs test, which checks every command the docs show)."""
    p = argparse.ArgumentParser(
        description="Run DeepSpeed configs against the DeepSpeed installed for this Python: initialize and a "
        "few steps of a small model each, with an empty TORCH_EXTENSIONS_DIR; every op DeepSpeed asks for is "
        "recorded and every compile at first use refused. Exit 0 when every config passed, 14 otherwise."
    )
    p.add_argument("configs", nargs="*", metavar="CONFIG", help="DeepSpeed config files (JSON, or .py of one dict)")
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.add_argument("--timeout", type=seconds_arg, default=180.0, help="seconds per config (default 180)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--launched", action="store_true",
                   help="run one config as this process's rank of a world a launcher started (torchrun across "
                   "nodes: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set): a line (or JSON) per rank")  # fmt: skip
    return p


def main() -> int:
    """`--spec FILE|-|JSON` (the toolkit: the JSON report after MARKER), or config files (people,
    on a node: a line per config, or --json; exit 14 unless every config passed)."""
    p = parser()
    args = p.parse_args()
    # What DeepSpeed prints (its accelerator warning, "... built successfully") goes to stderr, in
    # every process: stdout carries only the results, so --json is JSON.
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    try:
        return _main(args, p, out)
    finally:
        out.flush()


def _main(args: Any, p: Any, out: Any) -> int:
    if args.spec is not None:
        arg = sys.stdin.read() if args.spec == "-" else args.spec
        if not arg.lstrip().startswith("{"):
            with open(arg, encoding="utf-8") as f:
                arg = f.read()
        results = run(json.loads(arg))
        print(MARKER, file=out)
        print(json.dumps(results), file=out)
        return 0
    if not args.configs:
        p.error("name at least one config file")
    if args.launched:
        return _main_launched(args, p, out)
    entries = []
    for path in args.configs:
        config, error = read_config_file(path)
        entries.append({"name": path, "error": error} if error else {"name": path, "config": config})
    results = run({"configs": entries, "timeout": args.timeout, "jobs": default_jobs()})
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()._name
    if args.json:
        print(json.dumps([{**r, "means": explain(r, accelerator)} for r in results], indent=2), file=out)
    else:
        for r in results:
            print(f"{r['status']:14} {r['name']}: {explain(r, accelerator)}", file=out)
    return 0 if all(r["status"] == "passed" for r in results) else 14


def _main_launched(args: Any, p: Any, out: Any) -> int:
    if len(args.configs) != 1 or "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        p.error("--launched runs one config in a world a launcher started (torchrun sets RANK and WORLD_SIZE)")
    config, error = read_config_file(args.configs[0])
    if config is None:
        result = {"name": args.configs[0], "rank": int(os.environ["RANK"]), "status": "invalid", "detail": error}
    else:
        result = run_launched(args.configs[0], config)
    from deepspeed.accelerator import get_accelerator

    means = explain(result, get_accelerator()._name)
    if args.json:
        print(json.dumps({**result, "means": means}), file=out)
    else:
        where = f"rank {result['rank']}/{result.get('world', '?')} on {result.get('host', '?')}"
        if "backend" in result:
            where += f", {result['backend']} via {result['master']}"
        print(f"{result['status']:14} {result['name']} ({where}): {means}", file=out)
    return 0 if result["status"] == "passed" else 14


if __name__ == "__main__":
    sys.exit(main())
