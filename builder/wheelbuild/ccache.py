"""ccache in front of g++ and nvcc, in a cache folder the toolkit owns.

torch's extension builder already prefixes its compilers with ccache when it is on PATH
(`_wrap_compiler`, torch >= 2.x), so the toolkit only points ccache at its own folder and reads
the hit rate back after the build. No CCACHE_BASEDIR: it rewrites absolute include paths to
relative ones, which then reach the .so through __FILE__ past the -ffile-prefix-map rewrites and
make a ccache build differ from a plain one. Sources unpack to the same path in a work folder on
every build, so hits need no rewriting. Without ccache, or with it turned off, torch's wrapper is
disabled so the build is plain.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from builder.cmd import query, which


@dataclass(frozen=True)
class Stats:
    hits: int
    misses: int

    @property
    def rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def describe(self) -> str:
        return f"ccache: {self.hits} hits, {self.misses} misses ({self.rate:.0%} hit rate)"


# One cache for several work folders (the build tasks of a matrix on Slurm: a folder every node sees).
CACHE_DIR_ENV = "DS_BUILDER_CCACHE_DIR"


def cache_dir(work_cache: Path, env: Mapping[str, str]) -> Path:
    return Path(env[CACHE_DIR_ENV]) if env.get(CACHE_DIR_ENV) else work_cache / "ccache"


# Variables nvcc reads that change its output but never appear on the command line ccache hashes.
NVCC_ENV = ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN")


def environment(
    cache_dir: Path, enabled: bool, env: Mapping[str, str], stats_log: Path | None = None
) -> dict[str, str]:
    """ccache's settings for a build; the nvcc flags given through the environment (-Xfatbin
    -compress-all, -ccbin) go into its namespace, which ccache hashes with every compile, so an
    object built with other flags is never a hit. The build's own hits and misses go to
    `stats_log`: the cache's counters are shared by every build using it at the same time."""
    if not enabled or which("ccache", env) is None:
        return {"TORCH_NO_COMPILER_WRAPPER": "1"}
    flags = "\n".join(f"{k}={env.get(k, '')}" for k in NVCC_ENV)
    namespace = "nvcc-" + hashlib.sha256(flags.encode()).hexdigest()[:16]
    # compiler_check=content: nodes of a shared cache install the same compiler at other times (mtime).
    # include_file_ctime: uv hard-links torch's headers from its cache, so another environment being
    # made at the same time moves their ctime, and ccache would refuse to store the object
    # ("modified_input_file", seen here); their content still decides, through their mtime and hash.
    out = {"CCACHE_DIR": str(cache_dir), "CCACHE_NOHASHDIR": "1", "CCACHE_NAMESPACE": namespace,
           "CCACHE_COMPILERCHECK": "content", "CCACHE_SLOPPINESS": "include_file_ctime"}  # fmt: skip
    if stats_log is not None:
        out["CCACHE_STATSLOG"] = str(stats_log)
    return out


def parse_stats(text: str) -> Stats:
    """`ccache --print-stats` (tab-separated counters)."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition("\t")
        if value.strip().isdigit():
            values[key] = int(value)
    hits = values.get("direct_cache_hit", 0) + values.get("preprocessed_cache_hit", 0)
    return Stats(hits=hits, misses=values.get("cache_miss", 0))


def _ccache(env: Mapping[str, str]) -> str | None:
    """The ccache the build runs (the build env's, from PyPI), not whichever this process's PATH has."""
    return which("ccache", env) if "CCACHE_DIR" in env else None


def zero(env: Mapping[str, str]) -> None:
    """Start this build's count (its stats log), leaving the shared cache's counters alone."""
    if _ccache(env) and env.get("CCACHE_STATSLOG"):
        Path(env["CCACHE_STATSLOG"]).unlink(missing_ok=True)


def stats(env: Mapping[str, str]) -> Stats | None:
    program = _ccache(env)
    if program is None or not env.get("CCACHE_STATSLOG"):
        return None
    said = query(["env", f"CCACHE_DIR={env['CCACHE_DIR']}", f"CCACHE_STATSLOG={env['CCACHE_STATSLOG']}",
                  program, "--print-log-stats"])  # fmt: skip
    return parse_stats(said)
