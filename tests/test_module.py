"""The Lmod module (issue 40): `python -m builder module` (the node installer's --module mode) puts a
wheel with everything its lock pins into a venv under a site's prefix and writes its Lua modulefile
last, once Lmod has loaded it and ds_report lists its ops.

These tests use a FAKE DeepSpeed wheel (tests/fakes.py: `import deepspeed` works and its
`ds_report` prints the op table line of its one op, nothing else of DeepSpeed) and a fake
dependency, so a module installs in seconds; Lmod, venv and pip are real. The real wheel's module
(torch, every op, a DeepSpeed config) is tested by test_pipeline_images.py and on the cluster's nodes by
test_cluster.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from fakes import METADATA, dep_wheel, fake_wheel, write_wheel

import builder.node.module as node_module
from builder import cli, node, signing
from builder.node import EXIT_MODULE, MODULE_MARK, MODULE_PARTIAL, MODULE_RECORD
from builder.wheelhouse import publish, verify
from builder.wheelhouse.extras import publish_locks
from builder.wheelhouse.layout import load_manifest
from builder.wheelhouse.lockfile import render_lock, served_files
from builder.wheelhouse.publish import add_files, commit

LMOD = next((p for p in node.LMOD_INITS if os.path.isfile(p)), None)
needs_lmod = pytest.mark.skipif(LMOD is None, reason="needs Lmod: apt-get install lmod (.ci/run installs it)")
VERSION = "0.19.8+cpu.torch2.13-py3.11"
MODULE = f"deepspeed/{VERSION}"
REPORT = "cpu_adam ............. [YES] ...... [OKAY]"


def _module_wheel(folder: Path) -> Path:
    """A FAKE DeepSpeed wheel pip installs: `import deepspeed` and a `ds_report` printing its one op
    as installed, plus the build manifest and smoke report publish reads."""
    wheel = fake_wheel(folder, metadata=METADATA.replace("Requires-Dist: torch==2.13.0\n",
                                                          "Requires-Dist: fakedep-a>=1\n"),
                       cpu_target="x86-64")  # fmt: skip
    report = wheel.with_name(wheel.name + ".smoke.json").read_bytes()
    version = "0.19.8+cpu.torch2.13"
    with zipfile.ZipFile(wheel) as zf:
        files = {n: zf.read(n) for n in zf.namelist() if not n.endswith(("/RECORD", "/WHEEL"))}
    files |= {"deepspeed/__init__.py": f"__version__ = {version!r}\n".encode(),
              f"deepspeed-{version}.data/scripts/ds_report": f"#!python\nprint({REPORT!r})\n".encode()}  # fmt: skip
    wheel.unlink()
    write_wheel(wheel, files, executable=(f"deepspeed-{version}.data/scripts/ds_report",))
    data = json.loads(report)
    data["sha256"] = hashlib.sha256(wheel.read_bytes()).hexdigest()
    wheel.with_name(wheel.name + ".smoke.json").write_text(json.dumps(data))
    return wheel


def _deps(reqs: object, tag: str, dest: Path, log: object) -> list[Path]:
    """A FAKE `pip download`: the closure as one tiny real wheel."""
    return [dep_wheel(dest, "fakedep-a", "1.0")]


def _lock(house: Path) -> str:
    """What `lock` writes for the house's one wheel (its lock only), published into the signed manifest."""
    manifest = load_manifest(house)
    (wheel,) = manifest.wheels
    text = render_lock(wheel, served_files(manifest))
    publish_locks(house, {"locks/cpu.lock": text})
    return text


