"""smoke: prove a wheel in a brand-new environment before it may be published.

The wheel is installed with the torch it was built against (read from its embedded manifest);
`smoke_checks.py` then runs there with an empty TORCH_EXTENSIONS_DIR. The report is written next
to the wheel as `<wheel>.smoke.json`, bound to the wheel's sha256 so publish can trust it.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from packaging.version import Version

from builder import cmd, configs, envs, output, reference
from builder.contracts import BuildManifest, Check, SmokeReport, verdict
from builder.errors import SmokeError, UsageError
from builder.files import is_file_here, sha256_of, write_atomic
from builder.node import CHECK_STATUSES, Fields, ManifestError, TooLarge, format_configs, read_bounded
from builder.recipe import TorchSpec
from builder.resources import report_after, resource
from builder.workspace import Workspace

CHECKS_SCRIPT = resource("smoke_checks.py")
DIST_WORKER = resource("smoke_dist.py")
# What the quantized-load checks need besides the wheel; bitsandbytes pinned to the version
# whose CPU backend was measured here (0.50.2).
SMOKE_EXTRAS = ("transformers>=5,<6", "accelerate>=1.10", "bitsandbytes==0.50.2", "safetensors>=0.4")
MARKER = "==== smoke json ===="


def report_path(wheel: Path) -> Path:
    return wheel.with_name(wheel.name + ".smoke.json")


def parse_checks(output: str) -> tuple[Check, ...]:
    """The checks the smoke script printed after its marker, each validated."""
    try:
        data = report_after(output, MARKER)
    except ValueError as exc:
        raise SmokeError(f"the smoke checks {exc}", "read the smoke log") from exc
    checks = []
    for i, item in enumerate(data):
        f = Fields(item, f"smoke check {i}")
        try:
            checks.append(Check(f.get("name", str), f.choice("status", CHECK_STATUSES), f.get("detail", str)))
        except ManifestError as exc:
            raise SmokeError(exc.message, "read the smoke log") from exc
    return tuple(checks)


def smoke_spec(manifest: BuildManifest) -> dict[str, Any]:
    return {
        "version": manifest.version,
        "ops": list(manifest.ops),
        "accelerator": manifest.accelerator,
        "torch": {"version": manifest.torch_version, "cuda": manifest.torch_cuda},
        "dist_worker": str(DIST_WORKER),
    }


def load_report(wheel: Path) -> SmokeReport | None:
    """The wheel's smoke report, validated; None when there is none."""
    path = report_path(wheel)
    try:
        text = read_bounded(path, "report")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SmokeError(f"cannot read {path}: {exc.strerror}", "check the file's permissions") from exc
    except TooLarge as exc:
        raise SmokeError(str(exc), "smoke the wheel again: no smoke report is that large") from exc
    try:
        return SmokeReport.from_json(text, str(path))
    except ManifestError as exc:
        raise SmokeError(exc.message, f"smoke the wheel again: python -m builder smoke {wheel}") from exc


def interpreter_for(python_tag: str) -> Path | None:
    """The interpreter a wheel for `python_tag` is smoked with: the builder's own when it fits
    (None), else that Python found on this machine."""
    from builder.targets import find_interpreter, this_interpreter

    if this_interpreter().tag == python_tag:
        return None
    return find_interpreter(f"{python_tag[2]}.{python_tag[3:]}").path


def without_toolkit(env: dict[str, str]) -> dict[str, str]:
    """A GPU node's environment: the driver and torch's pip CUDA libraries, but no CUDA toolkit
    (CUDA_HOME and CUDA_PATH unset, no nvcc on PATH), where a CUDA wheel must import and load."""
    out = {k: v for k, v in env.items() if k not in ("CUDA_HOME", "CUDA_PATH")}
    out["PATH"] = os.pathsep.join(
        d for d in env.get("PATH", "").split(os.pathsep) if d and not is_file_here(Path(d) / "nvcc")
    )
    return out


def wheel_env(wheel: Path, manifest: BuildManifest, tmp: Path, log: Path, verbose: bool,
              extras: Sequence[str] = ()) -> tuple[Path, dict[str, str]]:  # fmt: skip
    """A new venv in `tmp` holding the wheel and the torch it was built against (and `extras`), and
    the environment to run in it: run_folders, the wheel's accelerator, and on CUDA no toolkit."""
    system = manifest.recipe_torch == "system"
    # The public version: pip's files may be named 2.14.1 while torch reports 2.14.1+cu130; a recipe
    # that named its build (variant) gets that build again, from the same index.
    torch = TorchSpec(Version(manifest.torch_version).public, manifest.torch_variant, manifest.torch_index)
    venv = envs.create(
        tmp / "venv", [torch.requirement, str(wheel), *extras], log, verbose, system_site_packages=system,
        base=interpreter_for(manifest.python_tag), index=envs.torch_index(torch),
    )  # fmt: skip
    env = {**envs.venv_environ(venv), **run_folders(tmp), "DS_ACCELERATOR": manifest.accelerator}
    if manifest.accelerator == "cuda":
        env = without_toolkit(env)
    return venv, env


