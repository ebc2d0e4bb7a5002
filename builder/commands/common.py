"""Helpers the handlers share: the work folder, the trust a command is given, the wheels of dist/.

Errors are raised, never printed here; `cli.main` turns them into one message and an exit code.
Each handler imports what it needs: a command's start stays fast."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from builder import output
from builder.errors import PublishError, SmokeError
from builder.workspace import Workspace


def _workspace(args: argparse.Namespace, check: bool = True) -> Workspace:
    """The work folder, judged as given (another user's link on its way is seen before it is resolved)."""
    if check:
        Workspace(args.work_dir).check_writable()
    return Workspace(args.work_dir.resolve())


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


def _publish_coverage(wheelhouse: Path, report: Path) -> None:
    from builder.wheelhouse.extras import publish_coverage

    published = publish_coverage(wheelhouse.resolve(), report)
    if published:
        output.note(f"coverage published to {published} (shown on {published.parent / 'index.html'})")


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


def _wheelhouse_id(wheelhouse: Path) -> str:
    """The id of the (verified) wheelhouse the nodes are told to accept, and no other."""
    from builder.wheelhouse.layout import load_manifest

    return load_manifest(wheelhouse).wheelhouse_id
