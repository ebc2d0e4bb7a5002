"""One handler per command: each takes the parsed arguments, calls the stage it names, returns 0.

Errors are raised, never printed here; `cli.main` turns them into one message and an exit code.
Only the standard library is imported at the top: each handler imports what it needs.
"""

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
from builder.errors import ConfigError, PublishError, SmokeError, ToolError, UsageError, WheelhouseError
from builder.workspace import Workspace


def _workspace(args: argparse.Namespace, check: bool = True) -> Workspace:
    ws = Workspace(args.work_dir.resolve())
    if check:
        ws.check_writable()
    return ws


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

        offline.use(args.offline, recipes)
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


def _report_run(run: Path, count: int, record: dict[str, Any]) -> int:
    from builder import coverage
    from builder.errors import MatrixError
    from builder.node import ManifestError

    try:
        report = coverage.load(run / "coverage")
    except ManifestError as exc:
        raise MatrixError(f"{exc.message}: not a coverage report", f"read {run / 'logs'}") from exc
    if report is None:
        raise MatrixError(f"the collect job {record['collect_job']} wrote no coverage report", f"read {run / 'logs'}")
    md = run / "coverage" / "coverage.md"
    output.step("coverage:\n    " + md.read_text(encoding="utf-8").replace("\n", "\n    "))
    if report.failed:
        raise MatrixError(f"{len(report.failed)} of {count} targets failed: {', '.join(report.failed[:50])}",
                          f"read the reasons in {md}")  # fmt: skip
    return 0


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
    output.step(said + (f": {result.reason}" if result.reason else ""))
    return 0 if result.status == "passed" else 1


def slurm_status(args: argparse.Namespace) -> int:
    from builder import slurm

    run = args.run.resolve()
    record = slurm.load_run(run)
    active = slurm.queue(slurm.jobs_of(record))
    lines = slurm.states(run, record, active)
    output.result("\n".join(f"{name}: {line}" for name, line in lines.items()))
    queued = ", ".join(f"{job} {state.lower()}" for job, state in sorted(active.items()))
    output.step(f"jobs queued or running: {queued}" if queued else "no job of this run is queued or running")
    return 0


def _publish_coverage(wheelhouse: Path, report: Path) -> None:
    from builder.wheelhouse.publish import publish_coverage

    published = publish_coverage(wheelhouse.resolve(), report)
    if published:
        output.note(f"coverage published to {published} (shown on {published.parent / 'index.html'})")


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


def smoke(args: argparse.Namespace) -> int:
    from builder.smoke import smoke as smoke_wheel

    ws = _workspace(args)
    for wheel in args.wheels or [_newest_wheel(ws.dist)]:
        smoke_wheel(wheel, ws, args.verbose, args.keep_env)
    return 0


def check_config(args: argparse.Namespace) -> int:
    import json

    from builder import configs
    from builder.smoke import check_configs

    if args.timeout <= 0:
        raise ConfigError(f"--timeout {args.timeout:g} is not a time limit", "give seconds above 0, e.g. --timeout 120")
    outcomes = check_configs(args.configs, _workspace(args), args.wheel, args.python, args.verbose, args.timeout)
    accelerator = "this accelerator"
    if args.wheel is not None:
        from builder.contracts import BuildManifest

        accelerator = BuildManifest.from_wheel(args.wheel.resolve()).accelerator
    if args.json:
        output.result(json.dumps([{"config": str(f), "status": o.status, "ops": list(o.ops), "needs": list(o.jit),
                                   "means": configs.explain(o, accelerator), "detail": o.detail,
                                   "world_size": o.world_size, "seconds": o.seconds}
                                  for f, o in zip(args.configs, outcomes, strict=True)], indent=2))  # fmt: skip
    else:
        for f, o in zip(args.configs, outcomes, strict=True):
            output.result(f"{o.status:14} {f}: {configs.explain(o, accelerator)}")
    code = configs.exit_status(outcomes)
    if code:
        bad = [str(f) for f, o in zip(args.configs, outcomes, strict=True) if o.status != "passed"]
        output.error(f"{len(bad)} of {len(outcomes)} configs do not run from the wheel: {', '.join(bad)}")
    return code


def publish(args: argparse.Namespace) -> int:
    from builder import pipeline

    ws = _workspace(args)
    pipeline.publish(args.wheels or _passed_wheels(ws.dist), args.wheelhouse, ws, variants=args.variants)
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


