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
from fakes import sign_offline

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
    # What pip's build isolation needs to install the toolkit from the folder is there, node or not.
    assert offline.keep(["setuptools==80.9.0"], True, {"setuptools": "80.9.0"}) == ["setuptools==80.9.0"]
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
    (tmp_path / offline.RECORD).write_text("[]")
    with pytest.raises(SourceError, match="holds no offline.json.sig: nothing says who gathered it") as err:
        offline.environ(tmp_path, recipe)
    assert "key trust" in err.value.fix and err.value.exit_code == 4
    sign_offline(tmp_path)
    with pytest.raises(SourceError, match="has schema 'list', not 1"):
        offline.environ(tmp_path, recipe)
    wheel = tmp_path / "wheels" / "hjson-3.1.0-py3-none-any.whl"
    wheel.write_bytes(b"a wheel")
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    (tmp_path / offline.RECORD).write_text(json.dumps({"schema": 1, "recipe": "system-cpu", "python": python,
        "wheels": [{"file": wheel.name, "size": 7, "sha256": hashlib.sha256(b"a wheel").hexdigest()}]}))  # fmt: skip
    sign_offline(tmp_path)
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


# DeepSpeed 0.19.8's requirements/requirements.txt: what a node's environment holds beside its torch.
DEEPSPEED_DEPS = ("einops", "hjson", "msgpack", "ninja", "numpy", "packaging>=20.0", "psutil", "py-cpuinfo",
                  "pydantic>=2.0.0", "tqdm", "nvidia-ml-py")  # fmt: skip
# A real failure of DeepSpeed's own on CPU (tests/test_pipeline_units.py): its engine steps LBFGS without a closure.
LBFGS = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "LBFGS", "params": {"lr": 1e-3}},
         "zero_optimization": {"stage": 0}}  # fmt: skip


def _node_venv(where: Path) -> Path:
    """A "node": a venv of this Python with the CPU torch and DeepSpeed's dependencies (and pip), made by uv
    from this machine's pip sources (a second or two with uv's cache warm). Its python."""
    from builder import envs

    uv = envs.uv_binary(envs.TOOLS)
    subprocess.run([uv, "venv", "--quiet", "--seed", "--python", sys.executable, str(where)], check=True)
    python = where / "bin" / "python"
    subprocess.run([uv, "pip", "install", "--quiet", "--python", str(python), *envs.pip_sources().uv_args(),
                    "torch==2.13.0", *DEEPSPEED_DEPS], check=True)  # fmt: skip
    return python


def _site_recipe(where: Path) -> Path:
    """recipes/system-cpu.toml with a site config that fails with DeepSpeed's own error, listed as a known
    failure, and one that runs (the recipe reads configs from its own folder)."""
    (where / "configs").mkdir(parents=True)
    (where / "configs" / "lbfgs-zero0.json").write_text(json.dumps(LBFGS))
    shutil.copy(ROOT / "recipes" / "configs" / "adam-zero2-offload.json", where / "configs")
    text = (ROOT / "recipes" / "system-cpu.toml").read_text().replace('name = "system-cpu"', 'name = "node-site"')
    site = (
        '\nconfigs = ["configs/adam-zero2-offload.json", "configs/lbfgs-zero0.json"]\n\n[known_failures]\n'
        '"configs/lbfgs-zero0.json" = { reason = "DeepSpeed steps LBFGS without its closure" }\n\n[deepspeed]'
    )
    text = text.replace("\n[deepspeed]", site, 1)
    recipe = where / "node-site.toml"
    recipe.write_text(text)
    return recipe


def _toolkit_source(where: Path) -> Path:
    """The toolkit's source as a node receives it (a copy: pip builds in the tree it is given)."""
    shutil.copytree(ROOT / "builder", where / "builder", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, where / name)
    return where