@pytest.fixture
def house(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(signing.KEYS_ENV, str(tmp_path / "keys"))
    monkeypatch.setenv(node.STATE_ENV, str(tmp_path / "node-state"))
    dist = tmp_path / "dist"
    dist.mkdir()
    target = tmp_path / "house"
    publish([_module_wheel(dist)], target, fetch_closure=_deps)
    _lock(target)
    assert verify(target) == []
    return target


def module(house: Path, prefix: Path, *args: str) -> tuple[int, str]:
    """`python -m builder module` in this process (the build host's keys are the trust)."""
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = cli.main(["module", "--wheelhouse", str(house), "--prefix", str(prefix), "--python", sys.executable,
                         *args])  # fmt: skip
    return code, err.getvalue()


def _login(modulefiles: Path, home: Path, script: str) -> subprocess.CompletedProcess[str]:
    """`script` in a login shell of a user whose home is `home`, after `module use modulefiles`."""
    env = {"HOME": str(home), "PATH": "/usr/local/bin:/usr/bin:/bin", "USER": "someone", "LANG": "C.UTF-8"}
    return subprocess.run(["bash", "-lc", f"module use {modulefiles} && {script}"], capture_output=True, text=True,
                          env=env)  # fmt: skip


def _tree(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.lstat().st_mtime_ns for p in sorted(folder.rglob("*"))}


# ---------------------------------------------------------------- pure


def test_the_modulefile_sets_only_the_environment_and_quotes_what_it_names() -> None:
    entry = node.WheelEntry(
        name="deepspeed-0.19.8+cpu.torch2.13-cp311-cp311-manylinux_2_28_x86_64.whl", sha256="a" * 64,
        version="0.19.8+cpu.torch2.13", recipe="cpu", accelerator="cpu", python_tag="cp311", torch="2.13.0+cpu",
        cuda=None, archs=(), cpu_target="x86-64-v3", cpu_flags=(), ops=("cpu_adam", "cpu_lion"),
        smoke=node.SmokeSummary(True, "", {}),
    )  # fmt: skip
    assert node.module_version(entry) == VERSION
    text = node.render_modulefile(entry, '/sw/a "b"\\c', "locks/cpu.lock", "b" * 64, "/usr/bin/python3.11")
    lines = text.splitlines()
    assert lines[0] == MODULE_MARK and lines[2] == f"-- lock: locks/cpu.lock sha256 {'b' * 64}"
    assert 'local root = "/sw/a \\"b\\"\\\\c"' in lines
    assert 'conflict("deepspeed")' in lines and 'prepend_path("PATH", pathJoin(root, "bin"))' in lines
    assert "ops: cpu_adam, cpu_lion" in text and "glibc 2.28 or newer" in text and "torch 2.13.0+cpu" in text
    # Only environment changes Lmod undoes at unload: no execute(), no file written.
    calls = {line.split("(")[0] for line in lines if "(" in line and not line.startswith(("--", " "))}
    assert calls <= {"whatis", "help", "conflict", "prepend_path", "setenv"}, calls
    # A help text holding "]]" gets a longer bracket level, so it cannot end the string early.
    assert node_module._lua_long("a]]b").startswith("[=[")


def test_unsafe_prefixes_are_named(tmp_path: Path) -> None:
    assert "system folder" in (node.folder_problem("/usr/lib/x") or "")
    assert "system folder" in (node.folder_problem("/opt") or "")
    assert node.folder_problem("/usr/local/software") is None or "/usr/local" not in node.SYSTEM_TREES
    shared = tmp_path / "shared"
    shared.mkdir()
    assert node.folder_problem(str(shared / "software")) is None
    shared.chmod(0o777)
    assert "writable by every user" in (node.folder_problem(str(shared / "software")) or "")
    shared.chmod(0o1777)  # sticky, as /tmp: others cannot move what is not theirs
    assert node.folder_problem(str(shared / "software")) is None
    shared.chmod(0o755)
    link = tmp_path / "link"
    link.symlink_to(shared)
    os.lchown(link, 4242, 4242)
    assert "a link made by another user (uid 4242)" in (node.folder_problem(str(link / "software")) or "")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 4242, 4242)
    assert "belongs to another user" in (node.folder_problem(str(theirs / "software")) or "")


