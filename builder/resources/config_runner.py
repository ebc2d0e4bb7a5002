"""Run DeepSpeed configs the way a user does, and record every op DeepSpeed asks its builders for.

Run as a script by an environment's Python (standard library, torch and DeepSpeed only), on a
build host against a wheel's fresh environment or on a node against what is installed:
    python config_runner.py '{"configs": [{"name": ..., "config": {...}}], "accelerator": "cpu"}'
Each config runs in processes of its own (forked after one import of DeepSpeed, so a matrix of
dozens costs seconds, and a config that hangs or aborts is that config's failure only), with an
empty TORCH_EXTENSIONS_DIR: `deepspeed.initialize` on a small model and a few steps. Every
builder's load() is recorded, and a JIT compile is refused and recorded instead of run (the
builder's jit_load and torch's cpp_extension.load/load_inline), so nothing compiles silently.
Results (one per config, in order) are printed as JSON after the MARKER line:
  passed       ran its steps, loss finite; `ops` are the ops it loaded, all from the installed wheel
  needs-op     DeepSpeed asked for an op the wheel lacks (`jit`): the config cannot run without a compiler
  unsupported  DeepSpeed itself refused the config on this accelerator (its error in `detail`)
  needs-compiler  torch.compile compiles at first use (Muon on CPU): no wheel can carry that
  invalid      DeepSpeed rejected the config's contents (its validation error in `detail`)
  no-gpu       a CUDA config where no GPU is visible (nothing ran)
  failed       anything else: a crash, a time limit, a loss that is not finite
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import socket
import sys
import tempfile
import time
import traceback
from typing import Any

MARKER = "==== config runner json ===="
STEPS = 3
NOT_IMPLEMENTED = (
    "not been implemented"  # DeepSpeed's NotImplementedBuilder: "This op had not been implemented on CPU backend."
)

_loaded: list[str] = []
_jit: list[str] = []
_refused: list[str] = []
_intercepted: list[bool] = []


class JitRefused(RuntimeError):
    """Raised where DeepSpeed would have compiled an op at first use."""


_stack: list[str] = []  # the builders whose load() is running (async_io's load loads pin_memory first)


def _record_load(load: Any) -> Any:
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        _stack.append(self.name)
        try:
            module = load(self, *args, **kwargs)
        except JitRefused:
            raise
        except Exception as exc:
            if NOT_IMPLEMENTED in str(exc):
                _refused.append(f"{self.name}: {exc}")
            raise
        finally:
            _stack.pop()
        if self.name not in _loaded:
            _loaded.append(self.name)
        return module

    wrapper.__wrapped__ = load  # type: ignore[attr-defined]
    return wrapper


def _installed(name: str) -> bool:
    try:
        from deepspeed.git_version_info import installed_ops
    except ImportError:
        return False
    return bool(installed_ops.get(name))


def _refuse_jit(self: Any, *args: Any, **kwargs: Any) -> Any:
    """Refuse the compile; the op needed is this one and every builder around it that the wheel
    lacks too (async_io loads pin_memory first: a wheel with neither needs both)."""
    del args, kwargs
    for name in [self.name, *reversed(_stack)]:
        if name not in _jit and (name == self.name or not _installed(name)):
            _jit.append(name)
    raise JitRefused(f"DeepSpeed tried to JIT-compile the op {self.name}: it is not in the installed wheel")


def _refuse_cpp_load(name: str, *args: Any, **kwargs: Any) -> Any:
    del args, kwargs
    if name not in _jit:
        _jit.append(name)
    raise JitRefused(f"torch.utils.cpp_extension was asked to compile {name} at first use")


# The reference run (the smoke's blame of a failure): DeepSpeed with none of the wheel's ops, compiling
# at first use what it needs as upstream does, into one extensions folder every config shares. On the CPU
# accelerator the engine compiles deepspeed_shm_comm at initialize: with JIT refused no config runs at all.
ALLOW_JIT_ENV = "DS_CONFIG_RUNNER_ALLOW_JIT"  # the shared TORCH_EXTENSIONS_DIR; set: compiles are recorded, run


def _allow_jit() -> str:
    return os.environ.get(ALLOW_JIT_ENV, "")


def _record_jit(jit_load: Any) -> Any:
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.name not in _jit:
            _jit.append(self.name)
        return jit_load(self, *args, **kwargs)

    wrapper.__wrapped__ = jit_load  # type: ignore[attr-defined]
    return wrapper


def _wrap(cls: Any) -> None:
    if "load" in cls.__dict__ and not hasattr(cls.__dict__["load"], "__wrapped__"):
        cls.load = _record_load(cls.__dict__["load"])
    if "jit_load" in cls.__dict__ and not hasattr(cls.__dict__["jit_load"], "__wrapped__"):
        cls.jit_load = _record_jit(cls.__dict__["jit_load"]) if _allow_jit() else _refuse_jit


def intercept() -> None:
    """Wrap every op builder's load (those that exist now and every later subclass) and refuse JIT."""
    import torch.utils.cpp_extension as cpp
    from deepspeed.accelerator import get_accelerator
    from deepspeed.ops.op_builder.all_ops import ALL_OPS  # imports every builder the accelerator has
    from deepspeed.ops.op_builder.builder import OpBuilder

    del ALL_OPS, get_accelerator
    if _intercepted:
        return
    _intercepted.append(True)
    pending = [OpBuilder]
    while pending:
        cls = pending.pop()
        _wrap(cls)
        pending.extend(cls.__subclasses__())
    original = OpBuilder.__init_subclass__

    def on_subclass(cls: Any, **kwargs: Any) -> None:
        original(**kwargs)
        _wrap(cls)

    OpBuilder.__init_subclass__ = classmethod(on_subclass)  # type: ignore[arg-type]
    if not _allow_jit():
        cpp.load = _refuse_cpp_load
        cpp.load_inline = _refuse_cpp_load


