"""Publishing rules and the PEP 503 pages, on fake wheels (zips with just the files publish reads)."""

from __future__ import annotations

import importlib
import json
import zipfile
from pathlib import Path

import pytest
from fakes import METADATA, NAME, fake_wheel, links

from builder.errors import PublishError
from builder.files import sha256_of
from builder.node import normalize
from builder.smoke import report_path
from builder.wheelhouse import IndexEntry, installer, project_page, publish, root_page, verify


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
    assert (house / f"{NAME}.smoke.json").read_bytes() == report_path(wheel).read_bytes()
    assert (house / "tools" / "ds-node-install.py").read_bytes() == installer.build()  # builder/node/ in one file
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


def test_verify_finds_tampering_missing_files_and_drift(tmp_path: Path) -> None:
    house = tmp_path / "house"
    (tmp_path / "a").mkdir()
    wheel = fake_wheel(tmp_path / "a")
    publish([wheel], house)
    assert verify(house) == []
    assert links((house / "simple" / "deepspeed" / "index.html").read_text())  # PEP 658 attribute present:
    assert 'data-dist-info-metadata="sha256=' in (house / "simple" / "deepspeed" / "index.html").read_text()
    assert (house / f"{NAME}.metadata").read_text() == METADATA

    (house / NAME).write_bytes((house / NAME).read_bytes() + b"x")
    (house / f"{NAME}.metadata").unlink()
    stray = house / "deepspeed-0.0.1-py3-none-any.whl"
    stray.write_bytes(b"")
    problems = verify(house)
    size = (house / NAME).stat().st_size
    assert f"{NAME}: {size} bytes, manifest.json says {size - 1} (tampered or replaced)" in problems
    assert f"{NAME}.metadata: missing" in problems
    assert f"{stray.name}: in the wheelhouse but not in manifest.json" in problems
    (house / NAME).unlink()
    assert f"{NAME}: listed in manifest.json but missing" in verify(house)


def test_verify_catches_an_edited_index(tmp_path: Path) -> None:
    house = tmp_path / "house"
    publish([fake_wheel(tmp_path)], house)
    page = house / "simple" / "deepspeed" / "index.html"
    page.write_text(page.read_text().replace("#sha256=", "#sha256=0"))
    assert verify(house) == [f"simple/deepspeed/index.html: wrong hash for {NAME}"]


def _publish_one(folder: str, house: str) -> None:
    publish([Path(folder) / NAME], Path(house))


@pytest.mark.spawns
def test_eight_concurrent_publishers_lose_nothing(tmp_path: Path) -> None:
    import multiprocessing

    folders = []
    for i in range(8):
        folder = tmp_path / f"w{i}"
        folder.mkdir()
        fake_wheel(folder, name=NAME.replace("0.19.8+", f"0.19.{i}+"), payload=bytes([i]))
        folders.append(folder)
    house = tmp_path / "house"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=publish, args=([next(f.glob("*.whl"))], house)) for f in folders]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    manifest = json.loads((house / "manifest.json").read_text())
    assert len(manifest["wheels"]) == 8
    assert len(links((house / "simple" / "deepspeed" / "index.html").read_text())) == 8
    assert verify(house) == []


@pytest.mark.spawns
def test_a_killed_publish_leaves_the_previous_index_whole(tmp_path: Path) -> None:
    import multiprocessing
    import random
    import time

    house = tmp_path / "house"
    (tmp_path / "first").mkdir()
    publish([fake_wheel(tmp_path / "first")], house)
    ctx = multiprocessing.get_context("fork")
    rng = random.Random(7)
    killed = []
    for i in range(12):
        folder = tmp_path / f"k{i}"
        folder.mkdir()
        wheel = fake_wheel(folder, name=NAME.replace("0.19.8+", f"0.20.{i}+"), payload=bytes([i]) * 200_000)
        killed.append(wheel)
        proc = ctx.Process(target=publish, args=([wheel], house))
        proc.start()
        time.sleep(rng.uniform(0.0, 0.03))
        proc.kill()
        proc.join()
        # Whatever moment it died at, the index and manifest parse, every wheel published before is
        # still listed and linked with its hash, and only killed wheels may be half-known
        # (landed but unlisted, or linked before the manifest caught up).
        problems = verify(house)
        left = [p for p in problems if not any(k.name in p for k in killed) and "interrupted publish" not in p]
        assert left == [], (i, problems)
        assert json.loads((house / "manifest.json").read_text())["wheels"][NAME]["smoke"]["passed"]
    publish(killed[:1], house)  # the next publish, under the lock, removes what killed ones left
    assert verify(house) == []
    publish(killed, house)
    assert verify(house) == []


