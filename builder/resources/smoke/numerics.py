"""What the ops compute: each optimizer op stepped against a reference (torch's own, or one written
here from the paper where torch has none), and the I/O and utility ops against what they copy.
"""

from __future__ import annotations

import os
from typing import Any

from builder.resources.smoke.common import STEPS, TOLERANCE, Skip
from builder.resources.smoke.wheel import load_op


def compare(make_ours: Any, make_reference: Any, device: str = "cpu") -> str:
    import torch

    torch.manual_seed(0)
    init = torch.randn(4097).to(device)  # not a multiple of the SIMD width, so the scalar tail runs too
    grads = [torch.randn(4097).to(device) for _ in range(STEPS)]
    params = []
    for make in (make_ours, make_reference):
        p = torch.nn.Parameter(init.clone())
        opt = make([p])
        for g in grads:
            p.grad = g.clone()
            opt.step()
        params.append(p.detach())
    diff = (params[0] - params[1]).abs().max().item()
    moved = (params[1] - init).abs().max().item()
    where = f" on {torch.cuda.get_device_name()}" if device == "cuda" else ""
    if not moved > 0:
        raise AssertionError("the reference optimizer did not move the parameters")
    if not diff <= TOLERANCE:
        raise AssertionError(f"max |difference| {diff:.3g} after {STEPS} steps exceeds {TOLERANCE}")
    return f"max |difference| {diff:.2g} after {STEPS} steps{where} (tolerance {TOLERANCE})"


def check_cpu_adam() -> str:
    import torch
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    return compare(
        lambda ps: DeepSpeedCPUAdam(ps, lr=1e-2, weight_decay=0.0, adamw_mode=False),
        lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.0),
    )


def check_cpu_adagrad() -> str:
    import torch
    from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad

    return compare(
        lambda ps: DeepSpeedCPUAdagrad(ps, lr=1e-2, eps=1e-10),
        lambda ps: torch.optim.Adagrad(ps, lr=1e-2, eps=1e-10),
    )


class ReferenceLion:
    """Lion (Chen et al. 2023) written out in torch: torch ships no Lion to compare against."""

    def __init__(
        self, params: Any, lr: float, betas: tuple[float, float] = (0.9, 0.99), weight_decay: float = 0.0
    ) -> None:
        import torch

        self.params, self.lr, self.betas, self.wd = params, lr, betas, weight_decay
        self.m = [torch.zeros_like(p) for p in params]

    def step(self) -> None:
        import torch

        b1, b2 = self.betas
        with torch.no_grad():
            for p, m in zip(self.params, self.m, strict=True):
                update = (b1 * m + (1 - b1) * p.grad).sign()
                p.mul_(1 - self.lr * self.wd).add_(update, alpha=-self.lr)
                m.mul_(b2).add_(p.grad, alpha=1 - b2)


def check_cpu_lion() -> str:
    from deepspeed.ops.lion import DeepSpeedCPULion

    return compare(
        lambda ps: DeepSpeedCPULion(ps, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0),
        lambda ps: ReferenceLion(ps, lr=1e-3, betas=(0.9, 0.99)),
    )


def check_fused_adam() -> str:
    import torch

    if not torch.cuda.is_available():
        raise Skip("no GPU visible: FusedAdam runs only on CUDA tensors")
    from deepspeed.ops.adam import FusedAdam

    return compare(
        lambda ps: FusedAdam(ps, lr=1e-2, adam_w_mode=False, weight_decay=0.0),
        lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.0),
        device="cuda",
    )


def check_fused_lion() -> str:
    import torch

    if not torch.cuda.is_available():
        raise Skip("no GPU visible: FusedLion runs only on CUDA tensors")
    from deepspeed.ops.lion import FusedLion

    return compare(
        lambda ps: FusedLion(ps, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0),
        lambda ps: ReferenceLion(ps, lr=1e-3, betas=(0.9, 0.99)),
        device="cuda",
    )


