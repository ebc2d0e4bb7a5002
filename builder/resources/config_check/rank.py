"""One config run as a user runs it, in a process per rank: deepspeed.initialize on a small model and
a few steps, with its world size and batch taken from the config.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from typing import Any

from builder.resources.config_check.jit import (
    STEPS,
    intercept,
    jit_allowed,
    jit_asked,
    load_stack,
    loaded_ops,
    refused_loads,
)
from builder.resources.config_check.outcome import classify
from builder.resources.config_check.screen import unknown_keys


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
    del loaded_ops[:], jit_asked[:], refused_loads[:], load_stack[:]
    shared = jit_allowed()
    ext = shared or tempfile.mkdtemp(prefix="config-ext-")
    os.environ["TORCH_EXTENSIONS_DIR"] = ext
    try:
        try:
            intercept()  # already done before a fork; a spawned process does it here
            result.update(_steps(config))
        except BaseException as exc:  # every outcome is reported
            result["status"], result["detail"] = classify(exc)
        compiled = [] if shared else sorted(os.listdir(ext))
    finally:
        if not shared:
            shutil.rmtree(ext, ignore_errors=True)
    if jit_asked and result.get("status") == "passed" and not shared:  # DeepSpeed caught the refusal and fell back
        result["status"] = "needs-op"
        result["detail"] = (f"needs {', '.join(jit_asked)}, which the installed wheel lacks: DeepSpeed tried to "
                            f"compile it and fell back when refused ({result.get('detail', '')})")  # fmt: skip
    if compiled and result.get("status") == "passed":
        result["status"], result["detail"] = "needs-op", f"files appeared in TORCH_EXTENSIONS_DIR: {compiled}"
    result.update({"ops": list(loaded_ops), "jit": list(jit_asked)})
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