def _trust_arg(args: argparse.Namespace) -> Any:
    """--trust (key lines or allowed-signers files) as a Trust, or None for this host's own."""
    from builder.errors import TrustError
    from builder.node import InstallError, load_trust

    if not getattr(args, "trust", None):
        return None
    try:
        return load_trust(args.trust)
    except InstallError as exc:
        raise TrustError(exc.message, exc.fix) from exc


def verify(args: argparse.Namespace) -> int:
    from builder import signing
    from builder.node import fingerprint_of, printable
    from builder.wheelhouse import verify as verify_wheelhouse
    from builder.wheelhouse.layout import read_manifest
    from builder.wheelhouse.verify import signature_problems

    house: Path = args.wheelhouse
    trust = _trust_arg(args)
    problems = verify_wheelhouse(house, trust)
    if args.json:
        output.result(json.dumps({"wheelhouse": str(house), "ok": not problems, "problems": problems}, indent=2))
    if problems:
        found = read_manifest(house) if house.is_dir() and (house / "manifest.json").is_file() else None
        signature = found is not None and any("interrupted publish" not in p for p in
                                              signature_problems(house, *found, trust))  # fmt: skip
        placed = house / "manifest.json"
        if house.is_dir() and (placed.is_symlink() or (placed.exists() and not placed.is_file())):
            fix = "restore the wheelhouse from the build host, or move it away and re-publish into a new one"
        elif any("interrupted publish" in p for p in problems) and not (house / "manifest.json").exists():
            fix = "run `python -m builder repair` to remove what the interrupted publish left, then publish again"
        elif not house.is_dir() or not (house / "manifest.json").is_file():
            fix = "pass --wheelhouse with the folder publish wrote (build-wheel publishes into ./wheelhouse)"
        elif any("publish is in progress" in p for p in problems):
            fix = "wait for the publish to finish, then run verify again"
        elif signature and not (house / "manifest.json.sig").exists():  # unsigned: an older toolkit, or stripped
            fix = (
                "do not install from it until it verifies: restore the wheelhouse from the build host; if it is "
                "what an older toolkit published there, check what it lists, then `python -m builder sign --adopt`"
            )
        elif signature:  # the signature is checked first: nothing else about the wheelhouse is known then
            fix = (
                "do not install from it: its signature is what vouches for every file. Restore the wheelhouse "
                "from the build host that signed it, or re-sign it there with `python -m builder sign`"
            )
        elif any("interrupted publish" in p or "builder repair" in p for p in problems):
            fix = ("run `python -m builder repair` for what interrupted publishes left; for anything else, "
                   "re-publish the affected wheels from their builds into a new wheelhouse")  # fmt: skip
        else:
            fix = "re-publish the affected wheels into a new wheelhouse; remove files you did not publish"
        shown = [printable(p) for p in problems]  # a planted file's name may hold a newline or ESC
        raise WheelhouseError(f"{house} failed verification:\n    " + "\n    ".join(shown), fix)
    found = read_manifest(house)  # verified above: its signer is the key that signed it (check_signer)
    assert found is not None
    manifest = found[1]
    extra = "".join(f", {len(table)} {what}" for table, what in ((manifest.images, "images"),
                    (manifest.variants, "variant wheels")) if table)  # fmt: skip
    output.step(f"{house}: {len(manifest.wheels)} wheels{extra}; signature, hashes, metadata, smoke reports, index, "
                "page and manifest agree")  # fmt: skip
    k = signing.keys()
    whose = " (this host's key)" if k.exists() and k.key().line() == manifest.signer else ""
    output.step(f"signed by {fingerprint_of(manifest.signer)}{whose}: serial {manifest.serial}, valid until "
                f"{manifest.expires}; wheelhouse id {manifest.wheelhouse_id}")  # fmt: skip
    return 0


def sign(args: argparse.Namespace) -> int:
    from builder import signing
    from builder.errors import RecipeError
    from builder.wheelhouse.publish import resign

    days = args.days if args.days is not None else signing.sign_days()
    if not 1 <= days <= 3660:
        raise RecipeError(f"--days {days} is not from 1 to 3660", "give how many days the signature stays valid")
    manifest = resign(args.wheelhouse, days, adopt=args.adopt, new_id=args.new_id)
    if args.new_id:
        output.note(f"{args.wheelhouse} is now wheelhouse {manifest.wheelhouse_id}: a node that read it before "
                    f"refuses it until told once, `--wheelhouse-id {manifest.wheelhouse_id}` (provision tells "
                    "it)")  # fmt: skip
    output.step(f"{args.wheelhouse}: manifest signed by {signing.keys().key().fingerprint()}: serial "
                f"{manifest.serial}, valid until {manifest.expires}")  # fmt: skip
    return 0


