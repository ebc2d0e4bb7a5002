"""Worker for the distributed smoke checks, started by torchrun (like transformers'
torch-distributed-gpu-test): init, all_reduce, barrier, and one OK line per rank saying which
backend really ran. Standard library and torch only."""

import datetime
import os

import torch
import torch.distributed as dist


def main() -> None:
    backend = os.environ["SMOKE_BACKEND"]
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    # DS_BUILDER_SLOWDOWN: an emulated node (qemu-user) runs 10 times slower than this limit was written for
    try:
        slowdown = float(os.environ.get("DS_BUILDER_SLOWDOWN") or 1)
    except ValueError:
        slowdown = 1.0
    slowdown = min(slowdown, 100.0) if slowdown >= 1.0 else 1.0
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60 * slowdown))
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank + 1)], device=device)
    dist.all_reduce(t)
    dist.barrier()
    expected = world * (world + 1) / 2
    status = "OK" if t.item() == expected else f"BAD(sum {t.item()} != {expected})"
    extra = ""
    if dist.get_backend() == "nccl":
        extra = " nccl=" + ".".join(map(str, torch.cuda.nccl.version()))
    print(f"SMOKE_DIST rank={rank} world={world} backend={dist.get_backend()}{extra} {status}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