class ReferenceLamb:
    """DeepSpeed's FusedLamb written out in torch, as csrc/lamb/fused_lamb_cuda_kernel.cu computes it
    (torch ships no Lamb): Adam's moments without bias correction in the update, eps added to the
    root (eps_inside_sqrt=False), the trust ratio ||w|| / ||update|| clamped to [min, max] (1 where
    either is 0), and the bias corrections folded into the step size."""

    def __init__(self, params: Any, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, max_coeff: float = 10.0, min_coeff: float = 0.01) -> None:  # fmt: skip
        import torch

        self.params, self.lr, self.betas, self.eps, self.wd = params, lr, betas, eps, weight_decay
        self.max_coeff, self.min_coeff, self.t = max_coeff, min_coeff, 0
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]

    def step(self) -> None:
        import torch

        b1, b2 = self.betas
        self.t += 1
        step_size = self.lr * (1 - b2**self.t) ** 0.5 / (1 - b1**self.t)
        with torch.no_grad():
            for p, m, v in zip(self.params, self.m, self.v, strict=True):
                m.mul_(b1).add_(p.grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                update = m / (v.sqrt() + self.eps) + self.wd * p
                w_norm, u_norm = p.norm().item(), update.norm().item()
                coeff = min(max(w_norm / u_norm, self.min_coeff), self.max_coeff) if w_norm and u_norm else 1.0
                p.sub_(step_size * coeff * update)


def check_fused_lamb() -> str:
    import torch

    if not torch.cuda.is_available():
        raise Skip("no GPU visible: FusedLamb runs only on CUDA tensors")
    from deepspeed.ops.lamb import FusedLamb

    return compare(
        lambda ps: FusedLamb(ps, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01),
        lambda ps: ReferenceLamb(ps, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01),
        device="cuda",
    )


def _loaded_from(fragment: str) -> list[str]:
    """The files mapped into this process whose path holds `fragment` (which libaio was loaded)."""
    with open("/proc/self/maps", encoding="utf-8") as f:
        return sorted({line.split()[-1] for line in f if fragment in line and "/" in line})


def check_async_io() -> str:
    """Write a tensor to a file and read it back through libaio (O_DIRECT, the op's own handle), and
    say which libaio the process loaded: the wheel's own copy when the wheel carries one."""
    import torch

    aio = load_op("async_io")
    handle = aio.aio_handle(1024 * 1024, 8, False, False, 1)
    torch.manual_seed(0)
    data = torch.randn(1024 * 1024)  # 4 MiB: a whole number of the handle's blocks
    path = os.path.join(os.getcwd(), "async_io_check.bin")  # the work disk: O_DIRECT fails on tmpfs
    try:
        wrote = handle.sync_pwrite(data, path)
        back = torch.zeros_like(data)
        read = handle.sync_pread(back, path)
        size = os.path.getsize(path)
    finally:
        if os.path.exists(path):
            os.remove(path)
    if size != data.numel() * 4:
        raise AssertionError(f"the file holds {size} bytes, {data.numel() * 4} were written")
    if not torch.equal(back, data):
        raise AssertionError(f"read back differs from what was written at {(back != data).sum().item()} values")
    libaio = _loaded_from("libaio")
    return f"4 MiB written ({wrote}) and read back ({read}) through libaio, identical; libaio: {', '.join(libaio)}"


def check_pin_memory() -> str:
    """A page-locked tensor from the op's own allocator: usable, reported pinned, freed."""
    import torch

    handle = load_op("pin_memory").pin_handle()
    locked = handle.new_cpu_locked_tensor(4096, torch.empty(0, dtype=torch.float32))
    locked.copy_(torch.arange(4096, dtype=torch.float32))
    if not handle.is_pinned(locked):
        raise AssertionError("the op does not report its own locked tensor as pinned")
    if not torch.equal(locked, torch.arange(4096, dtype=torch.float32)):
        raise AssertionError("the locked tensor does not hold what was copied into it")
    if not handle.free_cpu_locked_tensor(locked):
        raise AssertionError("free_cpu_locked_tensor returned false")
    return "4096 floats in page-locked memory (mlock), reported pinned, freed"


def check_utils() -> str:
    """cast_to_byte_tensor gives the tensor's own bytes (torch's view as the reference)."""
    import torch

    utils = load_op("utils")
    t = torch.randn(1025)
    ours = utils.cast_to_byte_tensor(t)
    if not torch.equal(ours, t.view(torch.uint8)):
        raise AssertionError("cast_to_byte_tensor differs from torch's byte view")
    many = utils.cast_to_byte_tensor([t, t[:7]])
    if [m.numel() for m in many] != [1025 * 4, 7 * 4]:
        raise AssertionError(f"the list form gave {[m.numel() for m in many]} bytes")
    return "cast_to_byte_tensor equals torch's byte view (one tensor and a list)"


def check_quantizer() -> str:
    """8-bit symmetric quantize and dequantize, called as ZeRO++ calls them (fp16 in, int8 and a scale per
    group out), against torch's own rounding of each group: the round trip within one step of the group."""
    import torch

    if not torch.cuda.is_available():
        raise Skip("no GPU visible: the quantizer runs only on CUDA tensors")
    q = load_op("quantizer")
    torch.manual_seed(0)
    groups, size = 16, 1024
    x = torch.randn(groups * size, device="cuda").half()
    data, params = q.quantize(x, groups, 8, q.Symmetric)
    if data.dtype != torch.int8 or data.numel() != x.numel():
        raise AssertionError(f"quantize gave {data.numel()} values of {data.dtype}, not {x.numel()} int8")
    back = q.dequantize(data, params, groups, 8, q.Symmetric).float().view(groups, -1)
    ref = x.float().view(groups, -1)
    step = ref.abs().amax(dim=1, keepdim=True) / 127  # one int8 level of each group
    worst = ((back - ref).abs() / step).max().item()
    if not worst <= 1.0:
        raise AssertionError(f"dequantize(quantize(x)) is off by {worst:.2f} int8 levels of its group (torch's "
                             "own rounding: at most 0.5)")  # fmt: skip
    levels = torch.round(ref / step).clamp(-127, 127)
    agree = ((data.view(groups, -1).float().abs() - levels.abs()).abs() <= 1).float().mean().item()
    if agree < 0.99:
        raise AssertionError(f"only {agree:.1%} of the int8 levels are within one of torch's rounding")
    where = torch.cuda.get_device_name()
    return (f"int8 symmetric, {groups} groups of {size} on {where}: round trip within {worst:.2f} levels of each "
            f"group (torch's rounding: 0.5), {agree:.1%} of levels within one of torch's")  # fmt: skip


def check_transformer_inference() -> str:
    """Two of the inference kernels against torch, in fp16: layer_norm, and bias + GELU (the tanh form
    DeepSpeed's kernel computes)."""
    import torch

    if not torch.cuda.is_available():
        raise Skip("no GPU visible: the inference kernels run only on CUDA tensors")
    mod = load_op("transformer_inference")
    torch.manual_seed(0)
    width = 1024
    x = torch.randn(2, 8, width, device="cuda").half()
    gamma, beta, bias = (torch.randn(width, device="cuda").half() for _ in range(3))
    ours = mod.layer_norm(x, gamma, beta, 1e-5).float()
    ref = torch.nn.functional.layer_norm(x.float(), (width,), gamma.float(), beta.float(), 1e-5)
    norm = (ours - ref).abs().max().item()
    gelu = mod.bias_gelu_fp16(x.clone(), bias).float()  # it works in place on its input
    ref_gelu = torch.nn.functional.gelu(x.float() + bias.float(), approximate="tanh")
    act = (gelu - ref_gelu).abs().max().item()
    tolerance = 3e-2  # fp16: about 1e-3 of values that reach 5 here
    if not norm <= tolerance:
        raise AssertionError(f"layer_norm differs from torch's by {norm:.3g} (tolerance {tolerance})")
    if not act <= tolerance:
        raise AssertionError(f"bias_gelu_fp16 differs from torch's tanh GELU by {act:.3g} (tolerance {tolerance})")
    return (f"fp16 on {torch.cuda.get_device_name()}: layer_norm max |difference| {norm:.2g}, bias + GELU "
            f"{act:.2g} (tolerance {tolerance})")  # fmt: skip