@pytest.mark.integration
def test_an_air_gapped_build_host_builds_and_smokes_from_the_gathered_folder_alone(tmp_path: Path) -> None:
    """Issues 49 and 56, as the docs tell a node to do it. A "node" venv (CPU torch and DeepSpeed's
    dependencies); `gather` on a connected machine of a system-torch recipe with a site config that fails
    with DeepSpeed's own error, less what the node holds (its pip freeze); then, in a network namespace
    holding only its loopback: the toolkit installed from the folder, build-wheel, check-config and smoke
    each with --offline. The failing config is judged by the reference, made from the folder with the
    node's own packages counted (einops is on the node only: uv once said "einops was not found"), and
    the smoke after check-config (uv's cache holding the wheel) still installs the wheel under test."""
    netns = _netns()
    try:
        node = _node_venv(tmp_path / "node")
        have = tmp_path / "have.txt"
        have.write_text(subprocess.run([str(node), "-m", "pip", "freeze"], capture_output=True, text=True,
                                       check=True).stdout)  # fmt: skip
        recipe = _site_recipe(tmp_path / "site")
        folder = tmp_path / "offline"
        python = f"{sys.version_info.major}.{sys.version_info.minor}"
        done = subprocess.run([sys.executable, "-m", "builder", "gather", "--recipe", str(recipe),
                               "--dest", str(folder), "--python", python, "--have", str(have), "--work-dir",
                               str(tmp_path / "gather-work")], cwd=ROOT, capture_output=True, text=True)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        record = json.loads((folder / offline.RECORD).read_text())
        names = {w["file"].split("-")[0].lower() for w in record["wheels"]}
        assert {"bitsandbytes", "auditwheel", "pyelftools"} <= names, names
        assert not names & {"torch", "einops", "hjson", "numpy"}, names  # the node has them
        assert all(w["size"] == (folder / "wheels" / w["file"]).stat().st_size for w in record["wheels"])
        assert "MB in" in done.stderr  # the sizes are shown
        reach = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", "import socket; "
                                "socket.create_connection(('pypi.org', 443), timeout=5)"], capture_output=True,
                               text=True)  # fmt: skip
        assert reach.returncode != 0  # nothing outside is reachable from the namespace

        assert record["root"]["name"].startswith("build-bullseye-") and "and the build root (" in done.stderr
        assert (folder / "root" / record["root"]["file"]).stat().st_size == record["root"]["size"]
        # The node: no apt sources (an empty /etc/apt in its mount namespace), no debootstrap on PATH, a
        # roots folder of its own (empty): its root can come from the folder alone.
        no_apt = tmp_path / "no-apt"
        no_apt.mkdir()

        def on_node(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
            bare = (
                f"mount --bind {no_apt} /etc/apt && for d in /usr/sbin/debootstrap /usr/bin/debootstrap; do "
                '[ ! -e "$d" ] || mount --bind /dev/null "$d"; done && '
            )
            return subprocess.run(["ip", "netns", "exec", netns, "sh", "-c", bare + 'exec "$@"', "sh", *argv],
                                  cwd=tmp_path, capture_output=True, text=True, env=env)  # fmt: skip

        # The documented node step: the toolkit from the folder alone (its nvidia-ml-py too, issue 56).
        src = _toolkit_source(tmp_path / "toolkit")
        installed = on_node(str(node), "-m", "pip", "install", "--no-index", "--find-links", str(folder / "wheels"),
                            str(src))  # fmt: skip
        assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
        env = own_envs({**os.environ, "DS_BUILDER_UNIT_CACHE": str(tmp_path / "units"),
                        "DS_BUILDER_ROOTS": str(tmp_path / "roots")})  # made from the folder  # fmt: skip
        work = tmp_path / "work"
        built = on_node(str(node), "-m", "builder", "build-wheel", "--recipe", str(recipe), "--offline", str(folder),
                        "--work-dir", str(work), "--no-publish", env=env)  # fmt: skip
        assert built.returncode == 0, built.stderr[-5000:]
        assert f"offline: every install reads {folder.resolve() / 'wheels'}" in built.stderr
        assert "smoke PASSED" in built.stderr
        assert f"unpacked from {folder.resolve() / 'root' / record['root']['file']}" in built.stderr
        assert "debootstrap" not in built.stderr.replace("no debootstrap", "")
        wheel = next((work / "dist").glob("deepspeed-*.whl"))
        report = json.loads((work / "dist" / f"{wheel.name}.smoke.json").read_text())
        checks = {c["name"]: c for c in report["checks"]}
        lbfgs = checks["config:site/configs/lbfgs-zero0.json"]
        assert lbfgs["status"] == "upstream", lbfgs
        assert lbfgs["detail"].startswith("DeepSpeed's own failure, not the wheel's"), lbfgs
        assert checks["config:site/configs/adam-zero2-offload.json"]["status"] == "passed"
        # check-config and smoke offline too; the smoke after check-config, whose install filled uv's cache.
        checked = on_node(str(node), "-m", "builder", "check-config", str(recipe.parent / "configs" /
                          "adam-zero2-offload.json"), "--wheel", str(wheel), "--offline", str(folder), "--work-dir",
                          str(work), env=env)  # fmt: skip
        assert checked.returncode == 0, checked.stderr[-3000:]
        assert "passed" in checked.stdout and "offline: every install reads" in checked.stderr
        smoked = on_node(str(node), "-m", "builder", "smoke", str(wheel), "--offline", str(folder), "--work-dir",
                         str(work), env=env)  # fmt: skip
        assert smoked.returncode == 0, smoked.stderr[-5000:]
        assert "smoke PASSED" in smoked.stderr and "reusing environment" in smoked.stderr  # the reference, kept
        # A folder without this recipe's sdist: one message naming the fix, before anything is built.
        other = subprocess.run([sys.executable, "-m", "builder", "build-wheel", "--recipe", "recipes/system-cpu.toml",
                                "--offline", str(tmp_path / "gather-work"), "--work-dir", str(tmp_path / "w2")],
                               cwd=ROOT, capture_output=True, text=True)  # fmt: skip
        assert other.returncode == 4 and "is not a folder `gather` made" in other.stderr
        for command in (["smoke", str(wheel)], ["check-config", str(recipe), "--wheel", str(wheel)]):
            refused = subprocess.run([sys.executable, "-m", "builder", *command, "--offline", str(tmp_path / "site"),
                                      "--work-dir", str(tmp_path / "w3")], cwd=ROOT, capture_output=True,
                                     text=True)  # fmt: skip
            assert refused.returncode == 4 and "is not a folder `gather` made" in refused.stderr, refused.stderr
    finally:
        subprocess.run(["ip", "netns", "delete", netns], check=False)
