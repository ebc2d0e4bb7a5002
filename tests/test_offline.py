"""An air-gapped build host (issue 49): `gather` on a connected machine, `build-wheel --offline` in a
network namespace that holds only its loopback. The pure parts first; then the real thing."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import own_envs

from builder import offline
from builder.errors import SourceError, UsageError
from builder.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[1]


def test_what_a_folder_holds_and_what_the_node_already_has() -> None:
    system = load_recipe(ROOT / "recipes" / "system-cpu.toml")
    pinned = load_recipe(ROOT / "recipes" / "cpu.toml")
    ds = ["einops", "numpy", "torch>=2.0.0", "pydantic>=2.0.0"]
    got = offline.wanted(system, ds, ("transformers>=5,<6",), ("pip", "ninja"))
    assert got[:6] == ["pip", "ninja", "einops", "numpy", "pydantic>=2.0.0", "transformers>=5,<6"]
    assert not any(r.startswith("torch") for r in got) and "uv==0.13.9" in got  # the toolkit's own
    assert offline.wanted(pinned, ds, (), ())[0] == "torch==2.13.0+cpu"  # a pinned torch is carried
    closure = ["torch==2.13.0", "nvidia-cublas==13.4.1.3", "triton==3.5.0", "sympy==1.14", "numpy==2.4.6",
               "transformers==5.24.0", "einops==0.8.2"]  # fmt: skip
    assert offline.keep(closure, True, {}) == ["numpy==2.4.6", "transformers==5.24.0", "einops==0.8.2"]
    assert offline.keep(closure, False, {})[:2] == ["torch==2.13.0", "nvidia-cublas==13.4.1.3"]
    assert offline.keep(closure, True, {"numpy": "2.1.0", "transformers": "5.24.0"}) == ["einops==0.8.2"]
    assert offline.keep(closure, False, {"numpy": "2.1.0"}) == closure  # its environments are its own
    # Issue 56: the toolkit's own nvidia-ml-py is not torch's: `pip install --no-index --find-links
    # DIR/wheels .` on the node needs it from the folder, unless the node has it.
    assert offline.keep([*closure, "nvidia-ml-py==13.580.82"], True, {}) == [*offline.keep(closure, True, {}),
                                                                            "nvidia-ml-py==13.580.82"]  # fmt: skip
    assert offline.keep(["nvidia-ml-py==13.580.82"], True, {"nvidia-ml-py": "12.0"}) == []
    have = offline.parse_freeze("# comment\ntorch==2.11.0+cu130\n-e git+https://x/y#egg=z\nNumPy==2.1.0\n", "f")
    assert have == {"torch": "2.11.0+cu130", "numpy": "2.1.0"}
    with pytest.raises(UsageError, match="is not a `pip freeze` line") as err:
        offline.parse_freeze("not a==line==", "freeze.txt")
    assert err.value.exit_code == 2


def test_a_folder_gather_did_not_make_or_without_the_recipes_sdist_is_refused(tmp_path: Path) -> None:
    recipe = load_recipe(ROOT / "recipes" / "system-cpu.toml")
    with pytest.raises(SourceError, match="is not a folder `gather` made") as err:
        offline.environ(tmp_path, recipe)
    assert "python -m builder gather" in err.value.fix and err.value.exit_code == 4
    (tmp_path / "wheels").mkdir()
    (tmp_path / offline.RECORD).write_text("{}")
    with pytest.raises(SourceError, match="cannot be read as gather writes it"):
        offline.environ(tmp_path, recipe)
    wheel = tmp_path / "wheels" / "hjson-3.1.0-py3-none-any.whl"
    wheel.write_bytes(b"a wheel")
    (tmp_path / offline.RECORD).write_text(json.dumps({"schema": 1, "wheels": [
        {"file": wheel.name, "size": 7, "sha256": hashlib.sha256(b"a wheel").hexdigest()}]}))  # fmt: skip
    # A file put there after gather, or damaged on its way: refused by name.
    (tmp_path / "wheels" / "planted-1.0-py3-none-any.whl").write_bytes(b"x")
    with pytest.raises(SourceError, match=r"planted-1.0-py3-none-any.whl \(not listed\)"):
        offline.environ(tmp_path, recipe)
    (tmp_path / "wheels" / "planted-1.0-py3-none-any.whl").unlink()
    wheel.write_bytes(b"a wheeL")
    with pytest.raises(SourceError, match=r"hjson-3.1.0-py3-none-any.whl \(size or sha256 differs\)"):
        offline.environ(tmp_path, recipe)
    wheel.write_bytes(b"a wheel")
    with pytest.raises(SourceError, match="holds no sdist of DeepSpeed 0.19.8"):
        offline.environ(tmp_path, recipe)
    sdist = tmp_path / "sdists" / recipe.deepspeed.sha256 / "deepspeed-0.19.8.tar.gz"
    sdist.parent.mkdir(parents=True)
    sdist.write_bytes(b"")
    env = offline.environ(tmp_path, recipe)
    assert env["PIP_NO_INDEX"] == env["UV_NO_INDEX"] == "1" and env["PIP_CONFIG_FILE"] == os.devnull
    assert env["PIP_FIND_LINKS"] == env["UV_FIND_LINKS"] == str(tmp_path.resolve() / "wheels")
    assert env["DS_BUILDER_SDIST_CACHE"] == str(tmp_path.resolve() / "sdists")


def _netns() -> str:
    if os.getuid() != 0 or shutil.which("ip") is None:
        pytest.skip("a network namespace needs root and iproute2's ip (apt-get install iproute2)")
    name = f"ds-offline-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True)
    return name


@pytest.mark.integration
def test_an_air_gapped_build_host_builds_and_smokes_from_the_gathered_folder_alone(tmp_path: Path) -> None:
    """`gather` the system-cpu recipe (the node's own torch: this environment's) for this Python, less
    what this environment already holds (its pip freeze), then build and smoke it in a network
    namespace with nothing but its loopback: every install reads the folder; PyPI does not resolve."""
    netns = _netns()
    try:
        have = tmp_path / "have.txt"
        have.write_text(subprocess.run([sys.executable, "-m", "pip", "freeze"], capture_output=True, text=True,
                                       check=True).stdout)  # fmt: skip
        folder = tmp_path / "offline"
        python = f"{sys.version_info.major}.{sys.version_info.minor}"
        done = subprocess.run([sys.executable, "-m", "builder", "gather", "--recipe", "recipes/system-cpu.toml",
                               "--dest", str(folder), "--python", python, "--have", str(have), "--work-dir",
                               str(tmp_path / "gather-work")], cwd=ROOT, capture_output=True, text=True)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        record = json.loads((folder / offline.RECORD).read_text())
        names = {w["file"].split("-")[0].lower() for w in record["wheels"]}
        assert {"bitsandbytes", "ninja", "hjson"} <= names and "torch" not in names, names
        assert all(w["size"] == (folder / "wheels" / w["file"]).stat().st_size for w in record["wheels"])
        assert "MB in" in done.stderr  # the sizes are shown
        reach = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", "import socket; "
                                "socket.create_connection(('pypi.org', 443), timeout=5)"], capture_output=True,
                               text=True)  # fmt: skip
        assert reach.returncode != 0  # nothing outside is reachable from the namespace
        env = own_envs({**os.environ, "DS_BUILDER_UNIT_CACHE": str(tmp_path / "units")})  # made from the folder
        built = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-m", "builder", "build-wheel",
                                "--recipe", "recipes/system-cpu.toml", "--offline", str(folder), "--work-dir",
                                str(tmp_path / "work"), "--no-publish"], cwd=ROOT, capture_output=True, text=True,
                               env=env)  # fmt: skip
        assert built.returncode == 0, built.stderr[-5000:]
        assert f"offline: every install reads {folder.resolve() / 'wheels'}" in built.stderr
        assert "smoke PASSED" in built.stderr
        # A folder without this recipe's sdist: one message naming the fix, before anything is built.
        other = subprocess.run([sys.executable, "-m", "builder", "build-wheel", "--recipe", "recipes/system-cpu.toml",
                                "--offline", str(tmp_path / "gather-work"), "--work-dir", str(tmp_path / "w2")],
                               cwd=ROOT, capture_output=True, text=True)  # fmt: skip
        assert other.returncode == 4 and "is not a folder `gather` made" in other.stderr
    finally:
        subprocess.run(["ip", "netns", "delete", netns], check=False)
