from __future__ import annotations

import sys
from pathlib import Path

import pytest

from builder import cmd
from builder.errors import ToolError

pytestmark = pytest.mark.spawns


def test_run_returns_output_and_keeps_the_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "logs" / "x.log"
    out = cmd.run(["sh", "-c", "echo hello; echo oops >&2"], log=log)
    assert out == "hello\noops\n"
    assert "+ sh -c 'echo hello; echo oops >&2'" in capsys.readouterr().err
    text = log.read_text()
    assert "hello\noops\n" in text and "# exit status 0" in text


def test_failure_shows_the_tail_and_the_log(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    with pytest.raises(ToolError) as err:
        cmd.run(["sh", "-c", "echo compiling; echo 'fatal: no cusparse.h'; exit 3"], log=log)
    assert "exit status 3" in err.value.message
    assert "fatal: no cusparse.h" in err.value.message
    assert str(log) in err.value.message


def test_missing_program_is_named_before_running() -> None:
    with pytest.raises(ToolError, match="'no-such-program-xyz' was not found on PATH"):
        cmd.run(["no-such-program-xyz", "--version"])


def test_progress_sees_every_line(capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[str] = []

    def pick(line: str) -> str | None:
        seen.append(line)
        return line.upper() if line.startswith("[") else None

    cmd.run(["sh", "-c", "echo a; echo '[1/2] b'; echo c"], progress=pick)
    assert seen == ["a", "[1/2] b", "c"]
    assert "[1/2] B" in capsys.readouterr().err


def test_relative_program_survives_cwd_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "bin" / "tool"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\npwd\n")
    script.chmod(0o755)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(tmp_path)
    assert cmd.run(["bin/tool"], cwd=elsewhere).strip() == str(elsewhere)


def test_pip_config_becomes_uv_sources() -> None:
    """uv reads no pip configuration: the toolkit hands it what `pip config list` says (captured here)."""
    from builder.envs import PackageSources, parse_pip_config

    text = (
        ":env:.cert='/etc/ssl/certs/ca-certificates.crt'\n:env:.find-links='/opt/wheels'\n"
        "global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'\n"
        "global.find-links='/opt/wheels'\ninstall.index-url='https://mirror.example/simple'\n"
    )
    sources = parse_pip_config(text)
    assert sources == PackageSources(
        index_url="https://mirror.example/simple",
        extra_index_urls=("file:///opt/pypi/simple", "file:///opt/pypi-more/simple"),
        find_links=("/opt/wheels",),
    )
    assert sources.uv_args() == [
        "--index-strategy", "unsafe-best-match", "--index-url", "https://mirror.example/simple",
        "--extra-index-url", "file:///opt/pypi/simple", "--extra-index-url", "file:///opt/pypi-more/simple",
        "--find-links", "/opt/wheels",
    ]  # fmt: skip
    assert parse_pip_config("global.no-index='true'\n").uv_args()[-1] == "--no-index"
    assert parse_pip_config("") == PackageSources() and PackageSources().describe() == "PyPI"


def test_uv_dry_run_lines_become_exact_requirements() -> None:
    """What `uv pip install --dry-run` prints against a system torch's environment (uv 0.13.9)."""
    from builder.envs import parse_dry_run

    said = (
        "Using Python 3.11.7 environment at: image\nResolved 30 packages in 242ms\nWould download 1 package\n"
        "Would install 3 packages\n + einops==0.8.2\n + hjson==3.1.0\n"
        " + deepspeed @ file:///work/dist/deepspeed-0.19.8%2Bcpu.torch2.13-cp311-cp311-manylinux_2_35_x86_64.whl\n"
        " - torch==2.13.0+cpu\n"
    )
    assert parse_dry_run(said) == [
        "einops==0.8.2",
        "hjson==3.1.0",
        "/work/dist/deepspeed-0.19.8+cpu.torch2.13-cp311-cp311-manylinux_2_35_x86_64.whl",
    ]
    # Issue 56: a local wheel uv has cached already (check-config installed it a minute earlier) is
    # printed with its version and the file it comes from; the wheel under test was silently left out.
    cached = " + deepspeed==0.19.8+cpu.torch2.13 (from file:///w/dist/deepspeed-0.19.8%2Bcpu.torch2.13-cp311-x.whl)\n"
    four = said.replace("Would install 3 packages", "Would install 4 packages")
    assert parse_dry_run(four + cached)[-1] == "/w/dist/deepspeed-0.19.8+cpu.torch2.13-cp311-x.whl"
    # A form not known here is never dropped silently.
    with pytest.raises(ToolError, match="cannot read") as err:
        parse_dry_run(" + deepspeed (some new form)\n")
    assert "uv==" in err.value.fix


def test_torch_index_is_part_of_the_environment_and_of_its_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A named torch build's index is in the environment's key (another index, another environment), and
    a failed install that asked it says so; PyTorch's index is asked only when pip's sources lack the build."""
    from builder import envs
    from builder.recipe import parse_recipe

    base = {"name": "cpu", "accelerator": "cpu", "ops": ["cpu_adam"], "deepspeed": {"version": "0.19.8",
            "sha256": "9" * 64}}  # fmt: skip
    named = envs.torch_index(parse_recipe({**base, "torch": {"version": "2.13.0", "variant": "cpu"}}).torch)
    mirror = envs.torch_index(parse_recipe({**base, "torch": {"version": "2.13.0", "variant": "cpu",
                                                              "index": "file:///srv/whl/cpu"}}).torch)  # fmt: skip
    assert envs.torch_index(parse_recipe({**base, "torch": {"version": "2.13.0"}}).torch) is None
    assert named == envs.IndexFor("torch==2.13.0+cpu", "https://download.pytorch.org/whl/cpu", always=False)
    assert mirror == envs.IndexFor("torch==2.13.0+cpu", "file:///srv/whl/cpu", always=True)
    keys = {envs.env_key(["torch==2.13.0+cpu"], index=i) for i in (None, named, mirror)}
    assert len(keys) == 3
    assert "pip's sources do not have it" in envs._install_fix(named)
    assert "the recipe's [torch] index" in envs._install_fix(mirror) and "find-links" in envs._install_fix(mirror)
    # The site's mirror is always asked, without a question to uv first (this unit test may start no process).
    assert envs._index_args(Path(sys.executable), envs.PackageSources(), mirror) == ["--extra-index-url",
                                                                                     "file:///srv/whl/cpu"]  # fmt: skip


def test_a_cached_build_environment_is_compiled_a_smoke_one_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every op unit and the probe start a Python that imports torch from the cached build env; with
    PYTHONDONTWRITEBYTECODE (this machine's) each compiled torch's modules again (issue 39). uv is
    asked to compile them when the env is made; a smoke env (made once, used once) is not."""
    from builder import envs

    calls: list[list[str]] = []
    monkeypatch.setattr(envs, "backend", lambda: "uv")
    monkeypatch.setattr(envs, "uv_binary", lambda tools: "uv")
    monkeypatch.setattr(envs, "pip_sources", lambda: envs.PackageSources())

    def run(argv: list[object], **kw: object) -> str:
        calls.append([str(a) for a in argv])
        if argv[1] == "venv":
            Path(str(argv[-1])).mkdir(parents=True)
        return ""

    monkeypatch.setattr(cmd, "run", run)
    built = envs.cached(tmp_path / "envs", ["torch==2.13.0+cpu"], tmp_path / "log")
    assert (built / envs.COMPLETE).is_file()
    assert "--compile-bytecode" in next(c for c in calls if c[1:3] == ["pip", "install"])
    calls.clear()
    envs.create(tmp_path / "smoke", ["torch==2.13.0+cpu"], tmp_path / "log")
    assert "--compile-bytecode" not in next(c for c in calls if c[1:3] == ["pip", "install"])


def test_build_environments_are_the_work_folders_unless_a_shared_folder_is_named(tmp_path: Path) -> None:
    """DS_BUILDER_ENV_CACHE: one folder of build environments for several work folders (keyed by
    what they hold, so another folder's is the same); unset or empty, each work folder has its own."""
    from builder import envs

    cache = tmp_path / "work" / "cache"
    assert envs.build_envs_folder(cache, {}) == cache / "envs"
    assert envs.build_envs_folder(cache, {envs.ENV_CACHE_ENV: ""}) == cache / "envs"
    assert envs.build_envs_folder(cache, {envs.ENV_CACHE_ENV: str(tmp_path / "shared")}) == tmp_path / "shared"


def test_the_op_probe_asks_py_cpuinfo_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """DeepSpeed's CPU op builders ask py-cpuinfo twice each (2.2 s a call here); the probe asks once."""
    import importlib.util
    import types

    from builder.wheelbuild.ops import PROBE_SCRIPT

    asked: list[int] = []
    fake = types.ModuleType("cpuinfo")

    def get_cpu_info() -> dict[str, object]:
        asked.append(1)
        return {"arch": "X86_64", "flags": ["avx2"]}

    fake.get_cpu_info = get_cpu_info  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cpuinfo", fake)
    spec = importlib.util.spec_from_file_location("ds_probe_under_test", PROBE_SCRIPT)
    assert spec and spec.loader
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    probe._cpu_info_once()
    import cpuinfo  # the fake: as DeepSpeed's builders find it, at each call

    assert [cpuinfo.get_cpu_info()["arch"] for _ in range(10)] == ["X86_64"] * 10
    assert len(asked) == 1


@pytest.mark.spawns
def test_a_fresh_environment_without_the_wheel_under_test_is_refused_before_any_check(tmp_path: Path) -> None:
    """Issue 56: the smoke venv was filled from uv's dry run, whose form for a cached local wheel was not
    read: the wheel under test was left out, and the config runner failed on "No module named
    'deepspeed'". Now the venv's DeepSpeed is read from its metadata before any check runs."""
    import subprocess
    import sys

    from builder.errors import SmokeError
    from builder.smoke import holds_the_wheel

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    with pytest.raises(SmokeError, match="holds no DeepSpeed, not the wheel under test") as err:
        holds_the_wheel(venv, "0.19.8+cpu.torch2.13", "deepspeed-0.19.8+cpu.torch2.13-cp311-x.whl")
    assert err.value.exit_code == 6 and "--verbose" in err.value.fix
    site = next((venv / "lib").glob("python3.*")) / "site-packages"
    meta = site / "deepspeed-0.19.8+cpu.torch2.14.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: deepspeed\nVersion: 0.19.8+cpu.torch2.14\n")
    with pytest.raises(SmokeError, match="holds DeepSpeed '0.19.8\\+cpu.torch2.14', not the wheel under test"):
        holds_the_wheel(venv, "0.19.8+cpu.torch2.13", "deepspeed-0.19.8+cpu.torch2.13-cp311-x.whl")
    holds_the_wheel(venv, "0.19.8+cpu.torch2.14", "deepspeed-0.19.8+cpu.torch2.14-cp311-x.whl")  # its own: fine
