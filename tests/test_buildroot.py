"""Build roots and floors, without building: the recipe's platform and [root], the floor check on
symbol lists, torch's floor from its WHEEL file, the OS names of a floor, the wrappers' content, the
-march spelling for gcc 10, the folders bound in, and the trust checks on a root folder."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from builder.buildroot import make, pack
from builder.buildroot.sandbox import check_trusted
from builder.buildroot.spec import (
    RootFacts,
    RootSpec,
    bind_paths,
    march_flags,
    pins_header,
    spec_key,
    tool_wrapper,
    wrapper_files,
)
from builder.errors import RecipeError, RootError
from builder.glibc import Needed, above_floor, known_floors, ops_floor, tag_for, wheel_floor
from builder.node import describe_floor, floor_systems
from builder.recipe import parse_recipe

GOOD: dict[str, Any] = {
    "name": "cpu",
    "accelerator": "cpu",
    "ops": ["cpu_adam"],
    "deepspeed": {"version": "0.19.8", "sha256": "9e491abd0827ea5c389dd702e15e11e13d83d904bac4a20d6c2a4cb37207a9af"},
    "torch": {"version": "2.13.0"},
}
FACTS = RootFacts(Path("/var/tmp/r"), "abc123", "2.31", "10.2.1", "Debian bullseye")


def recipe(**changes: Any) -> Any:
    return parse_recipe({**GOOD, **changes})


def test_every_recipe_targets_manylinux_2_28_by_default_and_a_floor_is_checked_at_load() -> None:
    assert recipe().platform == "manylinux_2_28" and recipe().root is None
    assert recipe(platform="host").platform == "host"
    assert recipe(platform="manylinux_2_31").platform == "manylinux_2_31"
    assert "manylinux_2_28" in known_floors() and "manylinux_2_17" in known_floors()
    with pytest.raises(RecipeError, match=r'platform = "manylinux_2_99" is not a floor') as bad:
        recipe(platform="manylinux_2_99")
    assert "manylinux_2_28" in bad.value.fix and '"host"' in bad.value.fix
    with pytest.raises(RecipeError, match=r'"banana" is not a floor'):
        recipe(platform="banana")
    with pytest.raises(RecipeError, match=r'did you mean "manylinux_2_28"'):
        recipe(platform="manylinux_2_2")
    for shipped in sorted((Path(__file__).parents[1] / "recipes").glob("*.toml")):
        assert 'platform = "manylinux_2_28"' in shipped.read_text(), shipped  # said in every shipped recipe


def test_a_recipe_names_its_own_root_as_a_folder_or_an_image() -> None:
    folder = recipe(root={"folder": "/srv/roots/alma8", "cxx": "/opt/rh/gcc-toolset-13/root/usr/bin/g++"})
    assert folder.root == RootSpec(
        "folder", folder=Path("/srv/roots/alma8"), cxx="/opt/rh/gcc-toolset-13/root/usr/bin/g++"
    )
    image = recipe(root={"image": "quay.io/pypa/manylinux_2_28_x86_64"})
    assert image.root is not None and image.root.image == "quay.io/pypa/manylinux_2_28_x86_64"
    cases = {
        "either a folder or an image": {"folder": "/a", "image": "b"},
        "is not an absolute path": {"folder": "roots/alma8"},
        "is not an image reference": {"image": "x; rm -rf /"},
        "not an absolute path inside the root": {"folder": "/a", "cxx": "../../usr/bin/g++"},
        'unknown key "root.compiler"': {"folder": "/a", "compiler": "/usr/bin/g++"},
    }
    for said, table in cases.items():
        with pytest.raises(RecipeError, match=said):
            recipe(root=table)
    with pytest.raises(RecipeError, match='platform = "host" has none'):
        recipe(platform="host", root={"folder": "/a"})


def test_the_floor_check_names_each_symbol_above_it() -> None:
    needed = [
        Needed("deepspeed/ops/comm/deepspeed_shm_comm_op.so", "libc.so.6", "GLIBC_2.34", "shm_open"),
        Needed("deepspeed/ops/adam/cpu_adam_op.so", "libm.so.6", "GLIBC_2.29", "pow"),
        Needed(
            "deepspeed/ops/adam/cpu_adam_op.so",
            "libstdc++.so.6",
            "GLIBCXX_3.4.30",
            "_ZNSt18condition_variable4waitERSt11unique_lockISt5mutexE",
        ),
        Needed("deepspeed/ops/adam/cpu_adam_op.so", "libc.so.6", "GLIBC_2.17", "clock_gettime"),
        Needed("deepspeed/ops/adam/cpu_adam_op.so", "libgomp.so.1", "GOMP_4.0", "GOMP_parallel"),  # not the policy's
    ]
    bad = above_floor(needed, "manylinux_2_28")
    assert [(n.symbol, n.version) for n in bad] == [  # by file, then version
        ("_ZNSt18condition_variable4waitERSt11unique_lockISt5mutexE", "GLIBCXX_3.4.30"),
        ("pow", "GLIBC_2.29"),
        ("shm_open", "GLIBC_2.34"),
    ]
    assert bad[-1].describe() == "deepspeed/ops/comm/deepspeed_shm_comm_op.so needs shm_open@GLIBC_2.34 (libc.so.6)"
    assert [n.symbol for n in above_floor(needed, "manylinux_2_35")] == []
    assert [n.symbol for n in above_floor(needed, "manylinux_2_31")] == [
        "_ZNSt18condition_variable4waitERSt11unique_lockISt5mutexE",
        "shm_open",
    ]


def test_the_tag_is_the_newest_of_the_ops_floor_and_torchs() -> None:
    assert tag_for("manylinux_2_17", "manylinux_2_28") == "manylinux_2_28_x86_64"
    assert tag_for("manylinux_2_31", "manylinux_2_28") == "manylinux_2_31_x86_64"
    assert ops_floor({"libc.so.6": {"GLIBC_2.2.5", "GLIBC_2.17"}}) == "manylinux_2_17"
    assert ops_floor({"libc.so.6": {"GLIBC_2.29"}, "libstdc++.so.6": {"GLIBCXX_3.4.22"}}) == "manylinux_2_31"
    torch_wheel = "Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp311-cp311-manylinux_2_28_x86_64\n"  # 2.13.0+cpu's
    assert wheel_floor(torch_wheel) == "manylinux_2_28"
    legacy = "Tag: cp311-cp311-manylinux2014_x86_64\nTag: cp311-cp311-manylinux_2_17_x86_64\n"
    assert wheel_floor(legacy) == "manylinux_2_17"
    assert wheel_floor("Tag: cp311-cp311-linux_x86_64\n") is None


def test_a_floor_is_told_in_the_names_of_the_systems_it_reaches() -> None:
    assert describe_floor("manylinux_2_28_x86_64") == "glibc 2.28 or newer: RHEL 8+, Debian 10+, Ubuntu 18.10+"
    assert floor_systems((2, 31)) == "RHEL 9+, Debian 11+, Ubuntu 20.04+"
    assert floor_systems((2, 35)) == "RHEL 10+, Debian 12+, Ubuntu 22.04+"
    assert describe_floor("linux_x86_64").startswith("no glibc floor stated")


def test_the_wrappers_carry_the_roots_identity_and_the_pins() -> None:
    files = wrapper_files(FACTS, ["/work", "/tmp/w"], covers=["1777 /tmp"])
    assert set(files) == {"enter", "inside", "root", "binds", "covers", "pins.h", "root.json", "gcc", "cc", "g++",
                          "c++", "strip"}  # fmt: skip
    assert "/usr/bin/strip" in files["strip"][0]  # binutils beside the root's gcc
    cross = wrapper_files(RootFacts(Path("/r"), "x", "2.31", "10.2.1", "x", "/usr/bin/aarch64-linux-gnu-gcc",
                                    "/usr/bin/aarch64-linux-gnu-g++"), ["/work"])  # fmt: skip
    assert "/usr/bin/aarch64-linux-gnu-strip" in cross["strip"][0]  # the host's strip knows only x86 objects
    assert files["binds"][0] == "/work\n/tmp/w\n" and files["root"][0] == "/var/tmp/r\n"
    assert files["covers"][0] == "1777 /tmp\n"
    gxx = files["g++"][0]
    assert "abc123" in gxx and "/usr/bin/g++" in gxx and files["g++"][1] == 0o755
    # ccache hashes the wrapper (compiler_check = content): another root or other pins is another compiler
    other_root = tool_wrapper(
        "/usr/bin/g++", RootFacts(Path("/var/tmp/r"), "def456", "2.31", "10.2.1", "x"), pins_header()
    )
    other_pins = tool_wrapper("/usr/bin/g++", FACTS, pins_header((("pow", "GLIBC_2.2.5"), ("exp", "GLIBC_2.2.5"))))
    assert len({gxx, other_root, other_pins}) == 3
    assert '__asm__(".symver pow,pow@GLIBC_2.2.5");' in files["pins.h"][0]
    assert "!defined(__CUDA_ARCH__)" in files["pins.h"][0]  # host code only, never device code
    assert spec_key(RootSpec("debian", mirror="http://a")) != spec_key(RootSpec("debian", mirror="http://b"))


def test_gcc_10_is_told_the_march_level_flag_by_flag() -> None:
    v3 = march_flags("-march=x86-64-v3", 10)
    assert v3 is not None and v3.startswith("-march=x86-64 -mtune=generic ")
    assert {"-mavx2", "-mfma", "-mbmi2", "-msse4.2", "-mmovbe"} <= set(v3.split())
    assert "-mavx512f" not in v3.split() and "-mavx512f" in (march_flags("-march=x86-64-v4", 10) or "")
    assert march_flags("-march=x86-64-v3", 11) is None  # gcc 11 knows the name
    assert march_flags("-march=x86-64", 10) is None


def test_only_the_builds_own_folders_are_bound_in() -> None:
    got = bind_paths(["/tmp", "/tmp/work", "/usr", "/usr/include/python3.11", "relative/x", "/opt", "/srv/cache/"])
    assert got == ("/srv/cache", "/tmp", "/usr/include/python3.11")


def _fake_root(base: Path, gxx: bool = True, headers: bool = True) -> Path:
    root = base / "root"
    for d in ("usr/bin", "usr/include", "usr/lib", "bin", "etc"):
        (root / d).mkdir(parents=True)
    for tool in ("gcc", *(["g++"] if gxx else [])):
        (root / "usr/bin" / tool).write_text("#!/bin/sh\n")
        (root / "usr/bin" / tool).chmod(0o755)
    if headers:
        (root / "usr/include/stdio.h").write_text("")
    for p in (base, *[q for q in root.rglob("*") if q.is_dir()], root):
        p.chmod(0o755)
    return root


def test_a_root_folder_is_trusted_only_when_no_one_else_can_change_it(tmp_path: Path) -> None:
    spec = RootSpec("folder")
    root = _fake_root(tmp_path)
    check_trusted(root, spec)  # ours, not writable by others: trusted
    (root / "usr/bin").chmod(0o777)
    with pytest.raises(RootError, match=r"usr/bin is writable by every user \(mode 777\)") as said:
        check_trusted(root, spec)
    assert said.value.exit_code == 15 and 'platform = "host"' in said.value.fix
    (root / "usr/bin").chmod(0o755)
    root.chmod(0o777)
    with pytest.raises(RootError, match=r"root is writable by every user \(mode 777\)"):
        check_trusted(root, spec)
    root.chmod(0o755)
    if os.geteuid() == 0:
        os.chown(root / "usr/bin/g++", 65534, 65534)
        with pytest.raises(RootError, match=r"g\+\+ belongs to another user \(uid 65534\)"):
            check_trusted(root, spec)
        os.chown(root / "usr/bin/g++", 0, 0)
        os.chown(root, 65534, 65534)
        with pytest.raises(RootError, match=r"belongs to another user \(uid 65534\).*could change the compiler"):
            check_trusted(root, spec)


def test_a_folder_that_is_no_root_or_lacks_a_compiler_is_refused(tmp_path: Path) -> None:
    spec = RootSpec("folder")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(RootError, match="is not the top folder of an OS's files"):
        check_trusted(empty, spec)
    with pytest.raises(RootError, match=r"has no compiler /usr/bin/g\+\+") as said:
        check_trusted(_fake_root(tmp_path / "a", gxx=False), spec)
    assert "apt-get install g++" in said.value.fix and "[root] cxx" in said.value.fix
    with pytest.raises(RootError, match="no C library headers"):
        check_trusted(_fake_root(tmp_path / "b", headers=False), spec)
    odd = tmp_path / "c,d"
    shutil.copytree(_fake_root(tmp_path / "c"), odd, symlinks=True)
    with pytest.raises(RootError, match="an overlay mount cannot take"):
        check_trusted(odd, spec)


def test_paths_inside_a_root_never_lead_out_of_it(tmp_path: Path) -> None:
    root = _fake_root(tmp_path)
    (root / "usr/local").mkdir()
    (root / "usr/local/g++").symlink_to("/usr/bin/g++")  # absolute: the root's own /usr/bin/g++
    (root / "usr/local/up").symlink_to("../../../../../../etc")
    assert make.inside(root, "/usr/local/g++") == root / "usr/bin/g++"
    assert make.inside(root, "/usr/local/up") == root / "etc"  # .. stops at the root's top
    assert make.inside(root, "/usr/bin/clang") is None


def test_no_debootstrap_and_no_apt_get_is_one_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on it
    with pytest.raises(RootError, match="needs debootstrap, which is not installed") as said:
        make.debootstrap(tmp_path / "tools", tmp_path / "log")
    assert "install debootstrap" in said.value.fix and 'platform = "host"' in said.value.fix
    # Issue 56: the three ways out of a node that cannot make a root, named.
    assert "--offline DIR" in said.value.fix and "[root] folder" in said.value.fix
    assert not (tmp_path / "tools").exists()


def _packed_root(folder: Path, members: list[tuple[str, bytes | str]]) -> pack.PackedRoot:
    """A packed root written here in-process (FAKE content: a few files, links as `->target`) and its record."""
    import hashlib
    import io
    import json
    import tarfile

    folder.mkdir(parents=True, exist_ok=True)
    file = folder / "build-bullseye-x.tar.xz"
    with tarfile.open(file, "w:xz") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if isinstance(data, str):
                info.type, info.linkname = tarfile.SYMTYPE, data
                tf.addfile(info)
            else:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    facts = RootFacts(Path("/"), "identity-1", "2.31", "10.2.1", "Debian bullseye")
    packed = pack.PackedRoot("build-bullseye-x", "bullseye", "buildd", ("libaio-dev",), facts, file.name,
                             file.stat().st_size, hashlib.sha256(file.read_bytes()).hexdigest())  # fmt: skip
    pack.record_path(folder, packed.name).write_text(json.dumps(packed.to_json()))
    return packed


def test_a_packed_root_is_found_by_what_it_holds_and_unpacked_inside_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 56: a node with no mirror unpacks the root an offline folder carries (FAKE root content)."""
    from builder.buildroot.spec import RootSpec

    folder = tmp_path / "offline" / "root"
    packed = _packed_root(folder, [("./usr/bin/g++-10", b"ELF"), ("./usr/bin/g++", "g++-10"),
                                   ("./usr/bin/cc", "/etc/alternatives/cc")])  # fmt: skip
    spec = RootSpec("debian", mirror="http://elsewhere/debian")  # another mirror: the same root
    assert pack.find(spec, {}) is None
    found = pack.find(spec, {pack.PACKED_ENV: str(folder)})
    assert found is not None and found[1] == packed
    assert pack.find(RootSpec("debian", suite="bookworm"), {pack.PACKED_ENV: str(folder)}) is None
    # ensure_debian takes it, with no debootstrap and no root (FAKE: the machine's user is not root).
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    roots = tmp_path / "roots"
    monkeypatch.setenv(pack.PACKED_ENV, str(folder))
    facts = make.ensure_debian(spec, roots)
    assert facts.identity == "identity-1" and facts.gcc == "10.2.1" and facts.path.parent == roots
    assert (facts.path / "usr" / "bin" / "g++-10").read_bytes() == b"ELF"
    assert os.readlink(facts.path / "usr" / "bin" / "cc") == "/etc/alternatives/cc"  # read inside the root
    assert make.ensure_debian(spec, roots) == facts  # recorded: made once
    assert not list(roots.glob(".*.tmp-*"))


def test_a_packed_root_that_is_changed_or_leads_out_of_its_folder_is_refused(tmp_path: Path) -> None:
    import json

    folder = tmp_path / "root"
    packed = _packed_root(folder, [("./usr/bin/g++", b"ELF")])
    (folder / packed.file).write_bytes((folder / packed.file).read_bytes()[:-1] + b"\0")
    with pytest.raises(RootError, match="is not the packed root its record describes"):
        pack.unpack(folder, packed, tmp_path / "out")
    # A link out of the root, then a file through it: nothing is written outside.
    outside = tmp_path / "outside"
    outside.mkdir()
    evil = _packed_root(tmp_path / "evil", [("./etc", str(outside)), ("./etc/passwd", b"owned")])
    with pytest.raises(RootError, match="cannot unpack"):
        pack.unpack(tmp_path / "evil", evil, tmp_path / "out2")
    assert list(outside.iterdir()) == []
    for bad in ({"schema": 2}, {"file": "../x.tar.xz"}, {"size": "1"}, {"name": "a\nb"}):
        record = pack.record_path(folder, packed.name)
        record.write_text(json.dumps({**packed.to_json(), **bad}))
        with pytest.raises(RootError, match="is not a packed root's record"):
            pack.read_record(record)
