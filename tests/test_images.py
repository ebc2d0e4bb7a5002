"""CI images (issue 22), the parts decided before podman runs and read back after: locks, the
Containerfile, the manifest's image entries, OCI archives, seccomp, the host's Debian mirror.

The real image (podman, debootstrap, the smoke inside, the same digest twice) is built in
tests/test_pipeline_images.py from the default recipe's published wheel.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from builder.debian import host_mirror
from builder.errors import ImageError
from builder.images import plan
from builder.images.base import debootstrap_ref
from builder.images.build import seccomp_for
from builder.node import (
    FileEntry,
    ImageEntry,
    ManifestError,
    SmokeSummary,
    WheelhouseManifest,
    parse_manifest,
    parse_wheel_entry,
)
from builder.wheelhouse import archive

WHEEL = "deepspeed-0.19.8+cpu.torch2.13-cp311-cp311-manylinux_2_28_x86_64.whl"
TORCH = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
LOCK = f"""# Lock for {WHEEL}, written by ds-wheel-builder. Install exactly these files with:
#   pip install --require-hashes --find-links <wheelhouse> -r <this file>
deepspeed==0.19.8+cpu.torch2.13 \\
    --hash=sha256:{"a" * 64}
torch==2.13.0+cpu \\
    --hash=sha256:{"b" * 64}
