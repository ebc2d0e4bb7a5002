"""torch.distributed from the wheel: torchrun with gloo on one node and across two, NCCL on GPUs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

from builder.resources.smoke.common import Skip, free_port, seconds


def _torchrun(
    args: list[str], backend: str, extra_env: dict[str, str] | None = None, timeout: int = 180
) -> subprocess.Popen[str]:
    env = {**os.environ, "SMOKE_BACKEND": backend, **(extra_env or {})}
    cmd = [sys.executable, "-m", "torch.distributed.run", *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _collect(procs: list[subprocess.Popen[str]], world: int, backend: str, timeout: int = 180) -> tuple[str, set[str]]:
    outputs = []
    try:
        for p in procs:
            try:
                out, _ = p.communicate(timeout=seconds(timeout))
            except subprocess.TimeoutExpired:
                p.kill()
                out, _ = p.communicate()
                raise AssertionError(f"torchrun timed out after {seconds(timeout):g}s:\n{out[-1500:]}") from None
            outputs.append(out)
            if p.returncode != 0:
                raise AssertionError(f"torchrun exited {p.returncode}:\n{out[-1500:]}")
    finally:
        for p in procs:  # a failed one leaves none of the others running
            if p.poll() is None:
                p.kill()
                p.communicate()
    text = "\n".join(outputs)
    return text, parse_dist_output(text, world, backend)


def parse_dist_output(text: str, world: int, backend: str) -> set[str]:
    """Every rank 0..world-1 printed OK with `backend` (the one that really ran); NCCL versions seen."""
    ok = re.findall(rf"SMOKE_DIST rank=(\d+) world={world} backend=(\w+)(?: nccl=(\S+))? OK", text)
    ranks = sorted(int(r) for r, _, _ in ok)
    backends = {b for _, b, _ in ok}
    if ranks != list(range(world)) or backends != {backend}:
        raise AssertionError(f"expected ranks 0..{world - 1} OK with {backend}, got {ok}:\n{text[-1500:]}")
    return {n for _, _, n in ok if n}


def _on_a_free_port(run: Any) -> Any:
    """torchrun binds the port it is given itself, so one chosen by binding port 0 and closing it can
    be taken by another process first (EADDRINUSE): the check runs again on another port, three
    times at most; any other failure is the check's."""
    for attempt in range(3):
        try:
            return run(free_port())
        except AssertionError as exc:
            taken = "EADDRINUSE" in str(exc) or "Address already in use" in str(exc)
            if attempt == 2 or not taken:
                raise
    raise AssertionError("unreachable")


def check_gloo_one_node(worker: str) -> str:
    _on_a_free_port(lambda port: _collect(
        [_torchrun(["--nproc_per_node=2", "--master_addr=127.0.0.1", f"--master_port={port}", worker], "gloo")],
        2,
        "gloo",
    ))  # fmt: skip
    return "torchrun 1 node x 2 processes: all_reduce and barrier OK, backend gloo"


def check_gloo_two_nodes(worker: str) -> str:
    def common(port: int) -> list[str]:
        return ["--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}",
                "--rdzv_id=ds-smoke", worker]  # fmt: skip

    _on_a_free_port(lambda port: _collect([_torchrun(common(port), "gloo"), _torchrun(common(port), "gloo")], 2,
                                          "gloo"))  # fmt: skip
    return "torchrun 2 nodes x 1 process over 127.0.0.1 (c10d rendezvous): all_reduce and barrier OK, backend gloo"


def check_nccl(worker: str) -> str:
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        raise Skip("no GPU visible: NCCL needs one process per GPU")
    if not dist.is_nccl_available():
        raise AssertionError("torch has CUDA but no NCCL built in")
    n = torch.cuda.device_count()
    text, nccl = _on_a_free_port(lambda port: _collect(
        [_torchrun([f"--nproc_per_node={n}", "--master_addr=127.0.0.1", f"--master_port={port}", worker], "nccl",
                   {"NCCL_DEBUG": "INFO"})],
        n,
        "nccl",
    ))  # fmt: skip
    print(text)  # NCCL_DEBUG=INFO output goes to the smoke log
    return f"torchrun 1 node x {n} GPU processes: all_reduce and barrier OK, backend nccl, NCCL {', '.join(nccl)}"