def held_store(world: int) -> Any:
    """A rendezvous store this process hosts, on a port the kernel picked and this process keeps: the
    ranks connect to it as clients (TORCHELASTIC_USE_AGENT_STORE, as under torchrun's agent). A port
    chosen by binding port 0 and closing it could be taken by another process before rank 0 bound it
    again (EADDRINUSE, a config failing by chance)."""
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", 0, world, True, wait_for_workers=False)


def world_size_of(config: dict[str, Any]) -> int:
    """The processes a config needs: train_batch_size / (micro batch x accumulation) where it gives
    all three (DeepSpeed checks that product against the world size), else 1."""
    batch = config.get("train_batch_size")
    micro = config.get("train_micro_batch_size_per_gpu")
    accumulation = config.get("gradient_accumulation_steps", 1)
    if isinstance(batch, int) and isinstance(micro, int) and isinstance(accumulation, int) and micro * accumulation:
        return max(1, batch // (micro * accumulation))
    return 1


def _batch(config: dict[str, Any]) -> int:
    micro = config.get("train_micro_batch_size_per_gpu")
    return micro if isinstance(micro, int) and micro > 0 else 4


def _classify(exc: BaseException) -> tuple[str, str]:
    text = f"{type(exc).__name__}: {exc}".strip()
    if _jit and not _allow_jit():
        return "needs-op", f"needs {', '.join(_jit)}, which the installed wheel lacks ({text.splitlines()[0]})"
    if "InvalidCxxCompiler" in text or "No working C++ compiler" in text:
        return "needs-compiler", (
            "torch.compile (inductor) compiles code for this config at first use, which needs a C++ compiler on "
            f"the node; no prebuilt wheel can carry that ({text.splitlines()[0]})"
        )
    if _refused or NOT_IMPLEMENTED in text:
        return "unsupported", text
    names = {type(e).__name__ for e in _chain(exc)}
    frames = traceback.extract_tb(exc.__traceback__)
    if names & {"ValidationError", "DeepSpeedConfigError"} or _checks_the_config(frames, text):
        return "invalid", " ".join(text.split())[:600]
    if frames and f"{os.sep}deepspeed{os.sep}" in frames[-1].filename:
        return "unsupported", text
    return "failed", text + "\n" + "".join(traceback.format_exception(exc, limit=-4))[-1500:]


_CONFIG_FILE = os.path.join("deepspeed", "runtime", "config.py")


def _checks_the_config(frames: Any, text: str) -> bool:
    """Whether the error came from DeepSpeed checking the config's contents, not from running it: its
    config module's asserts (`train_batch_size: NaN`), an optimizer name it does not have. Its other
    sanity checks (Lamb needs dynamic loss scaling) say what DeepSpeed supports, and stay so."""
    return any(f.filename.endswith(_CONFIG_FILE) for f in frames[-2:]) or UNKNOWN_OPTIMIZER in text


UNKNOWN_OPTIMIZER = "is not a supported DeepSpeed Optimizer"


def _chain(exc: BaseException | None) -> list[BaseException]:
    out = []
    while exc is not None and exc not in out:
        out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out


def run_rank(config: dict[str, Any], rank: int, world: int, port: int, send: Any) -> None:
    """One rank of one config, in a process of its own: initialize, STEPS steps, report."""
    result: dict[str, Any] = {"rank": rank}
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "TORCHELASTIC_USE_AGENT_STORE": "True"})  # fmt: skip
    send.send(_one_rank(config, result))
    send.close()


