"""Round 5 of hostile and bad inputs (issue 51): each case as it was tried, failing before its fix."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from test_recipe import GOOD

from builder import envs, node
from builder.buildroot.make import ROOTS_ENV, roots_folder
from builder.envs import PackageSources
from builder.errors import FolderError, RecipeError
from builder.recipe import parse_recipe
from builder.units import memory
from builder.wheelbuild import ccache, source

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("name", "folder"),
    [
        (ROOTS_ENV, roots_folder),
        (source.SDIST_CACHE_ENV, lambda env: source.sdist_folder(Path("/tmp/work/cache"), env)),
        (ccache.CACHE_DIR_ENV, lambda env: ccache.cache_dir(Path("/tmp/work/cache"), env)),
        (envs.ENV_CACHE_ENV, lambda env: envs.build_envs_folder(Path("/tmp/work/cache"), env)),
        (memory.POOL_ENV, memory.pool_folder),
    ],
)
def test_a_system_folder_from_the_environment_is_refused_wherever_one_is_read(name: str, folder: Any) -> None:
    """Item 3: DS_BUILDER_ROOTS=/opt made roots, their lock, log and a temporary tree in /opt. Every
    folder the environment names goes through one check (files.env_folder), as the unit cache and the
    key folder already did."""
    for bad in ("/opt", "/usr/lib", "/etc/x", "/"):
        with pytest.raises(FolderError, match=f"{name}={bad} cannot hold .+: {bad} is the system folder") as err:
            folder({name: bad})
        assert err.value.exit_code == 10 and f"point {name} at a folder of your own" in err.value.fix
    assert folder({name: "/var/tmp/ds-own"}) == Path("/var/tmp/ds-own")


def test_a_secret_in_an_index_url_is_found_wherever_a_url_can_carry_it() -> None:
    """Item 4: a token in the query string passed the credentials check (only user:password@ was
    looked for), was printed by the plan and embedded in the wheel's ds_builder.json."""
    for url, said in (
        ("https://mirror.example/whl/cpu?token=SECRET", "a query string"),
        ("https://u:SECRET@mirror.example/whl/cpu", "a user name or password"),
        ("https://mirror.example/whl/cpu#SECRET", "a fragment"),
    ):
        data: dict[str, Any] = copy.deepcopy(GOOD)
        data["torch"] = {"version": "2.13.0", "variant": "cpu", "index": url}
        with pytest.raises(RecipeError) as err:
            parse_recipe(data)
        assert f"torch.index holds {said}" in err.value.message and "SECRET" not in err.value.message
        assert err.value.exit_code == 2 and "~/.netrc" in err.value.fix
        with pytest.raises(node.InstallError, match=said):  # a node's --wheelhouse URL
            node.wheelhouse_base(url)
        assert not node.INDEX_URL_RE.match(url)
    assert node.url_secret("https://download.pytorch.org/whl/cpu") is None
    # A machine's own pip configuration may carry one: shown masked wherever the sources are printed.
    shown = PackageSources("https://u:p@idx.example/simple?token=SECRET", ("https://x/?sig=S",)).describe()
    assert "SECRET" not in shown and "sig=S" not in shown and "p@" not in shown
    assert shown == "index https://***@idx.example/simple?***, extra index https://x/?***"


def test_a_recipe_name_too_long_for_a_file_name_is_refused_at_load() -> None:
    """Item 14: a name of 250 characters passed, then the build log's file name was too long (OSError
    traceback, exit 1)."""
    with pytest.raises(RecipeError) as err:
        parse_recipe({**copy.deepcopy(GOOD), "name": "a" * 250})
    assert err.value.exit_code == 2 and "(250 characters)" in err.value.message and "1 to 64" in err.value.fix
    assert parse_recipe({**copy.deepcopy(GOOD), "name": "a" * 64}).name == "a" * 64


def test_readmes_node_step_names_the_cpu_build_of_torch() -> None:
    """Item 12: `pip install torch==2.13.0` installs PyPI's CUDA build (gigabytes of nvidia packages)
    for a `+cpu` wheel; the step names the CPU build's index, as recipes/cpu.toml does."""
    readme = (ROOT / "README.md").read_text()
    lines = [line for line in readme.splitlines() if line.startswith("pip install torch==")]
    assert lines and all("--index-url https://download.pytorch.org/whl/cpu" in line for line in lines), lines


def test_a_passphrase_protected_signing_key_is_named_so_not_damaged(tmp_path: Path) -> None:
    """Item 11: a key with a passphrase was called damaged, with "restore the key pair from a backup"."""
    import os
    import shutil
    import subprocess

    from builder import signing
    from builder.errors import TrustError

    if shutil.which("ssh-keygen") is None:
        pytest.skip("needs OpenSSH's ssh-keygen")
    k = signing.Keys(tmp_path / "keys")
    k.folder.mkdir(mode=0o700)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "a passphrase", "-C", "x", "-f", str(k.private)],
                   check=True)  # fmt: skip
    os.chmod(k.private, 0o600)
    with pytest.raises(TrustError) as err:
        signing.sign(b"manifest", signing.UNIT_NAMESPACE, k)
    assert "is protected by a passphrase" in err.value.message and "damaged" not in err.value.message
    assert "ssh-keygen -p -N ''" in err.value.fix and err.value.exit_code == 13


