"""The stage order, in one place: build -> smoke -> publish, for each target of a run.

Every recipe is validated and every output folder checked before the first build, so a bad
recipe or an unwritable wheelhouse fails in a second, not after minutes of compiling. A stage is
skipped only when its result is already proven for the same bytes (build key, smoke report).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from builder import cmd, configs, output
from builder.errors import BuilderError, BuildError, PublishError
from builder.machines import is_cross
from builder.results import StageResult, TargetResult
from builder.targets import Target
from builder.workspace import Workspace, check_writable

if TYPE_CHECKING:
    from builder.build import BuildResult


@dataclass(frozen=True)
class Stages:
    smoke: bool = True
    publish: bool = True
    force: bool = False
    use_ccache: bool = True
    verbose: bool = False
    variants: bool = False  # also publish CUDA wheels as wheel variants (experimental)


def install_command(wheelhouse: Path, wheel: Path) -> str:
    """The one command a node runs to install `wheel` from the wheelhouse (torch already present)."""
    version = wheel.name.split("-")[1]
    return f"pip install --index-url {(wheelhouse / 'simple').resolve().as_uri()}/ deepspeed=={version}"


def smoke_passed(wheel: Path) -> bool:
    from builder.wheelhouse import passing_report

    try:
        passing_report(wheel)
        return True
    except PublishError:
        return False


def check_can_sign() -> None:
    """Publishing signs the manifest with ssh-keygen: without one, say so before minutes of building
    (GPU images often have no OpenSSH client; `--no-publish` builds and smokes without it)."""
    import shutil

    from builder.errors import TrustError
    from builder.signing import SSH_KEYGEN_FIX

    if shutil.which("ssh-keygen") is None:
        raise TrustError(
            "publishing signs the wheelhouse's manifest with ssh-keygen, which is not on PATH",
            f"{SSH_KEYGEN_FIX}; or build and smoke with --no-publish (they need no ssh-keygen)",
        )


def publish(wheels: Sequence[Path], wheelhouse: Path, ws: Workspace, variants: bool = False) -> list[Path]:
    from builder.wheelhouse import publish as publish_wheels
    from builder.wheelhouse.page import PAGE

    published = publish_wheels(wheels, wheelhouse, log=ws.logs / "publish.log", variants=variants)
    for path in published:
        output.step(f"install it with: {install_command(wheelhouse, path)}")
    if published:  # the run's last lines: where to look, and the key the node installer needs (README's node step)
        output.step(f"the wheelhouse's page: {(wheelhouse / PAGE).resolve().as_uri()}")
        output.step("nodes check the wheelhouse with this host's key: `python -m builder key show` prints it; the "
                    "node installer takes it as --trust \"$(python -m builder key show)\"")  # fmt: skip
    return published


# What one target needs to be worth running beside another: DeepSpeed builds extensions mostly one
# after another, so a target keeps about 8 cores busy (16 cores gave 1.5x over 2 on the H100
# machine); each compile job takes up to 3 GB.
CORES_PER_TARGET = 8
GB_PER_TARGET = 8 * 3.0


def auto_jobs(n_targets: int, cores: int, mem_gb: float | None) -> int:
    """Targets to run at once when the user does not say: as many as cores and memory allow (pure)."""
    jobs = max(1, cores // CORES_PER_TARGET)
    if mem_gb is not None:
        jobs = min(jobs, max(1, int(mem_gb // GB_PER_TARGET)))
    return max(1, min(jobs, n_targets))


def run(
    targets: Sequence[Target],
    ws: Workspace,
    wheelhouse: Path,
    stages: Stages,
    keep_going: bool = False,
    jobs: int = 1,
    cores: int | None = None,
) -> list[TargetResult]:
    """Build, smoke and publish each target. Without keep_going the first failure raises its own
    error; with it (a matrix) every target runs and its failure is recorded with the reason.
    `jobs` targets run at once, each compiling with its share of the cores (of `cores`: a Slurm
    task's allocation, default all of this machine's)."""
    ws.check_writable()
    if stages.smoke and stages.publish:
        check_writable(wheelhouse, "--wheelhouse")  # before minutes of building, not after
        check_can_sign()
    jobs = max(1, min(jobs, len(targets)))
    given = cores
    cores = max(1, (given or os.cpu_count() or 1) // jobs)
    if jobs == 1:
        return [_run_one(t, ws, wheelhouse, stages, keep_going, given) for t in targets]
    output.step(f"{len(targets)} targets, {jobs} at once, {cores} cores each")
    # A signal stops every target's commands at once, their units' compilers included (cmd.in_threads).
    return cmd.in_threads(lambda t: _run_one(t, ws, wheelhouse, stages, keep_going, cores), targets, jobs, "target")


def _run_one(
    target: Target, ws: Workspace, wheelhouse: Path, stages: Stages, keep_going: bool, cores: int | None
) -> TargetResult:
    from builder.smoke import smoke

    results: dict[str, StageResult] = {}
    wheel = published = None

    def failed(stage: str, exc: BuilderError, started: float) -> None:
        results[stage] = StageResult("failed", f"{exc.message} (fix: {exc.fix})" if exc.fix else exc.message,
                                     time.monotonic() - started)  # fmt: skip
        output.error(f"{target.name}: {stage} failed: {exc.message}")

    started = time.monotonic()
    try:
        built = build_for_configs(target, ws, stages, cores)
        wheel = built.wheel
        results["build"] = StageResult("reused" if built.reused else "passed",
                                       "same build key" if built.reused else "", built.seconds)  # fmt: skip
    except BuilderError as exc:
        if not keep_going:
            raise
        failed("build", exc, started)
    if wheel is None:
        results["smoke"] = StageResult("skipped", "the build failed")
    elif not stages.smoke:
        results["smoke"] = StageResult("skipped", "--no-smoke")
    else:
        started = time.monotonic()
        try:
            if results["build"].status == "reused" and smoke_passed(wheel):
                output.note(f"{wheel.name} already passed its smoke tests")
                results["smoke"] = StageResult("reused", "already passed for these bytes")
            else:
                smoke(wheel, ws, stages.verbose)
                results["smoke"] = StageResult("passed", "", time.monotonic() - started)
        except BuilderError as exc:
            if not keep_going:
                raise
            failed("smoke", exc, started)
    smoked = results["smoke"]
    if smoked.status not in ("passed", "reused"):
        why = "the smoke tests failed" if smoked.status == "failed" else smoked.reason
        results["publish"] = StageResult("skipped", why)
    elif not stages.publish:
        results["publish"] = StageResult("skipped", "--no-publish")
    else:
        started = time.monotonic()
        try:
            with _PUBLISH:  # one writer at a time within this process (the file lock covers others)
                (published,) = publish([wheel], wheelhouse, ws, stages.variants)  # type: ignore[list-item]
            results["publish"] = StageResult("passed", "", time.monotonic() - started)
        except BuilderError as exc:
            if not keep_going:
                raise
            failed("publish", exc, started)
    return TargetResult(
        target=target.name,
        recipe=target.recipe.name,
        python=target.python.version,
        wheel=wheel,
        stages=results,
        published=published,
        install_command=install_command(wheelhouse, published) if published else None,
    )


_PUBLISH = threading.Lock()
CONFIG_ROUNDS = 4  # each round adds what the configs loaded next; DeepSpeed's CPU engine needs at most 3


def build_for_configs(target: Target, ws: Workspace, stages: Stages, cores: int | None) -> BuildResult:
    """Build the target; when its recipe names configs, run them from the wheel (fresh venv, no
    compiler) and add every op they loaded that the wheel lacks, building again (the op units built
    so far are reused, so only the new ops compile) until each config runs or DeepSpeed refuses it.
    An op DeepSpeed cannot build here fails the build, naming the config."""
    import dataclasses

    from builder.build import build_wheel
    from builder.smoke import run_cases

    recipe = target.recipe
    cases = [configs.ConfigCase(name, json.loads(text), name) for name, text in recipe.configs]
    for _ in range(CONFIG_ROUNDS):
        try:
            built = build_wheel(recipe, ws, stages.verbose, stages.force, stages.use_ccache, target.python, cores)
        except BuilderError as exc:
            if not recipe.ops_from_configs:
                raise
            added = ", ".join(recipe.ops_from_configs)
            fix = exc.fix or "take the config out of the recipe's configs"
            raise BuildError(f"the configs of {recipe.name} load {added}; the build with them failed: {exc.message}",
                             fix) from exc  # fmt: skip
        if not cases or is_cross(recipe.machine):  # a wheel for another machine runs its configs in its smoke
            return built
        output.step(f"{recipe.name}: running its {len(cases)} configs from the wheel to find the ops they load")
        outcomes = run_cases(cases, ws, built.wheel, verbose=stages.verbose)
        needs = {o.name: o.jit for o in outcomes if o.status == "needs-op"}
        if not needs:
            return built
        new = sorted({op for ops in needs.values() for op in ops} - set(recipe.ops))
        which = "; ".join(f"{name} loads {', '.join(ops)}" for name, ops in needs.items())
        if not new or recipe.all_ops:
            raise BuildError(f"{which}, which the wheel of {recipe.name} does not hold and this build cannot add",
                             "the build log says why that op is not in the wheel; or drop the config")  # fmt: skip
        output.step(f"{recipe.name}: {which}: adding {', '.join(new)} to its ops and building again")
        recipe = dataclasses.replace(recipe, ops=(*recipe.ops, *new), ops_from_configs=(*recipe.ops_from_configs, *new))
    raise BuildError(f"the configs of {recipe.name} still load ops the wheel lacks after {CONFIG_ROUNDS} rounds",
                     f"add {', '.join(recipe.ops_from_configs)} and what the configs name to ops yourself")  # fmt: skip
