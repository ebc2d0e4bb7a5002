"""Build op units side by side: each one DeepSpeed setup.py run (bdist_wheel) with one op enabled.

Each op builds in a folder of its own that stays the same from build to build
(WORK/units/<op>/src), so ccache, which hashes the compiler's absolute paths, hits whenever the
op's sources and flags did not change. Units run in threads, each driving its own pip process;
cores and memory are shared out by `plan.schedule_units`. A unit that fails is reported with
the compiler's or the linker's first error lines; the others go on and are cached, so the next
build compiles only what failed or changed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from filelock import Timeout

from builder import cmd, files, output
from builder.detect import available_memory_gb
from builder.errors import BuilderError, BuildError, ToolError
from builder.files import Sweeper, make_dirs
from builder.units import cache, memory, pch
from builder.units.plan import WITH_PIN_MEMORY, Unit
from builder.wheelbuild import artifacts, ccache, diagnose, source
from builder.wheelbuild.diagnose import CompileFailure

_EXTENSION = re.compile(r"building '([\w.]+)' extension")
_NINJA_STEP = re.compile(r"^\s*\[(\d+/\d+)\] .* -c (\S+) ")
# Zip timestamps of every wheel (wheel pack honours it) when the caller sets none: 1980-01-01,
# the earliest date a zip can hold, so two builds of the same inputs give the same bytes.
DEFAULT_SOURCE_DATE_EPOCH = "315532800"


def build_progress(line: str) -> str | None:
    """Short progress text for the lines of a DeepSpeed build that mark real work."""
    if m := _EXTENSION.search(line):
        return f"building {m.group(1)}"
    if m := _NINJA_STEP.match(line):
        return f"[{m.group(1)}] compiling {Path(m.group(2)).name}"
    if "Install Ops=" in line:
        return line.strip()
    return None


def reproducible_env(env: Mapping[str, str], src: Path, venv: Path) -> dict[str, str]:
    """Flags that keep build paths out of the binaries and fix the archive timestamps.

    __FILE__ in DeepSpeed's and torch's headers would otherwise embed the work folder and the
    build env's path into the .so files; the prefix maps rewrite both to fixed names.
    """
    maps = f"-ffile-prefix-map={src}=/deepspeed -ffile-prefix-map={venv}=/buildenv"
    out = {
        "SOURCE_DATE_EPOCH": env.get("SOURCE_DATE_EPOCH", DEFAULT_SOURCE_DATE_EPOCH),
        # DeepSpeed's setup.py builds extras_require["all"] from a set: without a fixed hash seed
        # the Requires-Dist lines in METADATA come out in a different order on every build.
        "PYTHONHASHSEED": "0",
        "NVCC_APPEND_FLAGS": " ".join(
            filter(None, [env.get("NVCC_APPEND_FLAGS"), f"-Xcompiler={maps.replace(' ', ',')}"])
        ),
    }
    for var in ("CFLAGS", "CXXFLAGS"):
        out[var] = " ".join(filter(None, [maps, env.get(var)]))
    return out


def single_wheel(folder: Path) -> Path:
    wheels = sorted(folder.glob("*.whl"))
    if len(wheels) != 1:
        raise BuildError(f"the build produced {len(wheels)} wheels, expected one", "read the build log")
    return wheels[0]


@dataclass(frozen=True)
class UnitResult:
    unit: Unit
    status: str  # "built", "cached" or "failed"
    wheel: Path | None  # the cached unit wheel (built or cached)
    seconds: float  # this build's time (0 for a cached unit); the unit's own build time is in its record
    log: Path
    failure: str = ""  # for a failed unit: what failed, in the compiler's or linker's words
    ccache_hits: tuple[int, int] | None = None  # (hits, misses) of this unit's compiles
    killed: bool = False  # the kernel killed its compiler (out of memory): the machine's fault, not the op's
    foreign: bool = False  # its build left files not its op's: the build root's tools wrote them, not the op
    header_log: Path | None = None  # what its compiles did with the precompiled header (pch.py)


@dataclass(frozen=True)
class UnitJob:
    """What every unit of one build shares: the sdist, the build env, the toolchain environment."""

    sdist: Path
    python: Path
    env: Mapping[str, str]  # toolchain and plan environment, before the unit's own
    work: Path  # WORK/units: one stable folder per op
    cache: Path
    logs: Path
    version: str  # the wheel version the plan stamps
    use_ccache: bool
    ccache_dir: Path
    verbose: bool = False
    job_gb: float = 2.0  # memory one compile job takes (plan.job_memory): a unit needs MAX_JOBS of these
    # Precompiled torch headers for the C++ compiles (a build in a root): pch.py. Making one takes
    # 1.9 GB here, a compile with one 1.7 GB as without: within job_gb, so the sizing holds for both.
    pch: bool = False
    src: Path | None = None  # the unpacked source the plan probed: which of an op's sources take the header


def run_units(units: Sequence[Unit], parallel: int, job: UnitJob) -> list[UnitResult]:
    """Every unit, cached or built (`parallel` at once); failures are results, not exceptions."""
    if not units:
        return []
    order = list(units)
    if job.pch:
        job = dataclasses.replace(job, env={**job.env, **header_env(units, job)})
        makers = job.env[MAKERS_ENV].split(",")
        # Units that make no header start first: their compiles keep the cores busy while the first
        # compile of a header's flag set makes it (the set's other compiles wait for it).
        order = sorted(units, key=lambda u: u.op.name in makers)
    with Sweeper() as sweeper:  # a signal: every unit's compilers killed at once, none started after (cmd.in_threads)
        results = cmd.in_threads(lambda u: run_unit(u, job, sweeper), order, parallel, "unit")
        done = dict(zip([u.op.name for u in order], results, strict=True))
    return [done[u.op.name] for u in units]


def header_env(units: Sequence[Unit], job: UnitJob) -> dict[str, str]:
    """The precompiled header's variables for these units. Ops whose builders add the same C++ flags
    share a flag set, so a header; one is made for a set only where MIN_SOURCES or more of its C++
    sources are to be compiled (it costs about three compiles), else used only if already made."""
    todo = [u for u in units if not (job.cache / u.key / cache.RECORD).is_file()]  # run_unit checks the rest
    sources: dict[tuple[str, ...], list[Unit]] = {}
    for u in todo:
        sources.setdefault(u.op.cxx_args, []).extend(
            u for s in u.op.sources if _takes_header(job.src, s, u.op.include_paths)
        )
    makers = {u.op.name for group in sources.values() if len(group) >= pch.MIN_SOURCES for u in group}
    for group in sources.values():
        if group and len(group) < pch.MIN_SOURCES:
            ops = ", ".join(sorted({u.op.name for u in group}))
            output.note(f"precompiled torch header: none made for {ops}, {len(group)} C++ source(s) of that "
                        f"flag set to compile (a header costs about {pch.MIN_SOURCES}); "
                        "one made before is used")  # fmt: skip
    return {**pch.environment(job.cache, job.work), MAKERS_ENV: ",".join(sorted(makers))}


def _takes_header(src: Path | None, source: str, include_paths: Sequence[str] = ()) -> bool:
    """Whether an op's source (as DeepSpeed lists it) would take the header: a C++ source that reaches
    torch/extension.h first (pch.reaches_header), its includes followed as its compile follows them:
    its own folder, the op builder's -I folders, DeepSpeed's csrc/includes. Without the op's folders
    an include of theirs was skipped and the walk went on to torch: async_io's sources counted, and
    made two headers for 4 of its 15 compiles (181 s and 80 s), where the front rightly refused 11."""
    if not pch.SOURCE.match(source):
        return False
    if src is None:
        return True
    path = src / source
    folders = [str(path.parent), *(str(src / p) for p in include_paths if not Path(p).is_absolute()),
               str(src / "csrc" / "includes")]  # fmt: skip
    return pch.reaches_header(str(path), folders, str(src)).why is None


MAKERS_ENV = "DS_BUILDER_PCH_MAKERS"  # the units that may make a header (header_env)


def run_unit(unit: Unit, job: UnitJob, sweeper: Sweeper) -> UnitResult:
    name = unit.op.name
    log = job.logs / f"unit-{name}-{unit.key}.log"
    found = cache.lookup(job.cache, unit)
    if found is not None:
        output.note(f"unit {name}: cached ({unit.key}, built in {found[0].seconds:.0f}s)")
        return UnitResult(unit, "cached", found[1], 0.0, log)
    make_dirs(job.cache)
    with _waiting_lock(job.cache / f".{unit.key}.lock", f"op unit {name}, which another builder is building"):
        found = cache.lookup(job.cache, unit)
        if found is not None:
            output.note(f"unit {name}: built meanwhile by another builder ({unit.key})")
            return UnitResult(unit, "cached", found[1], 0.0, log)
        folder = job.work / name
        make_dirs(folder)
        with _waiting_lock(job.work / f".{name}.lock", f"the work folder of op unit {name}"):
            unit, claim = room_for(unit, job.job_gb, pool=machine_pool())
            with _COMPILING_LOCK:
                _COMPILING[0] += 1
            try:
                return _build(unit, job, folder, log, sweeper)
            finally:
                with _COMPILING_LOCK:
                    _COMPILING[0] -= 1
                if claim is not None:
                    claim.release()


@contextlib.contextmanager
def _waiting_lock(path: Path, what: str) -> Iterator[None]:
    """A file lock waited for a second at a time, given up (cmd.Stopped) when the run stops; a wait says
    what it waits for and who holds it (files.waiting_line)."""
    lock = files.lock(path)  # 0664 in a group-shared unit cache: each member takes the other's lock
    said = False
    while True:
        try:
            lock.acquire(timeout=1)
            break
        except Timeout:
            if cmd.stopping():
                raise cmd.Stopped(f"stopped while waiting for {path}", "") from None
            if not said:
                output.note(files.waiting_line(path, what))
                said = True
    try:
        files.mark_holder(path)
        yield
    finally:
        Path(f"{path}{files.HOLDER}").unlink(missing_ok=True)
        lock.release()


# Units of this process compiling now, and how often a unit waiting for memory looks again.
_COMPILING = [0]
_COMPILING_LOCK = threading.Lock()
MEMORY_POLL_S = 5.0


def room_for(unit: Unit, job_gb: float, free_gb: Callable[[], float | None] = available_memory_gb,
             sleep: Callable[[float], None] = time.sleep,
             pool: memory.Pool | None = None) -> tuple[Unit, memory.Claim | None]:  # fmt: skip
    """The unit, once the memory its MAX_JOBS compile jobs need is free, and the tokens of the
    machine's pool (units.memory) it holds for them while it builds. Free memory is asked again
    now, not taken from the start of the build (other builds on a shared login node, a Slurm or
    cgroup limit: available_memory_gb), and the pool counts what other builders' units have claimed
    and not yet taken. While units of this build are compiling it waits for them; with none left to
    wait for it starts with as many jobs as the free memory and the pool hold (at least one)."""
    jobs, per = int(unit.env["MAX_JOBS"]), memory.tokens(job_gb)
    said = False
    while True:
        free = free_gb()
        with _COMPILING_LOCK:
            others = _COMPILING[0]
        short = free is not None and free < jobs * job_gb
        can = jobs if not short else 0 if others else max(1, min(jobs, int((free or 0) // job_gb)))
        claim = pool.take(can * per, can * per if others else per) if can and pool is not None else None
        if claim is not None:  # the pool may give fewer jobs than the free memory would
            can = min(can, max(1, len(claim) // per))
            claim.keep(can * per)
        elif pool is not None:
            can = 0
        if can:
            if can < jobs:
                why = (f"{free:.1f} GB free, {jobs * job_gb:.0f} GB wanted" if short
                       else f"other builds on this machine hold most of its {pool.size if pool else 0} GB "
                       "for compile jobs")  # fmt: skip
                output.note(f"unit {unit.op.name}: {why}: building with MAX_JOBS={can} of {jobs}")
                unit = dataclasses.replace(unit, env={**unit.env, "MAX_JOBS": str(can)})
            return unit, claim
        if not said:
            where = (f"{others} unit(s) of this build compiling" if others
                     else "other builds on this machine hold its memory for compile jobs")  # fmt: skip
            shown = "unknown" if free is None else f"{free:.1f} GB"
            output.note(f"unit {unit.op.name}: waiting for memory before compiling: its {jobs} compile jobs at "
                        f"once need about {jobs * job_gb:.0f} GB and {shown} is free now ({where}); it starts as "
                        "soon as they finish and memory is free again, or set MAX_JOBS lower to start "
                        "sooner")  # fmt: skip
            said = True
        if cmd.stopping():
            raise cmd.Stopped(f"unit {unit.op.name}: stopped while waiting for memory", "")
        sleep(MEMORY_POLL_S)


@functools.cache
def machine_pool() -> memory.Pool | None:
    """The pool this process's units share with every builder on the machine (once a process)."""
    return memory.machine_pool()