def _one_rank(config: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """Initialize and step in this process (its rank's environment set), every outcome a result;
    with a TORCH_EXTENSIONS_DIR of its own, empty at the start and removed at the end (a config per
    run: thousands of folders left in /tmp otherwise)."""
    del _loaded[:], _jit[:], _refused[:], _stack[:]
    shared = _allow_jit()
    ext = shared or tempfile.mkdtemp(prefix="config-ext-")
    os.environ["TORCH_EXTENSIONS_DIR"] = ext
    try:
        try:
            intercept()  # already done before a fork; a spawned process does it here
            result.update(_steps(config))
        except BaseException as exc:  # every outcome is reported
            result["status"], result["detail"] = _classify(exc)
        compiled = [] if shared else sorted(os.listdir(ext))
    finally:
        if not shared:
            shutil.rmtree(ext, ignore_errors=True)
    if _jit and result.get("status") == "passed" and not shared:  # DeepSpeed caught the refusal and fell back
        result["status"] = "needs-op"
        result["detail"] = (f"needs {', '.join(_jit)}, which the installed wheel lacks: DeepSpeed tried to compile it "
                            f"and fell back when refused ({result.get('detail', '')})")  # fmt: skip
    if compiled and result.get("status") == "passed":
        result["status"], result["detail"] = "needs-op", f"files appeared in TORCH_EXTENSIONS_DIR: {compiled}"
    result.update({"ops": list(_loaded), "jit": list(_jit)})
    return result


def run_launched(name: str, config: dict[str, Any]) -> dict[str, Any]:
    """One rank of a config in a world a launcher started (torchrun across nodes: RANK, WORLD_SIZE,
    MASTER_ADDR and MASTER_PORT in the environment), in this process, its JIT folder empty."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    result: dict[str, Any] = {"name": name, "rank": rank, "world": world, "host": socket.gethostname()}
    wanted = world_size_of(config)
    if wanted != world:
        return {**result, "status": "invalid", "ops": [], "jit": [],
                "detail": f"the config's batch sizes give {wanted} processes (train_batch_size / (micro batch x "
                f"accumulation)); the launcher started {world}"}  # fmt: skip
    invalid = unknown_keys(config)
    if invalid:
        return {**result, "status": "invalid", "ops": [], "jit": [], "detail": invalid}
    result = _one_rank(config, result)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():  # the backend that carried the steps, and where to
        result["backend"] = dist.get_backend()
        result["master"] = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    return result


def _steps(config: dict[str, Any]) -> dict[str, Any]:
    import deepspeed
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
    # A config without an "optimizer" section is used with the script's own optimizer: give it torch's AdamW.
    client = None if "optimizer" in config else torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, optimizer, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config, optimizer=client
    )
    param = next(engine.module.parameters())
    batch = _batch(config)
    losses = []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(batch, 16, generator=g).to(engine.device, param.dtype)
        loss = torch.nn.functional.mse_loss(engine(x).float(), x.float())
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    if not all(map(lambda v: v == v and abs(v) != float("inf"), losses)):
        return {"status": "failed", "detail": f"the loss is not finite: {losses}"}
    inner = getattr(optimizer, "optimizer", optimizer)
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
    return {
        "status": "passed",
        "detail": f"{STEPS} steps with {type(inner).__name__}, {param.dtype}, loss {losses[0]:.3f} -> {losses[-1]:.3f}",
    }


TIMED_OUT = "did not finish within"  # a config's detail when it hit its limit (again_alone reads it)


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
        self.early = "" if self.invalid else _refuse_early(entry, self.world, self.scratch)
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


def _nvme_paths(config: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    zero = config.get("zero_optimization")
    found = []
    if isinstance(zero, dict):
        for key in ("offload_optimizer", "offload_param"):
            section = zero.get(key)
            if isinstance(section, dict) and section.get("device") == "nvme":
                found.append((section, str(section.get("nvme_path", ""))))
    return found


_NAMES: list[frozenset[str]] = []


def deepspeed_names() -> frozenset[str]:
    """Every name DeepSpeed's own code spells as a string ('zero_optimization', 'offload_param', ...):
    a superset of the config keys it reads, found in its sources (0.2 s, once)."""
    if not _NAMES:
        import importlib.util
        import re

        spec = importlib.util.find_spec("deepspeed")
        root = os.path.dirname(spec.origin) if spec and spec.origin else ""
        quoted, names = re.compile(r"""["']([a-z][a-z0-9_]{1,60})["']"""), set()
        for folder, _, files in os.walk(root):
            for name in files:
                if name.endswith(".py"):
                    with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as f:
                        names.update(quoted.findall(f.read()))
        _NAMES.append(frozenset(names))
    return _NAMES[0]


def unknown_keys(config: dict[str, Any]) -> str:
    """Keys DeepSpeed does not know, at the top and in zero_optimization: it ignores them, so a typo
    ('zero_optimisation') runs as if the section were not there. Empty when all are known."""
    known = deepspeed_names()
    if not known:
        return ""
    found = [k for k in config if isinstance(k, str) and k not in known]
    zero = config.get("zero_optimization")
    if isinstance(zero, dict):
        found += [f"zero_optimization.{k}" for k in zero if isinstance(k, str) and k not in known]
        for section in ("offload_optimizer", "offload_param"):
            if isinstance(zero.get(section), dict):
                found += [f"zero_optimization.{section}.{k}" for k in zero[section] if isinstance(k, str)
                          and k not in known]  # fmt: skip
    if not found:
        return ""
    import difflib

    said = []
    for key in found[:5]:
        close = difflib.get_close_matches(key.rsplit(".", 1)[-1], known, n=1, cutoff=0.8)
        said.append(f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key))
    return (f"unknown key {', '.join(said)}: DeepSpeed ignores keys it does not know, so the config would run "
            "without what it says; fix the name, or remove it")  # fmt: skip


# Folders a config's nvme_path may not name: the checker would write DeepSpeed's swap files there.
_SYSTEM = ("/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/opt", "/proc", "/root", "/run",
           "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var")  # fmt: skip
_SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc", "/run", "/sbin", "/sys", "/usr")


def _refuse_early(entry: dict[str, Any], world: int, scratch: list[str]) -> str:
    """What stops a config before it starts: more processes than allowed, an NVMe folder that cannot
    be written or is a system folder. Each nvme_path is then pointed at a scratch folder of the
    checker's own inside it (SCRATCH: on the work disk), listed in `scratch` and removed after the
    config ran, so a check leaves nothing in the node's NVMe folder."""
    allowed = int(entry.get("max_world") or os.cpu_count() or 1)
    if world > allowed:
        return (f"the config needs {world} processes (train_batch_size / (micro batch x gradient accumulation)) "
                f"and this machine allows {allowed}: run it where there are {world} CPUs or GPUs, or lower "
                "train_batch_size")  # fmt: skip
    for section, path in _nvme_paths(entry["config"]):
        if not path:
            return "the config offloads to nvme but gives no nvme_path: name a folder on a local NVMe disk"
        if path == SCRATCH:
            path = os.getcwd()  # O_DIRECT: not tmpfs
        real = os.path.realpath(path)
        if real in _SYSTEM or any(real.startswith(tree + "/") for tree in _SYSTEM_TREES):
            return (f"the config offloads to nvme_path {path[:200]!r}, the system folder {real}: DeepSpeed would "
                    "write its swap files there; name a folder on a local NVMe disk")  # fmt: skip
        if not os.path.isdir(real) or not os.access(real, os.W_OK | os.X_OK):
            return (f"the config offloads to nvme_path {path[:200]!r}, which is not a folder this user can write: "
                    "create it or name another")  # fmt: skip
        scratch.append(tempfile.mkdtemp(prefix=".ds-config-check-", dir=real))
        section["nvme_path"] = scratch[-1]
    return ""


SCRATCH = "@scratch"  # nvme_path of the smoke's matrix: a fresh folder on the work disk


# What deepspeed.initialize imports on first use, imported once before the configs fork (a venv
# made by uv holds no bytecode, so each child would compile them again: 3 s of a 4 s config).
WARM = ("deepspeed.runtime.engine", "deepspeed.runtime.zero.stage_1_and_2", "deepspeed.runtime.zero.stage3",
        "deepspeed.runtime.zero.muon.muon_optimizer", "deepspeed.ops.adam", "deepspeed.ops.adagrad",
        "deepspeed.ops.lion", "deepspeed.ops.lamb", "torch._dynamo")  # fmt: skip


# spawn: each config's processes start a new Python, as on CUDA (a CUDA context cannot be forked); the
# bench runs the CPU matrix so to measure what compiling torch's modules in every process costs there.
START_ENV = "DS_CONFIG_RUNNER_START"


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
    if accelerator != "cpu" or os.environ.get(START_ENV) == "spawn":
        return multiprocessing.get_context("spawn")
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


def default_jobs() -> int:
    """Configs run at once: two per core (each is mostly waiting on its process group), 2 to 8."""
    return max(2, min(8, 2 * (os.cpu_count() or 1)))


MAX_CONFIG = 1 << 20  # a DeepSpeed config is a few KB


def read_config_file(path: str) -> tuple[dict[str, Any] | None, str]:
    """(config, "") or (None, why not): JSON, or a Python file holding one dict literal (`config =
    {...}` or the dict alone, read with ast.literal_eval: nothing in it is run)."""
    import ast
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))  # a FIFO must not block
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None, f"{path} is not a regular file (a FIFO, a folder or a device): not a DeepSpeed config"
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as f:
            raw = f.read(MAX_CONFIG + 1)  # bounded: /dev/zero and its like never end
        if len(raw) > MAX_CONFIG:
            return None, f"{path} is over {MAX_CONFIG >> 20} MiB: not a DeepSpeed config"
        text = raw.decode("utf-8")
    except FileNotFoundError:
        return None, f"{path} does not exist"
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}"
    try:
        if path.endswith(".py"):
            data: Any = None
            for node in ast.parse(text, filename=path).body:  # the first dict literal (a docstring is skipped)
                if isinstance(node, (ast.Expr, ast.Assign)) and isinstance(node.value, ast.Dict):
                    data = ast.literal_eval(node.value)  # ValueError for anything but literals (a call, a name)
                    break
            else:
                raise ValueError("no dict literal in it (write `config = {...}`)")
        else:
            data = json.loads(text)
    except (ValueError, SyntaxError, RecursionError) as exc:
        kind = "a Python dict literal" if path.endswith(".py") else "JSON"
        return None, f"{path} is not {kind} ({str(exc).splitlines()[0]})"
    if not isinstance(data, dict):
        return None, f"{path} holds a {type(data).__name__}, not a DeepSpeed config object"
    return data, ""