def test_prune_keeps_current_recipes_and_locked_wheels(tmp_path: Path) -> None:
    from builder.wheelhouse import prune

    house = tmp_path / "house"
    names = []
    for i, recipe in enumerate(["cpu", "old-recipe", "older-recipe"]):
        folder = tmp_path / recipe
        folder.mkdir()
        wheel = fake_wheel(
            folder,
            name=NAME.replace("0.19.8+", f"0.19.{i}+"),
            payload=bytes([i]),
            recipe={"name": recipe, "torch": "2.13.0"},
        )
        publish([wheel], house)
        names.append(wheel.name)
    assert prune(house, ["cpu"], keep=[names[2]], dry_run=True) == [names[1]]
    assert (house / names[1]).exists()
    assert prune(house, ["cpu"], keep=[names[2]]) == [names[1]]
    assert not (house / names[1]).exists() and not (house / f"{names[1]}.metadata").exists()
    assert not (house / f"{names[1]}.smoke.json").exists()
    assert verify(house) == []
    assert sorted(json.loads((house / "manifest.json").read_text())["wheels"]) == sorted([names[0], names[2]])
    assert prune(house, [], keep=[], remove_all=True) == sorted([names[0], names[2]])
    assert not (house / "simple" / "deepspeed").exists()  # no stale page links deleted wheels
    assert links((house / "simple" / "index.html").read_text()) == []
    assert "lists no DeepSpeed wheel" in verify(house)[0]  # an empty wheelhouse does not pass


def test_lock_rendering() -> None:
    from builder.wheelhouse.lock import default_base
    from builder.wheelhouse.lockfile import render_containerfile, render_lock, requirement_of

    assert requirement_of(NAME) == "deepspeed==0.19.8+cpu.torch2.13"
    assert requirement_of("py_cpuinfo-9.0.0.tar.gz") == "py-cpuinfo==9.0.0"
    text = render_lock(NAME, {NAME: "a" * 64, "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl": "b" * 64})
    assert text.splitlines()[0] == f"# Lock for {NAME}, written by ds-wheel-builder. Install exactly these files with:"
    assert f"deepspeed==0.19.8+cpu.torch2.13 \\\n    --hash=sha256:{'a' * 64}" in text
    assert f"torch==2.13.0+cpu \\\n    --hash=sha256:{'b' * 64}" in text
    container = render_containerfile(default_base("cp311"), "locks/cpu.lock", NAME)
    assert "FROM docker.io/library/python:3.11-slim" in container
    assert "--no-index" in container and "--require-hashes --find-links /wheelhouse" in container
    assert "-r /wheelhouse/locks/cpu.lock" in container and "SOURCE_DATE_EPOCH=0" in container


def test_a_wheelhouse_that_refuses_a_write_midway_is_reported_and_left_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The share goes read-only (or fills up) after the publish began, at its manifest: one clear
    error naming it and repair, no traceback, and the manifest nodes read is the one it had."""
    import errno

    publishing = importlib.import_module("builder.wheelhouse.publish")

    house = tmp_path / "house"
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
    publish([fake_wheel(tmp_path / "a")], house)
    before = (house / "manifest.json").read_bytes()

    def refused(*_: object, **__: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system", str(house / ".manifest.json.x.tmp"))

    monkeypatch.setattr(publishing, "commit", refused)
    with pytest.raises(PublishError, match="refused a write during the update \\(Read-only file system: ") as got:
        publish([fake_wheel(tmp_path / "b", name=NAME.replace("0.19.8", "0.19.9"))], house)
    assert "repair --wheelhouse" in got.value.fix and (house / "manifest.json").read_bytes() == before
