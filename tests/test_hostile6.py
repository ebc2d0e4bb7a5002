"""Round 6 of hostile and bad inputs (issue 57): shared caches, the gathered folder, trust options and
stop signals. Each case names the problem, exits with its documented code, and touches nothing."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

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
    with pytest.raises(FolderError, match=f"{name}={planted}: {planted} belongs to user {OTHER}") as err:
        folder({name: str(planted)})
    assert err.value.exit_code == 10
    os.chown(planted, 0, 0)
    with pytest.raises(FolderError, match=r"can be written by others \(mode 777\)"):
        folder({name: str(planted)})
    planted.chmod(0o755)
    assert folder({name: str(planted)}) == planted  # root's own, written by no one else: fine
    link = tmp_path / "link"
    link.symlink_to(planted)
    os.chown(link, OTHER, OTHER, follow_symlinks=False)
    with pytest.raises(FolderError, match=f"passes through {link}, a link made by another user"):
        folder({name: str(link / "sub")})
    afile = tmp_path / "a-file"
    afile.write_text("")
    with pytest.raises(FolderError, match="is not a folder") as err:
        folder({name: str(afile)})
    assert err.value.exit_code == 10
    # A folder above it that others can write (not sticky): they could swap the cache.
    (tmp_path / "open").mkdir(mode=0o777)
    (tmp_path / "open").chmod(0o777)
    with pytest.raises(FolderError, match="can be written by others"):
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
    with pytest.raises(FolderError, match=f"{site} can be written by others") as err:
        envs.cached(tmp_path, requirements, tmp_path / "log")
    assert err.value.exit_code == 10 and f"remove {venv}" in err.value.fix
    site.chmod(0o755)
    os.chown(venv / envs.COMPLETE, OTHER, OTHER)
    with pytest.raises(FolderError, match=f"belongs to user {OTHER}"):
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
    with pytest.raises(InstallError, match=r"can be written by others \(mode 775\)"):
        state_dir({STATE_ENV: str(shared)})
    shared.chmod(0o755)
    (shared / "serials.json").write_text("{}")
    os.chown(shared / "serials.json", OTHER, OTHER)
    with pytest.raises(InstallError, match="serials.json belongs to another user"):
        state_dir({STATE_ENV: str(shared)})
    os.chown(shared / "serials.json", 0, 0)
    assert state_dir({STATE_ENV: str(shared)}) == shared
    with pytest.raises(InstallError, match="is a system folder"):
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

    from test_reference import _manifest
    from test_recipe import GOOD

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