def test_pip_and_venv_run_without_the_users_pip_settings() -> None:
    env = node.clean_env({"PIP_INDEX_URL": "https://evil.example", "PIP_FIND_LINKS": "/srv", "PYTHONPATH": "/x",
                          "PATH": "/usr/bin", "HOME": "/root"})  # fmt: skip
    assert env == {"PATH": "/usr/bin", "HOME": "/root", "SOURCE_DATE_EPOCH": "0", "PIP_CONFIG_FILE": os.devnull,
                   "PYTHONNOUSERSITE": "1"}  # fmt: skip


# ---------------------------------------------------------------- installed for real (fake wheel, real Lmod, venv, pip)


@pytest.mark.spawns
@needs_lmod
def test_a_module_loads_in_a_login_shell_and_a_second_install_does_nothing(house: Path, tmp_path: Path) -> None:
    prefix = tmp_path / "shared" / "software"
    code, said = module(house, prefix)
    assert code == 0, said
    modulefile = prefix / "modulefiles" / "deepspeed" / f"{VERSION}.lua"
    lock_sha = load_manifest(house).locks["locks/cpu.lock"].sha256
    root = prefix / "deepspeed" / VERSION / lock_sha[:12]
    assert modulefile.read_text().splitlines()[0] == MODULE_MARK and f'local root = "{root}"' in modulefile.read_text()
    assert f"{MODULE} loads with Lmod: python {root}/bin/python; cpu_adam [YES]" in said
    record = json.loads((root / MODULE_RECORD).read_text())
    assert record["lock_sha256"] == lock_sha and sorted(record["files"]) == sorted(served_files(load_manifest(house)))
    assert not (root / MODULE_PARTIAL).exists()
    # Readable by every user, writable by none but the owner (files and folders, the modulefile too).
    for path in [modulefile, *root.rglob("*")]:
        if not path.is_symlink():
            mode = path.stat().st_mode
            assert mode & 0o444 == 0o444 and not mode & 0o022, (path, oct(mode))
    # A user's login shell: module load gives the module's python and ds_report, nothing written in
    # the home; module purge gives the shell back as it was.
    home = tmp_path / "home"
    home.mkdir()
    before = "echo PATH=$PATH; echo VENV=${VIRTUAL_ENV-}; command -v python3"
    shell = _login(
        prefix / "modulefiles",
        home,
        f"{before}; module load deepspeed && command -v python && ds_report "
        f"&& python -c 'import deepspeed; print(deepspeed.__version__)' && module purge && {before}",
    )
    assert shell.returncode == 0, shell.stderr
    out = shell.stdout.splitlines()
    assert out[3] == f"{root}/bin/python" and out[4] == REPORT and out[5] == "0.19.8+cpu.torch2.13", out
    assert out[:3] == out[6:9], out  # PATH, VIRTUAL_ENV and python3 as before the load
    assert list(home.iterdir()) == []
    # The same lock again: nothing is touched.
    tree = _tree(prefix)
    code, said = module(house, prefix)
    assert code == 0 and "is already installed from locks/cpu.lock" in said and "nothing to do" in said
    assert _tree(prefix) == tree
    # Issue 51, item 7: the same tree read by a node of another OS, which lacks the interpreter the venv
    # was made with (FAKE: its link pointed at a path this machine does not have, as a Debian 11 node
    # lacks the build host's /usr/bin/python3.11). It answered "already installed ... nothing to do".
    link = root / "bin" / "python"
    made_with = os.readlink(link)
    link.unlink()
    link.symlink_to("/nonexistent/python3.11")
    try:
        code, said = module(house, prefix)
        assert code == EXIT_MODULE and "does not run on this node: its python is /nonexistent/python3.11" in said, said
        assert "install a module per interpreter path" in said and "nothing to do" not in said
    finally:
        link.unlink()
        link.symlink_to(made_with)