def explain(result: dict[str, Any], accelerator: str) -> str:
    """One line for people: what the result means and what to do."""
    detail = str(result.get("detail", ""))
    first = detail.splitlines()[0] if detail else ""
    status, jit = result["status"], list(result.get("jit", []))
    if status == "passed":
        return f"runs from the wheel: ops {', '.join(result.get('ops', [])) or 'none'}; {first}"
    if status == "needs-op":
        add = ", ".join(json.dumps(o) for o in jit)
        return f"needs op {', '.join(jit)}, which the wheel lacks: add {add} to the recipe's ops"
    if status == "unsupported":
        return f"not supported by DeepSpeed on {accelerator}: {first}"
    if status == "invalid":
        return "DeepSpeed rejects the config: " + " ".join(detail.split())[:400]
    return first


def seconds_arg(text: str) -> float:
    """A time limit: a finite number of seconds above 0, at most 86400 (inf and nan are refused)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 86400:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a number of seconds above 0, at most 86400")
    return value


def parser() -> argparse.ArgumentParser:
    """The checker's options (also read by the docs test, which checks every command the docs show)."""
    p = argparse.ArgumentParser(
        description="Run DeepSpeed configs against the DeepSpeed installed for this Python: initialize and a "
        "few steps of a small model each, with an empty TORCH_EXTENSIONS_DIR; every op DeepSpeed asks for is "
        "recorded and every compile at first use refused. Exit 0 when every config passed, 14 otherwise."
    )
    p.add_argument("configs", nargs="*", metavar="CONFIG", help="DeepSpeed config files (JSON, or .py of one dict)")
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.add_argument("--timeout", type=seconds_arg, default=180.0, help="seconds per config (default 180)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--launched", action="store_true",
                   help="run one config as this process's rank of a world a launcher started (torchrun across "
                   "nodes: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set): a line (or JSON) per rank")  # fmt: skip
    return p