def run_folders(tmp: Path) -> dict[str, str]:
    """An empty TORCH_EXTENSIONS_DIR (what DeepSpeed compiles at first use shows there), a TMPDIR and
    a bytecode folder (WRITE_BYTECODE), all in `tmp`, which the caller removes: what DeepSpeed,
    torchrun and inductor write to a temporary folder goes with it (the smoke's 91 configs left
    thousands of folders in /tmp)."""
    folders = {
        "TORCH_EXTENSIONS_DIR": tmp / "torch_extensions",
        "TMPDIR": tmp / "tmp",
        "PYTHONPYCACHEPREFIX": tmp / "pycache",
    }
    for folder in folders.values():
        folder.mkdir()
    return {**{name: str(folder) for name, folder in folders.items()}, **WRITE_BYTECODE}


# Python's compiled modules are written once into a folder of the run's own (PYTHONPYCACHEPREFIX, in
# run_folders), never beside the packages, and read by every later process of the run. Images often hold
# torch with no .pyc and set PYTHONDONTWRITEBYTECODE, so each process compiled torch and DeepSpeed from
# source again: 55% of a config's time on an H100 node, where every config's ranks are spawned (a CUDA
# context cannot be forked). Python reads an empty PYTHONDONTWRITEBYTECODE as unset.
WRITE_BYTECODE = {"PYTHONDONTWRITEBYTECODE": ""}


def no_compiler(env: Mapping[str, str], python: Path) -> dict[str, str]:
    """As on a node with no compiler: PATH holds only the environment's own programs, so a compile
    at first use that got past the config runner's guards (torch.compile's inductor) fails."""
    out = {k: v for k, v in env.items() if k not in ("CC", "CXX", "CUDAHOSTCXX")}
    out["PATH"] = str(python.parent)
    return out


def built_wheel(wheel: Path) -> tuple[Path, BuildManifest]:
    """The wheel's absolute path and its embedded build manifest; SmokeError for anything else."""
    wheel = wheel.resolve()
    if not wheel.is_file():
        raise UsageError(f"no such wheel: {wheel}", "pass the path of a built wheel, e.g. work/dist/*.whl")
    try:
        return wheel, BuildManifest.from_wheel(wheel)
    except ManifestError as exc:  # a file given by hand that is no wheel build-wheel made: the argument is wrong
        raise UsageError(exc.message, "pass a wheel build-wheel made (work/dist/*.whl); rebuild this one") from exc


def check_configs(files: Sequence[Path], ws: Workspace, wheel: Path | None = None, python: Path | None = None,
                  verbose: bool = False, timeout: float = configs.TIMEOUT) -> list[configs.Outcome]:  # fmt: skip
    """check-config: run each config file against a wheel (a fresh venv, as the smoke) or against
    the DeepSpeed installed for `python` (a node), with no compiler and an empty extensions folder."""
    return run_cases([configs.read_config(f) for f in files], ws, wheel, python, verbose, timeout)


def run_cases(cases: Sequence[configs.ConfigCase], ws: Workspace, wheel: Path | None = None,
              python: Path | None = None, verbose: bool = False,
              timeout: float = configs.TIMEOUT) -> list[configs.Outcome]:  # fmt: skip
    """The configs run against a wheel's fresh venv (torch and the wheel only) or `python`'s DeepSpeed."""
    ws.logs.mkdir(parents=True, exist_ok=True)
    ws.scratch.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="check-config-", dir=ws.scratch))
    log = ws.logs / "check-config.log"
    output.note(f"full log: {log}")
    try:
        if wheel is not None:
            wheel, manifest = built_wheel(wheel)
            accelerator: str | None = manifest.accelerator
            venv, env = wheel_env(wheel, manifest, tmp, log, verbose)
            python = envs.python_in(venv)
        else:
            python = Path(python or sys.executable)
            if not is_file_here(python):
                raise UsageError(f"no such interpreter: {python}", "pass --python with the node environment's python")
            has = cmd.ask([str(python), "-c", "import deepspeed"], timeout=600)
            if has.returncode != 0:
                said = (has.stderr or has.stdout or "").strip().splitlines()
                raise UsageError(f"{python} cannot import DeepSpeed ({said[-1][:200] if said else 'no output'}): "
                                 "there is nothing installed to check the configs against",
                                 "pass --python with the environment DeepSpeed is installed in, or --wheel WHEEL to "
                                 "check a wheel in a fresh environment")  # fmt: skip
            accelerator = None
            env = {**os.environ, **run_folders(tmp)}
        return configs.run(python, cases, accelerator, env=no_compiler(env, python), cwd=tmp, log=log,
                           verbose=verbose, timeout=timeout)  # fmt: skip
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def smoke(wheel: Path, ws: Workspace, verbose: bool = False, keep_env: bool = False) -> SmokeReport:
    """Install `wheel` in a fresh venv, run the checks, write and return the report."""
    start = time.monotonic()
    wheel, manifest = built_wheel(wheel)
    log = ws.logs / f"{wheel.name}.smoke.log"
    ws.logs.mkdir(parents=True, exist_ok=True)
    ws.scratch.mkdir(parents=True, exist_ok=True)
    log.unlink(missing_ok=True)
    output.step(f"smoke: {wheel.name}; full log: {log}")
    tmp = Path(tempfile.mkdtemp(prefix="smoke-", dir=ws.scratch))
    try:
        venv, env = wheel_env(wheel, manifest, tmp, log, verbose, SMOKE_EXTRAS)
        said = cmd.run(
            [envs.python_in(venv), CHECKS_SCRIPT, json.dumps(smoke_spec(manifest))],
            env=env,
            cwd=tmp,
            log=log,
            verbose=verbose,
        )
        checks = parse_checks(said) + config_checks(manifest, envs.python_in(venv), env, tmp, log, verbose, ws)
    finally:
        if keep_env:
            output.note(f"kept the smoke environment at {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    report = SmokeReport(
        wheel=wheel.name,
        sha256=sha256_of(wheel),
        passed=verdict(checks),
        checks=checks,
        seconds=round(time.monotonic() - start, 1),
        finished_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    )
    write_atomic(report_path(wheel), report.to_json())
    _print(report)
    if not report.passed:
        failed = [c.name for c in checks if c.status == "failed"]
        upstream = [c.name for c in checks if c.status == "failed" and c.detail.startswith("DeepSpeed's own failure")]
        raise SmokeError(
            f"{wheel.name} failed smoke checks: {', '.join(failed) or 'nothing passed'}"
            + (f" ({', '.join(upstream)}: DeepSpeed's own failure, shown without the wheel)" if upstream else ""),
            (
                f"list {', '.join(n.removeprefix(configs.SITE_PREFIX) for n in upstream)} under [known_failures] in "
                "the recipe with a reason, or take it out of configs; "
                if upstream
                else ""
            )
            + f"read {report_path(wheel)} and the log {log}",
        )
    return report