@pytest.mark.spawns
@needs_lmod
def test_another_lock_at_the_same_version_is_refused_and_then_switched_last(house: Path, tmp_path: Path) -> None:
    prefix = tmp_path / "sw"
    assert module(house, prefix)[0] == 0
    modulefile = prefix / "modulefiles" / "deepspeed" / f"{VERSION}.lua"
    first = modulefile.read_text()
    old_root = next((prefix / "deepspeed" / VERSION).iterdir())
    # The lock changes (a newer dependency pinned): same wheel, same version, another lock.
    extra = tmp_path / "extra"
    extra.mkdir()
    add_files(house, [dep_wheel(extra, "fakedep-b", "2.0")], "a test")
    _lock(house)
    code, said = module(house, prefix)
    assert code == EXIT_MODULE and "is the module of another lock at version" in said and "--replace-module" in said
    assert modulefile.read_text() == first and [p.name for p in (prefix / "deepspeed" / VERSION).iterdir()] == [
        old_root.name
    ]
    code, said = module(house, prefix, "--replace-module")
    assert code == 0, said
    new_sha = load_manifest(house).locks["locks/cpu.lock"].sha256
    assert f"sha256 {new_sha}" in modulefile.read_text() and old_root.is_dir()  # the old files stay for running jobs
    assert sorted(p.name for p in (prefix / "deepspeed" / VERSION).iterdir()) == sorted([old_root.name, new_sha[:12]])


@pytest.mark.spawns
@needs_lmod
def test_an_interrupted_install_is_removed_by_the_next_and_a_folder_not_ours_is_not(
    house: Path, tmp_path: Path
) -> None:
    prefix = tmp_path / "sw"
    lock_sha = load_manifest(house).locks["locks/cpu.lock"].sha256
    root = prefix / "deepspeed" / VERSION / lock_sha[:12]
    root.mkdir(parents=True)
    (root / "bin").mkdir()
    (root / MODULE_PARTIAL).write_text("being installed by pid 1\n")  # what a kill -9 leaves
    code, said = module(house, prefix)
    assert code == 0 and "removing" in said and "an install that was interrupted" in said, said
    other = tmp_path / "other"
    theirs = other / "deepspeed" / VERSION / lock_sha[:12]
    theirs.mkdir(parents=True)
    (theirs / "data").write_text("someone's")
    code, said = module(house, other)
    assert code == EXIT_MODULE and "exists and was not made by this installer" in said
    assert (theirs / "data").read_text() == "someone's"


@pytest.mark.spawns
@pytest.mark.parametrize("case", ["system", "world-writable modulefiles", "not ours", "a file", "link of another user"])
def test_an_unsafe_or_taken_place_is_refused_before_anything_is_written(house: Path, tmp_path: Path, case: str) -> None:
    prefix = tmp_path / "sw"
    if case == "system":
        prefix = Path("/usr/lib/ds-module-test")
        said_here = "is the system folder"
    elif case == "world-writable modulefiles":
        (prefix / "modulefiles").mkdir(parents=True)
        (prefix / "modulefiles").chmod(0o777)
        said_here = "writable by every user"
    elif case == "not ours":
        (prefix / "modulefiles" / "deepspeed").mkdir(parents=True)
        (prefix / "modulefiles" / "deepspeed" / f"{VERSION}.lua").write_text('whatis("a site\'s own")\n')
        said_here = "exists and was not written by this installer"
    elif case == "a file":
        prefix.write_text("")
        said_here = "is a file, not a folder"
    else:
        real = tmp_path / "real"
        real.mkdir()
        link = tmp_path / "link"
        link.symlink_to(real)
        os.lchown(link, 4242, 4242)
        prefix = link / "sw"
        said_here = "is a link made by another user (uid 4242)"
    before = {k: v for k, v in _tree(tmp_path).items() if not k.startswith("node-state")}
    code, said = module(house, prefix)
    assert code == EXIT_MODULE, said
    assert said_here in said and "fix:" in said, said
    assert {k: v for k, v in _tree(tmp_path).items() if not k.startswith("node-state")} == before
    assert not Path("/usr/lib/ds-module-test").exists()