def key(args: argparse.Namespace) -> int:
    from builder import signing
    from builder.errors import TrustError, UsageError

    k = signing.keys()
    if args.action == "create":
        signing.create(k)
    elif args.action == "rotate":
        if not k.exists():
            raise TrustError(f"no signing key in {k.folder} to rotate", "`python -m builder key create`")
        old = k.key()
        new = signing.create(k, rotate=True)
        output.note(
            f"the old key {old.fingerprint()} stays trusted until you revoke it: give nodes the new "
            f"allowed_signers ({k.trust_file}), re-sign every wheelhouse (`python -m builder sign`), then "
            f"`python -m builder key revoke {old.fingerprint()}`; this host now signs with {new.fingerprint()}"
        )
    elif args.action == "trust":
        if not args.value:
            raise UsageError("key trust needs the key line", "python -m builder key trust 'ssh-ed25519 AAAA...'")
        added = signing.trust_key(k, args.value)
        output.step(f"this host now trusts {added.fingerprint()} ({k.trust_file})")
    elif args.action == "revoke":
        if not args.value:
            raise UsageError("key revoke needs the key's fingerprint", "python -m builder key revoke SHA256:...")
        gone = signing.revoke_key(k, args.value)
        output.step(f"revoked {gone.fingerprint()}: give nodes the new {k.trust_file}; its signatures are refused")
    if args.action == "show" or args.action in ("trust", "revoke"):
        if not k.exists():
            raise TrustError(f"no signing key in {k.folder}", "make one: `python -m builder key create` (the "
                             "first publish makes one too)")  # fmt: skip
        trust = k.trust()
        output.step(f"signing key {k.private} ({k.key().fingerprint()}); trusted: {trust.describe()}")
        if trust.revoked:
            output.note(f"revoked: {', '.join(r.fingerprint() for r in trust.revoked)}")
        output.note(f"nodes: --trust '{k.key().line()}', or --trust with a copy of {k.trust_file} (every trusted and "
                    "revoked key), installed on nodes as /etc/ds-node-install/allowed_signers")  # fmt: skip
        output.result(k.key().line())
    return 0


def repair(args: argparse.Namespace) -> int:
    from builder.wheelhouse import repair as repair_wheelhouse

    removed = repair_wheelhouse(args.wheelhouse)
    output.step(f"{args.wheelhouse}: removed {len(removed)} leftovers; index rewritten from manifest.json")
    return 0


def lock(args: argparse.Namespace) -> int:
    from builder.wheelhouse.lock import lock as lock_wheel

    ws = _workspace(args)
    lock_wheel(args.wheelhouse, args.wheel, ws.logs / "lock.log")
    return 0


def image(args: argparse.Namespace) -> int:
    from builder.images.build import build_image

    ws = _workspace(args)
    result = build_image(args.wheelhouse, ws, lock=args.lock, wheel=args.wheel, base=args.base,
                         publish=not args.no_publish, verbose=args.verbose, smoke=not args.no_smoke,
                         squashfs=args.squashfs)  # fmt: skip
    where = result.archive or "(not published: --no-publish)"
    output.step(f"image {result.ref}: ID {result.image_id[:12]}, {result.size / 1e6:.0f} MB archive (sha256 "
                f"{result.sha256[:16]}...) {where}")  # fmt: skip
    if result.squashfs_sha256:
        output.step(f"squashfs {result.squashfs_size / 1e6:.0f} MB (sha256 {result.squashfs_sha256[:16]}...) "
                    f"{result.squashfs or '(not published: --no-publish)'}")  # fmt: skip
    if result.archive is not None:
        output.result(f"load it with: podman load -i {result.archive}  (or docker load -i ...)")
        if result.squashfs is not None:
            output.result(f"run it with Slurm (Pyxis): srun --container-image={result.squashfs} python -c "
                          "'import deepspeed'")  # fmt: skip
    return 0


