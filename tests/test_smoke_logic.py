"""The smoke verdict, and the numeric comparison the smoke checks run (torch needed, no DeepSpeed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.contracts import Check, SmokeReport, verdict
from builder.errors import SmokeError
from builder.smoke import parse_checks


def test_verdict() -> None:
    assert verdict([Check("import", "passed"), Check("gpu", "skipped", "no GPU")])
    assert not verdict([Check("import", "passed"), Check("load:cpu_adam", "failed", "boom")])
    assert not verdict([Check("gpu", "skipped", "no GPU")])  # nothing ran: not a pass
    assert not verdict([])


def test_report_round_trip() -> None:
    name = "deepspeed-0.19.8+cpu.torch2.13-cp311-cp311-linux_x86_64.whl"
    report = SmokeReport(name, "ab" * 32, True, (Check("import", "passed", "ok"),), 1.5, "2026-11-22T00:00:00+00:00")
    assert SmokeReport.from_json(report.to_json(), "r.json") == report


def test_parse_checks() -> None:
    out = 'noise\n==== smoke json ====\n[{"name": "import", "status": "passed", "detail": "x"}]\n'
    assert parse_checks(out) == (Check("import", "passed", "x"),)
    # As seen on the GPU machine: torch warns at exit, after the report.
    warned = out + "[rank0]:[W1122 ProcessGroupNCCL.cpp:1575] Warning: destroy_process_group() was not called\n"
    assert parse_checks(warned) == (Check("import", "passed", "x"),)
    with pytest.raises(SmokeError, match="not valid JSON"):
        parse_checks("==== smoke json ====\n[{broken\n")
    with pytest.raises(SmokeError, match="no report"):
        parse_checks("crashed before the report\n")


torch = pytest.importorskip("torch", reason="torch is installed by the tests session; needed for numerics")


def test_comparison_catches_a_wrong_optimizer() -> None:
    from builder.resources.smoke.numerics import compare

    same = compare(
        lambda ps: torch.optim.Adam(ps, lr=1e-2),
        lambda ps: torch.optim.Adam(ps, lr=1e-2),
    )
    # Identical optimizers agree (to the last bit when run alone; torch's thread pool under a loaded
    # xdist run was seen to differ by 3e-06 once): well inside the tolerance either way.
    assert float(same.split("max |difference| ")[1].split()[0]) <= 1e-5 and "after 5 steps" in same
    with pytest.raises(AssertionError, match="exceeds 1e-05"):
        compare(lambda ps: torch.optim.Adam(ps, lr=1.1e-2), lambda ps: torch.optim.Adam(ps, lr=1e-2))


def test_reference_lion_matches_its_definition() -> None:
    from builder.resources.smoke.numerics import ReferenceLion

    p = torch.nn.Parameter(torch.tensor([1.0, -1.0, 0.5]))
    lion = ReferenceLion([p], lr=0.1, betas=(0.9, 0.99))
    p.grad = torch.tensor([2.0, -3.0, 0.0])
    lion.step()
    # m=0: update = sign(0.1 * g) = [1, -1, 0]; p -= 0.1 * update; m = 0.01 * g
    assert torch.allclose(p.detach(), torch.tensor([0.9, -0.9, 0.5]))
    assert torch.allclose(lion.m[0], torch.tensor([0.02, -0.03, 0.0]))


DS_REPORT = (
    "op name ................ installed .. compatible\n"
    "deepspeed_not_implemented  \x1b[93m[NO]\x1b[0m ....... \x1b[92m[OKAY]\x1b[0m\n"
    "async_io ............... \x1b[93m[NO]\x1b[0m ....... \x1b[93m[NO]\x1b[0m\n"
    "cpu_adagrad ............ \x1b[92m[YES]\x1b[0m ...... \x1b[92m[OKAY]\x1b[0m\n"
    "cpu_adam ............... \x1b[92m[YES]\x1b[0m ...... \x1b[92m[OKAY]\x1b[0m\n"
    "fused_adam ............. \x1b[93m[NO]\x1b[0m ....... \x1b[92m[OKAY]\x1b[0m\n"
)  # captured from DeepSpeed 0.19.8's ds_report (trimmed)


def test_parse_ds_report() -> None:
    from builder.resources.smoke.wheel import parse_ds_report

    assert parse_ds_report(DS_REPORT) == {"cpu_adagrad", "cpu_adam"}


def test_parse_dist_output_checks_every_rank_and_the_backend() -> None:
    from builder.resources.smoke.dist import parse_dist_output

    good = "noise\nSMOKE_DIST rank=1 world=2 backend=gloo OK\nSMOKE_DIST rank=0 world=2 backend=gloo OK\n"
    assert parse_dist_output(good, 2, "gloo") == set()
    nccl = "SMOKE_DIST rank=0 world=1 backend=nccl nccl=2.28.9 OK\n"
    assert parse_dist_output(nccl, 1, "nccl") == {"2.28.9"}
    with pytest.raises(AssertionError, match="expected ranks 0..1 OK with gloo"):
        parse_dist_output("SMOKE_DIST rank=0 world=2 backend=gloo OK\n", 2, "gloo")
    with pytest.raises(AssertionError, match="OK with nccl"):
        parse_dist_output(good.replace("world=2", "world=1"), 1, "nccl")


def test_the_smoke_checks_run_as_one_file_built_from_their_package(tmp_path: Path) -> None:
    """Issue 50: the checks are a package, a module per what they check; the smoke venv and a CI image
    run them as one file (bundle), the distributed worker beside it. The same package gives the same
    bytes, and the file holds every module and imports no toolkit code."""
    import ast

    from builder import bundle
    from builder.resources import RESOURCES
    from builder.resources.smoke import BUNDLE
    from builder.smoke import write_checks

    script = write_checks(tmp_path / "a")
    bundle._BUILT.clear()  # built again from the package, not the bytes this process built
    assert script.read_bytes() == write_checks(tmp_path / "b").read_bytes()
    assert (tmp_path / "a" / "smoke_dist.py").read_bytes() == (RESOURCES / "smoke_dist.py").read_bytes()
    text = script.read_text()
    assert [m for m in BUNDLE if f"# ==================== builder/resources/smoke/{m}.py" not in text] == []
    assert {p.stem for p in (RESOURCES / "smoke").glob("*.py")} - {"__init__"} == set(BUNDLE)
    tree = ast.parse(text)
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not [m for m in imported if m.startswith("builder")]
    assert "main()" in text.rsplit("if __name__", 1)[-1]
