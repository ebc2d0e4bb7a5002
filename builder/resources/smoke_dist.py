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
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60))
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