def _build(unit: Unit, job: UnitJob, folder: Path, log: Path, sweeper: Sweeper) -> UnitResult:
    name = unit.op.name
    sweeper.sweep_leftovers(folder)
    start = time.monotonic()
    log.parent.mkdir(parents=True, exist_ok=True)
    log.unlink(missing_ok=True)
    output.note(f"unit {name}: building ({unit.key}, MAX_JOBS={unit.env['MAX_JOBS']}; log {log})")
    src = source.unpack(job.sdist, folder / "src")
    source.patch_build_tree(src)
    env = {**job.env, **unit.env}
    env.update(reproducible_env(env, src, job.python.parent.parent))
    env.update(ccache.environment(job.ccache_dir, job.use_ccache, env, folder / "ccache-stats.log",
                                  front=folder / "ccache-front"))  # fmt: skip
    ccache.zero(env)
    header_log = folder / "pch.log" if pch.PCH_ENV in env else None
    if header_log:
        env[pch.LOG_ENV] = str(header_log)
        env[pch.MAKE_ENV] = "1" if name in env.get(MAKERS_ENV, "").split(",") else "0"
        header_log.unlink(missing_ok=True)
    raw_dir = folder / "raw"
    shutil.rmtree(raw_dir, ignore_errors=True)
    try:
        # setup.py bdist_wheel, as pip's in-tree build runs it, without pip's separate metadata run
        # (a second start of setup.py: torch and every op builder imported again, 4 s a unit).
        cmd.run(
            [job.python, "setup.py", "bdist_wheel", "--dist-dir", raw_dir],
            env=env,
            cwd=src,
            log=log,
            verbose=job.verbose,
            progress=lambda line: f"{name}: {shown}" if (shown := build_progress(line)) else None,
            fix=f"read the log {log}",
            group=True,  # setup.py and its compilers die with the builder, kill -9 included
        )
        raw = single_wheel(raw_dir)
        artifacts.verify(raw, (unit.op,), job.version)
        foreign = artifacts.foreign_files(raw, job.sdist, so_prefixes(unit))
        if foreign:
            shown = ", ".join(foreign[:8]) + (f" and {len(foreign) - 8} more" if len(foreign) > 8 else "")
            return UnitResult(unit, "failed", None, time.monotonic() - start, log,
                              f"op {name}: its build left files that are not its op's nor DeepSpeed's own, refused "
                              f"(a compiler or a tool it ran wrote them; check the build root and its compilers): "
                              f"{shown}", foreign=True)  # fmt: skip
    except ToolError:
        killed = killed_lines(log)
        failure = describe_killed(unit, killed) if killed else describe_failure(unit, log)
        return UnitResult(unit, "failed", None, time.monotonic() - start, log, failure, killed=bool(killed))
    except BuilderError as exc:
        return UnitResult(unit, "failed", None, time.monotonic() - start, log, f"op {name}: {exc.message}")
    stats = ccache.stats(env)
    seconds = time.monotonic() - start
    if cmd.stopping():  # a unit whose compile ended as the run stopped is not sealed or stored
        return UnitResult(unit, "failed", None, seconds, log, f"op {name}: stopped (the run is stopping)")
    _, cached = cache.store(job.cache, unit, raw, seconds)
    # The unit is in the cache: its objects are not reused (ccache keeps what is), only the path is.
    sweeper.discard(raw_dir)
    sweeper.discard(folder / "src")
    headers = pch.summarize([header_log]).describe() if header_log else None
    uncached = "" if stats else f"; no compiler cache ({'--no-ccache' if not job.use_ccache else 'no ccache found'})"
    output.note(f"unit {name}: built in {seconds:.0f}s" + (f"; {stats.describe()}" if stats else uncached)
                + (f"; {headers}" if headers else ""))  # fmt: skip
    return UnitResult(unit, "built", cached, seconds, log, "", (stats.hits, stats.misses) if stats else None,
                      header_log=header_log)  # fmt: skip


