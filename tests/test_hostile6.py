"""Round 6 of hostile and bad inputs (issue 57): shared caches, the gathered folder, trust options and
stop signals. Each case names the problem, exits with its documented code, and touches nothing."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from fakes import sign_offline

from builder import envs
from builder.errors import FolderError
from builder.wheelbuild import ccache

OTHER = 65534  # nobody: another user of a shared machine


@pytest.mark.parametrize(
    ("name", "folder"),
    [
        (envs.ENV_CACHE_ENV, lambda env: envs.build_envs_folder(Path("/tmp/work/cache"), env)),
        (ccache.CACHE_DIR_ENV, lambda env: ccache.cache_dir(Path("/tmp/work/cache"), env)),
    ],
)
def test_a_shared_cache_others_can_change_is_refused(name: str, folder: Any, tmp_path: Path) -> None:
    """Item 1: a planted environment in DS_BUILDER_ENV_CACHE (a folder of another user's, mode 0777, holding
    an environment with a .pth that runs code) was used, and so was the same cache through another user's
    link; a shared compiler cache others can write decides the objects in a wheel. Each is refused (exit 10)
    before anything in it is read; a file in the folder's place is named as such."""
    if os.geteuid() != 0:
        pytest.skip("making a folder of another user needs root")
    planted = tmp_path / "planted"
    (planted / "key" / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    (planted / "key" / "lib" / "python3.11" / "site-packages" / "zz_planted.pth").write_text("import os\n")
    os.chown(planted, OTHER, OTHER)
    planted.chmod(0o777)
    said = f"{name}={planted} cannot hold .+: {planted} belongs to another user \\(uid {OTHER}\\)"
    with pytest.raises(FolderError, match=said) as err:
        folder({name: str(planted)})
    assert err.value.exit_code == 10
    os.chown(planted, 0, 0)
    with pytest.raises(FolderError, match=r"is writable by every user \(mode 777\)"):
        folder({name: str(planted)})
    planted.chmod(0o755)
    assert folder({name: str(planted)}) == planted  # root's own, written by no one else: fine
    link = tmp_path / "link"
    link.symlink_to(planted)
    os.chown(link, OTHER, OTHER, follow_symlinks=False)
    with pytest.raises(FolderError, match=f"{link} is a link made by another user"):
        folder({name: str(link / "sub")})
    afile = tmp_path / "a-file"
    afile.write_text("")
    with pytest.raises(FolderError, match="is a file, not a folder") as err:
        folder({name: str(afile)})
    assert err.value.exit_code == 10
    # A folder above it that others can write (not sticky): they could swap the cache.
    (tmp_path / "open").mkdir(mode=0o777)
    (tmp_path / "open").chmod(0o777)
    with pytest.raises(FolderError, match="is writable by every user"):
        folder({name: str(tmp_path / "open" / "cache")})
    (tmp_path / "sticky").mkdir()
    (tmp_path / "sticky").chmod(0o1777)
    assert folder({name: str(tmp_path / "sticky" / "cache")}) == tmp_path / "sticky" / "cache"  # as /tmp is


def test_an_environment_someone_else_could_change_is_not_reused(tmp_path: Path) -> None:
    """Item 1: inside the cache, a complete environment whose folder others can write, or that belongs to
    another user, is refused by name (the next build makes it again once it is removed)."""
    if os.geteuid() != 0:
        pytest.skip("making a folder of another user needs root")
    requirements = ["torch==2.13.0"]
    venv = tmp_path / envs.env_key(requirements, False, None, None)
    (venv / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    (venv / envs.COMPLETE).write_text("torch==2.13.0\n")
    site = venv / "lib" / "python3.11" / "site-packages"
    site.chmod(0o777)
    with pytest.raises(FolderError, match=f"{site} is writable by every user") as err:
        envs.cached(tmp_path, requirements, tmp_path / "log")
    assert err.value.exit_code == 10 and f"remove {venv}" in err.value.fix
    site.chmod(0o755)
    os.chown(venv / envs.COMPLETE, OTHER, OTHER)
    with pytest.raises(FolderError, match=f"belongs to another user \\(uid {OTHER}\\)"):
        envs.cached(tmp_path, requirements, tmp_path / "log")
    os.chown(venv / envs.COMPLETE, 0, 0)
    assert envs.cached(tmp_path, requirements, tmp_path / "log") == venv  # its own: reused


def test_a_node_state_folder_another_user_could_change_is_refused(tmp_path: Path) -> None:
    """Item 1: DS_NODE_STATE_DIR world-writable and owned by another user was used: that user deletes
    serials.json and an older signed manifest is accepted again. Refused, as the module prefix is."""
    if os.geteuid() != 0:
        pytest.skip("making a folder of another user needs root")
    from builder.node import InstallError
    from builder.node.state import STATE_ENV, state_dir

    shared = tmp_path / "state"
    shared.mkdir()
    os.chown(shared, OTHER, OTHER)
    shared.chmod(0o777)
    with pytest.raises(InstallError, match=f"belongs to another user \\(uid {OTHER}\\)") as err:
        state_dir({STATE_ENV: str(shared)})
    assert "rollback" in err.value.message and STATE_ENV in err.value.fix
    os.chown(shared, 0, 0)
    with pytest.raises(InstallError, match="is writable by every user"):
        state_dir({STATE_ENV: str(shared)})
    shared.chmod(0o775)  # its group's members are others too
    with pytest.raises(InstallError, match=r"is writable by its group \(gid 0, mode 775\)"):
        state_dir({STATE_ENV: str(shared)})
    shared.chmod(0o755)
    (shared / "serials.json").write_text("{}")
    os.chown(shared / "serials.json", OTHER, OTHER)
    with pytest.raises(InstallError, match="serials.json belongs to another user"):
        state_dir({STATE_ENV: str(shared)})
    os.chown(shared / "serials.json", 0, 0)
    assert state_dir({STATE_ENV: str(shared)}) == shared
    with pytest.raises(InstallError, match="is the system folder"):
        state_dir({STATE_ENV: "/etc"})


def test_a_unit_secret_that_is_not_what_the_toolkit_makes_is_refused_and_rotate_makes_a_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 1: a unit-seal secret of any length was used (1 byte: every seal forgeable in 256 tries; empty:
    every unit rebuilt while the cache was blamed), and `key rotate` left the old secret in place."""
    import argparse

    from builder import signing
    from builder.commands.publishing import key
    from builder.errors import TrustError

    monkeypatch.setenv("DS_BUILDER_KEYS", str(tmp_path / "keys"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no ssh-keygen: units are sealed by the secret
    k = signing.keys()
    (tmp_path / "keys").mkdir(mode=0o700)
    secret = k.folder / signing.UNIT_SECRET_FILE
    for short in (b"", b"x", b"y" * 31, b"z" * 33):
        secret.write_bytes(short)
        secret.chmod(0o600)
        with pytest.raises(TrustError, match=f"is {len(short)} bytes, not the 32 random bytes") as err:
            signing.seal_unit(b"record", k)
        assert "key rotate" in err.value.fix and err.value.exit_code == TrustError.exit_code
    old = b"o" * 32
    secret.write_bytes(old)
    seal = signing.seal_unit(b"record", k)
    assert key(argparse.Namespace(action="rotate", value=None)) == 0  # no signing key here: the secret alone
    new = secret.read_bytes()
    assert len(new) == 32 and new != old and secret.stat().st_mode & 0o777 == 0o600
    with pytest.raises(TrustError, match="is not sealed by this host's secret"):
        signing.check_unit(b"record", seal, "unit.json", k)  # the old secret's seals: built again


def test_a_known_failures_link_with_credentials_or_a_query_is_refused_as_torch_index_is() -> None:
    """Item 2: `user:token@` or a query string in a known failure's link loaded and was embedded in every
    manifest and the page, while the same in [torch] index was refused. One rule now (a fragment, an
    anchor in the issue's page, stays)."""
    import copy

    from test_recipe import GOOD
    from test_reference import _manifest

    from builder.contracts import BUILD_SCHEMA, BuildManifest
    from builder.errors import RecipeError
    from builder.node import ManifestError
    from builder.recipe import parse_recipe

    data = {**copy.deepcopy(GOOD), "configs": ["configs/lbfgs.json"]}
    for link, said in (("https://user:tok@github.com/x/y/issues/1", "a user name or password"),
                       ("https://github.com/x/y/issues/1?token=abc", "a query string")):  # fmt: skip
        with pytest.raises(RecipeError, match=f"known_failures.configs/lbfgs.json.link holds {said}") as err:
            parse_recipe({**data, "known_failures": {"configs/lbfgs.json": {"reason": "r", "link": link}}})
        assert err.value.exit_code == 2 and "without credentials" in err.value.fix
        forged = _manifest(schema=BUILD_SCHEMA, known_failures={"configs/lbfgs.json": {"reason": "r", "link": link}})
        with pytest.raises(ManifestError, match=f"field 'link' holds {said}"):
            BuildManifest.from_dict(forged, "ds_builder.json")
    anchor = "https://github.com/x/y/issues/1#issuecomment-2"
    recipe = parse_recipe({**data, "known_failures": {"configs/lbfgs.json": {"reason": "r", "link": anchor}}})
    assert recipe.known_failures[0][2] == anchor


def _record(folder: Path, **fields: Any) -> None:
    import json
    import sys

    data = {"schema": 1, "recipe": "system-cpu", "python": f"{sys.version_info.major}.{sys.version_info.minor}",
            "wheels": [], **fields}  # fmt: skip
    (folder / "offline.json").write_text(json.dumps(data))
    sign_offline(folder)


def test_gather_writes_only_where_it_may_and_records_only_what_it_fetched(tmp_path: Path) -> None:
    """Item 2: wheels already in DEST/wheels (a planted numpy-99.0.0, a stale wheel) were recorded and then
    picked by the offline resolver; DEST/wheels a link another user made was written through as root; a
    system folder was accepted as --dest. Each is refused (exit 10) before anything is fetched, and the
    planted files are left where they are (nothing the toolkit did not create is removed)."""
    from builder import offline

    dest = tmp_path / "dest"
    (dest / "wheels").mkdir(parents=True)
    planted = dest / "wheels" / "numpy-99.0.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    planted.write_bytes(b"planted")
    with pytest.raises(FolderError, match="holds files gather did not put there: numpy-99.0.0") as err:
        offline.check_dest(dest)
    assert err.value.exit_code == 10 and "empty wheels/ and root/ yourself" in err.value.fix
    assert planted.read_bytes() == b"planted"
    _record(dest, wheels=[{"file": planted.name, "size": 7, "sha256": "0" * 64}])
    assert offline.check_dest(dest) == {planted.name: "0" * 64}  # an earlier gather's: replaced by this run's closure
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (dest / "wheels").rename(tmp_path / "old-wheels")
    (dest / "wheels").symlink_to(elsewhere)
    with pytest.raises(FolderError, match="is a link or a file, not a folder gather made"):
        offline.check_dest(dest)
    (dest / "wheels").unlink()
    if os.geteuid() == 0:
        link = tmp_path / "dest-link"
        link.symlink_to(dest)
        os.chown(link, OTHER, OTHER, follow_symlinks=False)
        with pytest.raises(FolderError, match="a link made by another user"):
            offline.check_dest(link)
    for system in (Path("/srv"), Path("/usr/lib/x")):
        with pytest.raises(FolderError, match="is the system folder") as err:
            offline.check_dest(system)
        assert err.value.exit_code == 10
    afile = tmp_path / "a-file"
    afile.write_text("")
    with pytest.raises(FolderError, match="is a file, not a folder") as err:
        offline.check_dest(afile)
    assert err.value.exit_code == 10
    with pytest.raises(FolderError, match="is a file, not a folder"):
        offline.check_dest(afile / "sub")


def test_have_is_a_bounded_regular_file_of_pip_freeze_lines(tmp_path: Path) -> None:
    """Item 2: `foo @ https://...==...whl` or a marker line gave a StopIteration traceback; a FIFO hung for
    ever; /dev/zero read until memory ran out. Each is one line, exit 2 (a URL install counts as held)."""
    from builder import offline
    from builder.errors import UsageError

    good = tmp_path / "freeze.txt"
    good.write_text("torch==2.11.0+cu130\nfoo @ https://x.org/foo-1.0==2-py3-none-any.whl\n# c\n-e git+https://x/y\n")
    assert offline.read_freeze(good) == {"torch": "2.11.0+cu130", "foo": ""}
    for line in ('foo; python_version=="3.11"', "foo>=1", "foo==1,!=2", 'foo==1; sys_platform=="linux"'):
        good.write_text(line + "\n")
        with pytest.raises(UsageError, match="line 1 .* is not a `pip freeze` line") as err:
            offline.read_freeze(good)
        assert err.value.exit_code == 2
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="is not a regular file"):
        offline.read_freeze(fifo)  # at once: no writer is waited for
    with pytest.raises(UsageError, match="is not a regular file"):
        offline.read_freeze(Path("/dev/zero"))
    big = tmp_path / "big.txt"
    with big.open("wb") as f:
        f.truncate(offline.FREEZE_LIMIT + 10)
    with pytest.raises(UsageError, match="larger than 4 MB"):
        offline.read_freeze(big)
    with pytest.raises(UsageError, match="cannot read --have"):
        offline.read_freeze(tmp_path / "absent.txt")


def test_a_gathered_folders_record_is_checked_before_it_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 2: offline.json's schema, recipe and python were never read (schema 999 was used); 200,000
    nested brackets gave a RecursionError; a huge one was read whole. Each is exit 4 in one line."""
    from builder import offline
    from builder.errors import SourceError
    from builder.recipe import load_recipe

    recipe = load_recipe(Path(__file__).resolve().parents[1] / "recipes" / "system-cpu.toml")
    (tmp_path / "wheels").mkdir()
    cases: list[tuple[dict[str, Any], str]] = [
        ({"schema": 999}, "has schema '999', not 1"),
        ({"recipe": "other"}, "was gathered for recipe 'other', not 'system-cpu'"),
        ({"python": "2.7"}, "was gathered for CPython 2.7"),
    ]
    for fields, said in cases:
        _record(tmp_path, **fields)
        with pytest.raises(SourceError, match=said) as err:
            offline.environ(tmp_path, recipe)
        assert err.value.exit_code == 4
    (tmp_path / "offline.json").write_text("[" * 200_000 + "]" * 200_000)
    sign_offline(tmp_path)
    with pytest.raises(SourceError, match="cannot be read as gather writes it"):
        offline.environ(tmp_path, recipe)
    monkeypatch.setattr(offline, "RECORD_LIMIT", 1000)
    _record(tmp_path, padding="x" * 2000)
    with pytest.raises(SourceError, match="larger than"):
        offline.environ(tmp_path, recipe)


def test_gathers_work_folder_or_dest_a_file_is_one_line_exit_10(tmp_path: Path, capsys: Any) -> None:
    """Item 2: --work-dir or --dest a regular file gave raw tracebacks; exit 10 with one line, as
    build-wheel does, and --have a FIFO one line, exit 2, before anything is fetched."""
    from builder import cli

    afile = tmp_path / "a-file"
    afile.write_text("")
    recipe = str(Path(__file__).resolve().parents[1] / "recipes" / "system-cpu.toml")
    assert cli.main(["gather", "--recipe", recipe, "--dest", str(tmp_path / "d"), "--work-dir", str(afile)]) == 10
    assert f"{afile} is a file, not a folder" in capsys.readouterr().err
    assert cli.main(["gather", "--recipe", recipe, "--dest", str(afile), "--work-dir", str(tmp_path / "w")]) == 10
    err = capsys.readouterr().err
    assert "is a file, not a folder" in err and "Traceback" not in err
    os.mkfifo(tmp_path / "fifo")
    assert cli.main(["gather", "--recipe", recipe, "--dest", str(tmp_path / "d"), "--have", str(tmp_path / "fifo"),
                     "--work-dir", str(tmp_path / "w")]) == 2  # fmt: skip
    assert "is not a regular file" in capsys.readouterr().err


def test_key_trust_keeps_what_a_line_says_or_refuses_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 3: namespaces="ds-wheel-builder-unit", valid-before="20200101" and cert-authority on a trusted
    line were dropped: allowed_signers got a plain ds-wheelhouse line (a unit key signing wheelhouses, an
    expired key never expiring, a CA key a signer), and provision hands that file to nodes. Refused now."""
    import shutil

    from builder import signing
    from builder.errors import UsageError

    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen makes the keys (apt-get install openssh-client)")
    monkeypatch.setenv(signing.KEYS_ENV, str(tmp_path / "keys"))
    k = signing.keys()
    signing.create(k)
    before = k.trust_file.read_text()
    other = signing.Keys(tmp_path / "other")
    (tmp_path / "other").mkdir(mode=0o700)
    key = signing.create(other).line()
    for options in ('namespaces="ds-wheel-builder-unit"', 'valid-before="20200101"', "cert-authority",
                    'cert-authority,namespaces="ds-wheelhouse"'):  # fmt: skip
        for line in (f"{options} {key}", f"ds-wheelhouse {options} {key}", f"@cert-authority * {key}"):
            with pytest.raises(UsageError, match="which `key trust` would drop") as err:
                signing.trust_key(k, line)
            assert err.value.exit_code == 2 and "plain key line" in err.value.fix
    assert k.trust_file.read_text() == before  # nothing written
    assert signing.trust_key(k, key) in k.trust().keys  # the plain line: trusted
    assert signing.trust_key(k, f"someone@host {key}") in k.trust().keys  # a principal and the key: fine


@pytest.mark.spawns
def test_sigterm_kills_every_threads_commands_at_once_and_starts_none(tmp_path: Path) -> None:
    """Item 4: with units compiling, `kill -TERM <builder>` exited 143 only after 217 s: the compilers ran
    on and new compile steps started 47 s after the signal. The units' threads (cmd.in_threads) now lose
    their commands' sessions at once, and what was queued never starts. FAKE compiles: sleeps."""
    import signal
    import subprocess
    import sys
    import time

    from test_hostile import _count

    root = Path(__file__).resolve().parents[1]
    marker = f"sleep 4{os.getpid() % 1000:03d}"
    script = tmp_path / "builder.py"
    script.write_text(
        f"import sys\nsys.path.insert(0, {str(root)!r})\nfrom builder import cli, cmd\ncli._terminate_cleanly()\n"
        f"try:\n    cmd.in_threads(lambda i: cmd.run(['sh', '-c', '{marker} & {marker}; wait'], group=True), "
        "range(6), 2, 'unit')\nexcept cli.Terminated:\n    sys.exit(143)\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _count(marker) < 4:
            time.sleep(0.1)
        assert _count(marker) == 4  # two units, two compiles each
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 143
        took = time.monotonic() - sent
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _count(marker):
            time.sleep(0.1)
        assert _count(marker) == 0, "a compile ran on after the builder stopped"
        time.sleep(1)
        assert _count(marker) == 0, "a queued unit started after the signal"
        assert took < 20, took  # not the length of a compile (400 s here)
    finally:
        proc.kill()


def _compilers_of(folder: Path) -> int:
    """cc1plus processes compiling a source under `folder` (their command line names it)."""
    found = 0
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"cc1plus") and any(str(folder).encode() in a for a in argv):
            found += 1
    return found


@pytest.mark.integration
def test_sigterm_stops_a_real_build_with_its_compilers_and_leaves_nothing(tmp_path: Path) -> None:
    """Item 4, for real: build-wheel of one op with an empty unit cache and no compiler cache, SIGTERM once
    its compiler runs: exit 143 in seconds, no compiler of it left, no unit sealed or stored, and the
    work folder's temporary folders gone, as the last line says."""
    import signal
    import subprocess
    import sys
    import time

    from conftest import own_envs

    root = Path(__file__).resolve().parents[1]
    text = (root / "recipes" / "system-cpu.toml").read_text()
    start = text.index("ops = [")
    recipe = tmp_path / "one.toml"
    recipe.write_text(text[:start] + 'ops = ["cpu_adam"]' + text[text.index("]", start) + 1 :])
    work, units = tmp_path / "work", tmp_path / "units"
    env = {**own_envs(dict(os.environ)), "DS_BUILDER_UNIT_CACHE": str(units)}
    proc = subprocess.Popen([sys.executable, "-m", "builder", "build-wheel", "--recipe", str(recipe), "--work-dir",
                             str(work), "--no-smoke", "--no-ccache"], cwd=root, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 900  # the build environment and the root, where this machine has none yet
        while time.monotonic() < deadline and not _compilers_of(work) and proc.poll() is None:
            time.sleep(0.5)
        assert _compilers_of(work), "no compiler ran"
        sent = time.monotonic()
        # As Slurm and `timeout` send it (issue 62 item 9): to the whole process group, twice.
        os.killpg(proc.pid, signal.SIGTERM)
        time.sleep(0.3)
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        proc.kill()
    assert proc.returncode == 143, err[-3000:]
    assert "terminated (SIGTERM)" in err.splitlines()[-1]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _compilers_of(work):
        time.sleep(0.2)
    assert _compilers_of(work) == 0
    assert not list(units.glob("*/unit.json")), "a unit was stored after the signal"
    assert not list(units.rglob("*.tmp")), list(units.rglob("*.tmp"))  # no half-made header or unit in the cache
    assert not list((work / "tmp").iterdir()), list((work / "tmp").iterdir())  # its temporary folders
    assert took < 30, took  # a cpu_adam compile takes minutes here


def test_a_wheel_from_which_no_config_runs_is_said_to_loudly() -> None:
    """Item 6: recipes/system-cpu.toml built cpu_adam, cpu_adagrad and cpu_lion without deepspeed_shm_comm:
    0 of 84 configs ran from its wheel on a node with no compiler, and the smoke said PASSED with no word of
    it. Now a check says so, with the op they need, and the smoke's last line says it (smoke._print); a
    CUDA wheel smoked where no GPU is (nothing could run) is not blamed, nor a wheel from which one config
    runs. (The recipe now builds shm_comm and fused_adam.)"""
    from builder.configs import Outcome
    from builder.recipe import load_recipe
    from builder.smoke import none_run

    needs = [Outcome(f"Adam/zero{i}/none/fp32", "needs-op", "", jit=("deepspeed_shm_comm",)) for i in range(4)]
    needs.append(Outcome("Lion/zero0/none/fp32", "unsupported", "not implemented"))
    (check,) = none_run(needs)
    assert check.status == "skipped" and check.name == "configs:none-run"
    assert (
        "not one of the 5 DeepSpeed configs runs" in check.detail
        and "4 of them need deepspeed_shm_comm" in check.detail
    )
    assert 'add "deepspeed_shm_comm" to the recipe\'s ops' in check.detail
    assert none_run([*needs, Outcome("Adam/zero1/cpu/fp32", "passed", "ok")]) == ()
    assert none_run([Outcome("Adam/zero0/none/fp32", "no-gpu", "no GPU visible")]) == ()
    assert none_run([]) == ()
    ops = load_recipe(Path(__file__).resolve().parents[1] / "recipes" / "system-cpu.toml").ops
    assert {"deepspeed_shm_comm", "fused_adam"} <= set(ops)
    from builder import output
    from builder.contracts import SmokeReport
    from builder.smoke import _print

    said: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(output, "step", said.append)
        mp.setattr(output, "warn", said.append)
        mp.setattr(output, "note", lambda text: None)
        _print(SmokeReport("w.whl", "0" * 64, True, (check,), 1.0, "2026-11-27T00:00:00+00:00"))
    assert said[0].endswith("BUT NOT ONE DeepSpeed config runs from it") and "deepspeed_shm_comm" in said[1]


def test_a_file_where_a_folder_is_named_and_the_default_memory_pool_are_told_apart(tmp_path: Path) -> None:
    """Item 7: DS_BUILDER_ENV_CACHE, _SDIST_CACHE, _ROOTS and _UNIT_CACHE naming a regular file gave raw
    tracebacks (exit 10 with one line now); DS_BUILDER_MEMORY_POOL naming the default pool itself
    (/dev/shm/ds-builder-memory-0) was called a system folder."""
    from builder.buildroot.make import ROOTS_ENV, roots_folder
    from builder.units import memory
    from builder.units.cache import UNIT_CACHE_ENV, cache_folder
    from builder.wheelbuild import source

    afile = tmp_path / "a-file"
    afile.write_text("")
    for name, folder in (
        (envs.ENV_CACHE_ENV, lambda env: envs.build_envs_folder(tmp_path, env)),
        (source.SDIST_CACHE_ENV, lambda env: source.sdist_folder(tmp_path, env)),
        (ROOTS_ENV, roots_folder),
        (UNIT_CACHE_ENV, lambda env: cache_folder(tmp_path, env)),
        (ccache.CACHE_DIR_ENV, lambda env: ccache.cache_dir(tmp_path, env)),
    ):
        with pytest.raises(FolderError, match=f"{name}=.* is a file, not a folder") as err:
            folder({name: str(afile)})
        assert err.value.exit_code == 10
    default = memory.pool_folder({})
    assert memory.pool_folder({memory.POOL_ENV: str(default)}) == default
    with pytest.raises(FolderError, match="is the system folder"):
        memory.pool_folder({memory.POOL_ENV: "/dev/shm"})


def test_a_path_the_system_refuses_is_one_line_exit_10(tmp_path: Path, capsys: Any) -> None:
    """Item 7: `verify --wheelhouse` with a path over 4,096 characters gave an OSError traceback."""
    from builder import cli

    long = str(tmp_path / ("a" * 5000))
    assert cli.main(["verify", "--wheelhouse", long]) == 10
    err = capsys.readouterr().err
    assert "File name too long" in err and "(5" in err and "Traceback" not in err and len(err) < 1000


def test_a_root_compilers_planted_side_files_are_not_called_the_ops_fault() -> None:
    """Item 7: a root compiler's planted side files were refused (right) with the fix "drop the op or set
    on_op_failure = "drop"": no op is at fault, the root's tools are, and "drop" must not ship past it."""
    from test_units import plan_for

    from builder.build import refuse_failed
    from builder.errors import BuildError
    from builder.units.plan import plan_units
    from builder.units.runner import UnitResult

    (unit,), _ = plan_units(plan_for("cpu_lion"), {}, 2, None)
    (other,), _ = plan_units(plan_for("cpu_adam"), {}, 2, None)
    planted = UnitResult(unit, "failed", None, 1.0, Path("unit.log"), "op cpu_lion: its build left files that are "
                         "not its op's nor DeepSpeed's own, refused: deepspeed/evil.py", foreign=True)  # fmt: skip
    built = UnitResult(other, "built", Path("w.whl"), 1.0, Path("u2.log"))
    for on_failure in ("error", "drop"):
        with pytest.raises(BuildError, match="deepspeed/evil.py") as err:
            refuse_failed([planted, built], on_failure)
        assert "on_op_failure" not in err.value.fix and "build root's compilers" in err.value.fix


def test_a_folder_of_files_no_publish_wrote_is_not_sent_to_repair(tmp_path: Path, capsys: Any) -> None:
    """Item 7: verify said run repair, repair removed 0 leftovers, verify said the same again (a loop)."""
    from builder import cli

    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "deepspeed-1.0-py3-none-any.whl").write_text("y")
    assert cli.main(["verify", "--wheelhouse", str(tmp_path)]) == 8
    err = capsys.readouterr().err
    assert "holds files no publish wrote" in err and "builder repair" not in err, err
    (tmp_path / ".publish.lock").write_text("")  # a publish's own trace: then it is repair's
    assert cli.main(["verify", "--wheelhouse", str(tmp_path)]) == 8
    assert "builder repair" in capsys.readouterr().err


def test_a_known_failure_that_passes_now_is_called_stale() -> None:
    """Item 7: a known failure for a config that now passes was never called stale."""
    from builder import configs

    passed = configs.Outcome("configs/lbfgs.json", "passed", "3 steps with LBFGS")
    check = configs.as_check(passed, "cpu", site=True, known="DeepSpeed steps LBFGS without its closure")
    assert check.status == "passed" and "[known_failures] entry in the recipe is stale: remove it" in check.detail
    assert "stale" not in configs.as_check(passed, "cpu", site=True).detail


@pytest.mark.spawns
def test_check_config_python_that_is_no_python_is_named(tmp_path: Path, capsys: Any) -> None:
    """Item 7: `check-config --python /bin/echo` exited 6 (the smoke's code) and said "read its log",
    naming none. It is a usage error naming the interpreter (exit 2)."""
    from builder import cli

    config = tmp_path / "adam.json"
    config.write_text('{"train_micro_batch_size_per_gpu": 4}')
    assert cli.main(["check-config", str(config), "--python", "/bin/echo", "--work-dir", str(tmp_path / "w")]) == 2
    assert "/bin/echo is not a Python interpreter with DeepSpeed" in capsys.readouterr().err


@pytest.mark.spawns
def test_install_ops_that_are_no_op_names_are_refused_not_suggested(capsys: Any) -> None:
    """Item 7: `install --ops '../../x,cpu_adam'` suggested adding ../../x to a recipe."""
    from builder import cli

    with pytest.raises(SystemExit) as done:
        cli.main(["install", "--wheelhouse", "/nonexistent", "--ops", "../../x,cpu_adam"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "'../../x' is not an op's name" in err and "recipe" not in err


def test_the_smokes_fix_names_the_wheels_own_failures_before_deepspeeds() -> None:
    """Item 7: when the wheel's own checks failed too, the smoke's fix line spoke only of listing the
    upstream config as a known failure."""
    from builder.contracts import Check
    from builder.smoke import failure

    upstream = Check("config:site/configs/lbfgs.json", "failed", "DeepSpeed's own failure, not the wheel's: ...")
    own = Check("numerics:cpu_adam", "failed", "max |difference| 3 exceeds 1e-5")
    err = failure("w.whl", [upstream, own], Path("w.whl.smoke.json"), Path("smoke.log"))
    assert err.fix.startswith("the wheel's own checks failed (numerics:cpu_adam)")
    assert err.fix.index("numerics:cpu_adam") < err.fix.index("[known_failures]")
    only = failure("w.whl", [upstream], Path("w.whl.smoke.json"), Path("smoke.log"))
    assert "wheel's own" not in only.fix and "configs/lbfgs.json under [known_failures]" in only.fix


def test_a_modules_missing_python_is_named_by_the_path_the_node_lacks(tmp_path: Path) -> None:
    """Item 7: a module whose Python is missing on the node named `python3.11` (the venv link's text),
    not the missing path."""
    from builder.node.module import module_runs_here

    bin_dir = tmp_path / "root" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python3.11").symlink_to(tmp_path / "usr" / "bin" / "python3.11")
    (bin_dir / "python").symlink_to("python3.11")
    why = module_runs_here(str(tmp_path / "root"))
    assert why == f"its python is {tmp_path / 'usr' / 'bin' / 'python3.11'}, which this node does not have"


def test_newlines_in_names_are_printed_escaped(tmp_path: Path, capsys: Any) -> None:
    """Item 8: an --offline folder's planted wheel name and the folder's own name, a module --prefix and
    serve --wheelhouse each printed a line of their own that could read as "error: ..."; escaped now, as
    verify does. (check-config's config file names: the same printable, in commands/proving.py.)"""
    import json

    from builder import cli, offline
    from builder.errors import SourceError
    from builder.node.module import ModuleError, check_module_folders
    from builder.wheelhouse.serve import serve

    folder = tmp_path / "off\nerror: fake"
    (folder / "wheels").mkdir(parents=True)
    (folder / "offline.json").write_text(json.dumps({"schema": 1, "recipe": "x", "wheels": []}))
    sign_offline(folder)
    (folder / "wheels" / "evil\nerror: all good.whl").write_bytes(b"x")
    with pytest.raises(SourceError) as err:
        offline.check_record(folder)
    assert "\n" not in err.value.message and "evil\\nerror: all good.whl (not listed)" in err.value.message
    assert "off\\nerror: fake" in err.value.message
    with pytest.raises(ModuleError) as module_err:
        check_module_folders(str(tmp_path / "pre\nerror: x"), str(tmp_path / "mf"))
    assert "\n" not in module_err.value.message.split(" is unsafe")[0]
    with pytest.raises(Exception) as serve_err:
        serve(tmp_path / "house\nerror: y", "127.0.0.1", 0)
    assert "house\\nerror: y" in str(serve_err.value) and "\nerror: y" not in str(serve_err.value)
    assert cli.main(["smoke", "--offline", str(folder), "--work-dir", str(tmp_path / "w")]) == 4
    said = capsys.readouterr().err
    assert "\nerror: fake" not in said and "\nerror: all good" not in said, said
