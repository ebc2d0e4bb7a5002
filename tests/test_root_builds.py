"""Builds in a root, and the bad roots and floors a build refuses (issue 37). Each case runs the real
`build-wheel` (or the real wrappers) in a work folder whose cache is the worker's.

- a root whose compiler is newer than the floor allows (the build host itself, Debian 12's gcc 12,
  named as the root folder): the symbol check stops the build, naming each symbol and its .so;
- a floor below torch's own: refused before anything compiles, naming torch's floor;
- a root folder that is no root, lacks g++, or that others can write: refused before anything else;
- no way to make a namespace: one message (a stand-in unshare that fails as a kernel without user
  namespaces answers, labelled: this machine allows them);
- an unprivileged user compiles through the wrappers in a user namespace, and the pin holds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from fakes import default_recipe_text

from builder.buildroot import sandbox
from builder.glibc import above_floor, needed_symbols

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="making the build root takes root (debootstrap)"),
    pytest.mark.skipif(shutil.which("unshare") is None, reason="util-linux's unshare is not installed"),
]


def recipe(folder: Path, name: str, ops: str = '["deepspeed_shm_comm"]', extra: str = "", root: str = "") -> Path:
    text = default_recipe_text().replace('name = "cpu"', f'name = "{name}"\nlabel = "{name.replace("-", "")}"')
    text = text.replace('platform = "manylinux_2_28"', extra or 'platform = "manylinux_2_28"')
    start, end = text.index("ops = ["), text.index("]", text.index("ops = [")) + 1
    text = text[:start] + f"ops = {ops}" + text[end:] + (f"\n[root]\n{root}\n" if root else "")
    path = folder / f"{name}.toml"
    path.write_text(text)
    return path


def build(recipe_path: Path, work: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "builder", "build-wheel", "--recipe", str(recipe_path), "--work-dir", str(work),
         "--no-smoke", "--no-publish"],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=1800,
    )  # fmt: skip


def test_a_root_whose_compiler_is_too_new_fails_the_build_naming_each_symbol(own_workspace: Path) -> None:
    """The build host's own filesystem as the root: gcc 12 and glibc 2.36 give deepspeed_shm_comm
    shm_open@GLIBC_2.34, which manylinux_2_28 does not allow."""
    done = build(recipe(own_workspace, "too-new", root='folder = "/"'), own_workspace)
    assert done.returncode == 5, done.stderr[-3000:]
    err = done.stderr
    assert 'the wheel\'s ops need symbols newer than platform = "manylinux_2_28" allows' in err, err[-2000:]
    assert "glibc 2.28 or newer: RHEL 8+, Debian 10+, Ubuntu 18.10+" in err
    assert "deepspeed_shm_comm_op.cpython-311-x86_64-linux-gnu.so needs shm_open@GLIBC_2.34 (libc.so.6)" in err
    assert 'platform = "host"' in err and "the default [root] is Debian 11" in err
    assert not list((own_workspace / "dist").glob("*.whl"))  # nothing built is left as a wheel


def test_a_floor_below_torchs_own_is_refused_naming_torchs_floor(own_workspace: Path) -> None:
    done = build(recipe(own_workspace, "too-low", extra='platform = "manylinux_2_17"'), own_workspace)
    assert done.returncode == 2, done.stderr[-3000:]
    assert (
        'platform = "manylinux_2_17" is below the floor of the torch it builds against (manylinux_2_28' in done.stderr
    )
    assert 'set platform = "manylinux_2_28"' in done.stderr
    assert not (own_workspace / "units").exists()  # no unit started


def test_bad_root_folders_are_refused_before_anything_is_built(own_workspace: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o755)
    open_root = tmp_path / "open"
    (open_root / "usr" / "bin").mkdir(parents=True)
    (open_root / "usr" / "include").mkdir()
    (open_root / "usr" / "include" / "stdio.h").write_text("")
    for tool in ("gcc", "g++"):
        (open_root / "usr" / "bin" / tool).write_text("#!/bin/sh\n")
        (open_root / "usr" / "bin" / tool).chmod(0o755)
    open_root.chmod(0o777)  # anyone may replace its compiler
    no_gxx = tmp_path / "nogxx"
    shutil.copytree(open_root, no_gxx, symlinks=True)
    no_gxx.chmod(0o755)
    (no_gxx / "usr" / "bin" / "g++").unlink()
    cases = {
        empty: "is not the top folder of an OS's files",
        open_root: "open is writable by every user (mode 777): anyone could replace what is in it; whoever "
        "could change it could change the compiler every build runs",
        no_gxx: "has no compiler /usr/bin/g++",
        tmp_path / "absent": "does not exist or is not a folder",
    }
    for folder, said in cases.items():
        done = build(recipe(own_workspace, f"bad-{folder.name}", root=f'folder = "{folder}"'), own_workspace)
        assert done.returncode == 15, (folder, done.stderr[-2000:])
        assert said in done.stderr and 'platform = "host"' in done.stderr, (folder, done.stderr[-2000:])
        assert "Traceback" not in done.stderr
    assert not (own_workspace / "units").exists() and not list((own_workspace / "dist").glob("*.whl"))


def test_no_way_to_make_a_namespace_is_one_message(own_workspace: Path, tmp_path: Path) -> None:
    """A stand-in `unshare` (labelled: this machine allows namespaces) answers as util-linux does
    where the kernel refuses them."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "unshare").write_text("#!/bin/sh\necho 'unshare: unshare failed: Operation not permitted' >&2\nexit 1\n")
    (fake / "unshare").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"}
    done = build(recipe(own_workspace, "no-ns"), own_workspace, env)
    assert done.returncode == 15, done.stderr[-2000:]
    assert "cannot make a mount namespace to enter the build root" in done.stderr
    assert "Operation not permitted" in done.stderr and "user.max_user_namespaces" in done.stderr
    assert 'platform = "host"' in done.stderr and "Traceback" not in done.stderr


