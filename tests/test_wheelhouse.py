"""Publishing rules and the PEP 503 pages, on fake wheels (zips with just the files publish reads)."""

from __future__ import annotations

import json
import zipfile
from html.parser import HTMLParser
from pathlib import Path

import pytest

from builder.errors import PublishError
from builder.smoke import Check, SmokeReport, report_path
from builder.source import sha256_of
from builder.wheelhouse import IndexEntry, normalize, project_page, publish, root_page

NAME = "deepspeed-0.19.8+cpu.torch2.13-cp311-cp311-linux_x86_64.whl"
BUILD = {
    "version": "0.19.8+cpu.torch2.13",
    "recipe": {"name": "cpu"},
    "accelerator": "cpu",
    "python_tag": "cp311",
    "torch": {"version": "2.13.0+cpu", "cuda": None},
    "archs": [],
    "ops": ["cpu_adam"],
}


class Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.hrefs.append(dict(attrs)["href"] or "")


def links(html: str) -> list[str]:
    parser = Links()
    parser.feed(html)
    return parser.hrefs


def fake_wheel(folder: Path, name: str = NAME, payload: bytes = b"x", passed: bool | None = True) -> Path:
    """A fake wheel: a zip holding only the embedded build manifest, plus its smoke report."""
    wheel = folder / name
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("deepspeed-0.19.8+cpu.torch2.13.dist-info/ds_builder.json", json.dumps(BUILD))
        zf.writestr("deepspeed/payload", payload)
    if passed is not None:
        status = "passed" if passed else "failed"
        report = SmokeReport(wheel.name, sha256_of(wheel), passed, (Check("import", status),), 1.0, "t")
        report_path(wheel).write_text(report.to_json())
    return wheel


def test_normalize() -> None:
    assert normalize("DeepSpeed") == "deepspeed"
    assert normalize("ds_wheel.Builder") == "ds-wheel-builder"


def test_project_page_links_up_to_the_wheel_with_its_hash() -> None:
    page = project_page("deepspeed", [IndexEntry(NAME, "ab" * 32)])
    assert links(page) == [f"../../deepspeed-0.19.8%2Bcpu.torch2.13-cp311-cp311-linux_x86_64.whl#sha256={'ab' * 32}"]
    assert '<meta name="pypi:repository-version" content="1.0">' in page


def test_root_page() -> None:
    assert links(root_page(["deepspeed", "a-b"])) == ["a-b/", "deepspeed/"]


def test_publish_writes_wheel_index_and_manifest(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    dist.mkdir()
    wheel = fake_wheel(dist)
    house = tmp_path / "wheelhouse"
    assert publish([wheel], house) == [house / NAME]
    assert sha256_of(house / NAME) == sha256_of(wheel)
    page = (house / "simple" / "deepspeed" / "index.html").read_text()
    assert links(page)[0].endswith(f"#sha256={sha256_of(wheel)}")
    assert links((house / "simple" / "index.html").read_text()) == ["deepspeed/"]
    entry = json.loads((house / "manifest.json").read_text())["wheels"][NAME]
    assert entry["sha256"] == sha256_of(wheel)
    assert entry["recipe"] == "cpu" and entry["ops"] == ["cpu_adam"] and entry["torch"] == "2.13.0+cpu"
    assert entry["cuda"] is None and entry["archs"] == []
    assert entry["smoke"]["passed"] is True and entry["smoke"]["checks"] == {
        "import": {"status": "passed", "detail": ""}
    }
    assert not list(house.rglob("*.tmp"))
    # Publishing the same bytes again is a no-op.
    publish([wheel], house)
    assert len(list(house.glob("*.whl"))) == 1


def test_publish_refuses_without_a_passing_report(tmp_path: Path) -> None:
    house = tmp_path / "house"
    with pytest.raises(PublishError, match="has no smoke report"):
        publish([fake_wheel(tmp_path, passed=None)], house)
    with pytest.raises(PublishError, match="failed its smoke tests"):
        publish([fake_wheel(tmp_path, passed=False)], house)
    assert not house.exists()  # refused before anything was written


def test_publish_refuses_a_wheel_changed_after_smoke(tmp_path: Path) -> None:
    wheel = fake_wheel(tmp_path)
    with zipfile.ZipFile(wheel, "a") as zf:
        zf.writestr("deepspeed/extra", b"tampered")
    with pytest.raises(PublishError, match="changed after it was smoke-tested"):
        publish([wheel], tmp_path / "house")


def test_publish_refuses_a_different_wheel_under_a_published_name(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    house = tmp_path / "house"
    publish([fake_wheel(tmp_path / "a", payload=b"one")], house)
    with pytest.raises(PublishError, match="already has a different"):
        publish([fake_wheel(tmp_path / "b", payload=b"two")], house)
