"""Running a list of configs side by side: one import of DeepSpeed forked per config (spawned where a
GPU is visible), each with its time limit, a config that timed out run again alone.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import sys
import time
from typing import Any

from builder.resources.config_check.jit import intercept
from builder.resources.config_check.outcome import TIMED_OUT
from builder.resources.config_check.rank import held_store, run_rank, world_size_of
from builder.resources.config_check.screen import refuse_early, unknown_keys


class Running:
    """The processes of one config, started; `finish` waits for them within the config's time limit."""

    def __init__(self, entry: dict[str, Any], context: Any, timeout: float) -> None:
        self.entry, self.timeout = entry, timeout
        self.start = time.monotonic()
        self.config = entry["config"]
        self.world = world_size_of(self.config)
        self.procs: list[Any] = []
        self.pipes: list[Any] = []
        self.scratch: list[str] = []
        self.store: Any = None
        self.config = entry["config"] = json.loads(json.dumps(self.config))  # its nvme paths are changed below
        self.invalid = unknown_keys(self.config)
        self.early = "" if self.invalid else refuse_early(entry, self.world, self.scratch)
        if self.early or self.invalid:
            return
        self.store = held_store(self.world)  # kept until the ranks are done
        port = self.store.port
        for rank in range(self.world):
            receive, send = context.Pipe(duplex=False)
            p = context.Process(target=run_rank, args=(self.config, rank, self.world, port, send), daemon=True)
            p.start()
            send.close()
            self.procs.append(p)
            self.pipes.append(receive)

    def finish(self) -> dict[str, Any]:
        try:
            return self._finish()
        finally:
            for folder in self.scratch:
                shutil.rmtree(folder, ignore_errors=True)

    def _finish(self) -> dict[str, Any]:
        base = {"name": self.entry["name"], "world_size": self.world, "ops": [], "jit": []}
        if self.invalid:
            return {**base, "status": "invalid", "detail": self.invalid, "seconds": 0.0}
        if self.early:
            return {**base, "status": "failed", "detail": self.early, "seconds": 0.0}
        results: list[dict[str, Any]] = []
        deadline = self.start + self.timeout
        for p, receive in ((self.procs[i], self.pipes[i]) for i in range(len(self.procs))):
            ready = receive.poll(max(0.05, deadline - time.monotonic()))
            p.join(max(0.05, deadline - time.monotonic()))
            if ready or (not p.is_alive() and receive.poll(0)):  # a report sent as the limit passed counts
                try:
                    results.append(receive.recv())
                except EOFError:  # the process died before it could report
                    pass
        timed_out = any(p.is_alive() for p in self.procs)
        for p in self.procs:
            if p.is_alive():
                p.kill()
                p.join()
        self.store = None
        seconds = round(time.monotonic() - self.start, 2)
        base["ops"] = sorted({op for r in results for op in r.get("ops", [])})
        base["jit"] = sorted({op for r in results for op in r.get("jit", [])})
        if len(results) < self.world:
            codes = [p.exitcode for p in self.procs]
            why = (
                f"{TIMED_OUT} {self.timeout:g} s (its time limit)"
                if timed_out
                else f"died before reporting (exit codes {codes}; a negative code is the signal)"
            )
            return {**base, "status": "failed", "seconds": seconds, "detail": f"the config {why}"}
        first = next((r for r in results if r["status"] != "passed"), results[0])
        return {**base, "status": first["status"], "detail": first["detail"], "seconds": seconds}


# What deepspeed.initialize imports on first use, imported once before the configs fork (a venv
# made by uv holds no bytecode, so each child would compile them again: 3 s of a 4 s config).
WARM = ("deepspeed.runtime.engine", "deepspeed.runtime.zero.stage_1_and_2", "deepspeed.runtime.zero.stage3",
        "deepspeed.runtime.zero.muon.muon_optimizer", "deepspeed.ops.adam", "deepspeed.ops.adagrad",
        "deepspeed.ops.lion", "deepspeed.ops.lamb", "torch._dynamo")  # fmt: skip


