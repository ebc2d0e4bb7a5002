from __future__ import annotations

import os
from pathlib import Path

import pytest

from builder.wheelbuild.ccache import Stats, cache_dir, environment, parse_stats

# Captured from ccache 4.7.5's --print-stats (trimmed).
STATS = (
    "cache_miss\t3\ndirect_cache_hit\t4\ndirect_cache_miss\t3\npreprocessed_cache_hit\t1\nstats_updated_timestamp\t0\n"
)


def test_parse_stats() -> None:
    got = parse_stats(STATS)
    assert got == Stats(hits=5, misses=3)
    assert got.describe() == "ccache: 5 hits, 3 misses (62% hit rate)"
    assert Stats(0, 0).rate == 0.0


def test_environment(tmp_path: Path) -> None:
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "ccache").write_text("#!/bin/sh\n")  # FAKE ccache: only its presence on PATH matters here
    (fake_bin / "ccache").chmod(0o755)
    env = {"PATH": f"{fake_bin}{os.pathsep}/usr/bin"}
    on = environment(tmp_path / "cc", True, env)
    assert on["CCACHE_DIR"] == str(tmp_path / "cc") and on["CCACHE_NOHASHDIR"] == "1"
    # nvcc flags given through the environment are invisible to ccache's hash of the command line:
    # they go into its namespace, so a compressed and an uncompressed build never share objects.
    compressed = environment(tmp_path / "cc", True, {**env, "NVCC_APPEND_FLAGS": "-Xfatbin -compress-all"})
    assert on["CCACHE_NAMESPACE"].startswith("nvcc-") and compressed["CCACHE_NAMESPACE"] != on["CCACHE_NAMESPACE"]
    assert environment(tmp_path / "cc", True, env) == on
    assert environment(tmp_path / "cc", False, env) == {"TORCH_NO_COMPILER_WRAPPER": "1"}
    assert environment(tmp_path / "cc", True, {"PATH": str(tmp_path / "empty")}) == {"TORCH_NO_COMPILER_WRAPPER": "1"}


def test_a_shared_cache_counts_each_build_in_its_own_stats_log(tmp_path: Path) -> None:
    """Build tasks on several nodes share one cache: its counters mix them, so each build reads its
    own stats log; and the compilers are checked by content (nodes install them at other times)."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "ccache").write_text("#!/bin/sh\n")  # FAKE ccache: only its presence on PATH matters here
    (fake_bin / "ccache").chmod(0o755)
    on = environment(tmp_path / "shared", True, {"PATH": str(fake_bin)}, tmp_path / "adam" / "ccache-stats.log")
    assert on["CCACHE_STATSLOG"] == str(tmp_path / "adam" / "ccache-stats.log")
    assert on["CCACHE_COMPILERCHECK"] == "content" and on["CCACHE_SLOPPINESS"] == "include_file_ctime"
    assert cache_dir(tmp_path / "cache", {}) == tmp_path / "cache" / "ccache"
    assert cache_dir(tmp_path / "cache", {"DS_BUILDER_CCACHE_DIR": "/shared/ccache"}) == Path("/shared/ccache")


@pytest.mark.spawns
def test_ccache_is_put_in_front_by_the_toolkit_for_every_torch(tmp_path: Path) -> None:
    """Issue 49: torch 2.11's extension builder has no compiler wrapper, so a build for it got no
    cache ("0 hits, 0 misses"). The toolkit wraps the compilers itself: CXX runs ccache before the
    build's own compiler, PYTORCH_NVCC is ccache before the toolkit's nvcc, torch's wrapper is off."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "ccache").write_text('#!/bin/sh\necho ccache "$@"\n')  # FAKE ccache: echoes what it would run
    (fake_bin / "ccache").chmod(0o755)
    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    (cuda / "bin" / "nvcc").write_text("")
    env = {"PATH": f"{fake_bin}{os.pathsep}/usr/bin", "CXX": "/root folder/g++", "CUDA_HOME": str(cuda)}
    on = environment(tmp_path / "cc", True, env, front=tmp_path / "front")
    assert on["TORCH_NO_COMPILER_WRAPPER"] == "1" and on["CXX"] == str(tmp_path / "front" / "c++")
    assert on["PYTORCH_NVCC"] == f"{fake_bin / 'ccache'} {cuda / 'bin' / 'nvcc'}"
    import subprocess

    said = subprocess.run([on["CXX"], "-c", "a b.cpp"], capture_output=True, text=True, check=True).stdout
    assert said == "ccache /root folder/g++ -c a b.cpp\n"  # each argument kept whole
    # No CXX: the c++ on the build's PATH; no toolkit: nvcc left to torch.
    plain = environment(tmp_path / "cc", True, {"PATH": f"{fake_bin}{os.pathsep}/usr/bin"}, front=tmp_path / "f2")
    assert "PYTORCH_NVCC" not in plain and "/usr/bin/c++" in (tmp_path / "f2" / "c++").read_text()