"""
ROOT = Path(__file__).resolve().parents[1]


def _manifest(with_torch: bool = True) -> WheelhouseManifest:
    """The default recipe's wheel (made through the manifest's own loader) and, maybe, its torch."""
    wheel = parse_wheel_entry(WHEEL, {
        "python_tag": "cp311", "torch": "2.13.0+cpu", "accelerator": "cpu", "cuda": None, "archs": [],
        "cpu_target": "x86-64-v3", "cpu_flags": [], "ops": ["cpu_adam"], "recipe": "cpu", "sha256": "a" * 64,
        "smoke": {"passed": True, "finished_at": "", "checks": {"import": {"status": "passed", "detail": ""}}},
        "version": "0.19.8+cpu.torch2.13"}, "test")  # fmt: skip
    deps = {TORCH: FileEntry(TORCH, "b" * 64)} if with_torch else {}
    locks = {"locks/cpu.lock": FileEntry("locks/cpu.lock", hashlib.sha256(LOCK.encode()).hexdigest())}
    return WheelhouseManifest({WHEEL: wheel}, deps, locks=locks)


def test_a_lock_is_read_pin_by_pin_and_each_pin_found_by_its_hash() -> None:
    wheel, pins = plan.parse_lock(LOCK, "locks/cpu.lock")
    assert wheel == WHEEL and pins == {"deepspeed==0.19.8+cpu.torch2.13": "a" * 64, "torch==2.13.0+cpu": "b" * 64}
    files = plan.locked_files(pins, _manifest(), "locks/cpu.lock")
    assert [f.name for f in files] == [WHEEL, TORCH]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("torch==2.13.0\n", "is not a lock written by `lock`"),
        (LOCK.replace(f"    --hash=sha256:{'b' * 64}\n", ""), "pins torch==2.13.0+cpu without a hash"),
        (LOCK + "rm -rf / \\\n", "line 7: 'rm -rf / \\\\' is not a pinned requirement"),
        (LOCK.replace("b" * 64, "../../etc"), "is not a pinned requirement with its hash"),
    ],
)
def test_a_damaged_lock_is_refused_naming_the_line(text: str, message: str) -> None:
    with pytest.raises(ImageError, match=re.escape(message)):
        plan.parse_lock(text, "locks/cpu.lock")


def test_a_pin_the_wheelhouse_lacks_is_named_with_the_fix() -> None:
    _, pins = plan.parse_lock(LOCK, "locks/cpu.lock")
    with pytest.raises(ImageError, match=r"pins 1 file\(s\) the wheelhouse lacks: torch==2.13.0\+cpu") as err:
        plan.locked_files(pins, _manifest(with_torch=False), "locks/cpu.lock")
    assert "python -m builder lock --wheel" in err.value.fix


def test_the_containerfile_installs_from_the_context_alone_with_hashes() -> None:
    text = plan.render_containerfile("localhost/base:1", "locks/cpu.lock", WHEEL, 0)
    run = text[text.index("RUN") :]
    assert text.count("FROM ") == 1 and "FROM localhost/base:1\n" in text
    assert "--mount=type=bind,source=.,target=/wheelhouse,ro" in run  # no layer of wheels in the image
    assert "--no-index" in run and "--require-hashes" in run and "-r /wheelhouse/locks/cpu.lock" in run
    assert "SOURCE_DATE_EPOCH=0" in run and "PIP_CONFIG_FILE=/dev/null" in run
    assert "ENV VIRTUAL_ENV=/opt/deepspeed PATH=/opt/deepspeed/bin:" in text


def test_image_names_say_what_they_hold() -> None:
    entry = _manifest().wheels[WHEEL]
    assert plan.image_ref(entry) == "localhost/deepspeed-cpu:0.19.8-cpu.torch2.13-cp311"
    assert plan.archive_name(entry, "c" * 64) == "images/cpu-0.19.8+cpu.torch2.13-cp311-cccccccccccc.oci.tar"


def _image(name: str = "images/cpu-1.oci.tar", **change: object) -> ImageEntry:
    entry = ImageEntry(
        name=name, sha256="d" * 64, image_id="e" * 64, digest="sha256:" + "f" * 64, size=10,
        ref="localhost/deepspeed-cpu:0.19.8-cpu.torch2.13-cp311", base="localhost/ds-builder-base:bookworm-1",
        base_id="1" * 64, lock="locks/cpu.lock", lock_sha256="2" * 64, wheel=WHEEL, python_tag="cp311",
        smoke=SmokeSummary(True, "2026-11-24T06:00:00+00:00", {"import": ("passed", "ok")}),
    )  # fmt: skip
    return dataclasses.replace(entry, **change)  # type: ignore[arg-type]


def test_an_image_entry_survives_the_round_trip() -> None:
    manifest = dataclasses.replace(_manifest(), images={"images/cpu-1.oci.tar": _image()})
    assert parse_manifest(manifest.to_json()).images == manifest.images
    assert "images" not in json.loads(_manifest().to_json())  # a wheelhouse without images: no new key


@pytest.mark.parametrize(
    ("name", "change", "message"),
    [
        ("images/../../etc/passwd.oci.tar", {}, "is not an image archive name"),
        ("images/.hidden.oci.tar", {}, "is not an image archive name"),
        ("images/a/b.oci.tar", {}, "is not an image archive name"),
        ("images/x.tar", {}, "is not an image archive name"),
        ("images/cpu-1.oci.tar", {"wheel": WHEEL.replace("0.19.8", "0.19.9")}, "which no wheel entry lists"),
        ("images/cpu-1.oci.tar", {"digest": "md5:1"}, "field 'digest' is not valid"),
        ("images/cpu-1.oci.tar", {"lock": "../locks/cpu.lock"}, "field 'lock' is not valid"),
        ("images/cpu-1.oci.tar", {"size": -1}, "field 'size' is not a positive number"),
        ("images/cpu-1.oci.tar", {"base": "x; rm -rf /"}, "field 'base' is not valid"),
        ("images/cpu-1.oci.tar", {"python_tag": "cp312"}, "is not its wheel's"),
    ],
)
def test_a_tampered_image_entry_is_refused(name: str, change: dict[str, object], message: str) -> None:
    manifest = dataclasses.replace(_manifest(), images={name: _image(name, **change)})
    with pytest.raises(ManifestError, match=re.escape(message)):
        parse_manifest(manifest.to_json())


def _oci(path: Path, manifest_bytes: bytes | None = None, index_digest: str | None = None) -> tuple[str, str]:
    """A small OCI archive as podman save writes it: index.json, the image manifest, a config."""
    config = b'{"architecture":"amd64"}'
    config_digest = hashlib.sha256(config).hexdigest()
    blob = manifest_bytes or json.dumps({"schemaVersion": 2, "config": {"digest": f"sha256:{config_digest}"}}).encode()
    digest = index_digest or hashlib.sha256(blob).hexdigest()
    index = json.dumps({"schemaVersion": 2, "manifests": [{"digest": f"sha256:{digest}", "annotations": {
        "org.opencontainers.image.ref.name": "localhost/x:1"}}]}).encode()  # fmt: skip
    with tarfile.open(path, "w") as tar:
        for name, data in (("index.json", index), (f"blobs/sha256/{hashlib.sha256(blob).hexdigest()}", blob),
                           (f"blobs/sha256/{config_digest}", config)):  # fmt: skip
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return f"sha256:{digest}", config_digest


def test_two_saves_of_one_image_become_the_same_bytes(tmp_path: Path) -> None:
    """podman stamps the save time into the archive: two saves of one image had one ID and digest
    but two sha256s. Rewritten (sorted, SOURCE_DATE_EPOCH times, root owners), they are one file."""
    first, second = tmp_path / "a.oci.tar", tmp_path / "b.oci.tar"
    _oci(first)
    with tarfile.open(first) as src, tarfile.open(second, "w", format=tarfile.PAX_FORMAT) as dst:
        for info in reversed(src.getmembers()):  # another order, times, owner and mode
            data = src.extractfile(info)
            info.mtime, info.uid, info.uname, info.mode = 1_800_000_000, 1000, "builder", 0o600
            dst.addfile(info, data)
    assert hashlib.sha256(first.read_bytes()).digest() != hashlib.sha256(second.read_bytes()).digest()
    for path in (first, second):
        archive.make_reproducible(path, 0)
    assert first.read_bytes() == second.read_bytes()
    assert archive.read_facts(first) == archive.read_facts(second)
    with tarfile.open(first) as tar:
        assert {(m.mtime, m.uid, m.uname, m.mode) for m in tar.getmembers()} == {(0, 0, "", 0o644)}


def test_an_archive_is_read_back_and_a_tampered_one_refused(tmp_path: Path) -> None:
    good = tmp_path / "good.oci.tar"
    digest, config = _oci(good)
    facts = archive.read_facts(good)
    assert (facts.digest, facts.image_id, facts.ref) == (digest, config, "localhost/x:1")
    forged = tmp_path / "forged.oci.tar"
    _oci(forged, index_digest="0" * 64)
    with pytest.raises(archive.ArchiveError, match="has no blobs/sha256/0000"):
        archive.read_facts(forged)
    (tmp_path / "text.oci.tar").write_text("not a tar")
    with pytest.raises(archive.ArchiveError, match="not a readable tar"):
        archive.read_facts(tmp_path / "text.oci.tar")


def test_the_aio_syscall_is_allowed_only_where_the_profile_denies_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    system = tmp_path / "seccomp.json"
    system.write_text(json.dumps({"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
        {"names": ["io_pgetevents", "kexec_load"], "action": "SCMP_ACT_ERRNO"},
        {"names": ["io_submit"], "action": "SCMP_ACT_ALLOW"}]}))  # fmt: skip
    monkeypatch.setattr("builder.images.build.SYSTEM_SECCOMP", (system,))
    assert seccomp_for(("cpu_adam",), tmp_path) == ([], None)  # no aio op: the default profile
    flags, row = seccomp_for(("async_io", "cpu_adam"), tmp_path)
    written = json.loads((tmp_path / "seccomp-aio.json").read_text())
    assert flags == ["--security-opt", f"seccomp={tmp_path / 'seccomp-aio.json'}"]
    assert row is not None and "io_pgetevents" in row.detail and str(system) in row.detail
    assert written["syscalls"][0]["names"] == ["kexec_load"] and written["syscalls"][-1]["names"] == ["io_pgetevents"]
    system.write_text(json.dumps({"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
        {"names": ["io_pgetevents"], "action": "SCMP_ACT_ALLOW"}]}))  # fmt: skip
    assert seccomp_for(("async_io",), tmp_path) == ([], None)  # a newer profile allows it: nothing to change


def test_the_base_comes_from_the_hosts_own_mirror(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n\n"
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n"
    )
    assert host_mirror(tmp_path) == "http://mirror.example/debian"
    (tmp_path / "sources.list.d" / "debian.sources").unlink()
    (tmp_path / "sources.list").write_text("deb [arch=amd64] http://other.example/debian bookworm main\n")
    assert host_mirror(tmp_path) == "http://other.example/debian"
    (tmp_path / "sources.list").unlink()
    assert host_mirror(tmp_path) == "http://deb.debian.org/debian"
    assert debootstrap_ref("http://a") != debootstrap_ref("http://b")  # another mirror: another base
    assert debootstrap_ref("http://a").startswith("localhost/ds-builder-base:bookworm-")


@pytest.fixture
def image_house(tmp_path: Path) -> tuple[Path, ImageEntry]:
    """A wheelhouse with one FAKE wheel and one image archive (a small OCI tar) published for it."""
    from fakes import NAME, fake_wheel

    from builder.wheelhouse import publish, verify
    from builder.wheelhouse.extras import publish_image

    (tmp_path / "dist").mkdir()
    house = tmp_path / "house"
    publish([fake_wheel(tmp_path / "dist")], house)
    arc = tmp_path / "a.oci.tar"
    digest, config = _oci(arc)
    entry = _image(f"images/cpu-{config[:12]}.oci.tar", wheel=NAME, image_id=config, digest=digest,
                   sha256=hashlib.sha256(arc.read_bytes()).hexdigest(), size=arc.stat().st_size)  # fmt: skip
    target = publish_image(house, arc, entry)
    assert target.stat().st_mode & 0o777 == 0o644 and (house / "images").stat().st_mode & 0o777 == 0o755
    assert verify(house) == []
    assert publish_image(house, arc, entry) == target  # the same image again: a no-op
    return house, entry


def test_verify_reads_each_archive_back(image_house: tuple[Path, ImageEntry], tmp_path: Path) -> None:
    from builder.wheelhouse import verify

    house, entry = image_house
    archive_path = house / entry.name
    good = archive_path.read_bytes()
    archive_path.write_bytes(good + b"\0" * 512)
    assert verify(house) == [f"{entry.name}: size or sha256 differs from manifest.json (tampered or replaced)"]
    archive_path.write_bytes(good)
    (house / "images" / "planted.oci.tar").write_bytes(good)
    assert verify(house) == ["images/planted.oci.tar: not in manifest.json"]
    (house / "images" / "planted.oci.tar").unlink()
    # An archive whose bytes and size the manifest records, but which holds another image.
    other = tmp_path / "other.oci.tar"
    _oci(other, manifest_bytes=json.dumps({"schemaVersion": 2, "config": {"digest": "sha256:" + "9" * 64}}).encode())
    data = json.loads((house / "manifest.json").read_text())
    data["images"][entry.name].update(sha256=hashlib.sha256(other.read_bytes()).hexdigest(), size=other.stat().st_size)
    (house / "manifest.json").write_text(json.dumps(data))
    archive_path.write_bytes(other.read_bytes())
    signature, problem = verify(house)  # a consistent forgery: the signature fails first
    assert "manifest.json.sig does not match what it signs" in signature
    assert problem.startswith(f"{entry.name}: holds image 999999999999") and entry.image_id[:12] in problem


def test_a_killed_image_publish_is_removed_by_repair(image_house: tuple[Path, ImageEntry]) -> None:
    """What a publish killed while copying an archive leaves (its journal naming the archive, the
    copy, a temporary file) is removed by repair; a file it did not write is left alone."""
    from builder.wheelhouse import repair, verify

    house, entry = image_house
    data = (house / entry.name).read_bytes()
    half = house / "images" / "cpu-000000000000.oci.tar"
    half.write_bytes(data)
    temp = house / "images" / ".cpu-111111111111.oci.tar.abc123xy.tmp"
    temp.write_bytes(data[:100])
    foreign = house / "images" / "theirs.oci.tar"
    foreign.write_bytes(b"someone's file")
    journal = {"files": {half.relative_to(house).as_posix(): hashlib.sha256(data).hexdigest(),
                         "images/theirs.oci.tar": "0" * 64}}  # fmt: skip
    (house / ".publish-journal.json").write_text(json.dumps(journal))
    assert any("interrupted publish" in p for p in verify(house))
    removed = repair(house)
    assert sorted(removed) == sorted([".publish-journal.json", str(half.relative_to(house)),
                                      str(temp.relative_to(house))])  # fmt: skip
    assert foreign.read_bytes() == b"someone's file" and (house / entry.name).read_bytes() == data
    assert verify(house) == ["images/theirs.oci.tar: not in manifest.json"]


def test_a_journal_naming_a_path_outside_images_is_refused(image_house: tuple[Path, ImageEntry]) -> None:
    from builder.wheelhouse import repair

    house, _ = image_house
    outside = house.parent / "precious.oci.tar"
    outside.write_bytes(b"keep me")
    (house / ".publish-journal.json").write_text(json.dumps({"files": {"images/../../precious.oci.tar": "0" * 64}}))
    repair(house)  # the unreadable journal is reported and dropped, nothing it names is touched
    assert outside.read_bytes() == b"keep me"


def test_pruning_a_wheel_removes_its_images(image_house: tuple[Path, ImageEntry]) -> None:
    from builder.wheelhouse import prune, verify

    house, entry = image_house
    removed = prune(house, ["other-recipe"], [], remove_all=True)
    assert entry.name in removed and not (house / entry.name).exists()
    manifest = json.loads((house / "manifest.json").read_text())
    assert manifest["wheels"] == {} and "images" not in manifest
    assert verify(house) == ["manifest.json lists no DeepSpeed wheel: the wheelhouse is empty"]


def test_a_lock_named_with_a_path_is_looked_up_in_locks_only(tmp_path: Path) -> None:
    from builder.images.build import find_lock

    house = tmp_path / "house"
    (house / "locks").mkdir(parents=True)
    (house / "locks" / "cpu.lock").write_text(LOCK)
    (tmp_path / "evil.lock").write_text(LOCK)  # outside the wheelhouse
    for name in ("cpu", "cpu.lock", "locks/cpu.lock", str(house / "locks" / "cpu.lock")):
        assert find_lock(house, _manifest(), name, None, tmp_path / "log") == "locks/cpu.lock"
    for name in ("../evil.lock", str(tmp_path / "evil.lock"), "locks/../../evil", ".hidden", "a b.lock"):
        with pytest.raises(ImageError, match="no lock"):
            find_lock(house, _manifest(), name, None, tmp_path / "log")
    assert find_lock(house, _manifest(), None, WHEEL, tmp_path / "log") == "locks/cpu.lock"  # the wheel's own lock
    (house / "locks" / "planted.lock").write_text(LOCK)  # a lock file the signed manifest does not list
    with pytest.raises(ImageError, match="that the signed manifest lists"):
        find_lock(house, _manifest(), "planted", None, tmp_path / "log")


# ---------------------------------------------------------------- the Slurm container image (issue 40)


def test_enroot_files_are_written_as_enroot_import_writes_them() -> None:
    from builder.images.squashfs import ImageConfig, enroot_files, parse_config

    config = parse_config({"config": {"Env": ["VIRTUAL_ENV=/opt/deepspeed", "PATH=/opt/deepspeed/bin:/usr/bin"],
                                      "Cmd": ["/bin/bash"], "Labels": {"io.buildah.version": "1.28.2"},
                                      "Volumes": {"/data": {}}}})  # fmt: skip
    files = enroot_files(config, "ds-wheel-builder:images/cpu-1.sqsh")
    assert files["etc/environment"] == "VIRTUAL_ENV=/opt/deepspeed\nPATH=/opt/deepspeed/bin:/usr/bin\n"
    assert files["etc/fstab"] == "${ENROOT_ROOTFS}/data /data none x-create=dir,bind,rw,nosuid,nodev\n"
    rc = files["etc/rc"].splitlines()
    assert rc[:2] == ["# enroot-provenance: ds-wheel-builder:images/cpu-1.sqsh", "# io.buildah.version 1.28.2"]
    assert 'cd "/" && unset OLDPWD || exit 1' in rc and '    exec "$@"' in rc and "    exec /bin/bash" in rc
    assert files["etc/rc.local"].startswith("# This file is sourced by /etc/rc")
    # An entrypoint comes before the user's arguments; with no entrypoint and no command, a shell (as Enroot).
    bare = enroot_files(ImageConfig(entrypoint=("/bin/ep", "a b")), "x")["etc/rc"]
    assert "    exec /bin/ep 'a b' \"$@\"" in bare and "    exec /bin/ep 'a b'" in bare.splitlines()
    assert "    exec /bin/sh" in enroot_files(ImageConfig(), "x")["etc/rc"].splitlines()
    with pytest.raises(archive.ArchiveError, match="Env is not a list of strings"):
        parse_config({"config": {"Env": "PATH=/x"}})


def _member(
    name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, link: str = ""
) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size, info.mode = kind, link, len(data), 0o755 if kind == tarfile.DIRTYPE else 0o644
    return info, data


def _layered_oci(path: Path, layers: list[list[tuple[tarfile.TarInfo, bytes]]]) -> None:
    """An OCI archive of FAKE layers (small tars, the second gzipped as registries keep them)."""
    blobs: dict[str, bytes] = {}
    digests = []
    for number, members in enumerate(layers):
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w:gz" if number % 2 else "w") as tar:
            for info, data in members:
                tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
        blob = raw.getvalue()
        digests.append(hashlib.sha256(blob).hexdigest())
        blobs[digests[-1]] = blob
    config = json.dumps({"config": {"Env": ["PATH=/usr/bin"], "Cmd": ["/bin/sh"]}}).encode()
    blobs[hashlib.sha256(config).hexdigest()] = config
    manifest = json.dumps({"schemaVersion": 2, "config": {"digest": f"sha256:{hashlib.sha256(config).hexdigest()}"},
                           "layers": [{"digest": f"sha256:{d}"} for d in digests]}).encode()  # fmt: skip
    blobs[hashlib.sha256(manifest).hexdigest()] = manifest
    index = json.dumps({"manifests": [{"digest": f"sha256:{hashlib.sha256(manifest).hexdigest()}"}]}).encode()
    with tarfile.open(path, "w") as tar:
        for name, data in [("index.json", index), *((f"blobs/sha256/{d}", b) for d, b in blobs.items())]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


LOWER = [_member("etc", kind=tarfile.DIRTYPE), _member("etc/os-release", b"debian"),
         _member("opt", kind=tarfile.DIRTYPE), _member("opt/old", kind=tarfile.DIRTYPE), _member("opt/old/a", b"a"),
         _member("gone", b"x"),
         _member("bin", kind=tarfile.SYMTYPE, link="usr/bin"), _member("usr/bin/sh", b"#!"),
         _member("dev/null", kind=tarfile.CHRTYPE)]  # fmt: skip


def test_layers_are_applied_in_order_with_their_whiteouts(tmp_path: Path) -> None:
    from builder.images.squashfs import flatten

    upper = [_member("./opt/old/.wh..wh..opq"), _member("opt/old/b", b"b"), _member(".wh.gone"),
             _member("etc/os-release", b"debian 12"),
             _member("etc/issue", kind=tarfile.LNKTYPE, link="etc/os-release")]  # fmt: skip
    arc = tmp_path / "a.oci.tar"
    _layered_oci(arc, [LOWER, upper])
    root = tmp_path / "rootfs"
    root.mkdir()
    config = flatten(arc, root)
    assert config.env == ("PATH=/usr/bin",) and config.cmd == ("/bin/sh",)
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    assert files == ["bin", "etc", "etc/issue", "etc/os-release", "opt", "opt/old", "opt/old/b", "usr", "usr/bin",
                     "usr/bin/sh"], files  # fmt: skip
    assert (root / "etc/os-release").read_bytes() == b"debian 12" and (root / "etc/issue").stat().st_nlink == 2
    assert os.readlink(root / "bin") == "usr/bin"


@pytest.mark.parametrize(
    ("member", "said"),
    [
        (_member("../escape", b"x"), "does not stay inside the image"),
        (_member("/etc/passwd", b"x"), "does not stay inside the image"),
        (_member("bin/evil", b"x"), "through the link bin"),
        (_member("etc/shadow", kind=tarfile.LNKTYPE, link="../../etc/shadow"), "does not stay inside the image"),
        # Issue 51: a whiteout naming `..` removed the folder above (the scratch folder with the archive).
        (_member("opt/.wh.."), "names '.', which is no file of the image"),
        (_member(".wh..."), "names '..', which is no file of the image"),
    ],
)
def test_a_layer_that_would_write_outside_is_refused(
    tmp_path: Path, member: tuple[tarfile.TarInfo, bytes], said: str
) -> None:
    from builder.images.squashfs import flatten

    arc = tmp_path / "a.oci.tar"
    _layered_oci(arc, [LOWER, [member]])
    root = tmp_path / "rootfs"
    root.mkdir()
    with pytest.raises(archive.ArchiveError, match=re.escape(said)):
        flatten(arc, root)
    assert not (tmp_path / "escape").exists() and not (root / "usr/bin/evil").exists()
    assert arc.is_file() and (root / "opt").is_dir()  # nothing above the whiteout's folder was removed


@pytest.mark.parametrize("target", ["absolute", "relative"])
def test_enroots_files_are_never_written_through_a_link_in_the_image(tmp_path: Path, target: str) -> None:
    """Issue 51, item 1: a base whose layer makes `etc` a link to a folder of the build host: Enroot's
    files (etc/environment, fstab, rc, rc.local), written after the layers, went through it (as root
    with etc -> /etc: the build host's /etc). Now the squashfs is refused, naming the link."""
    from builder.errors import ImageError
    from builder.images.squashfs import make_squashfs

    host = tmp_path / "host-folder"
    host.mkdir()
    link = str(host) if target == "absolute" else "../host-folder"
    evil = [_member("etc", kind=tarfile.SYMTYPE, link=link)]
    arc = tmp_path / "a.oci.tar"
    _layered_oci(arc, [[m for m in LOWER if not m[0].name.startswith("etc")], evil])
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    if shutil.which("mksquashfs") is None:
        pytest.skip("needs mksquashfs: apt-get install squashfs-tools")
    with pytest.raises(ImageError, match="makes etc in .* is a link or not a folder: Enroot's /etc/environment"):
        make_squashfs(arc, tmp_path / "x.sqsh", scratch, "x", 0, tmp_path / "log")
    assert list(host.iterdir()) == [] and not (tmp_path / "x.sqsh").exists()
    assert not (scratch / "rootfs").exists()


@pytest.mark.spawns
@pytest.mark.skipif(shutil.which("mksquashfs") is None, reason="needs mksquashfs: apt-get install squashfs-tools")
def test_the_same_archive_gives_the_same_squashfs_bytes(tmp_path: Path) -> None:
    from builder.images.squashfs import make_squashfs
    from builder.wheelhouse.archive import SQUASHFS_MAGIC

    arc = tmp_path / "a.oci.tar"
    _layered_oci(arc, [LOWER])
    one, two = tmp_path / "one.sqsh", tmp_path / "two.sqsh"
    make_squashfs(arc, one, tmp_path, "x", 0, tmp_path / "log")
    (tmp_path / "later").mkdir()
    os.utime(arc, (1_900_000_000, 1_900_000_000))
    make_squashfs(arc, two, tmp_path / "later", "x", 0, tmp_path / "log")
    assert one.read_bytes() == two.read_bytes() and one.read_bytes()[:4] == SQUASHFS_MAGIC
    assert not (tmp_path / "rootfs").exists() and not (tmp_path / "later" / "rootfs").exists()
    listed = subprocess.run(["unsquashfs", "-lls", str(one)], capture_output=True, text=True, check=True).stdout
    assert "root/root" in listed and "squashfs-root/etc/rc" in listed and "squashfs-root/dev/null" not in listed
    assert "1970-01-01 00:00" in listed


def test_a_squashfs_entry_is_checked_like_its_archive() -> None:
    sq: dict[str, object] = {"squashfs": "images/cpu-1.sqsh", "squashfs_sha256": "3" * 64, "squashfs_size": 99}
    manifest = dataclasses.replace(_manifest(), images={"images/cpu-1.oci.tar": _image("images/cpu-1.oci.tar", **sq)})
    assert parse_manifest(manifest.to_json()).images == manifest.images
    for change, said in ((dict(sq, squashfs="images/other.sqsh"), "is not images/cpu-1.sqsh"),
                         (dict(sq, squashfs="images/../x.sqsh"), "field 'name' is not valid"),
                         (dict(sq, squashfs_size=0), "not a size from 1")):  # fmt: skip
        bad = dataclasses.replace(
            _manifest(), images={"images/cpu-1.oci.tar": _image("images/cpu-1.oci.tar", **change)}
        )
        with pytest.raises(ManifestError, match=re.escape(said)):
            parse_manifest(bad.to_json())


def test_a_published_squashfs_is_verified_repaired_and_pruned(
    image_house: tuple[Path, ImageEntry], tmp_path: Path
) -> None:
    from builder.wheelhouse import prune, repair, verify
    from builder.wheelhouse.extras import publish_image

    house, entry = image_house
    sqsh = tmp_path / "x.sqsh"
    sqsh.write_bytes(b"hsqs" + b"\0" * 4092)
    digest = hashlib.sha256(sqsh.read_bytes()).hexdigest()
    with_sq = dataclasses.replace(entry, squashfs=entry.name[: -len(".oci.tar")] + ".sqsh", squashfs_sha256=digest,
                                  squashfs_size=4096)  # fmt: skip
    publish_image(house, house / entry.name, with_sq, sqsh)
    assert verify(house) == [] and (house / with_sq.squashfs).stat().st_mode & 0o777 == 0o644
    (house / with_sq.squashfs).write_bytes(b"XXXX" + b"\0" * 4092)
    assert verify(house) == [f"{with_sq.squashfs}: sha256 differs from manifest.json (tampered or replaced)"]
    (house / with_sq.squashfs).write_bytes(sqsh.read_bytes())
    # A killed publish of another image's squashfs: the journal names it, repair removes it.
    half = house / "images" / "cpu-000000000000.sqsh"
    half.write_bytes(b"hsqs")
    (house / ".publish-journal.json").write_text(json.dumps({"files": {
        "images/cpu-000000000000.sqsh": hashlib.sha256(b"hsqs").hexdigest()}}))  # fmt: skip
    assert "images/cpu-000000000000.sqsh" in repair(house) and not half.exists()
    assert verify(house) == []
    removed = prune(house, ["other-recipe"], [], remove_all=True)
    assert with_sq.squashfs in removed and not (house / with_sq.squashfs).exists()


@pytest.mark.spawns
def test_without_mksquashfs_or_room_the_squashfs_is_refused_and_nothing_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mksquashfs missing: exit 12 naming the package. A full disk while it writes (the output on a
    1 MiB tmpfs in a private mount namespace): exit 12 naming the free space, no half squashfs, no
    unpacked root filesystem left."""
    from builder.images.squashfs import make_squashfs

    arc = tmp_path / "a.oci.tar"
    _layered_oci(arc, [[*LOWER, _member("opt/big", os.urandom(3 << 20))]])  # incompressible: 3 MiB
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ImageError, match="mksquashfs is not installed") as caught:
        make_squashfs(arc, tmp_path / "x.sqsh", tmp_path, "x", 0, tmp_path / "log")
    assert "squashfs-tools" in caught.value.fix and not (tmp_path / "rootfs").exists()
    monkeypatch.undo()
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("mksquashfs") is None:
        pytest.skip("the full-disk half needs root, unshare and mksquashfs")
    small = tmp_path / "small"
    small.mkdir()
    code = (f"from pathlib import Path; from builder.images.squashfs import make_squashfs; "
            f"make_squashfs(Path({str(arc)!r}), Path({str(small / 'x.sqsh')!r}), Path({str(tmp_path)!r}), 'x', 0, "
            f"Path({str(tmp_path / 'log')!r}))")  # fmt: skip
    script = f'mount -t tmpfs -o size=1m tmpfs {small} && "$0" -c "$1"; code=$?; ls -A {small}; exit $code'
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, sys.executable, code],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert done.returncode == 1 and "ImageError: mksquashfs could not write" in done.stderr, done.stderr[-2000:]
    assert "check the free space" in done.stderr or "free space" in done.stderr
    assert done.stdout.strip() == "" and not (tmp_path / "rootfs").exists()  # no half squashfs, no unpacked root