PIN_MEMORY_SO = "deepspeed/ops/pin_memory/pin_memory_op."  # built beside async_io and gds (plan.WITH_PIN_MEMORY)


def so_prefixes(unit: Unit) -> list[str]:
    """Where the shared objects a unit's build makes may be: its op's, and pin_memory's beside those
    DeepSpeed builds it with."""
    return [unit.op.so_prefix, *([PIN_MEMORY_SO] if unit.op.name in WITH_PIN_MEMORY else [])]


def killed_lines(log: Path) -> list[str]:
    try:
        return diagnose.find_killed(log.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return []


def describe_killed(unit: Unit, lines: Sequence[str]) -> str:
    quoted = "\n".join(f"    {line}" for line in lines)
    return (f"op {unit.op.name}: the kernel killed its compiler (out of memory: the OOM killer or a memory limit), "
            f"not a fault of the op:\n{quoted}")  # fmt: skip


def describe_failure(unit: Unit, log: Path) -> str:
    """The unit's failure in the compiler's or the linker's words (the unit's log holds one op only)."""
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return f"op {unit.op.name} failed to build (no log at {log})"
    failures = diagnose.find_failures(text, (unit.op,))
    if failures:
        return "\n".join(CompileFailure(unit.op.name, f.files, f.errors).describe() for f in failures)
    linker = diagnose.find_link_errors(text)
    if linker:
        return f"op {unit.op.name} failed to link:\n" + "\n".join(f"    {line}" for line in linker)
    return f"op {unit.op.name} failed to build: read {log}"
