"""Op units: keys, scheduling and assembly (pure or on FAKE unit wheels); tests/test_pipeline.py and
tests/test_units_build.py build real units."""

from __future__ import annotations

import dataclasses
import os
import signal
import time
import zipfile
from pathlib import Path

import pytest
from fakes import write_wheel

from builder.errors import BuildError
from builder.recipe import load_recipe
from builder.units.assemble import assemble, merge_installed
from builder.units.plan import plan_units, schedule_units
from builder.wheelbuild.artifacts import INSTALLED_INFO, parse_installed_info
from builder.wheelbuild.diagnose import find_link_errors
from builder.wheelbuild.ops import OpInfo, ProbeReport, TorchInfo
from builder.wheelbuild.plan import plan_build

ROOT = Path(__file__).resolve().parents[1]
MODULES = {
    "cpu_adam": "adam",
    "cpu_adagrad": "adagrad",
    "cpu_lion": "lion",
    "async_io": "aio",
    "pin_memory": "pin_memory",
}
OPS = {
    name: OpInfo(
        name, f"DS_BUILD_{name.upper()}", f"deepspeed.ops.{mod}.{name}_op", True, sources=(f"csrc/{name}.cpp",)
    )
    for name, mod in MODULES.items()
}
PROBE = ProbeReport("cpu", TorchInfo("2.13.0+cpu", None, True), "cp311", OPS)


def plan_for(*ops: str):  # type: ignore[no-untyped-def]
    recipe = dataclasses.replace(load_recipe(ROOT / "recipes" / "cpu.toml"), ops=ops)
    return plan_build(recipe, PROBE)


def test_a_units_key_is_its_ops_alone() -> None:
    """Adding an op to a recipe, renaming it, reordering its ops, or giving it configs and known failures
    (they fill the wheel's manifest and its smoke, not an op's .so) leaves every other unit's key as it was."""
    inputs = {"deepspeed": "0.19.8", "recipe": {"name": "cpu"}, "ops": ["cpu_adam", "cpu_lion"], "python": "3.11"}
    two, _ = plan_units(plan_for("cpu_adam", "cpu_lion"), inputs, 2, None)
    renamed = {
        **inputs,
        "recipe": {"name": "x"},
        "ops": ["cpu_lion", "cpu_adam", "cpu_adagrad"],
        "configs": {"configs/lbfgs.json": {"optimizer": {"type": "LBFGS"}}},
        "known_failures": {"configs/lbfgs.json": {"reason": "DeepSpeed steps LBFGS without its closure"}},
    }
    three, _ = plan_units(plan_for("cpu_lion", "cpu_adam", "cpu_adagrad"), renamed, 2, None)
    keys = {u.op.name: u.key for u in three}
    assert {u.op.name: u.key for u in two} == {k: keys[k] for k in ("cpu_adam", "cpu_lion")}
    assert len(set(keys.values())) == 3
    other_torch, _ = plan_units(plan_for("cpu_adam", "cpu_lion"), {**inputs, "python": "3.12"}, 2, None)
    assert {u.key for u in other_torch}.isdisjoint(keys.values())


def test_a_unit_builds_its_op_alone() -> None:
    units, _ = plan_units(plan_for("cpu_adam", "cpu_lion"), {}, 2, None)
    env = units[0].env
    assert env["DS_BUILD_OPS"] == "0" and env["DS_BUILD_CPU_ADAM"] == "1" and "DS_BUILD_CPU_LION" not in env
    assert "DS_BUILDER_PARALLEL" not in env and env["DS_BUILD_STRING"] == "+cpu.torch2.13"


@pytest.mark.parametrize(
    ("units", "cores", "mem", "expected"),
    [
        (3, 2, None, (3, 2)),  # one unit more than cores: a core compiles through another's start-up
        (3, 2, 24.0, (3, 2)),
        (1, 16, None, (1, 16)),  # a lone unit takes every core
        (20, 16, None, (17, 2)),
        (4, 16, 16.0, (4, 2)),  # memory for 8 jobs: 4 units of 2
        (3, 8, 1.0, (1, 1)),  # memory for none: one job at a time
    ],
)
def test_units_share_cores_and_memory(units: int, cores: int, mem: float | None, expected: tuple[int, int]) -> None:
    assert schedule_units(units, cores, mem, 2.0) == expected


