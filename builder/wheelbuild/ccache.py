"""ccache in front of g++ and nvcc, in a cache folder the toolkit owns.

The toolkit puts ccache in front itself, for every torch: CXX names a small script that runs
`ccache <the real C++ compiler>`, and PYTORCH_NVCC (read by torch's ninja builds since 2.1) is
`ccache <nvcc>`; torch's own wrapper is turned off (TORCH_NO_COMPILER_WRAPPER). torch's wrapper
(`_wrap_compiler`) arrived after 2.11: a build for torch 2.11, what most GPU images hold, got no
compiler cache at all, silently ("ccache: 0 hits, 0 misses" on an H100 node). The hit rate is read
back after the build. No CCACHE_BASEDIR: it rewrites absolute include paths to
relative ones, which then reach the .so through __FILE__ past the -ffile-prefix-map rewrites and
make a ccache build differ from a plain one. Sources unpack to the same path in a work folder on
every build, so hits need no rewriting. Without ccache, or with it turned off, torch's wrapper is
disabled so the build is plain.
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from builder.cmd import query, which
from builder.files import env_folder, group_shared


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
    named = env_folder(env, CACHE_DIR_ENV, "compiled objects")  # they go into the wheel as they are
    return named if named is not None else work_cache / "ccache"


# Variables nvcc reads that change its output but never appear on the command line ccache hashes.
NVCC_ENV = ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN")


def environment(
    cache_dir: Path, enabled: bool, env: Mapping[str, str], stats_log: Path | None = None,
    front: Path | None = None,
) -> dict[str, str]:  # fmt: skip
    """ccache's settings for a build; the nvcc flags given through the environment (-Xfatbin
    -compress-all, -ccbin) go into its namespace, which ccache hashes with every compile, so an
    object built with other flags is never a hit. The build's own hits and misses go to
    `stats_log`: the cache's counters are shared by every build using it at the same time. With
    `front` (a folder of the build's own) the compilers are wrapped there (see the module's note)."""
    program = which("ccache", env)
    if not enabled or program is None:
        return {"TORCH_NO_COMPILER_WRAPPER": "1"}
    flags = "\n".join(f"{k}={env.get(k, '')}" for k in NVCC_ENV)
    namespace = "nvcc-" + hashlib.sha256(flags.encode()).hexdigest()[:16]
    # compiler_check=content: nodes of a shared cache install the same compiler at other times (mtime).
    # include_file_ctime: uv hard-links torch's headers from its cache, so another environment being
    # made at the same time moves their ctime, and ccache would refuse to store the object
    # ("modified_input_file", seen here); their content still decides, through their mtime and hash.
    out = {"CCACHE_DIR": str(cache_dir), "CCACHE_NOHASHDIR": "1", "CCACHE_NAMESPACE": namespace,
           "CCACHE_COMPILERCHECK": "content", "CCACHE_SLOPPINESS": "include_file_ctime"}  # fmt: skip
    if group_shared(cache_dir):  # ccache's own way to share a cache: what one member stores, the others may use
        out["CCACHE_UMASK"] = "002"
    if stats_log is not None:
        out["CCACHE_STATSLOG"] = str(stats_log)
    if front is not None:
        out.update(compiler_front(front, program, env))
    return out


def compiler_front(folder: Path, ccache: str, env: Mapping[str, str]) -> dict[str, str]:
    """CXX as a script running ccache before the real compiler (the build's CXX, else the c++ on its
    PATH), and PYTORCH_NVCC as ccache before the toolkit's nvcc where CUDA_HOME names one."""
    real = env.get("CXX") or which("c++", env) or "c++"
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "c++"
    script.write_text(f'#!/bin/sh\nexec {shlex.quote(ccache)} {shlex.quote(real)} "$@"\n', encoding="utf-8")
    script.chmod(0o755)
    out = {"CXX": str(script), "TORCH_NO_COMPILER_WRAPPER": "1"}
    nvcc = Path(env.get("CUDA_HOME", "")) / "bin" / "nvcc" if env.get("CUDA_HOME") else None
    if nvcc is not None and nvcc.is_file():
        out["PYTORCH_NVCC"] = f"{shlex.quote(ccache)} {shlex.quote(str(nvcc))}"
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