def prune(args: argparse.Namespace) -> int:
    from builder.errors import RecipeError
    from builder.recipe import load_recipe
    from builder.wheelhouse import prune as prune_wheelhouse
    from builder.wheelhouse.lock import locked_wheels

    folder: Path = args.recipes_dir
    if not folder.is_dir():
        raise RecipeError(f"the recipes folder {folder} does not exist (prune keeps the wheels of its recipes)",
                          "run prune from the checkout that holds recipes/, or pass --recipes-dir")  # fmt: skip
    names = [load_recipe(p).name for p in sorted(folder.glob("*.toml"))]
    if not names:
        raise RecipeError(f"{folder} holds no recipe (*.toml): prune would keep nothing",
                          "pass --recipes-dir with the folder of your recipes")  # fmt: skip
    gone = prune_wheelhouse(args.wheelhouse, names, locked_wheels(args.wheelhouse), args.dry_run, args.remove_all)
    verb = "would remove" if args.dry_run else "removed"
    output.result("\n".join(f"{verb} {name}" for name in gone))
    output.step(f"{verb} {len(gone)} wheels; kept those of recipes {', '.join(names)} and of locks")
    return 0


def provision(args: argparse.Namespace) -> int:
    from builder.errors import RecipeError
    from builder.wheelhouse import provision as prov

    ws = _workspace(args)
    url = args.url or str(args.wheelhouse.resolve())
    if args.launcher == "slurm":
        return _provision_slurm(args, ws, url)
    if args.hostfile is None:
        raise RecipeError("provision needs --hostfile (or --launcher slurm with --partition or --nodelist)",
                          "pass a DeepSpeed hostfile: `host slots=N` a line")  # fmt: skip
    try:
        text = args.hostfile.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ToolError(
            f"cannot read the hostfile {args.hostfile}: {exc}", "pass --hostfile with a readable file"
        ) from exc
    hosts = prov.parse_hostfile(text, str(args.hostfile))
    if args.module:
        hosts = _once(hosts, [h.name for h in hosts])
    prov.installer_sha256(args.wheelhouse)  # the wheelhouse verifies here before any node is asked to trust it
    scripts = prov.write(hosts, url, args.out, _provision_trust(), _wheelhouse_id(args.wheelhouse), args.module or "")
    output.step(f"wrote {len(scripts)} host scripts in {args.out}/ for wheelhouse {url}")
    if args.run:
        outcomes = prov.run(hosts, args.out, args.launcher, ws.logs / "provision.log", args.ssh_config)
        return _provision_report(outcomes, "hosts", ws.logs / "provision.log")
    return 0


def _once(items: list[Any], names: list[str]) -> list[Any]:
    """A module goes on a shared tree: it is installed from the first host alone, not from each."""
    output.step(f"--module: the module is installed once, from {names[0]} (the tree it names is shared); "
                f"{len(names) - 1} other host(s) load it from there")  # fmt: skip
    return items[:1]


def _provision_report(outcomes: list[Any], what: str, log: Path) -> int:
    """One line per host or node: the wheel it installed, or why not; an error unless all installed."""
    done = [o.node for o in outcomes if o.installed]
    output.step(f"installed on {len(done)}/{len(outcomes)} {what}: {', '.join(done) or 'none'}")
    for o in outcomes:
        output.note(f"  {o.node}: {'installed ' if o.installed else 'NOT installed: '}{o.detail}")
    failed = [o.node for o in outcomes if not o.installed]
    if failed:
        raise ToolError(f"provisioning did not finish on {len(failed)} of {len(outcomes)} {what}: "
                        f"{', '.join(failed)} (log {log})",
                        "fix what each one's line above says, then run provision again (the others are left as "
                        "they are)")  # fmt: skip
    return 0


def _provision_trust() -> Any:
    """The keys provision scripts carry: this host's trusted keys (its own first) and revoked ones."""
    from builder import signing

    trust = signing.keys().trust()
    if not trust.keys:
        raise WheelhouseError("this host has no signing key to give the nodes", "publish first, or `python -m "
                              "builder key create`")  # fmt: skip
    return trust


def _wheelhouse_id(wheelhouse: Path) -> str:
    """The id of the (verified) wheelhouse the nodes are told to accept, and no other."""
    from builder.wheelhouse.layout import load_manifest

    return load_manifest(wheelhouse).wheelhouse_id