INFO = (
    "version='0.19.8+cpu.torch2.13'\ngit_hash='unknown'\ngit_branch='unknown'\n"
    "installed_ops={installed}\naccelerator_name='cpu'\n"
    "torch_info={{'version': '2.13', 'bf16_support': False, 'cuda_version': '0.0', 'nccl_version': '0.0', "
    "'hip_version': '0.0'}}\n"
)


def installed(**on: object) -> str:
    ops = {name: on.get(name, False) for name in ("async_io", "cpu_adam", "cpu_lion", "pin_memory")}
    return INFO.format(installed=ops)


def unit_wheel(folder: Path, op: str, *extra_so: str, info: str | None = None, py: bytes = b"x = 1\n") -> Path:
    """A FAKE unit wheel: DeepSpeed's files as one setup.py run with `op` alone leaves them."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "deepspeed/__init__.py": py,
        INSTALLED_INFO: (info or installed(**{op: 1})).encode(),
        "deepspeed-0.19.8+cpu.torch2.13.dist-info/METADATA": b"Name: deepspeed\nVersion: 0.19.8+cpu.torch2.13\n",
        **{f"deepspeed/ops/{MODULES[o]}/{o}_op.cpython-311-x86_64-linux-gnu.so": f"ELF {o}".encode()
           for o in (op, *extra_so)},
    }  # fmt: skip
    return write_wheel(folder / "deepspeed-0.19.8+cpu.torch2.13-cp311-cp311-linux_x86_64.whl", files)


def test_units_assemble_into_one_tree(tmp_path: Path) -> None:
    adam = unit_wheel(tmp_path / "a", "cpu_adam")
    aio = unit_wheel(tmp_path / "b", "async_io", "pin_memory", info=installed(async_io=1, pin_memory=1))
    tree = assemble([(OPS["async_io"], aio), (OPS["cpu_adam"], adam)], tmp_path / "out")
    assert tree.name == "deepspeed-0.19.8+cpu.torch2.13"
    sos = sorted(str(p.relative_to(tree)) for p in tree.rglob("*.so"))
    assert [s.split("/")[2] for s in sos] == ["adam", "aio", "pin_memory"]
    info = parse_installed_info((tree / INSTALLED_INFO).read_text())
    assert info["installed_ops"] == {"async_io": 1, "cpu_adam": 1, "cpu_lion": False, "pin_memory": 1}
    assert info["version"] == "0.19.8+cpu.torch2.13" and info["accelerator_name"] == "cpu"
    assert (tree / "deepspeed" / "__init__.py").read_bytes() == b"x = 1\n"
    assert not list(tree.rglob("RECORD"))  # wheel pack writes it anew


def test_units_that_differ_beyond_their_ops_are_refused(tmp_path: Path) -> None:
    adam = unit_wheel(tmp_path / "a", "cpu_adam")
    lion = unit_wheel(tmp_path / "b", "cpu_lion", py=b"x = 2\n")
    with pytest.raises(BuildError, match=r"differ in 1 files besides their shared objects \(deepspeed/__init__.py\)"):
        assemble([(OPS["cpu_adam"], adam), (OPS["cpu_lion"], lion)], tmp_path / "out")
    other_torch = installed(cpu_lion=1).replace("'version': '2.13'", "'version': '2.14'")
    with pytest.raises(BuildError, match="op units disagree on torch_info"):
        merge_installed([installed(cpu_adam=1), other_torch])


def test_a_unit_wheel_keeps_its_file_modes(tmp_path: Path) -> None:
    wheel = unit_wheel(tmp_path / "a", "cpu_adam")
    with zipfile.ZipFile(wheel, "a") as zf:
        info = zipfile.ZipInfo("deepspeed/bin/tool")
        info.external_attr = 0o755 << 16
        zf.writestr(info, b"#!/bin/sh\n")
    tree = assemble([(OPS["cpu_adam"], wheel)], tmp_path / "out")
    assert (tree / "deepspeed" / "bin" / "tool").stat().st_mode & 0o777 == 0o755


def test_a_link_failure_is_quoted() -> None:
    log = (
        "g++ -shared build/temp/transformer.o -lcurand -o transformer_op.so\n"
        "/usr/bin/ld: cannot find -lcurand: No such file or directory\n"
        "collect2: error: ld returned 1 exit status\n"
        "error: command '/usr/bin/g++' failed with exit code 1\n"
    )
    assert find_link_errors(log) == ["/usr/bin/ld: cannot find -lcurand: No such file or directory",
                                     "collect2: error: ld returned 1 exit status"]  # fmt: skip


# ---------------------------------------------------------------- the unit cache, read back as hostile


def cached_unit(tmp_path: Path):  # type: ignore[no-untyped-def]
    from builder.units import cache

    (unit,), _ = plan_units(plan_for("cpu_adam"), {}, 2, None)
    wheel = unit_wheel(tmp_path / "built", "cpu_adam")
    cache.store(tmp_path / "units", unit, wheel, 12.3)
    return cache, unit


def test_a_stored_unit_is_found_again(tmp_path: Path) -> None:
    cache, unit = cached_unit(tmp_path)
    found = cache.lookup(tmp_path / "units", unit)
    assert found is not None and found[0].op == "cpu_adam" and found[0].seconds == 12.3
    assert sorted(p.name for p in (tmp_path / "units").iterdir()) == [unit.key]  # no temporary folder left


@pytest.mark.parametrize(
    "damage",
    ["record is not JSON", "record names a path", "record for another op", "wheel changed", "wheel gone",
     "record schema", "sha256 not hex"],
)  # fmt: skip
def test_a_damaged_or_tampered_unit_is_never_reused(tmp_path: Path, damage: str) -> None:
    """Hostile input: the unit cache may be a shared folder others write; what fails its record or its
    sha256 is built again, never assembled into a wheel."""
    import json

    cache, unit = cached_unit(tmp_path)
    folder = tmp_path / "units" / unit.key
    record = json.loads((folder / "unit.json").read_text())
    wheel = folder / record["wheel"]
    if damage == "record is not JSON":
        (folder / "unit.json").write_text("{oops")
    elif damage == "record names a path":
        record["wheel"] = "../../evil-1.0-py3-none-any.whl"
    elif damage == "record for another op":
        record["op"] = "cpu_lion"
    elif damage == "wheel changed":
        wheel.write_bytes(wheel.read_bytes() + b"x")
    elif damage == "wheel gone":
        wheel.unlink()
    elif damage == "record schema":
        record["schema"] = 99
    elif damage == "sha256 not hex":
        record["sha256"] = "z" * 64
    if damage in ("record names a path", "record for another op", "record schema", "sha256 not hex"):
        (folder / "unit.json").write_text(json.dumps(record))
    assert cache.lookup(tmp_path / "units", unit) is None
    rebuilt = unit_wheel(tmp_path / "again", "cpu_adam")
    cache.store(tmp_path / "units", unit, rebuilt, 1.0)  # the damaged entry is replaced whole
    assert cache.lookup(tmp_path / "units", unit) is not None


def test_a_unit_cache_that_cannot_be_written_is_one_message(tmp_path: Path) -> None:
    """A full disk is simulated with a FAKE OSError (ENOSPC) from the copy into the cache: one
    message naming the unit, the folder and the fix; no temporary folder left behind."""
    import errno
    from unittest import mock

    from builder.errors import FolderError
    from builder.units import cache

    (unit,), _ = plan_units(plan_for("cpu_adam"), {}, 2, None)
    wheel = unit_wheel(tmp_path / "built", "cpu_adam")
    full = OSError(errno.ENOSPC, "No space left on device")
    with mock.patch("builder.units.cache.shutil.copyfile", side_effect=full), pytest.raises(FolderError) as err:
        cache.store(tmp_path / "units", unit, wheel, 1.0)
    assert "cannot store op unit cpu_adam in the unit cache" in err.value.message
    assert "No space left on device" in err.value.message and "DS_BUILDER_UNIT_CACHE" in err.value.fix
    assert list((tmp_path / "units").iterdir()) == []


def test_a_compiler_the_kernel_killed_is_memory_not_the_op() -> None:
    """Issue 30: three builds at once drove this machine into the OOM killer; the unit log held gcc's
    "Killed signal" line and the toolkit said the op failed to compile and advised dropping it. The
    lines are found as they are printed (gcc, an ICE, nvcc's cicc)."""
    from builder.wheelbuild.diagnose import find_failures, find_killed

    log = (
        "[3/4] c++ -MMD -MF cpu_adam_impl.o.d -O3 -c /tmp/u/src/csrc/adam/cpu_adam_impl.cpp -o cpu_adam_impl.o\n"
        "FAILED: [code=1] /tmp/u/src/build/temp.linux-x86_64-cpython-311/csrc/adam/cpu_adam_impl.o\n"
        "c++: fatal error: Killed signal terminated program cc1plus\n"
        "compilation terminated.\n"
        "g++: internal compiler error: Killed (program cc1plus)\n"
        "nvcc error   : 'cicc' died due to signal 9 (Kill signal)\n"
        "ninja: build stopped: subcommand failed.\n"
    )
    assert find_killed(log) == [
        "c++: fatal error: Killed signal terminated program cc1plus",
        "g++: internal compiler error: Killed (program cc1plus)",
        "nvcc error   : 'cicc' died due to signal 9 (Kill signal)",
    ]
    assert find_killed("csrc/x.cpp:3:1: error: 'foo' was not declared in this scope\n") == []
    (failure,) = find_failures(log, (OPS["cpu_adam"],))  # what was said before: no compiler line
    assert failure.errors == ()


def test_a_killed_unit_stops_the_build_with_the_memory_fix_even_where_ops_may_be_dropped(tmp_path: Path) -> None:
    from builder.build import refuse_failed
    from builder.errors import BuildError
    from builder.units.runner import UnitResult

    (adam, lion), _ = plan_units(plan_for("cpu_adam", "cpu_lion"), {}, 2, None)
    built = UnitResult(adam, "built", tmp_path / "a.whl", 1.0, tmp_path / "a.log")
    killed = UnitResult(lion, "failed", None, 1.0, tmp_path / "l.log", "op cpu_lion: the kernel killed its compiler",
                        killed=True)  # fmt: skip
    for policy in ("fail", "drop"):
        with pytest.raises(BuildError) as err:
            refuse_failed([built, killed], policy)
        assert "the kernel killed its compiler" in err.value.message
        assert err.value.fix.startswith("free memory for the build") and "drop" not in err.value.fix
    broken = UnitResult(lion, "failed", None, 1.0, tmp_path / "l.log", "op cpu_lion failed to compile")
    assert refuse_failed([built, broken], "drop") == [broken]
    with pytest.raises(BuildError, match="drop cpu_lion from the recipe"):
        refuse_failed([built, broken], "fail")


def test_memory_is_the_least_of_the_machine_its_cgroup_and_its_slurm_job(tmp_path: Path) -> None:
    """Issue 30: a build on a shared login node or in a Slurm job must size itself by its own room.
    On a FAKE /proc and /sys tree: cgroup v1 (this machine's layout) and v2, "no limit" values, Slurm."""
    from builder.detect import available_memory_gb, total_memory_gb
    from builder.detect.parsers import cgroup_memory_files, slurm_memory_gb

    gib = 1024**3
    (tmp_path / "proc" / "self").mkdir(parents=True)
    (tmp_path / "proc" / "meminfo").write_text("MemTotal: 25165824 kB\nMemAvailable: 16777216 kB\n")  # 16 GB
    (tmp_path / "proc" / "self" / "cgroup").write_text("4:memory:/process_api/abc\n0::/\n")
    v1 = tmp_path / "sys" / "fs" / "cgroup" / "memory" / "process_api" / "abc"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text(f"{9223372036854771712}\n")  # no limit
    (v1 / "memory.usage_in_bytes").write_text(f"{3 * gib}\n")
    assert available_memory_gb({}, tmp_path) == 16.0
    (v1 / "memory.limit_in_bytes").write_text(f"{10 * gib}\n")  # a 10 GB limit, 3 GB used: 7 GB of room
    assert available_memory_gb({}, tmp_path) == 7.0
    assert available_memory_gb({"SLURM_MEM_PER_NODE": "4096"}, tmp_path) == 4.0
    assert total_memory_gb(tmp_path) == 10.0  # what the machine's pool shares out: the limit, not MemTotal
    (tmp_path / "proc" / "self" / "cgroup").write_text("0::/slurm/job_42/step_0\n")
    v2 = tmp_path / "sys" / "fs" / "cgroup" / "slurm" / "job_42" / "step_0"
    v2.mkdir(parents=True)
    (v2 / "memory.max").write_text(f"{6 * gib}\n")
    (v2 / "memory.current").write_text(f"{gib}\n")
    assert available_memory_gb({}, tmp_path) == 5.0
    (v2 / "memory.max").write_text("max\n")
    assert available_memory_gb({}, tmp_path) == 16.0 and total_memory_gb(tmp_path) == 24.0
    assert available_memory_gb({}, tmp_path / "nothing") is None and total_memory_gb(tmp_path / "nothing") is None
    assert slurm_memory_gb({"SLURM_MEM_PER_CPU": "2048", "SLURM_CPUS_ON_NODE": "4"}) == 8.0
    assert slurm_memory_gb({"SLURM_MEM_PER_NODE": "0"}) is None
    assert cgroup_memory_files("12:cpu,cpuacct:/x\n") == []


def test_a_unit_asks_for_memory_again_before_it_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three builds started minutes apart drove this 24 GB machine into the OOM killer: each had
    sized itself from the free memory at its start. A unit now looks again: it waits while units of
    its build compile, and with none to wait for starts with the jobs the free memory holds."""
    from builder.units import runner

    (unit,), _ = plan_units(plan_for("cpu_adam"), {}, 8, None)
    unit = dataclasses.replace(unit, env={**unit.env, "MAX_JOBS": "4"})
    slept: list[float] = []
    assert runner.room_for(unit, 2.0, lambda: 9.0, slept.append) == (unit, None)  # 8 GB needed, 9 free
    assert runner.room_for(unit, 2.0, lambda: None, slept.append)[0] is unit  # nothing known: as planned
    fewer, _ = runner.room_for(unit, 2.0, lambda: 5.0, slept.append)  # nothing of ours compiling
    assert fewer.env["MAX_JOBS"] == "2" and fewer.key == unit.key and slept == []
    assert runner.room_for(unit, 2.0, lambda: 0.5, slept.append)[0].env["MAX_JOBS"] == "1"
    frees = iter([3.0, 3.0, 12.0])
    monkeypatch.setattr(runner, "_COMPILING", [1])  # another unit of this build is compiling
    assert runner.room_for(unit, 2.0, lambda: next(frees), slept.append)[0] is unit
    assert slept == [runner.MEMORY_POLL_S, runner.MEMORY_POLL_S]


def _no_wait(seconds: float) -> None:
    raise AssertionError("waited for memory that was there")


class _Holder:
    """Another builder (a process of its own, forked) holding `n` tokens of the pool until killed."""

    def __init__(self, folder: Path, size: int, n: int) -> None:
        from builder.units.memory import Pool

        read, write = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the child: take the tokens, say so, wait to be killed
            claim = Pool(folder, size).take(n, n)
            os.write(write, str(len(claim or [])).encode())
            time.sleep(600)
            os._exit(0)
        os.close(write)
        assert os.read(read, 16) == str(n).encode()
        os.close(read)

    def kill(self) -> None:
        if self.pid:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            self.pid = 0


def test_builders_on_one_machine_share_its_memory_for_compile_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test run's builders and its Slurm nodes' tasks each saw the free memory before their
    compilers took it, and together ran 18 compilers on this 24 GB machine; in CI it stalled for
    minutes. A unit now takes tokens of one pool per machine (1 GB each, lock files) for its jobs:
    what another builder holds is not free, a builder killed frees its tokens with it, and a unit
    with nothing of its own build compiling starts with the jobs the pool gives."""
    from builder.units import memory, runner

    (unit,), _ = plan_units(plan_for("cpu_adam"), {}, 8, None)
    unit = dataclasses.replace(unit, env={**unit.env, "MAX_JOBS": "2"})  # 2 jobs of 2 GB: 4 tokens
    pool = memory.Pool(tmp_path, 6)
    other = _Holder(tmp_path, 6, 5)  # another builder holds 5 of the 6
    slept: list[float] = []

    def killed(seconds: float) -> None:  # the other builder dies (OOM, kill -9) while this one waits
        assert not slept, "waited again after the other builder died"
        slept.append(seconds)
        other.kill()

    try:
        monkeypatch.setattr(runner, "_COMPILING", [1])  # a unit of this build compiles: wait for all 4
        got, claim = runner.room_for(unit, 2.0, lambda: 20.0, killed, pool)
        assert got is unit and claim is not None and len(claim) == 4 and slept == [runner.MEMORY_POLL_S]
        assert pool.take(6, 3) is None  # held: 2 of 6 left
        left = pool.take(2, 2)
        assert left is not None and len(left) == 2
        left.release()
        claim.release()
    finally:
        other.kill()
    other = _Holder(tmp_path, 6, 4)
    try:
        monkeypatch.setattr(runner, "_COMPILING", [0])  # nothing of ours to wait for: the jobs there are
        fewer, claim = runner.room_for(unit, 2.0, lambda: 20.0, _no_wait, pool)
        assert fewer.env["MAX_JOBS"] == "1" and claim is not None and len(claim) == 2
        claim.release()
    finally:
        other.kill()
    assert memory.tokens(2.0) == 2 and memory.tokens(6.0) == 6 and memory.tokens(0.5) == 1


def test_the_memory_pool_is_a_private_folder_of_this_user_or_none(tmp_path: Path) -> None:
    """Another user's folder, or a link, is never used (its owner could hold every token): each
    build then sizes itself from the free memory alone. Its size is a share of the machine's memory."""
    from builder.units import memory

    made = memory.machine_pool(tmp_path / "pool", total_gb=24.0)
    assert made is not None and made.size == 18 and (tmp_path / "pool").stat().st_mode & 0o777 == 0o700
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    assert memory.machine_pool(tmp_path / "link", total_gb=24.0) is None
    (tmp_path / "open").mkdir(mode=0o777)
    (tmp_path / "open").chmod(0o777)
    assert memory.machine_pool(tmp_path / "open", total_gb=24.0) is None
    assert memory.machine_pool(tmp_path / "pool", total_gb=None) is not None  # this machine's own memory
    assert memory.pool_folder({memory.POOL_ENV: str(tmp_path / "x")}) == tmp_path / "x"
    assert memory.pool_folder({}).name == f"ds-builder-memory-{os.getuid()}"


def test_units_that_make_no_header_start_first_and_results_keep_the_plans_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Precompiled torch headers (issue 39): ops that share a flag set with 3+ sources make one; the
    others start first so that their compiles fill the cores while the header is made."""
    from builder.units import cache, runner
    from builder.units.plan import Unit

    def op(name: str, sources: int, args: tuple[str, ...]) -> OpInfo:
        return OpInfo(name, f"DS_BUILD_{name.upper()}", f"deepspeed.ops.x.{name}_op", True,
                      sources=tuple(f"csrc/{name}{i}.cpp" for i in range(sources)), cxx_args=args)  # fmt: skip

    ops = [op("cpu_adam", 2, ("-O3",)), op("cpu_lion", 2, ("-O3",)), op("shm", 2, ("-O2",)), op("one", 1, ("-g",))]
    units = [Unit(o, o.name, {"MAX_JOBS": "1"}, {}) for o in ops]
    job = runner.UnitJob(tmp_path / "s.tar.gz", tmp_path / "python", {}, tmp_path / "units", tmp_path / "cache",
                         tmp_path / "logs", "0.19.8", False, tmp_path / "ccache", pch=True)  # fmt: skip
    started: list[str] = []
    seen_env: dict[str, str] = {}

    def fake_run(unit: Unit, job: runner.UnitJob, sweeper: object) -> runner.UnitResult:
        started.append(unit.op.name)
        seen_env.update(job.env)
        return runner.UnitResult(unit, "built", None, 1.0, tmp_path / f"{unit.op.name}.log")

    monkeypatch.setattr(cache, "lookup", lambda c, u: None)
    monkeypatch.setattr(runner, "run_unit", fake_run)
    results = runner.run_units(units, 1, job)
    assert [r.unit.op.name for r in results] == ["cpu_adam", "cpu_lion", "shm", "one"]
    assert started == ["shm", "one", "cpu_adam", "cpu_lion"]
    assert seen_env[runner.MAKERS_ENV] == "cpu_adam,cpu_lion"


def test_only_sources_that_would_take_the_header_count_toward_making_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pin_memory's three sources, one of which has code before torch/extension.h: two would use a
    header, fewer than it costs, so none is made for it (the bench made one, 37 s, for 2 uses)."""
    from builder.units import cache, runner
    from builder.units.plan import Unit

    src = tmp_path / "src"
    (src / "csrc" / "pin").mkdir(parents=True)
    (src / "csrc" / "pin" / "a.cpp").write_text("#include <torch/extension.h>\n")
    (src / "csrc" / "pin" / "b.cpp").write_text("#include <torch/extension.h>\n")
    (src / "csrc" / "pin" / "c.cpp").write_text("#include <sys/mman.h>\nint page_alloc();\n")
    pin = OpInfo("pin_memory", "DS_BUILD_PIN_MEMORY", "deepspeed.ops.pin_memory.pin_memory_op", True,
                 sources=("csrc/pin/a.cpp", "csrc/pin/b.cpp", "csrc/pin/c.cpp"))  # fmt: skip
    job = runner.UnitJob(tmp_path / "s.tar.gz", tmp_path / "python", {}, tmp_path / "units", tmp_path / "cache",
                         tmp_path / "logs", "0.19.8", False, tmp_path / "ccache", pch=True, src=src)  # fmt: skip
    monkeypatch.setattr(cache, "lookup", lambda c, u: None)
    assert runner.header_env([Unit(pin, "k", {}, {})], job)[runner.MAKERS_ENV] == ""
    without_src = dataclasses.replace(job, src=None)  # not known: every C++ source counts
    assert runner.header_env([Unit(pin, "k", {}, {})], without_src)[runner.MAKERS_ENV] == "pin_memory"


def test_a_finished_units_folders_are_deleted_beside_the_build_not_in_its_way(tmp_path: Path) -> None:
    """The unit's source tree is renamed aside at once and deleted by a thread the `with` waits for;
    a tree a killed builder left aside is deleted by the next one; nothing else there is touched."""
    from builder.files import Sweeper

    unit = tmp_path / "cpu_adam"
    (unit / "src" / "deep" / "er").mkdir(parents=True)
    for i in range(200):
        (unit / "src" / "deep" / "er" / f"f{i}.py").write_text("x")
    (unit / ".gone-leftover" / "a").mkdir(parents=True)
    (unit / "pch.log").write_text("kept")
    with Sweeper() as sweeper:
        sweeper.sweep_leftovers(unit)
        sweeper.discard(unit / "src")
        assert not (unit / "src").exists()  # out of the way before the deletion ends
        sweeper.discard(unit / "raw")  # nothing there: nothing to do
    assert sorted(p.name for p in unit.iterdir()) == ["pch.log"]


def test_a_sources_includes_are_followed_through_its_ops_own_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """async_io's sources include deepspeed_aio_types.h from csrc/aio/common (an -I folder of its
    builder), which has `using namespace std;` before torch/extension.h: followed through that folder
    they take no header, so none is made for them (the full-op bench made two, 181 s and 80 s, for 4
    of 15 compiles). Not followed, the walk skipped the include and counted them."""
    from builder.units import cache, runner
    from builder.units.plan import Unit

    src = tmp_path / "src"
    (src / "csrc" / "aio" / "common").mkdir(parents=True)
    (src / "csrc" / "aio" / "py_lib").mkdir(parents=True)
    (src / "csrc" / "aio" / "common" / "deepspeed_aio_types.h").write_text(
        "#include <libaio.h>\nusing namespace std;\n#include <torch/extension.h>\n"
    )
    names = ("a", "b", "c", "d")
    for name in names:
        (src / "csrc" / "aio" / "py_lib" / f"{name}.cpp").write_text(
            '#include "deepspeed_aio_types.h"\n#include <torch/extension.h>\n'
        )
    sources = tuple(f"csrc/aio/py_lib/{n}.cpp" for n in names)
    aio = OpInfo("async_io", "DS_BUILD_AIO", "deepspeed.ops.aio.async_io_op", True, sources=sources,
                 include_paths=("csrc/aio/py_lib", "csrc/aio/common", "/usr/local/cuda/include"))  # fmt: skip
    job = runner.UnitJob(tmp_path / "s.tar.gz", tmp_path / "python", {}, tmp_path / "units", tmp_path / "cache",
                         tmp_path / "logs", "0.19.8", False, tmp_path / "ccache", pch=True, src=src)  # fmt: skip
    monkeypatch.setattr(cache, "lookup", lambda c, u: None)
    assert runner.header_env([Unit(aio, "k", {}, {})], job)[runner.MAKERS_ENV] == ""
    unfollowed = dataclasses.replace(aio, include_paths=())  # as before: the include skipped, torch reached
    assert runner.header_env([Unit(unfollowed, "k", {}, {})], job)[runner.MAKERS_ENV] == "async_io"
