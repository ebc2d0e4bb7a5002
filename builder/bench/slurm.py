"""bench --slurm MATRIX: the same matrix built here one target after another and as a Slurm job array."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from builder import cmd, output
from builder.bench.common import EXTRA_OPS, _report
from builder.errors import ToolError


def _copy_matrix(matrix: Path, dest: Path) -> tuple[Path, list[Path]]:
    """The matrix file and its recipes copied into `dest`, so one recipe can change for the second run."""
    import re
    import tomllib

    dest.mkdir(parents=True, exist_ok=True)
    text = matrix.read_text(encoding="utf-8")
    copies = []
    for i, rel in enumerate(tomllib.loads(text)["recipes"]):
        copy = dest / f"{i}-{Path(rel).name}"
        source = (matrix.parent / rel).resolve()
        recipe = source.read_text(encoding="utf-8")
        configs = tomllib.loads(recipe).get("configs")
        if configs:  # the configs go beside the copy (a recipe reads configs from its own folder only)
            for c in configs:
                (dest / f"{i}-configs" / c).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source.parent / c, dest / f"{i}-configs" / c)
            named = "configs = [" + ", ".join(json.dumps(f"{i}-configs/{c}") for c in configs) + "]"
            found = re.search(r"(?ms)^configs\s*=\s*\[.*?\]", recipe)
            if found:
                recipe = recipe[: found.start()] + named + recipe[found.end() :]
        copy.write_text(recipe, encoding="utf-8")
        copies.append(copy)
    listed = "recipes = [" + ", ".join(json.dumps(c.name) for c in copies) + "]"
    text = re.sub(r"(?ms)^recipes\s*=\s*\[.*?\]", lambda _: listed, text, count=1)
    (dest / "matrix.toml").write_text(text, encoding="utf-8")
    return dest / "matrix.toml", copies


def _add_op(recipe_file: Path, op: str) -> None:
    import re

    text = recipe_file.read_text(encoding="utf-8")
    changed = re.sub(r"(?m)^(ops\s*=\s*\[)", lambda m: f'{m.group(1)}"{op}", ', text, count=1)
    recipe_file.write_text(changed, encoding="utf-8")


def _matrix_run(args: list[str], work: Path, house: Path, log: Path) -> tuple[float, str]:
    """Seconds for one `build-wheel --matrix` run (exit 0 or 11: a failed target is part of the matrix)."""
    argv = [sys.executable, "-m", "builder", "build-wheel", *args, "--work-dir", str(work), "--wheelhouse", str(house)]
    start = time.monotonic()
    done = cmd.ask(argv, timeout=4 * 3600)
    seconds = time.monotonic() - start
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"+ {cmd.quote(argv)}\n{done.stdout}{done.stderr}# exit {done.returncode} after {seconds:.0f} s\n")
    if done.returncode not in (0, 11):
        raise ToolError(f"the matrix run failed (exit {done.returncode}): {done.stderr.strip()[-600:]}", f"read {log}")
    return seconds, done.stderr


def _hits(text: str) -> tuple[int, int]:
    import re

    found = re.findall(r"ccache: (\d+) hits, (\d+) misses", text)
    return sum(int(h) for h, _ in found), sum(int(m) for _, m in found)


def bench_slurm(matrix: Path, out: Path) -> dict[str, Any]:
    """The same matrix built here one target after another and as a job array on Slurm, both
    cold; then one recipe gains an op and both run again (Slurm's build tasks with their shared
    compiler cache and their target folders of the first run)."""
    from builder.targets import load_matrix

    first = load_matrix(matrix).recipes[0]
    extra = next(o for o in EXTRA_OPS if o not in first.ops)
    root = out / "slurm-bench"
    shutil.rmtree(root, ignore_errors=True)
    copy, recipes = _copy_matrix(matrix, root / "matrix")
    log = out / "bench-slurm.log"
    log.unlink(missing_ok=True)
    env_cache = os.environ.pop("DS_BUILDER_CCACHE_DIR", None)  # each side's cache starts empty, in its work folder
    try:
        seconds: dict[str, float] = {}
        for side, args in (("local", ["--matrix", str(copy), "--jobs", "1"]),
                           ("slurm", ["--matrix", str(copy), "--slurm", "--wait"])):  # fmt: skip
            output.step(f"bench: the matrix {side}, cold")
            seconds[f"{side}_cold"], _ = _matrix_run(args, root / side, root / f"house-{side}", log)
        _add_op(recipes[0], extra)
        said = {}
        for side, args in (("local", ["--matrix", str(copy), "--jobs", "1"]),
                           ("slurm", ["--matrix", str(copy), "--slurm", "--wait"])):  # fmt: skip
            output.step(f"bench: the matrix {side}, after adding {extra} to {first.name}")
            # Another wheelhouse: the changed recipe's wheel keeps its file name, which publish refuses
            # to replace with other bytes in the first one.
            house = root / f"house-{side}-changed"
            seconds[f"{side}_second"], said[side] = _matrix_run(args, root / side, house, log)
    finally:
        if env_cache is not None:
            os.environ["DS_BUILDER_CCACHE_DIR"] = env_cache
    run_logs = sorted((root / "slurm" / "slurm").glob("run-*"), key=lambda p: p.stat().st_mtime)[-1] / "logs"
    hits, misses = _hits("".join(p.read_text(errors="replace") for p in run_logs.glob("build-*.log")))
    nodes = cmd.ask(["sinfo", "-h", "-o", "%D %c"]).stdout.split()
    result = {
        "matrix": str(matrix),
        "targets": len(load_matrix(copy).recipes),
        "changed": {"recipe": first.name, "added_op": extra},
        "slurm_nodes": " ".join(nodes),
        "seconds": seconds,
        "second_slurm_ccache": {"hits": hits, "misses": misses},
        "ratios": {
            "slurm_vs_local_cold": seconds["slurm_cold"] / seconds["local_cold"],
            "slurm_second_vs_cold": seconds["slurm_second"] / seconds["slurm_cold"],
            "slurm_vs_local_second": seconds["slurm_second"] / seconds["local_second"],
        },
    }
    return _report(out / "bench-slurm", result, render_slurm(result))


def render_slurm(result: dict[str, Any]) -> str:
    s, r, cc = result["seconds"], result["ratios"], result["second_slurm_ccache"]
    change = f"+{result['changed']['added_op']} in {result['changed']['recipe']}"
    return "\n".join([
        f"Matrix `{result['matrix']}` ({result['targets']} targets), Slurm nodes x cpus: {result['slurm_nodes']}:",
        "",
        "| measure | seconds | ratio |",
        "|---|---|---|",
        f"| cold: Slurm job array vs here one after another | {s['slurm_cold']:.0f} s vs {s['local_cold']:.0f} s "
        f"| {r['slurm_vs_local_cold']:.2f} |",
        f"| second run ({change}): Slurm, shared compiler cache, vs Slurm cold | {s['slurm_second']:.0f} s vs "
        f"{s['slurm_cold']:.0f} s | {r['slurm_second_vs_cold']:.2f} |",
        f"| second run: Slurm vs here | {s['slurm_second']:.0f} s vs {s['local_second']:.0f} s "
        f"| {r['slurm_vs_local_second']:.2f} |",
        f"| compiler cache in the second Slurm run | {cc['hits']} hits, {cc['misses']} misses | |",
        "",
    ])  # fmt: skip


# ---------------------------------------------------------------- every op, as units vs one plain run