def _provision_slurm(args: argparse.Namespace, ws: Workspace, url: str) -> int:
    from builder.errors import RecipeError
    from builder.files import write_atomic
    from builder.wheelhouse import provision as prov

    if args.hostfile is not None or not (args.partition or args.nodelist):
        raise RecipeError("--launcher slurm installs on a partition's or a nodelist's nodes, not a hostfile's",
                          "pass --partition NAME or --nodelist LIST (and no --hostfile)")  # fmt: skip
    prov.installer_sha256(args.wheelhouse)
    host = prov.Host("every node", python=args.python or "python3")
    script = write_atomic(args.out / "node.sh", prov.host_script(host, url, _provision_trust(), json_result=True,
                                                                 wheelhouse_id=_wheelhouse_id(args.wheelhouse),
                                                                 module=args.module or ""), mode=0o755)  # fmt: skip
    output.step(f"wrote {script} for wheelhouse {url}")
    if not args.run:
        return 0
    nodes, down = prov.slurm_nodes(args.partition, args.nodelist)
    if down:
        output.warn(f"skipping {len(down)} nodes Slurm reports down or draining: {', '.join(down)}")
    if args.module and nodes:
        nodes = _once(nodes, nodes)
    outcomes = prov.run_slurm(nodes, args.partition, script.resolve(), args.out, ws.logs / "provision.log")
    return _provision_report(outcomes, "nodes", args.out / "logs")


def bench(args: argparse.Namespace) -> int:
    from builder.bench import bench as run_bench
    from builder.bench import bench_all_ops, bench_slurm
    from builder.recipe import load_recipe

    if args.all_ops:
        bench_all_ops(load_recipe(args.recipe), args.out.resolve())
        return 0
    if args.slurm_matrix:
        bench_slurm(args.slurm_matrix.resolve(), args.out.resolve())
        return 0
    if args.cluster:
        from builder.bench import bench_cluster

        bench_cluster(args.cluster.resolve(), args.out.resolve(), args.installs, args.dry_runs)
        return 0
    if args.image:
        from builder.bench import bench_image

        bench_image(args.wheelhouse.resolve(), args.out.resolve())
        return 0
    run_bench(load_recipe(args.recipe), args.out.resolve(), args.runs,
              load_recipe(args.full_ops) if args.full_ops else None)  # fmt: skip
    return 0


def serve(args: argparse.Namespace) -> int:
    from builder.wheelhouse.serve import serve as serve_wheelhouse

    serve_wheelhouse(args.wheelhouse, args.bind, args.port)
    return 0


def _newest_wheel(dist: Path) -> Path:
    wheels = sorted(dist.glob("*.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        raise SmokeError(f"no wheels in {dist}", "build one first: python -m builder build-wheel")
    return wheels[-1]


def _passed_wheels(dist: Path) -> list[Path]:
    from builder.smoke import report_path
    from builder.wheelhouse import passing_report

    passed = []
    for wheel in sorted(dist.glob("*.whl")):
        if not report_path(wheel).is_file():
            continue
        try:
            passing_report(wheel)
            passed.append(wheel)
        except PublishError as exc:
            output.note(f"skipping {wheel.name}: {exc.message}")
    if not passed:
        raise PublishError(f"no smoke-passed wheels in {dist}", "run build-wheel, or smoke on a built wheel")
    return passed


def gather(args: argparse.Namespace) -> int:
    from builder import offline
    from builder.recipe import load_recipe

    recipe = load_recipe(args.recipe)
    try:
        text = args.have.read_text(encoding="utf-8", errors="replace") if args.have else ""
    except OSError as exc:
        raise UsageError(f"cannot read --have {args.have}: {exc.strerror or exc}",
                         "pass a file holding the node's `python -m pip freeze`") from exc  # fmt: skip
    have = offline.parse_freeze(text, str(args.have)) if args.have else {}
    ws = _workspace(args, check=False)
    ws.logs.mkdir(parents=True, exist_ok=True)
    offline.gather(recipe, args.dest.resolve(), args.python, have, ws.logs / "gather.log", args.verbose)
    return 0


HANDLERS = {
    "build-wheel": build_wheel,
    "gather": gather,
    "slurm-collect": slurm_collect,
    "slurm-task": slurm_task,
    "slurm-units": slurm_units,
    "slurm-smoke": slurm_smoke,
    "slurm-status": slurm_status,
    "smoke": smoke,
    "check-config": check_config,
    "publish": publish,
    "detect": detect,
    "toolchain": toolchain,
    "verify": verify,
    "sign": sign,
    "key": key,
    "repair": repair,
    "lock": lock,
    "image": image,
    "prune": prune,
    "provision": provision,
    "bench": bench,
    "serve": serve,
}