def test_a_units_files_are_its_ops_and_deepspeeds_own_and_nothing_else(tmp_path: Path) -> None:
    """Item 2: a root's g++ that ran the real one and then wrote pwned_marker.py and PWNED_MARKER.txt
    beside its output got both into the wheel (deepspeed/ops/lion/pwned_marker.py, importable on every
    node): a unit's files were taken as the build left them. Now each must be the sdist's own bytes at
    its place, a script of its bin/ (first line rewritten), the dist-info, the generated version module
    (literal assignments only), or a shared object of the unit's op (FAKE sdist and wheel)."""
    import io
    import tarfile

    from fakes import write_wheel

    from builder.wheelbuild.artifacts import foreign_files

    sdist = tmp_path / "deepspeed-0.19.8.tar.gz"
    source = {"deepspeed/__init__.py": b"x = 1\n", "deepspeed/ops/lion/__init__.py": b"", "csrc/lion/a.cpp": b"//",
              "bin/ds": b"#!/usr/bin/env python\nimport deepspeed\n", "LICENSE": b"Apache"}  # fmt: skip
    with tarfile.open(sdist, "w:gz") as tf:
        for rel, data in source.items():
            info = tarfile.TarInfo(f"deepspeed-0.19.8/{rel}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    so = "deepspeed/ops/lion/cpu_lion_op.cpython-311-x86_64-linux-gnu.so"
    good = {"deepspeed/__init__.py": b"x = 1\n", "deepspeed/ops/lion/__init__.py": b"",
            "deepspeed/ops/csrc/lion/a.cpp": b"//",
            "deepspeed-0.19.8.data/scripts/ds": b"#!/opt/venv/bin/python\nimport deepspeed\n",
            "deepspeed-0.19.8.dist-info/METADATA": b"Name: deepspeed\n", "deepspeed-0.19.8.dist-info/RECORD": b"",
            "deepspeed-0.19.8.dist-info/licenses/LICENSE": b"Apache", so: b"ELF",
            "deepspeed/git_version_info_installed.py": b"version='0.19.8'\ninstalled_ops={'cpu_lion': 1}\n",
            }  # fmt: skip
    prefix = ["deepspeed/ops/lion/cpu_lion_op."]
    (tmp_path / "a").mkdir()
    assert (
        foreign_files(
            write_wheel(tmp_path / "a" / "deepspeed-0.19.8-cp311-cp311-linux_x86_64.whl", good), sdist, prefix
        )
        == []
    )
    planted = {
        **good,
        "deepspeed/ops/lion/pwned_marker.py": b"import os\n",
        "deepspeed/ops/lion/PWNED_MARKER.txt": b"x",
        "deepspeed/__init__.py": b"x = 1\nimport os\n",  # a file of DeepSpeed's, changed
        "deepspeed-0.19.8.data/scripts/ds": b"#!/opt/venv/bin/python\nimport os\n",
        "deepspeed/git_version_info_installed.py": b"version='0.19.8'\n__import__('os').system('id')\n",
        "deepspeed/ops/adam/cpu_adam_op.cpython-311-x86_64-linux-gnu.so": b"ELF",  # another op's
        "deepspeed-0.19.8.dist-info/sitecustomize.py": b"",
    }
    (tmp_path / "b").mkdir()
    assert sorted(
        foreign_files(
            write_wheel(tmp_path / "b" / "deepspeed-0.19.8-cp311-cp311-linux_x86_64.whl", planted), sdist, prefix
        )
    ) == sorted(
        [
            "deepspeed/ops/lion/pwned_marker.py",
            "deepspeed/ops/lion/PWNED_MARKER.txt",
            "deepspeed/__init__.py",
            "deepspeed-0.19.8.data/scripts/ds",
            "deepspeed/git_version_info_installed.py",
            "deepspeed/ops/adam/cpu_adam_op.cpython-311-x86_64-linux-gnu.so",
            "deepspeed-0.19.8.dist-info/sitecustomize.py",
        ]
    )


@pytest.mark.spawns
def test_what_a_killed_run_left_in_its_scratch_folder_goes_at_the_next_run(tmp_path: Path) -> None:
    """Item 13: a killed `image` run's context and debootstrap tree stayed in the work folder and the
    next run did not remove them. Folders are named for their process; the next run removes those of
    processes that are gone, never a live one's."""
    import os
    import subprocess

    from builder.files import scratch_folder, sweep_dead

    dead = subprocess.Popen(["true"])
    dead.wait()
    left = tmp_path / f"image-{dead.pid}-abc"
    (left / "deep").mkdir(parents=True)
    (left / "deep" / "f").write_text("x")
    mine = scratch_folder(tmp_path, "image-")
    assert mine.name.startswith(f"image-{os.getpid()}-")
    other = tmp_path / "image-notapid-x"
    other.mkdir()
    assert sweep_dead(tmp_path, "image-") == [left]
    assert not left.exists() and mine.is_dir() and other.is_dir()


@pytest.mark.spawns
def test_a_tool_that_runs_out_of_room_is_one_line_and_the_folder_exit_code(tmp_path: Path) -> None:
    """Item 9: a first publish into a too small folder printed pip's whole traceback, then a fix about
    pip's index. A tool's own words about a full disk now make the message (FAKE tool: it says what pip
    says on ENOSPC and fails)."""
    from builder import cmd

    tool = tmp_path / "pip-like"
    said = "OSError: [Errno 28] No space left on device: '/wh/.deps.x/numpy.whl'"
    tool.write_text(f"#!/bin/sh\necho 'Traceback (most recent call last):'\necho '  File x'\necho \"{said}\"\nexit 1\n")
    tool.chmod(0o755)
    from builder.errors import NoRoom, ToolError

    with pytest.raises(NoRoom) as err:
        cmd.run([tool], log=tmp_path / "log", fix="about pip's index")
    assert isinstance(err.value, ToolError)  # a caller that cleans up after a failed tool still does
    assert (
        err.value.exit_code == 10 and "pip-like ran out of room: OSError: [Errno 28] No space left" in err.value.message
    )
    assert "Traceback" not in err.value.message and "index" not in err.value.fix and "free space" in err.value.fix
