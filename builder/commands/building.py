"""The build stage's commands: build-wheel (here or on Slurm), the Slurm tasks, gather, detect, toolchain, bench.

Errors are raised, never printed here; `cli.main` turns them into one message and an exit code.
Each handler imports what it needs: a command's start stays fast."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from builder import DEFAULT_RECIPE, output
from builder.commands.common import _publish_coverage, _report_run, _trust_arg, _workspace
from builder.errors import ToolError
from builder.node import shown


def build_wheel(args: argparse.Namespace) -> int:
    from builder import coverage, pipeline
    from builder.errors import MatrixError, RecipeError
    from builder.recipe import load_recipe
    from builder.targets import load_matrix, select, targets_for

    if args.matrix and args.recipes:
        raise RecipeError("--matrix and --recipe both name what to build", "pass one of them")
    matrix = load_matrix(args.matrix) if args.matrix else None
    recipes = list(matrix.recipes) if matrix else [load_recipe(p) for p in (args.recipes or [Path(DEFAULT_RECIPE)])]
    pythons = args.pythons or (list(matrix.python) if matrix else [])
    if args.offline is not None:  # before the first install: every later pip and uv reads only the folder
        from builder import offline

        offline.use(args.offline, recipes, _trust_arg(args))
    targets = targets_for(recipes, pythons)  # every recipe and interpreter checked before the first build
    if args.target:
        targets = [select(targets, args.target)]
    if args.slurm:
        if args.variants:
            raise RecipeError(
                "--variants is not passed on to the Slurm collect job",
                "run `python -m builder publish --variants --wheelhouse W` once after the run: a wheelhouse that has "
                "variants keeps them up to date on every later publish, the collect job's included",
            )
        return _submit_to_slurm(args, matrix, targets)
    if args.wait or args.partition or args.account:
        raise RecipeError("--wait, --partition and --account are for --slurm", "add --slurm, or leave them out")
    stages = pipeline.Stages(
        smoke=not args.no_smoke,
        publish=not (args.no_smoke or args.no_publish),
        force=args.force,
        use_ccache=not args.no_ccache,
        verbose=args.verbose,
        variants=args.variants,
    )
    ws = _workspace(args, check=False)
    jobs = args.jobs or (matrix.jobs if matrix and matrix.jobs else 1)
    if matrix is not None and not args.jobs and not matrix.jobs:
        from builder.detect import available_memory_gb

        jobs = pipeline.auto_jobs(len(targets), os.cpu_count() or 1, available_memory_gb())
    results = pipeline.run(targets, ws, args.wheelhouse, stages, keep_going=matrix is not None, jobs=jobs)
    if args.json:
        output.result(json.dumps({"targets": [r.to_json() for r in results]}, indent=2))
    if matrix is not None:
        js, md = coverage.write(results, ws.root / "coverage", str(matrix.path))
        output.step("coverage:\n    " + "\n    ".join(coverage.table(results)))
        output.step(f"coverage report: {md} (JSON: {js})")
        if stages.publish:
            _publish_coverage(args.wheelhouse, js)
        failed = [r.target for r in results if not r.ok]
        if failed:
            raise MatrixError(
                f"{len(failed)} of {len(targets)} targets failed: {', '.join(failed)}",
                f"read the reasons in {md}; the other targets were built, smoked and published",
            )
    return 0


def _submit_to_slurm(args: argparse.Namespace, matrix: Any, targets: list[Any]) -> int:
    import shutil
    import tempfile

    from builder import slurm
    from builder.errors import BuilderError, RecipeError
    from builder.files import make_dirs
    from builder.wheelbuild import ccache
    from builder.wheelbuild.source import sdist_folder

    if matrix is None:
        raise RecipeError("--slurm submits a matrix", "pass --matrix FILE")
    from builder.cmd import which

    if which("sbatch") is None:
        raise ToolError("sbatch was not found on PATH: this machine cannot submit Slurm jobs",
                        "run it on a login node of the cluster, or build here: leave out --slurm")  # fmt: skip
    ws = _workspace(args)
    make_dirs(ws.root / "slurm")
    run = Path(tempfile.mkdtemp(prefix="run-", dir=ws.root / "slurm"))
    run.chmod(0o755)
    given = {k: v for k, v in matrix.slurm.items() if k != "compiler_cache"}  # the build tasks' sizes
    given.update({k: v for k, v in (("partition", args.partition), ("account", args.account)) if v})
    shared = matrix.slurm.get("compiler_cache")
    cache = Path(shared) if shared else ccache.cache_dir(ws.cache, os.environ)
    sdists = sdist_folder(ws.cache, os.environ)
    try:
        record = slurm.submit(targets, matrix.path, run, ws.root / "slurm" / "targets", args.wheelhouse,
                              slurm.SlurmOptions(**given), matrix.gpu, cache, sdists)  # fmt: skip
    except BuilderError:
        shutil.rmtree(run, ignore_errors=True)  # nothing runs from it: its jobs were cancelled
        raise
    smokes = [f"{t['name']} on {s['partition']} ({s['job']})" for t in record["targets"] for s in t["smoke"]]
    output.step(
        f"submitted {len(targets)} targets: build array {', '.join(a['job'] for a in record['arrays'])}, "
        + (f"GPU smoke jobs: {', '.join(smokes)}, " if smokes else "no GPU smoke jobs (no [slurm.gpu] match), ")
        + f"collect job {record['collect_job']} (afterany)\n    run folder: {run}\n"
        f"    compiler cache: {cache}\n    follow: python -m builder slurm-status {run}"
    )
    if args.json:
        output.result(json.dumps(record, indent=2))
    if not args.wait:
        return 0
    slurm.wait(run, record)
    return _report_run(run, len(targets), record)


def slurm_task(args: argparse.Namespace) -> int:
    from builder import slurm

    result = slurm.run_task(args.run.resolve(), args.target)
    return 0 if result.ok else 1  # a failed build fails the task, so Slurm cancels its GPU smoke job


def slurm_units(args: argparse.Namespace) -> int:
    from builder import slurm

    rows = slurm.run_units_task(args.run.resolve(), args.target, args.group, args.of)
    for row in rows:
        output.note(f"unit {row['op']}: {row['status']}" + (f": {row['failure']}" if row["failure"] else ""))
    return 0  # a failed unit is the build task's to name (or drop), after every unit task has ended


def slurm_smoke(args: argparse.Namespace) -> int:
    from builder import slurm

    result = slurm.run_smoke(args.run.resolve(), args.target, args.partition)
    said = f"smoke on {result.partition} ({result.node}): {result.status}"
    output.step(said + (f": {shown(result.reason, 400)}" if result.reason else ""))
    return 0 if result.status == "passed" else 1


def slurm_status(args: argparse.Namespace) -> int:
    from builder import slurm

    run = args.run.resolve()
    record = slurm.load_run(run)
    active = slurm.queue(slurm.jobs_of(record))
    lines = slurm.states(run, record, active)
    output.result("\n".join(f"{shown(name)}: {shown(line, 400)}" for name, line in lines.items()))
    queued = ", ".join(f"{job} {state.lower()}" for job, state in sorted(active.items()))
    output.step(f"jobs queued or running: {queued}" if queued else "no job of this run is queued or running")
    return 0


def slurm_collect(args: argparse.Namespace) -> int:
    from builder import coverage, slurm
    from builder.errors import MatrixError

    run = args.run.resolve()
    results = slurm.collect(run, args.wheelhouse)
    js, md = coverage.write(results, run / "coverage", str(slurm.load_run(run).get("matrix")))
    output.step("coverage:\n    " + "\n    ".join(coverage.table(results)))
    output.step(f"coverage report: {md} (JSON: {js})")
    _publish_coverage(args.wheelhouse, js)
    failed = [r.target for r in results if not r.ok]
    if failed:
        raise MatrixError(f"{len(failed)} of {len(results)} targets failed: {', '.join(failed)}", f"read {md}")
    return 0


def gather(args: argparse.Namespace) -> int:
    from builder import offline
    from builder.recipe import load_recipe

    recipe = load_recipe(args.recipe)
    have = offline.read_freeze(args.have) if args.have else {}
    ws = _workspace(args)  # a file or a read-only mount in its place: exit 10, one line
    ws.logs.mkdir(parents=True, exist_ok=True)
    offline.check_dest(args.dest)  # as given: resolved first, another user's link on its way was followed
    offline.gather(
        recipe,
        args.dest.resolve(),
        args.python,
        have,
        ws.logs / "gather.log",
        args.verbose,
        with_root=not args.no_root,
        machine=args.machine,
    )
    return 0


def detect(args: argparse.Namespace) -> int:
    from builder.build import prepare, toolchain_env
    from builder.detect import detect as detect_machine
    from builder.detect import render_table
    from builder.recipe import load_recipe
    from builder.wheelbuild.ops import probe

    if args.recipe:  # the recipe's build environment, and DeepSpeed's own answer for its ops
        ws = _workspace(args)
        recipe = load_recipe(args.recipe)
        log = ws.logs / f"{recipe.name}-env.log"
        src, python = prepare(recipe, ws, log, args.verbose)
        env, report, _ = toolchain_env(recipe, python, ws, dry_run=True)
        ops = probe(python, src, env, log).ops
        report = dataclasses.replace(report, deepspeed_ops={n: {"compatible": o.compatible, "why": o.why}
                                                            for n, o in ops.items()})  # fmt: skip
    else:
        report = detect_machine(os.environ, args.python or sys.executable)
    output.result(report.to_json() if args.json else render_table(report))
    return 0


def toolchain(args: argparse.Namespace) -> int:
    from builder.build import prepare
    from builder.detect import detect as detect_machine
    from builder.recipe import load_recipe
    from builder.wheelbuild.toolchain import apply, compose_env, plan_toolchain

    ws = _workspace(args)
    python, need_cuda = args.python or sys.executable, None
    if args.recipe:
        recipe = load_recipe(args.recipe)
        _, built = prepare(recipe, ws, ws.logs / f"{recipe.name}-env.log", args.verbose)
        python, need_cuda = str(built), recipe.accelerator == "cuda"
    report = detect_machine(os.environ, python)
    plan = plan_toolchain(report, args.folder or ws.root / "toolchain" / "bin", need_cuda=need_cuda
                          if need_cuda is not None else bool(report.torch.cuda))  # fmt: skip
    lines = [f"{'would ' if args.dry_run else ''}{action}" for action in apply(plan, args.dry_run)]
    lines += [f"# {note}" for note in plan.notes]
    env = compose_env(os.environ, plan)
    lines += [
        f"export {v}={shlex.quote(env[v])}" for v in [*plan.prepend, *plan.set_vars] if env.get(v) != os.environ.get(v)
    ]
    output.result("\n".join(lines))
    return 0


def bench(args: argparse.Namespace) -> int:
    from builder.bench import bench as run_bench
    from builder.bench.all_ops import bench_all_ops
    from builder.bench.slurm import bench_slurm
    from builder.recipe import load_recipe

    if args.all_ops:
        bench_all_ops(load_recipe(args.recipe), args.out.resolve())
        return 0
    if args.slurm_matrix:
        bench_slurm(args.slurm_matrix.resolve(), args.out.resolve())
        return 0
    if args.cluster:
        from builder.bench.cluster import bench_cluster

        bench_cluster(args.cluster.resolve(), args.out.resolve(), args.installs, args.dry_runs)
        return 0
    if args.image:
        from builder.bench.image import bench_image

        bench_image(args.wheelhouse.resolve(), args.out.resolve())
        return 0
    run_bench(load_recipe(args.recipe), args.out.resolve(), args.runs,
              load_recipe(args.full_ops) if args.full_ops else None)  # fmt: skip
    return 0