# How a config's processes start: "fork" (CPU: from this process, DeepSpeed imported once), "forkserver"
# (CUDA: from a server that imported torch and DeepSpeed without touching a GPU; each child sets up CUDA
# itself), "spawn" (a new Python per process, the fallback). Set, it overrides the accelerator's choice:
# the bench runs the CPU matrix spawned and from the server, to measure the GPU node's setting on CPU.
START_ENV = "DS_CONFIG_RUNNER_START"
STARTS = ("fork", "forkserver", "spawn")
# What the fork server imports before its first fork (a module it cannot import is left out, as
# multiprocessing does): every later child starts with them loaded. On an H200 node a spawned config
# spent most of its 9 s median importing these again; the GPU was 0-16% busy.
SERVER_PRELOAD = ("torch", "deepspeed", *WARM, "deepspeed.ops.op_builder.all_ops")
SHORT_PATH = 40  # characters of a temporary folder under which the server's socket path still fits
PROBE_SECONDS = 600.0  # the server's first start imports torch and DeepSpeed (tens of seconds on a cold node)


def _gpu_visible() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def prepare(accelerator: str) -> Any:
    """Import DeepSpeed once, intercept its builders, and choose how configs get their processes:
    forked from this one on CPU; spawned on CUDA (a forked child cannot use CUDA)."""
    import importlib

    os.environ.setdefault("DS_ACCELERATOR", accelerator)
    import deepspeed  # noqa: F401

    intercept()
    start = os.environ.get(START_ENV) or ("fork" if accelerator == "cpu" else "forkserver")
    if start not in STARTS:
        raise SystemExit(f"{START_ENV}={start[:40]!r} is not one of {', '.join(STARTS)}")
    if start == "spawn":
        return multiprocessing.get_context("spawn")
    if start == "forkserver":
        return server_context(accelerator)
    for name in WARM:
        try:
            importlib.import_module(name)
        except Exception:  # a module this DeepSpeed lacks or cannot import: the config will say
            pass
    try:  # py-cpuinfo asks a subprocess (1 s) every time DeepSpeedCPUAdam starts: ask once, here
        import functools

        from cpuinfo import cpuinfo

        cpuinfo.get_cpu_info_json = functools.lru_cache(maxsize=1)(cpuinfo.get_cpu_info_json)
        cpuinfo.get_cpu_info_json()
    except Exception:
        pass
    return multiprocessing.get_context("fork")


def server_context(accelerator: str) -> Any:
    """The fork server's context, proven before any config uses it: a first child forked from it must see
    a GPU it can compute on (where CUDA was set up in the server by an import, torch refuses CUDA in every
    forked child). Where it cannot be proven, configs are spawned, each in a new Python, and this says why."""
    import tempfile

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["__main__", *SERVER_PRELOAD])
    began = time.monotonic()
    # The server listens on a Unix socket in multiprocessing's temporary folder, made in TMPDIR at its
    # start: a run's TMPDIR deep in a work folder gave "AF_UNIX path too long" (108 bytes). That one
    # folder (removed at exit) goes to the system's short one; the configs' TMPDIR stays the run's.
    saved = tempfile.tempdir
    if len(tempfile.gettempdir()) > SHORT_PATH:
        tempfile.tempdir = next((d for d in ("/tmp", "/dev/shm") if os.access(d, os.W_OK | os.X_OK)), saved)
    try:
        probe = context.Process(target=probe_fork, args=(accelerator,), daemon=True)
        probe.start()
        probe.join(PROBE_SECONDS)
        code = probe.exitcode
        if code is None:
            probe.kill()
            probe.join()
    except Exception as exc:  # the server could not start: its imports failed in a way multiprocessing does not skip
        code, why = -1, f"{type(exc).__name__}: {exc}"
    else:
        why = f"exit code {code}" if code is not None else f"no answer in {PROBE_SECONDS:g} s"
    finally:
        tempfile.tempdir = saved
    if code == 0:
        print(f"config runner: a fork server imported torch and DeepSpeed in {time.monotonic() - began:.1f} s; "
              "each config's processes are forked from it", file=sys.stderr, flush=True)  # fmt: skip
        return context
    print(f"config runner: a child of the fork server could not use {accelerator} ({why}; its traceback is above); "
          "each config's processes are spawned instead (a new Python each: slower, the same results)",
          file=sys.stderr, flush=True)  # fmt: skip
    return multiprocessing.get_context("spawn")