def config_cases(manifest: BuildManifest) -> list[configs.ConfigCase]:
    """The smoke's configs: the matrix for the wheel's accelerator and ops, then the site's own
    (the recipe's `configs`, embedded in the wheel's manifest)."""
    site = manifest.data.get("configs") or {}
    return configs.matrix(manifest.accelerator, manifest.ops) + [
        configs.ConfigCase(str(name), config, "site")
        for name, config in sorted(site.items())
        if isinstance(config, dict)
    ]


def config_checks(manifest: BuildManifest, python: Path, env: dict[str, str], tmp: Path, log: Path, verbose: bool,
                  ws: Workspace, cases: Sequence[configs.ConfigCase] | None = None) -> tuple[Check, ...]:  # fmt: skip
    """Run every config from the wheel (each in its own processes, with an empty extensions folder)
    and make each a check: see configs.as_check for what fails the smoke. A config that fails is run
    again without the wheel (builder.reference) to tell DeepSpeed's own failures from the wheel's."""
    cases = config_cases(manifest) if cases is None else cases
    env = no_compiler(env, python)
    output.step(f"smoke: {len(cases)} DeepSpeed configs (optimizer x ZeRO stage x offload x dtype, and the recipe's)")
    start = time.monotonic()
    outcomes = configs.run(python, cases, manifest.accelerator, env=env, cwd=tmp, log=log, verbose=verbose)
    sites = {c.name for c in cases if c.source == "site"}
    passed = sum(o.status == "passed" for o in outcomes)
    output.note(f"  configs: {passed} of {len(outcomes)} ran from the wheel in {time.monotonic() - start:.0f}s")
    failed = [o for o in outcomes if o.status == "failed"]
    blames: dict[str, configs.Blame] = {}
    if failed:
        work = tmp / "reference"
        work.mkdir(exist_ok=True)
        blames = reference.blame(failed, cases, manifest, ws, interpreter_for(manifest.python_tag), run_folders(work),
                                 work, log, verbose)  # fmt: skip
    return tuple(configs.as_check(o, manifest.accelerator, o.name in sites, blames.get(o.name),
                                  known_reason(manifest.known_failures, o.name)) for o in outcomes)  # fmt: skip


def known_reason(known: Mapping[str, Mapping[str, str]], name: str) -> str:
    """The recipe's reason for a known failure, with its link; "" when the config is not listed."""
    entry = known.get(name)
    if not entry:
        return ""
    return entry["reason"] + (f" ({entry['link']})" if entry.get("link") else "")


def _print(report: SmokeReport) -> None:
    output.step(f"smoke {'PASSED' if report.passed else 'FAILED'} for {report.wheel} in {report.seconds:.0f}s")
    for c in report.checks:
        if c.name.startswith("config:") and c.status not in ("failed", "upstream"):
            continue  # collapsed below, a line per optimizer
        first = c.detail.splitlines()[0] if c.detail else ""
        output.note(f"  {c.status:7} {c.name:24} {first}")
    for line in format_configs(report.summary_checks()):
        output.note(f"  {line}")