def test_an_unprivileged_user_compiles_in_the_root_through_a_user_namespace() -> None:
    """User nobody runs the wrappers' g++ (a user namespace maps it to root inside): the root's gcc
    10 compiles, the pin gives pow@GLIBC_2.2.5, and the object belongs to nobody."""
    if shutil.which("runuser") is None:
        pytest.skip("runuser is not installed")
    facts = sandbox.resolve(None, os.environ)
    folder = Path(tempfile.mkdtemp(prefix="ds-root-user-"))
    try:
        folder.chmod(0o755)
        work = folder / "work"
        work.mkdir()
        os.chown(work, 65534, 65534)
        (work / "t.cpp").write_text("#include <cmath>\ndouble f(double x) { return std::pow(x, 2.5); }\n")
        env = sandbox.enter(facts, folder / "toolchain", [str(work)])
        done = subprocess.run(["runuser", "-u", "nobody", "--", env["CXX"], "-O2", "-fPIC", "-shared", "t.cpp", "-o",
                               "t.so"], cwd=work, capture_output=True, text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert (work / "t.so").stat().st_uid == 65534
        said = subprocess.run(["runuser", "-u", "nobody", "--", env["CXX"], "-dumpfullversion"], cwd=work,
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        assert said.stdout.strip() == facts.gcc and facts.gcc.startswith("10.")
        pows = {n.version for n in needed_symbols(work) if n.symbol == "pow"}
        assert pows == {"GLIBC_2.2.5"}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


TEST_IMAGE = "localhost/ds-builder-test-root:bullseye"


@pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed (apt-get install podman runc)")
def test_an_oci_image_is_a_root_a_recipe_can_name(own_workspace: Path) -> None:
    """No registry is reachable here, so the image is made from the toolkit's own Debian 11 root
    (podman import), standing in for pypa's manylinux_2_28: the build exports it into the roots folder
    once, finds its compilers on the image's PATH, and the wheel holds the floor."""
    from builder import podman

    facts = sandbox.resolve(None, os.environ)
    if podman.image_id(TEST_IMAGE) is None:
        tar = subprocess.Popen(["tar", "-C", str(facts.path), "--numeric-owner", "-cf", "-", "."],
                               stdout=subprocess.PIPE)  # fmt: skip
        made = subprocess.run(["podman", "import", "--change", "ENV PATH=/usr/local/bin:/usr/bin:/bin", "-",
                               TEST_IMAGE], stdin=tar.stdout, capture_output=True, text=True,
                              env=podman.environ())  # fmt: skip
        assert tar.stdout is not None
        tar.stdout.close()
        assert tar.wait() == 0 and made.returncode == 0, made.stderr
    image_id = podman.image_id(TEST_IMAGE)
    assert image_id
    done = build(recipe(own_workspace, "in-image", ops='["cpu_lion"]', root=f'image = "{TEST_IMAGE}"'), own_workspace)
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = (own_workspace / "dist").glob("*.whl")
    assert wheel.name.endswith("-cp311-cp311-manylinux_2_28_x86_64.whl")
    import json
    import zipfile

    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith("ds_builder.json")]
        record = json.loads(zf.read(name))["platform"]
    assert record["root"]["describe"] == f"the image {TEST_IMAGE}" and record["root"]["gcc"].startswith("10.")
    assert record["tags"] == ["manylinux_2_28_x86_64"]
    exported = list(Path(os.environ.get("DS_BUILDER_ROOTS") or "/var/tmp/ds-builder-roots").glob(
        f"image-{image_id[:16]}"))  # fmt: skip
    assert len(exported) == 1 and (exported[0] / "usr" / "bin" / "g++").exists()
    assert "root: exporting the image" in done.stdout + done.stderr or "compiling in the image" in done.stderr


def test_a_cuda_recipe_compiles_in_the_root_nvcc_host_code_included(own_workspace: Path) -> None:
    """CUDA through the toolkit's own Debian 11 root: nvcc's host compiler is the root's gcc 10 (its
    -ccbin is the wrappers' folder), fused_adam's .so holds manylinux_2_28. torch 2.13.0, PyPI's CUDA
    13.0 build: torch 2.14's headers need gcc 11+, which is why the shipped CUDA recipes name pypa's
    image instead. pip's configuration here has a local CPU build of torch 2.13.0 in find-links, which
    would stand in for PyPI's CUDA one: the build is told to ask PyPI alone."""
    import re
    import zipfile

    text = (ROOT / "recipes" / "cu130-hopper-min.toml").read_text()
    text = re.sub(r"(?ms)^\[root\]\n.*?(?=^\[|\Z)", "", text).replace('version = "2.14.1"', 'version = "2.13.0"')
    text = re.sub(r"(?m)^ops = \[.*\]$", 'ops = ["fused_adam"]', text).replace('label = "min"', 'label = "inroot"')
    path = own_workspace / "cuda-in-root.toml"
    path.write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}  # nox hands pip's to uv
    env["PIP_CONFIG_FILE"] = os.devnull
    done = build(path, own_workspace, env)
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = (own_workspace / "dist").glob("*.whl")
    assert wheel.name == "deepspeed-0.19.8+cu130.torch2.13.sm90.inroot-cp311-cp311-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel) as zf:
        (so,) = [n for n in zf.namelist() if n.endswith(".so") and "fused_adam_op" in n]
        zf.extract(so, own_workspace / "unpacked")
    comment = subprocess.run(["readelf", "-p", ".comment", str(own_workspace / "unpacked" / so)],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "GCC: (Debian 10.2.1" in comment and "GCC: (Debian 12" not in comment, comment
    needed = needed_symbols(own_workspace / "unpacked")
    assert any(n.version.startswith("GLIBCXX_") for n in needed)  # the check read C++ symbols
    assert above_floor(needed, "manylinux_2_28") == []


def test_a_compiler_called_from_a_folder_the_root_does_not_see_still_runs(tmp_path: Path) -> None:
    """A tool run from a folder no build folder holds (the toolkit's own checkout, /work/main here,
    was one: `cc -E` of the CUDA stub failed with "can't cd"): it runs from / in the root, with
    absolute paths."""
    facts = sandbox.resolve(None, os.environ)
    env = sandbox.enter(facts, tmp_path / "toolchain", [str(tmp_path)])
    elsewhere = Path(tempfile.mkdtemp(dir="/run", prefix="ds-builder-test-"))
    try:
        (tmp_path / "t.c").write_text("int f(void) { return 1; }\n")
        done = subprocess.run([env["CC"], "-c", str(tmp_path / "t.c"), "-o", str(tmp_path / "t.o")], cwd=elsewhere,
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert (tmp_path / "t.o").is_file()
    finally:
        shutil.rmtree(elsewhere, ignore_errors=True)


@pytest.mark.parametrize("where", ["/run", "/tmp"])
@pytest.mark.parametrize("user", ["root", "nobody"])
def test_a_roots_tools_cannot_write_into_the_hosts_tmp(where: str, user: str) -> None:
    """Issue 51, item 2: a root's g++ that ran the real one then wrote files also wrote into the host's
    /tmp, which was bound in whole when the build folder lay below it. Now a tmpfs covers the root's
    /tmp and only the build's folders are bound into it, as root and as another user (a user namespace
    then): a tool of the root (its sh, run through the same `enter`) writing to /tmp writes into that
    tmpfs, which goes with the namespace. The build folder's cache is a link elsewhere in /tmp: its
    target is bound too."""
    if user != "root" and shutil.which("runuser") is None:
        pytest.skip("runuser is not installed")
    facts = sandbox.resolve(None, os.environ)
    work = Path(tempfile.mkdtemp(dir=where, prefix="ds-builder-test-"))
    cache = Path(tempfile.mkdtemp(prefix="ds-builder-test-cache-"))
    try:
        (work / "cache").symlink_to(cache)
        for folder in (work, cache):
            folder.chmod(0o755)
            os.chown(folder, 65534 if user == "nobody" else 0, 65534 if user == "nobody" else 0)
        toolchain = work / "toolchain"  # in a folder user nobody can reach (tmp_path's parents are 0700)
        sandbox.enter(facts, toolchain, [str(work), str(work / "cache")])
        mark = f"ds-builder-pwned-{os.getpid()}"
        (work / "tool.sh").write_text(f"echo x > /tmp/{mark} && echo y > {work}/ok && echo z > {work}/cache/c\n")
        runner = [] if user == "root" else ["runuser", "-u", user, "--"]
        done = subprocess.run([*runner, str(toolchain / "enter"), "/bin/sh", str(work / "tool.sh")],
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert (work / "ok").read_text() == "y\n"  # the build's own folder is there, at its path
        assert (cache / "c").read_text() == "z\n"  # and its cache, through the link
        assert not Path("/tmp", mark).exists()  # the host's /tmp is not
        assert (toolchain / "binds").read_text().split() == sorted([str(work), str(cache)])
        assert (toolchain / "covers").read_text().split() == (["1777", "/tmp"] if where == "/tmp" else
                                                              ["0755", "/run", "1777", "/tmp"])  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)


def test_kill_9_of_build_wheel_leaves_no_compiler_running(own_workspace: Path) -> None:
    """ninja starts each compile in a process group of its own, so killing the build's group left
    `c++` and `cc1plus` compiling for a minute after a kill -9 of build-wheel: the watchdog now kills
    the build's whole session."""
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-m", "builder", "build-wheel", "--recipe",
                             str(recipe(own_workspace, "killed", ops='["cpu_adam"]')), "--work-dir",
                             str(own_workspace), "--no-smoke", "--no-ccache", "--force"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip

    def compilers() -> list[str]:
        found = []
        for name in os.listdir("/proc"):
            try:
                cmdline = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(own_workspace) in cmdline and ("cc1plus" in cmdline or "g++" in cmdline):
                found.append(cmdline[:120])
        return found

    try:
        deadline = time.monotonic() + 600
        while not compilers() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(1)
        assert compilers(), "the build never reached its compilers"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        time.sleep(3)
        assert compilers() == []
    finally:
        if proc.poll() is None:
            proc.kill()