def probe_fork(accelerator: str) -> None:
    """In the fork server's first child: the accelerator works here (exit 0), or the exception says why."""
    import torch

    if accelerator == "cuda":
        if torch.cuda._is_in_bad_fork():
            raise SystemExit("CUDA was set up in the fork server before it forked: a forked child cannot use it")
        if float(torch.ones(1, device="cuda").add(1).item()) != 2.0:
            raise SystemExit("a forked child computed 1 + 1 wrong on the GPU")


def run(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Every config's result, in order; `jobs` configs run at once (each is a few tenths of a second
    of one core's work, most of it waiting on its process group)."""
    accelerator = spec.get("accelerator")
    if not accelerator:  # a node's installed DeepSpeed: the accelerator it detects
        from deepspeed.accelerator import get_accelerator

        accelerator = get_accelerator()._name
    if accelerator == "cuda" and not _gpu_visible():
        return [{"name": e["name"], "status": "no-gpu", "ops": [], "jit": [], "world_size": 0, "seconds": 0.0,
                 "detail": "no GPU visible: DeepSpeed's CUDA accelerator runs configs on GPUs; run this on a GPU node"}
                for e in spec["configs"]]  # fmt: skip
    context = prepare(accelerator)
    timeout = float(spec.get("timeout", 180))
    jobs = max(1, int(spec.get("jobs", 1)))
    results: list[dict[str, Any] | None] = [None] * len(spec["configs"])
    running: list[tuple[int, Running]] = []
    pending = list(enumerate(spec["configs"]))

    def finish_oldest() -> None:
        i, r = running.pop(0)
        done = results[i] = r.finish()
        print(f"config {r.entry['name']}: {done['status']} ({done['seconds']} s)", file=sys.stderr, flush=True)

    for i, entry in pending:
        if "error" in entry:  # a config the caller could not read: reported in its place
            results[i] = {"name": entry["name"], "status": "failed", "detail": entry["error"], "ops": [], "jit": [],
                          "world_size": 0, "seconds": 0.0}  # fmt: skip
            continue
        while len(running) >= jobs:
            finish_oldest()
        running.append((i, Running(entry, context, timeout)))
    while running:
        finish_oldest()
    for i, entry in enumerate(spec["configs"]):
        if jobs > 1 and _timed_out(results[i]):
            results[i] = again_alone(entry, context, timeout, results[i])  # type: ignore[arg-type]
    return [r for r in results if r is not None]


def _timed_out(result: dict[str, Any] | None) -> bool:
    return bool(result) and result["status"] == "failed" and TIMED_OUT in result["detail"]  # type: ignore[index]


def again_alone(entry: dict[str, Any], context: Any, timeout: float, first: dict[str, Any]) -> dict[str, Any]:
    """A config that hit its time limit while others ran beside it, run once more with nothing beside
    it. Seen once in CI: a Muon config (torch.compile) stopped inside inductor, holding its cache lock,
    with three others waiting on that lock until the limit; the same config takes 7 s. A config that
    hangs alone too is a failure; either way the result says it ran twice."""
    print(f"config {entry['name']}: {first['detail']} beside other configs; running it again alone",
          file=sys.stderr, flush=True)  # fmt: skip
    done = Running(entry, context, timeout).finish()
    print(f"config {entry['name']}, alone: {done['status']} ({done['seconds']} s)", file=sys.stderr, flush=True)
    said = f"{first['detail']} beside other configs, "
    if done["status"] == "failed":
        return {**done, "detail": said + f"and again alone: {done['detail']}"}
    return {**done, "detail": f"{done['detail']} (run again alone: the first run {said.rstrip(', ')})"}


def default_jobs(accelerator: str | None = None) -> int:
    """Configs run at once: two per core (each is mostly waiting on its process group), 2 to 8; on GPUs
    up to 16 (their configs wait on the GPU and its libraries, which sat 0-16% busy with 8 on an H200)."""
    most = 16 if accelerator == "cuda" else 8
    return max(2, min(most, 2 * (os.cpu_count() or 1)))