@pytest.mark.spawns
def test_a_lock_that_fails_verification_or_is_missing_installs_nothing(house: Path, tmp_path: Path) -> None:
    prefix = tmp_path / "sw"
    lock = house / "locks" / "cpu.lock"
    text = lock.read_text()
    at = text.index("--hash=sha256:") + len("--hash=sha256:")
    lock.write_text(text[:at] + ("0" if text[at] != "0" else "1") + text[at + 1 :])  # one digit: same size
    code, said = module(house, prefix)
    assert code == 8 and "locks/cpu.lock" in said and "the manifest says" in said, said
    assert not prefix.exists()
    lock.write_text(text)
    manifest = load_manifest(house)
    commit(house, dataclasses.replace(manifest, locks={}))  # signed: a wheelhouse whose lock was never written
    code, said = module(house, prefix)
    assert code == EXIT_MODULE and "has no lock for" in said and "python -m builder lock --wheel" in said, said
    assert not prefix.exists()


@pytest.mark.spawns
def test_without_lmod_nothing_is_published(house: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_module, "LMOD_INITS", (str(tmp_path / "no-lmod" / "init" / "bash"),))
    monkeypatch.delenv("LMOD_PKG", raising=False)
    prefix = tmp_path / "sw"
    code, said = module(house, prefix)
    assert code == EXIT_MODULE and "Lmod is not installed here" in said and "apt-get install lmod" in said, said
    assert not (prefix / "modulefiles").exists() and list((prefix / "deepspeed" / VERSION).iterdir()) == []


@pytest.mark.spawns
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root to mount a small tmpfs")
def test_a_full_disk_leaves_no_half_module(house: Path, tmp_path: Path) -> None:
    """The prefix on a 2 MiB tmpfs (in a private mount namespace): the venv cannot be made; exit 16,
    the half-made folder removed, no modulefile."""
    prefix = tmp_path / "small"
    prefix.mkdir()
    keys = os.environ[signing.KEYS_ENV]
    script = (f"mount -t tmpfs -o size=2m tmpfs {prefix} && {sys.executable} -m builder module --wheelhouse {house} "
              f"--prefix {prefix} --python {sys.executable}; code=$?; ls -A {prefix}; find {prefix}/deepspeed "
              "-mindepth 2; exit $code")  # fmt: skip
    env = {**os.environ, signing.KEYS_ENV: keys, "PYTHONPATH": str(Path(__file__).parents[1])}
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], capture_output=True,
                          text=True, env=env)  # fmt: skip
    assert done.returncode == EXIT_MODULE, done.stderr[-3000:]
    assert "No space left" in done.stderr or "venv failed" in done.stderr or "could not install" in done.stderr
    assert done.stdout.split() == ["deepspeed"], done.stdout  # the version folder only: no venv, no modulefiles
    assert stat.S_ISDIR(prefix.stat().st_mode)


@pytest.mark.spawns
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root to mount a read-only folder")
def test_a_prefix_on_a_read_only_mount_is_one_message(house: Path, tmp_path: Path) -> None:
    """Issue 51, item 10: `module --prefix P` where P/deepspeed is a read-only mount (a node that mounts
    the software tree read-only) ended in an EROFS traceback. Now: exit 16, what to do, nothing written."""
    prefix = tmp_path / "sw"
    (prefix / "deepspeed").mkdir(parents=True)
    keys = os.environ[signing.KEYS_ENV]
    script = (f"mount --bind -o ro {prefix / 'deepspeed'} {prefix / 'deepspeed'} && mount -o remount,bind,ro "
              f"{prefix / 'deepspeed'} && {sys.executable} -m builder module --wheelhouse {house} --prefix {prefix} "
              f"--python {sys.executable}")  # fmt: skip
    env = {**os.environ, signing.KEYS_ENV: keys, "PYTHONPATH": str(Path(__file__).parents[1])}
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], capture_output=True,
                          text=True, env=env)  # fmt: skip
    assert done.returncode == EXIT_MODULE, done.stderr[-3000:]
    assert "Read-only file system" in done.stderr and "mounts the tree read-write" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert list((prefix / "deepspeed").iterdir()) == [] and not (prefix / "modulefiles").exists()
