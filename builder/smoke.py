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
import tempfile
import time
from pathlib import Path
from typing import Any

from packaging.version import Version

from builder import cmd, envs, output
from builder.contracts import BuildManifest, Check, SmokeReport, verdict
from builder.errors import SmokeError
from builder.files import is_file_here, write_atomic
from builder.node import CHECK_STATUSES, Fields, ManifestError, TooLarge, read_bounded
from builder.resources import resource
from builder.wheelbuild.source import sha256_of
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
    _, sep, payload = output.rpartition(MARKER)
    if not sep:
        raise SmokeError("the smoke checks printed no report", "read the smoke log")
    # The report is one JSON line; what follows it (warnings printed at interpreter exit, such as
    # torch's "destroy_process_group() was not called") is not part of it.
    try:
        data, _ = json.JSONDecoder().raw_decode(payload.lstrip())
    except json.JSONDecodeError as exc:
        raise SmokeError(f"the smoke report is not valid JSON ({exc})", "read the smoke log") from exc
    if not isinstance(data, list):
        raise SmokeError("the smoke report is not a list of checks", "read the smoke log")
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


def smoke(wheel: Path, ws: Workspace, verbose: bool = False, keep_env: bool = False) -> SmokeReport:
    """Install `wheel` in a fresh venv, run the checks, write and return the report."""
    start = time.monotonic()
    wheel = wheel.resolve()
    if not wheel.is_file():
        raise SmokeError(f"no such wheel: {wheel}", "pass the path of a built wheel, e.g. build/dist/*.whl")
    try:
        manifest = BuildManifest.from_wheel(wheel)
    except ManifestError as exc:
        raise SmokeError(exc.message, "smoke only wheels built by build-wheel; rebuild this one") from exc
    log = ws.logs / f"{wheel.name}.smoke.log"
    ws.logs.mkdir(parents=True, exist_ok=True)
    ws.scratch.mkdir(parents=True, exist_ok=True)
    log.unlink(missing_ok=True)
    output.step(f"smoke: {wheel.name}; full log: {log}")
    tmp = Path(tempfile.mkdtemp(prefix="smoke-", dir=ws.scratch))
    try:
        system = manifest.recipe_torch == "system"
        # The public version: pip's files may be named 2.14.1 while torch reports 2.14.1+cu130.
        torch_req = f"torch=={Version(manifest.torch_version).public}"
        venv = envs.create(
            tmp / "venv", [torch_req, str(wheel), *SMOKE_EXTRAS], log, verbose, system_site_packages=system,
            base=interpreter_for(manifest.python_tag),
        )  # fmt: skip
        ext_dir = tmp / "torch_extensions"
        ext_dir.mkdir()
        env = envs.venv_environ(venv)
        env.update({"TORCH_EXTENSIONS_DIR": str(ext_dir), "DS_ACCELERATOR": manifest.accelerator})
        if manifest.accelerator == "cuda":
            env = without_toolkit(env)
        said = cmd.run(
            [envs.python_in(venv), CHECKS_SCRIPT, json.dumps(smoke_spec(manifest))],
            env=env,
            cwd=tmp,
            log=log,
            verbose=verbose,
        )
        checks = parse_checks(said)
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
        raise SmokeError(
            f"{wheel.name} failed smoke checks: {', '.join(failed) or 'nothing passed'}",
            f"read {report_path(wheel)} and the log {log}",
        )
    return report


def _print(report: SmokeReport) -> None:
    output.step(f"smoke {'PASSED' if report.passed else 'FAILED'} for {report.wheel} in {report.seconds:.0f}s")
    for c in report.checks:
        first = c.detail.splitlines()[0] if c.detail else ""
        output.note(f"  {c.status:7} {c.name:24} {first}")