def main() -> int:
    """`--spec FILE|-|JSON` (the toolkit: the JSON report after MARKER), or config files (people,
    on a node: a line per config, or --json; exit 14 unless every config passed)."""
    p = parser()
    args = p.parse_args()
    # What DeepSpeed prints (its accelerator warning, "... built successfully") goes to stderr, in
    # every process: stdout carries only the results, so --json is JSON.
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    try:
        return _main(args, p, out)
    finally:
        out.flush()


def _main(args: Any, p: Any, out: Any) -> int:
    if args.spec is not None:
        arg = sys.stdin.read() if args.spec == "-" else args.spec
        if not arg.lstrip().startswith("{"):
            with open(arg, encoding="utf-8") as f:
                arg = f.read()
        results = run(json.loads(arg))
        print(MARKER, file=out)
        print(json.dumps(results), file=out)
        return 0
    if not args.configs:
        p.error("name at least one config file")
    if args.launched:
        return _main_launched(args, p, out)
    entries = []
    for path in args.configs:
        config, error = read_config_file(path)
        entries.append({"name": path, "error": error} if error else {"name": path, "config": config})
    results = run({"configs": entries, "timeout": args.timeout, "jobs": default_jobs()})
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()._name
    if args.json:
        print(json.dumps([{**r, "means": explain(r, accelerator)} for r in results], indent=2), file=out)
    else:
        for r in results:
            print(f"{r['status']:14} {r['name']}: {explain(r, accelerator)}", file=out)
    return 0 if all(r["status"] == "passed" for r in results) else 14


def _main_launched(args: Any, p: Any, out: Any) -> int:
    if len(args.configs) != 1 or "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        p.error("--launched runs one config in a world a launcher started (torchrun sets RANK and WORLD_SIZE)")
    config, error = read_config_file(args.configs[0])
    if config is None:
        result = {"name": args.configs[0], "rank": int(os.environ["RANK"]), "status": "invalid", "detail": error}
    else:
        result = run_launched(args.configs[0], config)
    from deepspeed.accelerator import get_accelerator

    means = explain(result, get_accelerator()._name)
    if args.json:
        print(json.dumps({**result, "means": means}), file=out)
    else:
        where = f"rank {result['rank']}/{result.get('world', '?')} on {result.get('host', '?')}"
        if "backend" in result:
            where += f", {result['backend']} via {result['master']}"
        print(f"{result['status']:14} {result['name']} ({where}): {means}", file=out)
    return 0 if result["status"] == "passed" else 14


if __name__ == "__main__":
    sys.exit(main())
