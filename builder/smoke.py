"""smoke: prove a wheel in a brand-new environment before it may be published.

The wheel is installed with the torch it was built against (read from its embedded manifest);
`smoke_checks.py` then runs there with an empty TORCH_EXTENSIONS_DIR. The report is written next
to the wheel as `<wheel>.smoke.json`, bound to the wheel's sha256 so publish can trust it.
"""

from __future__ import annotations

import datetime
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from packaging.version import Version

from builder import cmd, envs
from builder.errors import SmokeError
from builder.source import sha256_of
from builder.wheelfile import read_manifest
from builder.workspace import Workspace

CHECKS_SCRIPT = Path(__file__).with_name("smoke_checks.py")
DIST_WORKER = Path(__file__).with_name("smoke_dist.py")
# What the quantized-load checks need besides the wheel; bitsandbytes pinned to the version
# whose CPU backend was measured here (0.50.2).
SMOKE_EXTRAS = ("transformers>=5,<6", "accelerate>=1.10", "bitsandbytes==0.50.2", "safetensors>=0.4")
MARKER = "==== smoke json ===="


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # passed | failed | skipped
    detail: str = ""


@dataclass(frozen=True)
class SmokeReport:
    wheel: str
    sha256: str
    passed: bool
    checks: tuple[Check, ...]
    seconds: float
    finished_at: str

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> SmokeReport:
        data = json.loads(text)
        data["checks"] = tuple(Check(**c) for c in data["checks"])
        return cls(**data)


def report_path(wheel: Path) -> Path:
    return wheel.with_name(wheel.name + ".smoke.json")


def parse_checks(output: str) -> tuple[Check, ...]:
    _, sep, payload = output.rpartition(MARKER)
    if not sep:
        raise SmokeError("the smoke checks printed no report", "read the smoke log")
    # The report is one JSON line; what follows it (warnings printed at interpreter exit, such as
    # torch's "destroy_process_group() was not called") is not part of it.
    try:
        data, _ = json.JSONDecoder().raw_decode(payload.lstrip())
    except json.JSONDecodeError as exc:
        raise SmokeError(f"the smoke report is not valid JSON ({exc})", "read the smoke log") from exc
    return tuple(Check(**c) for c in data)


def verdict(checks: Sequence[Check]) -> bool:
    """Passed only if something ran and nothing failed; a skip is reported, never a pass on its own."""
    return any(c.status == "passed" for c in checks) and not any(c.status == "failed" for c in checks)


def smoke_spec(manifest: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "version": manifest["version"],
        "ops": manifest["ops"],
        "accelerator": manifest["accelerator"],
        "torch": manifest["torch"],
        "dist_worker": str(DIST_WORKER),
    }


def smoke(wheel: Path, ws: Workspace, verbose: bool = False, keep_env: bool = False) -> SmokeReport:
    """Install `wheel` in a fresh venv, run the checks, write and return the report."""
    start = time.monotonic()
    wheel = wheel.resolve()
    if not wheel.is_file():
        raise SmokeError(f"no such wheel: {wheel}", "pass the path of a built wheel, e.g. build/dist/*.whl")
    manifest = read_manifest(wheel)
    log = ws.logs / f"{wheel.name}.smoke.log"
    ws.logs.mkdir(parents=True, exist_ok=True)
    ws.scratch.mkdir(parents=True, exist_ok=True)
    log.unlink(missing_ok=True)
    print(f"==> smoke: {wheel.name}; full log: {log}", file=sys.stderr)
    tmp = Path(tempfile.mkdtemp(prefix="smoke-", dir=ws.scratch))
    try:
        system = manifest["recipe"]["torch"] == "system"
        # The public version: pip's files may be named 2.14.1 while torch reports 2.14.1+cu130.
        torch_req = f"torch=={Version(manifest['torch']['version']).public}"
        venv = envs.create(
            tmp / "venv", [torch_req, str(wheel), *SMOKE_EXTRAS], log, verbose, system_site_packages=system
        )
        ext_dir = tmp / "torch_extensions"
        ext_dir.mkdir()
        env = envs.venv_environ(venv)
        env.update({"TORCH_EXTENSIONS_DIR": str(ext_dir), "DS_ACCELERATOR": manifest["accelerator"]})
        output = cmd.run(
            [envs.python_in(venv), CHECKS_SCRIPT, json.dumps(smoke_spec(manifest))],
            env=env,
            cwd=tmp,
            log=log,
            verbose=verbose,
        )
        checks = parse_checks(output)
    finally:
        if keep_env:
            print(f"  kept the smoke environment at {tmp}", file=sys.stderr)
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
    _write_atomic(report_path(wheel), report.to_json())
    _print(report)
    if not report.passed:
        failed = [c.name for c in checks if c.status == "failed"]
        raise SmokeError(
            f"{wheel.name} failed smoke checks: {', '.join(failed) or 'nothing passed'}",
            f"read {report_path(wheel)} and the log {log}",
        )
    return report


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def _print(report: SmokeReport) -> None:
    print(
        f"==> smoke {'PASSED' if report.passed else 'FAILED'} for {report.wheel} in {report.seconds:.0f}s",
        file=sys.stderr,
    )
    for c in report.checks:
        first = c.detail.splitlines()[0] if c.detail else ""
        print(f"    {c.status:7} {c.name:24} {first}", file=sys.stderr)
