"""The wheelhouse page (index.html): rendered from the validated manifest, escaped, checked by
verify, rewritten by repair; the last matrix run's coverage shown with its Slurm job ids. On
fake wheels; the real page of a real build is opened in chromium in test_pipeline_images."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from browser import NO_BROWSER, chromium
from fakes import NAME, fake_wheel

from builder import node
from builder.contracts import Check, SmokeReport
from builder.errors import PublishError, WheelhouseError
from builder.files import sha256_of
from builder.smoke import report_path
from builder.wheelhouse import publish, verify
from builder.wheelhouse.extras import publish_coverage, publish_locks
from builder.wheelhouse.layout import load_manifest
from builder.wheelhouse.page import PAGE, gather, install_commands, render
from builder.wheelhouse.upkeep import repair

STAGES = {s: {"status": "passed", "reason": "", "seconds": 3.0} for s in ("build", "smoke", "publish")}


def _report(tmp_path: Path, **row: object) -> Path:
    data = {
        "schema": 1, "matrix": "recipes/matrices/slurm-two-partitions.toml", "finished_at": "2026-11-24T10:00:00+00:00",
        "targets": [{"target": "cpu", "python": "3.11", "wheel": f"/work/dist/{NAME}", "stages": STAGES,
                     "slurm": {"job": "4711", "node": "node1", "smoke_on": "h100 (4712)", "log": "/x",
                               "units_on": "cpu_adam (node2), fused_adam (node3)"}, **row}],
        "failed": [],
    }  # fmt: skip
    path = tmp_path / "coverage.json"
    path.write_text(json.dumps(data))
    return path


def test_publish_writes_the_page_and_verify_holds_it_to_the_manifest(tmp_path: Path) -> None:
    house = tmp_path / "house"
    publish([fake_wheel(tmp_path)], house)
    page = house / PAGE
    assert page.is_file() and page.stat().st_mode & 0o777 == 0o644
    text = page.read_text()
    assert f"<code>{NAME}</code>" in text.replace("+", "+") and "<script" not in text
    assert "content=\"default-src 'none'" in text  # nothing from elsewhere, no script runs
    assert verify(house) == []
    # An edited page (other commands than the manifest backs) is found; repair rewrites it.
    page.write_text(text.replace("pip install", "pip install evil-package"))
    assert verify(house) == [
        "index.html: not the page manifest.json renders here (edited, or the wheelhouse was moved): "
        "run `python -m builder repair` to rewrite it"
    ]
    repair(house)
    assert verify(house) == [] and page.read_text() == text
    page.unlink()
    assert verify(house) == ["index.html: missing (run `python -m builder repair` to write it)"]


def test_markup_in_a_manifest_value_is_shown_as_text(tmp_path: Path) -> None:
    wheel = fake_wheel(tmp_path)
    evil = '<script>alert(1)</script><img src=x onerror=alert(2)>"'
    report = SmokeReport(wheel.name, sha256_of(wheel), True, (Check("import", "passed", evil),), 1.0,
                         "2026-11-23T00:00:00+00:00")  # fmt: skip
    report_path(wheel).write_text(report.to_json())
    house = tmp_path / "house"
    publish([wheel], house)
    text = (house / PAGE).read_text()
    assert evil not in text and "<script>" not in text and "<img" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;&quot;" in text


def test_install_commands_name_the_wheel_exactly(tmp_path: Path) -> None:
    house = tmp_path / "house"
    publish([fake_wheel(tmp_path)], house)
    manifest = load_manifest(house)
    commands = install_commands(manifest, manifest.wheels[NAME])
    assert commands["pip"] == (
        'pip install "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu\n'
        'pip install --index-url "$WH/simple/" "deepspeed==0.19.8+cpu.torch2.13"'
    )
    assert commands["uv"].endswith('uv pip install --index-url "$WH/simple/" "deepspeed==0.19.8+cpu.torch2.13"')
    assert "uv-variants" not in commands  # no variant wheels published
    # The page names no folder (a copy elsewhere stays valid): WH is for the person to set.
    assert 'WH="file:///path/to/this/wheelhouse"' in (house / PAGE).read_text().replace("&quot;", '"')
    assert str(house.resolve()) not in (house / PAGE).read_text()


def test_a_matrix_runs_coverage_is_published_and_shown_with_its_job_ids(tmp_path: Path) -> None:
    house = tmp_path / "house"
    assert publish_coverage(house, _report(tmp_path)) is None  # nothing published there yet: left alone
    assert not house.exists()
    publish([fake_wheel(tmp_path)], house)
    assert publish_coverage(house, _report(tmp_path)) == house / "coverage.json"
    text = (house / PAGE).read_text()
    assert "slurm-two-partitions.toml" in text and (
        "<td>4711</td><td>node1</td><td>cpu_adam (node2), fused_adam (node3)</td><td>h100 (4712)</td>" in text
    )
    assert f"<code>{NAME}</code></td><td>4711" in text  # the wheel's file name, not the build host's path
    assert load_manifest(house).reports["coverage.json"].sha256 == sha256_of(house / "coverage.json")
    assert verify(house) == []
    # A tampered report: verify names it, and the page no longer shows what it says.
    tampered = json.loads((house / "coverage.json").read_text())
    tampered["targets"][0]["slurm"]["job"] = "9999"
    (house / "coverage.json").write_text(json.dumps(tampered))
    assert "coverage.json: sha256 differs from manifest.json (tampered or replaced)" in verify(house)
    shown = render(gather(house, load_manifest(house)))
    assert "9999" not in shown and "is not the file the manifest lists" in shown


def test_coverage_is_never_written_through_a_link_or_over_a_file_not_ours(tmp_path: Path) -> None:
    house = tmp_path / "house"
    publish([fake_wheel(tmp_path)], house)
    outside = tmp_path / "outside.json"
    outside.write_text("keep")
    os.symlink(outside, house / "coverage.json")
    with pytest.raises(WheelhouseError, match="holds symlinks where the toolkit writes: coverage.json"):
        publish_coverage(house, _report(tmp_path))
    assert outside.read_text() == "keep"
    (house / "coverage.json").unlink()
    (house / "coverage.json").write_text("someone's own notes")
    with pytest.raises(PublishError, match="is not the report a publish wrote"):
        publish_coverage(house, _report(tmp_path))
    assert (house / "coverage.json").read_text() == "someone's own notes"
    (house / "coverage.json").unlink()
    bad = _report(tmp_path, python="<b>")
    with pytest.raises(PublishError, match="is not a coverage report"):
        publish_coverage(house, bad)
    assert not (house / "coverage.json").exists()


def test_a_page_someone_else_put_there_is_never_replaced(tmp_path: Path) -> None:
    house = tmp_path / "house"
    house.mkdir()
    (house / PAGE).write_text("<html>our cluster's own front page</html>")
    with pytest.raises(PublishError, match="exists and is not the page this toolkit writes"):
        publish([fake_wheel(tmp_path)], house)
    assert (house / PAGE).read_text() == "<html>our cluster's own front page</html>"
    assert not (house / "manifest.json").exists() and not list(house.glob("*.whl"))  # the publish undid itself


def test_only_real_locks_are_listed_and_a_lock_header_is_never_trusted(tmp_path: Path) -> None:
    """The page lists locks/<name>.lock by the wheel their first line names, only for locks the
    signed manifest lists: a lock that is a link, a header naming no wheel (markup, a path), a file
    with another name or one the manifest does not list (a header is easy to write) is not listed."""
    house = tmp_path / "house"
    publish([fake_wheel(tmp_path)], house)
    locks = house / "locks"
    publish_locks(house, {"locks/cpu.lock": f"# Lock for {NAME}, written by ds-wheel-builder.\n"})
    (locks / "forged.lock").write_text(f"# Lock for {NAME}, written by ds-wheel-builder.\n")  # not in the manifest
    (locks / "evil.lock").write_text("# Lock for <script>alert(1)</script>, x\n")
    (locks / "path.lock").write_text("# Lock for ../../etc/passwd, x\n")
    outside = tmp_path / "outside.lock"
    outside.write_text(f"# Lock for {NAME}, x\n")
    (locks / "link.lock").symlink_to(outside)
    (locks / ".hidden.lock").write_text(f"# Lock for {NAME}, x\n")
    facts = gather(house, load_manifest(house))
    assert facts.locks == {"locks/cpu.lock": NAME}
    text = render(facts)
    assert "<script>" not in text and "passwd" not in text and "link.lock" not in text


@pytest.mark.spawns
@pytest.mark.skipif(NO_BROWSER is not None, reason=str(NO_BROWSER))
def test_the_signed_page_fits_a_phone(tmp_path: Path) -> None:
    """The signer's fingerprint and key (long unbreakable words) wrap at 390 px: the page itself never
    scrolls sideways (a FAKE wheel; the full page of a real build is checked in test_pipeline_images)."""
    house = tmp_path / "house"
    publish([fake_wheel(tmp_path)], house)
    manifest = load_manifest(house)
    with chromium() as driver:
        driver.set_window_size(390, 844)  # as test_pipeline_images does (a new window is at least 500 wide)
        driver.get((house / PAGE).as_uri())
        assert driver.execute_script("return document.documentElement.scrollWidth") <= 390
        text = driver.find_element("id", "install").text
    assert node.fingerprint_of(manifest.signer) in text.replace("\n", "")


def test_the_config_grid_shows_what_each_deepspeed_config_does_from_the_wheel(tmp_path: Path) -> None:
    """Issue 29: the smoke's config rows, as a grid per wheel (optimizer x offload, ZeRO stages),
    dtypes split only where they differ; the site's configs below it. On a FAKE wheel's report."""
    wheel = fake_wheel(tmp_path)
    # Lion first and fp32 before bf16: the manifest keeps checks sorted by name, and the page must
    # render the same from the report's order and from the manifest's (verify compares them).
    checks = [Check("import", "passed"), Check("config:matrix/Lion/zero1/cpu/fp32", "passed", "runs")]
    for stage in range(4):
        for offload in ("none", "cpu") if stage else ("none",):
            for dtype in ("fp32", "bf16"):
                ok = offload == "cpu" or (stage < 3 or dtype == "fp32")
                detail = "runs from the wheel: ops cpu_adam" if ok else "needs op async_io, which the wheel lacks: x"
                checks.append(Check(f"config:matrix/Adam/zero{stage}/{offload}/{dtype}", "passed" if ok else "skipped",
                                    detail))  # fmt: skip
    checks.append(
        Check("config:site/configs/lion.json", "skipped", "not supported by DeepSpeed on cpu: ValueError: <b>")
    )
    report = SmokeReport(wheel.name, sha256_of(wheel), True, tuple(checks), 1.0, "2026-11-23T00:00:00+00:00")
    report_path(wheel).write_text(report.to_json())
    house = tmp_path / "house"
    publish([wheel], house)
    text = (house / PAGE).read_text()
    section = text[text.index('<section id="configs">') : text.index('<section id="smoke">')]
    assert '<td class="ok" data-config="Adam/zero0/none">runs</td>' in section
    assert '<td class="skip" data-config="Adam/zero3/none">fp32: runs; bf16: needs async_io</td>' in section
    assert '<td class="ok" data-config="Adam/zero3/cpu">runs</td>' in section
    assert '<tr><th>Adam</th><td>cpu</td><td class="op-none">-</td>' in section  # no offload at ZeRO 0
    assert "configs/lion.json" in section and "ValueError: &lt;b&gt;" in section and "<b>" not in section
    assert verify(house) == []


def test_a_known_failures_link_is_a_link_and_the_targets_table_says_it_passed_with_it(tmp_path: Path) -> None:
    """Issue 57, item 7: on the page a known failure's link was plain text, and "Published targets" showed
    "passed" with no word of the listed failure. On a FAKE wheel's report."""
    wheel = fake_wheel(tmp_path)
    detail = ("DeepSpeed's own failure, not the wheel's: TypeError: closure; listed by the recipe as a known "
              "failure: LBFGS without its closure (https://github.com/x/y/issues/1#c2)")  # fmt: skip
    evil = "DeepSpeed's own failure: see https://x.org/a\"><script>alert(1)</script>"
    checks = (Check("import", "passed"), Check("config:site/configs/lbfgs.json", "upstream", detail),
              Check("config:site/configs/other.json", "upstream", evil))  # fmt: skip
    report = SmokeReport(wheel.name, sha256_of(wheel), True, checks, 1.0, "2026-11-23T00:00:00+00:00")
    report_path(wheel).write_text(report.to_json())
    house = tmp_path / "house"
    publish([wheel], house)
    text = (house / PAGE).read_text()
    link = (
        '<a href="https://github.com/x/y/issues/1#c2" rel="noopener noreferrer">https://github.com/x/y/issues/1#c2</a>'
    )
    assert link in text
    assert "<script>" not in text and '<a href="https://x.org/a"' in text  # the URL ends where markup would start
    targets = text[text.index('<table id="targets">') :]
    assert "with 2 known failures of DeepSpeed's own" in targets[: targets.index("</table>")]
    assert verify(house) == []
