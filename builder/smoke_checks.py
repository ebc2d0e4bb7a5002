"""Checks run inside a fresh environment where only torch and the DeepSpeed wheel are installed.

Run as a script by that environment's Python (standard library, torch and DeepSpeed only):
    python smoke_checks.py '{"version": ..., "ops": [...]}'
Each check records passed, failed (with why) or skipped (with why). The JSON report is printed
after the MARKER line. TORCH_EXTENSIONS_DIR must point at an empty folder: if any op were
JIT-compiled instead of loaded from the wheel, files would appear there and the check fails.
"""

import json
import os
import sys
import traceback

MARKER = "==== smoke json ===="
# fp32 optimizer steps on the same inputs: vectorised C++ vs torch's reference differ only by
# rounding (measured ~5e-7), so 1e-5 catches a wrong update while tolerating SIMD reordering.
TOLERANCE = 1e-5
STEPS = 5


def _check(results, name, fn):
    try:
        detail = fn()
        results.append({"name": name, "status": "passed", "detail": detail or ""})
    except _Skip as skip:
        results.append({"name": name, "status": "skipped", "detail": str(skip)})
    except Exception as exc:  # every failure is reported, the suite goes on
        tb = traceback.format_exc(limit=3)
        results.append({"name": name, "status": "failed", "detail": f"{type(exc).__name__}: {exc}\n{tb}"})


class _Skip(Exception):
    pass


def _ext_dir_files():
    root = os.environ["TORCH_EXTENSIONS_DIR"]
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def check_import(expected_version):
    import deepspeed

    if deepspeed.__version__ != expected_version:
        raise AssertionError(f"deepspeed.__version__ is {deepspeed.__version__}, expected {expected_version}")
    return f"deepspeed {deepspeed.__version__} from {os.path.dirname(deepspeed.__file__)}"


def check_torch(expected):
    """The installed torch is the one the wheel was built against, CUDA build included."""
    import torch

    want_cuda = expected["cuda"]
    if torch.__version__.split("+")[0] != expected["version"].split("+")[0]:
        raise AssertionError(f"torch {torch.__version__} is installed, the wheel was built for {expected['version']}")
    if (torch.version.cuda or None) != (want_cuda or None) and want_cuda:
        raise AssertionError(f"torch has CUDA {torch.version.cuda}, the wheel was built for CUDA {want_cuda}")
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU visible"
    return f"torch {torch.__version__} (CUDA {torch.version.cuda}); {gpu}"


def check_op_loads(op):
    import deepspeed
    from deepspeed.ops.op_builder.all_ops import ALL_OPS

    module = ALL_OPS[op].load(verbose=False)
    where = os.path.realpath(module.__file__)
    package = os.path.realpath(os.path.dirname(deepspeed.__file__))
    if not where.startswith(package + os.sep):
        raise AssertionError(f"{op} loaded from {where}, not from the installed wheel")
    compiled = _ext_dir_files()
    if compiled:
        raise AssertionError(f"loading {op} wrote to TORCH_EXTENSIONS_DIR (a JIT compile): {compiled[:5]}")
    return f"{op} loaded from {os.path.relpath(where, os.path.dirname(package))}, no JIT"


def _compare(make_ours, make_reference, device="cpu"):
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


def check_cpu_adam():
    import torch
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    return _compare(
        lambda ps: DeepSpeedCPUAdam(ps, lr=1e-2, weight_decay=0.0, adamw_mode=False),
        lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.0),
    )


def check_cpu_adagrad():
    import torch
    from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad

    return _compare(
        lambda ps: DeepSpeedCPUAdagrad(ps, lr=1e-2, eps=1e-10),
        lambda ps: torch.optim.Adagrad(ps, lr=1e-2, eps=1e-10),
    )


class _ReferenceLion:
    """Lion (Chen et al. 2023) written out in torch: torch ships no Lion to compare against."""

    def __init__(self, params, lr, betas=(0.9, 0.99), weight_decay=0.0):
        import torch

        self.params, self.lr, self.betas, self.wd = params, lr, betas, weight_decay
        self.m = [torch.zeros_like(p) for p in params]

    def step(self):
        import torch

        b1, b2 = self.betas
        with torch.no_grad():
            for p, m in zip(self.params, self.m, strict=True):
                update = (b1 * m + (1 - b1) * p.grad).sign()
                p.mul_(1 - self.lr * self.wd).add_(update, alpha=-self.lr)
                m.mul_(b2).add_(p.grad, alpha=1 - b2)


def check_cpu_lion():
    from deepspeed.ops.lion import DeepSpeedCPULion

    return _compare(
        lambda ps: DeepSpeedCPULion(ps, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0),
        lambda ps: _ReferenceLion(ps, lr=1e-3, betas=(0.9, 0.99)),
    )


def check_fused_adam():
    import torch

    if not torch.cuda.is_available():
        raise _Skip("no GPU visible: FusedAdam runs only on CUDA tensors")
    from deepspeed.ops.adam import FusedAdam

    return _compare(
        lambda ps: FusedAdam(ps, lr=1e-2, adam_w_mode=False, weight_decay=0.0),
        lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.0),
        device="cuda",
    )


NUMERICS = {
    "cpu_adam": check_cpu_adam,
    "cpu_adagrad": check_cpu_adagrad,
    "cpu_lion": check_cpu_lion,
    "fused_adam": check_fused_adam,
}


def main():
    spec = json.loads(sys.argv[1])
    results = []
    if _ext_dir_files():
        raise SystemExit("TORCH_EXTENSIONS_DIR is not empty at the start")
    _check(results, "torch", lambda: check_torch(spec["torch"]))
    _check(results, "import", lambda: check_import(spec["version"]))
    for op in spec["ops"]:
        _check(results, f"load:{op}", lambda op=op: check_op_loads(op))
    for op in spec["ops"]:
        if op in NUMERICS:
            _check(results, f"numerics:{op}", NUMERICS[op])
    _check(results, "no-jit", lambda: _no_jit())
    print(MARKER)
    print(json.dumps(results))


def _no_jit():
    files = _ext_dir_files()
    if files:
        raise AssertionError(f"TORCH_EXTENSIONS_DIR is not empty after the checks: {files[:5]}")
    return "TORCH_EXTENSIONS_DIR stayed empty"


if __name__ == "__main__":
    main()
