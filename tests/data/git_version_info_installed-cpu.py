version = "0.19.8+cpu.torch2.13"
git_hash = "unknown"
git_branch = "unknown"
installed_ops = {
    "deepspeed_not_implemented": False,
    "async_io": False,
    "deepspeed_ccl_comm": False,
    "deepspeed_shm_comm": False,
    "cpu_adagrad": 1,
    "cpu_adam": 1,
    "cpu_lion": 1,
    "fused_adam": False,
    "pin_memory": False,
}
accelerator_name = "cpu"
torch_info = {
    "version": "2.13",
    "bf16_support": False,
    "cuda_version": "0.0",
    "nccl_version": "0.0",
    "hip_version": "0.0",
}
