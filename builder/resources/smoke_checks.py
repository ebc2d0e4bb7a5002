"""Checks run inside a fresh environment where only torch and the DeepSpeed wheel are installed.

Run as a script by that environment's Python (standard library, torch and DeepSpeed only):
    python smoke_checks.py '{"version": ..., "ops": [...]}'
Each check records passed, failed (with why) or skipped (with why). The JSON report is printed
after the MARKER line. TORCH_EXTENSIONS_DIR must point at an empty folder: if any op were
JIT-compiled instead of loaded from the wheel, files would appear there and the check fails.
"""

from __future__ import annotations

import functools
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

MARKER = "==== smoke json ===="
# fp32 optimizer steps on the same inputs: vectorised C++ vs torch's reference differ only by
# rounding (measured ~5e-7), so 1e-5 catches a wrong update while tolerating SIMD reordering.
TOLERANCE = 1e-5
STEPS = 5


def _check(results: list[dict[str, str]], name: str, fn: Callable[[], str | None]) -> None:
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


def _ext_dir_files() -> list[str]:
    root = os.environ["TORCH_EXTENSIONS_DIR"]
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def check_import(expected_version: str) -> str:
    import deepspeed

    if deepspeed.__version__ != expected_version:
        raise AssertionError(f"deepspeed.__version__ is {deepspeed.__version__}, expected {expected_version}")
    return f"deepspeed {deepspeed.__version__} from {os.path.dirname(deepspeed.__file__)}"


def check_torch(expected: dict[str, Any]) -> str:
    """The installed torch is the one the wheel was built against, CUDA build included."""
    import torch

    want_cuda = expected["cuda"]
    if torch.__version__.split("+")[0] != expected["version"].split("+")[0]:
        raise AssertionError(f"torch {torch.__version__} is installed, the wheel was built for {expected['version']}")
    if (torch.version.cuda or None) != (want_cuda or None) and want_cuda:
        raise AssertionError(f"torch has CUDA {torch.version.cuda}, the wheel was built for CUDA {want_cuda}")
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU visible"
    return f"torch {torch.__version__} (CUDA {torch.version.cuda}); {gpu}"


def _load(op: str) -> Any:
    """The op's module as DeepSpeed loads it; an op linked against the NVIDIA driver (async_io and
    gds of a CUDA build) cannot load where there is none, which is a missing-hardware skip."""
    from deepspeed.ops.op_builder.all_ops import ALL_OPS

    try:
        return ALL_OPS[op].load(verbose=False)
    except (ImportError, OSError) as exc:
        if "libcuda.so" in str(exc) and not os.path.exists("/dev/nvidiactl"):
            raise _Skip(f"{op} links the NVIDIA driver (libcuda.so.1) and this machine has none: "
                        "load it on a GPU node") from exc  # fmt: skip
        raise


def check_op_loads(op: str) -> str:
    import deepspeed

    module = _load(op)
    where = os.path.realpath(module.__file__)
    package = os.path.realpath(os.path.dirname(deepspeed.__file__))
    if not where.startswith(package + os.sep):
        raise AssertionError(f"{op} loaded from {where}, not from the installed wheel")
    compiled = _ext_dir_files()
    if compiled:
        raise AssertionError(f"loading {op} wrote to TORCH_EXTENSIONS_DIR (a JIT compile): {compiled[:5]}")
    return f"{op} loaded from {os.path.relpath(where, os.path.dirname(package))}, no JIT"


def _compare(make_ours: Any, make_reference: Any, device: str = "cpu") -> str:
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

    return _compare(
        lambda ps: DeepSpeedCPUAdam(ps, lr=1e-2, weight_decay=0.0, adamw_mode=False),
        lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.0),
    )


def check_cpu_adagrad() -> str:
    import torch
    from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad

    return _compare(
        lambda ps: DeepSpeedCPUAdagrad(ps, lr=1e-2, eps=1e-10),
        lambda ps: torch.optim.Adagrad(ps, lr=1e-2, eps=1e-10),
    )


class _ReferenceLion:
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

    return _compare(
        lambda ps: DeepSpeedCPULion(ps, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0),
        lambda ps: _ReferenceLion(ps, lr=1e-3, betas=(0.9, 0.99)),
    )


def check_fused_adam() -> str:
    import torch

    if not torch.cuda.is_available():
        raise _Skip("no GPU visible: FusedAdam runs only on CUDA tensors")
    from deepspeed.ops.adam import FusedAdam

    return _compare(
        lambda ps: FusedAdam(ps, lr=1e-2, adam_w_mode=False, weight_decay=0.0),
        lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.0),
        device="cuda",
    )


def check_fused_lion() -> str:
    import torch

    if not torch.cuda.is_available():
        raise _Skip("no GPU visible: FusedLion runs only on CUDA tensors")
    from deepspeed.ops.lion import FusedLion

    return _compare(
        lambda ps: FusedLion(ps, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0),
        lambda ps: _ReferenceLion(ps, lr=1e-3, betas=(0.9, 0.99)),
        device="cuda",
    )


class _ReferenceLamb:
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
        raise _Skip("no GPU visible: FusedLamb runs only on CUDA tensors")
    from deepspeed.ops.lamb import FusedLamb

    return _compare(
        lambda ps: FusedLamb(ps, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01),
        lambda ps: _ReferenceLamb(ps, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01),
        device="cuda",
    )


def parse_ds_report(text: str) -> set[str]:
    """The ops ds_report's 'installed' column marks [YES] (colour codes removed)."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)
    return {m.group(1) for m in re.finditer(r"^(\w+)\s*\.*\s*\[YES\]", plain, re.MULTILINE)}


def check_ds_report(spec: dict[str, Any]) -> str:
    """`ds_report` runs and its installed column agrees with the ops the manifest says were built."""
    exe = os.path.join(os.path.dirname(sys.executable), "ds_report")
    done = subprocess.run([exe], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise AssertionError(f"ds_report exited {done.returncode}: {done.stderr[-500:]}")
    installed = parse_ds_report(done.stdout)
    if installed != set(spec["ops"]):
        raise AssertionError(
            f"ds_report lists installed ops {sorted(installed)}, the manifest says {sorted(spec['ops'])}"
        )
    return f"ds_report: installed {', '.join(sorted(installed))}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_engine(accelerator: str) -> str:
    """deepspeed.initialize, ZeRO stage 2 with the optimizer offloaded to CPU: the loss goes down.

    Runs with its own TORCH_EXTENSIONS_DIR and reports any op the engine JIT-compiled that the
    wheel does not carry (on CPU, DeepSpeed's comm layer wants deepspeed_shm_comm).
    """
    import torch

    if accelerator == "cuda" and not torch.cuda.is_available():
        raise _Skip("no GPU visible: DeepSpeed's CUDA accelerator runs the engine over NCCL, which needs GPUs")
    ext = tempfile.mkdtemp(prefix="engine-ext-")
    env_before = dict(os.environ)
    from torch.distributed import TCPStore

    # A store on a port the kernel picked, held by this process: no other can take it (EADDRINUSE).
    store = TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    os.environ.update(
        {
            "TORCH_EXTENSIONS_DIR": ext,
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(store.port),
            "TORCHELASTIC_USE_AGENT_STORE": "True",  # the rendezvous connects to the store held below
        }
    )
    try:
        import deepspeed
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        config = {
            "train_micro_batch_size_per_gpu": 8,
            "optimizer": {"type": "Adam", "params": {"lr": 1e-2}},
            "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
        }
        engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        inner = getattr(optimizer, "optimizer", None)
        if not isinstance(inner, DeepSpeedCPUAdam):
            raise AssertionError(f"ZeRO-Offload did not use DeepSpeedCPUAdam but {type(inner).__name__}")
        device = next(engine.parameters()).device
        x = torch.randn(64, 16)
        y = x.sum(dim=1, keepdim=True)
        losses = []
        for step in range(20):
            i = (step % 8) * 8
            loss = torch.nn.functional.mse_loss(engine(x[i : i + 8].to(device)), y[i : i + 8].to(device))
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
        if not last < first * 0.9:
            raise AssertionError(f"loss did not go down: first steps {first:.4f}, last steps {last:.4f}")
        jit = sorted(os.listdir(ext))
        note = f"; JIT-compiled at init, not in the wheel: {', '.join(jit)}" if jit else "; nothing JIT-compiled"
        return (
            f"ZeRO-2 + CPU offload with {type(inner).__name__}: mean loss {first:.3f} -> {last:.3f} over 20 steps{note}"
        )
    finally:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        os.environ.clear()
        os.environ.update(env_before)


# Quantized logits vs the fp32 model, as max |difference| / max |fp32 logit| on a random tiny
# Llama: measured about 0.02 for int8 and 0.2-0.3 for nf4/fp4 on this machine's CPU.
QUANT_TOLERANCE = {"int8": 0.10, "nf4": 0.60, "fp4": 0.60}


def _tiny_llama(folder: str) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(folder, safe_serialization=True)
    return model


def check_quantized(kind: str, max_memory: dict[Any, str] | None, state: dict[str, Any]) -> str:
    """Load the saved tiny Llama with bitsandbytes and check what really happened to its layers."""
    import torch

    if "folder" not in state:
        state["folder"] = tempfile.mkdtemp(prefix="tiny-llama-")
        model = _tiny_llama(state["folder"])
        state["ids"] = torch.randint(0, 512, (1, 16), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            state["ref"] = model(state["ids"]).logits
        state["fp32_bytes"] = model.get_memory_footprint()
    if torch.cuda.is_available() and kind == "int8":
        cc = torch.cuda.get_device_capability()
        if cc < (7, 5):
            raise _Skip(
                f"GPU compute capability {cc[0]}.{cc[1]} < 7.5: bitsandbytes int8 matmul (igemmlt) "
                "is not available there; use nf4/fp4"
            )
    import bitsandbytes as bnb
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    config = (
        BitsAndBytesConfig(load_in_8bit=True)
        if kind == "int8"
        else BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=kind)
    )
    memory = None if max_memory is None else {**max_memory}
    model = AutoModelForCausalLM.from_pretrained(
        state["folder"], quantization_config=config, device_map="auto", max_memory=memory
    )
    layer = bnb.nn.Linear8bitLt if kind == "int8" else bnb.nn.Linear4bit
    want_dtype = torch.int8 if kind == "int8" else torch.uint8
    plain = [n for n, m in model.named_modules() if type(m) is torch.nn.Linear and not n.endswith("lm_head")]
    quantized = [m for m in model.modules() if isinstance(m, layer)]
    if plain or not quantized:
        raise AssertionError(f"{len(quantized)} {layer.__name__} layers, still plain Linear: {plain[:3]}")
    dtypes = {m.weight.dtype for m in quantized}
    if dtypes != {want_dtype}:
        raise AssertionError(f"{layer.__name__} weights are {dtypes}, expected {want_dtype}")
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(state["ids"].to(device)).logits.float().cpu()
    if not torch.isfinite(logits).all():
        raise AssertionError("logits are not finite")
    rel = ((logits - state["ref"]).abs().max() / state["ref"].abs().max()).item()
    if rel > QUANT_TOLERANCE[kind]:
        raise AssertionError(f"logits differ from fp32 by {rel:.3f} (relative), tolerance {QUANT_TOLERANCE[kind]}")
    generated = model.generate(state["ids"].to(device), max_new_tokens=4, do_sample=False)
    if generated.shape[1] != state["ids"].shape[1] + 4:
        raise AssertionError(f"generate returned shape {tuple(generated.shape)}")
    footprint = model.get_memory_footprint()
    if not footprint < state["fp32_bytes"]:
        raise AssertionError(f"footprint {footprint} is not below fp32's {state['fp32_bytes']}")
    device_map = getattr(model, "hf_device_map", {"": str(device)})
    return (
        f"{len(quantized)} x {layer.__name__} ({want_dtype}), relative logit diff {rel:.3f} "
        f"(tolerance {QUANT_TOLERANCE[kind]}), footprint {footprint / 1e6:.2f} MB vs fp32 "
        f"{state['fp32_bytes'] / 1e6:.2f} MB, hf_device_map {device_map}, generate OK"
    )


def check_fp16_and_offload(state: dict[str, Any]) -> str:
    """The same model in float16, and with one layer offloaded to disk: both match fp32."""
    import torch
    from transformers import AutoModelForCausalLM

    if "folder" not in state:
        raise _Skip("the tiny model was not created (quantized checks did not run)")
    half = AutoModelForCausalLM.from_pretrained(state["folder"], dtype=torch.float16)
    with torch.no_grad():
        d16 = (half(state["ids"]).logits.float() - state["ref"]).abs().max().item()
    device_map = {
        "model.embed_tokens": "cpu",
        "model.layers.0": "cpu",
        "model.layers.1": "disk",
        "model.norm": "cpu",
        "model.rotary_emb": "cpu",
        "lm_head": "cpu",
    }
    offloaded = AutoModelForCausalLM.from_pretrained(
        state["folder"], device_map=device_map, offload_folder=tempfile.mkdtemp(prefix="offload-")
    )
    with torch.no_grad():
        dd = (offloaded(state["ids"]).logits - state["ref"]).abs().max().item()
    if d16 > 0.05 or dd > 1e-5:
        raise AssertionError(f"float16 diff {d16:.3g} (tolerance 0.05), disk-offload diff {dd:.3g} (tolerance 1e-5)")
    return (
        f"float16 max diff {d16:.2g}; disk offload ({offloaded.hf_device_map['model.layers.1']} for "
        f"model.layers.1) max diff {dd:.2g}"
    )


def check_overflow_scan(state: dict[str, Any]) -> str:
    """A short float16 forward under transformers' DebugUnderflowOverflow; reports any inf/nan."""
    import contextlib
    import io

    import torch
    from transformers import AutoModelForCausalLM
    from transformers.debug_utils import DebugUnderflowOverflow

    if "folder" not in state:
        raise _Skip("the tiny model was not created (quantized checks did not run)")
    model = AutoModelForCausalLM.from_pretrained(state["folder"], dtype=torch.float16)
    DebugUnderflowOverflow(model, max_frames_to_save=3)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), torch.no_grad():
        model(state["ids"])
    if "Detected inf/nan" in out.getvalue():
        raise AssertionError("inf/nan in the float16 forward:\n" + out.getvalue()[:1500])
    return "float16 forward: no inf/nan detected"


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
                out, _ = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                out, _ = p.communicate()
                raise AssertionError(f"torchrun timed out after {timeout}s:\n{out[-1500:]}") from None
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
            return run(_free_port())
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
        raise _Skip("no GPU visible: NCCL needs one process per GPU")
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


def _loaded_from(fragment: str) -> list[str]:
    """The files mapped into this process whose path holds `fragment` (which libaio was loaded)."""
    with open("/proc/self/maps", encoding="utf-8") as f:
        return sorted({line.split()[-1] for line in f if fragment in line and "/" in line})


def check_async_io() -> str:
    """Write a tensor to a file and read it back through libaio (O_DIRECT, the op's own handle), and
    say which libaio the process loaded: the wheel's own copy when the wheel carries one."""
    import torch

    aio = _load("async_io")
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

    handle = _load("pin_memory").pin_handle()
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

    utils = _load("utils")
    t = torch.randn(1025)
    ours = utils.cast_to_byte_tensor(t)
    if not torch.equal(ours, t.view(torch.uint8)):
        raise AssertionError("cast_to_byte_tensor differs from torch's byte view")
    many = utils.cast_to_byte_tensor([t, t[:7]])
    if [m.numel() for m in many] != [1025 * 4, 7 * 4]:
        raise AssertionError(f"the list form gave {[m.numel() for m in many]} bytes")
    return "cast_to_byte_tensor equals torch's byte view (one tensor and a list)"


def _isolated(name: str) -> Callable[[], str]:
    """A check run in a child process, so an op that aborts the process fails its own check instead
    of the whole report: DeepSpeed's aio asserts (SIGABRT) when io_pgetevents is refused, which a
    container's seccomp profile may do (podman 4.3's default profile does)."""

    def run() -> str:
        done = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--one", name],
            capture_output=True, text=True, errors="replace", timeout=900, check=False,
        )  # fmt: skip
        _, sep, payload = done.stdout.rpartition(MARKER)
        if done.returncode != 0 or not sep:
            why = f"signal {-done.returncode}" if done.returncode < 0 else f"exit status {done.returncode}"
            tail = " | ".join(done.stderr.strip().splitlines()[-3:])[-600:]
            hint = ""
            if "n_completes >= min_completes" in done.stderr:
                hint = " (io_pgetevents failed: a container's seccomp profile may deny it; podman's default does)"
            raise AssertionError(f"the check's process died ({why}){hint}: {tail}")
        result = json.loads(payload.strip().splitlines()[0])
        if result["status"] == "skipped":
            raise _Skip(result["detail"])
        if result["status"] == "failed":
            raise AssertionError(result["detail"])
        return str(result["detail"])

    return run


def _one(name: str) -> None:
    """`--one CHECK`: run one numerics check and print its result after the marker (_isolated)."""
    results: list[dict[str, str]] = []
    _check(results, f"numerics:{name}", NUMERICS[name])
    print(MARKER)
    print(json.dumps(results[0]))


ISOLATED = ("async_io",)  # checks that may abort the process
NUMERICS = {
    "async_io": check_async_io,
    "pin_memory": check_pin_memory,
    "utils": check_utils,
    "cpu_adam": check_cpu_adam,
    "cpu_adagrad": check_cpu_adagrad,
    "cpu_lion": check_cpu_lion,
    "fused_adam": check_fused_adam,
    "fused_lion": check_fused_lion,
    "fused_lamb": check_fused_lamb,
}


def main() -> None:
    if sys.argv[1] == "--one":
        _one(sys.argv[2])
        return
    spec = json.loads(sys.argv[1])
    results: list[dict[str, str]] = []
    if _ext_dir_files():
        raise SystemExit("TORCH_EXTENSIONS_DIR is not empty at the start")
    _check(results, "torch", lambda: check_torch(spec["torch"]))
    _check(results, "import", lambda: check_import(spec["version"]))
    for op in spec["ops"]:
        _check(results, f"load:{op}", functools.partial(check_op_loads, op))
    for op in spec["ops"]:
        numerics: Callable[[], str | None] = functools.partial(_unchecked, op, spec["accelerator"])
        if op in NUMERICS:
            numerics = _isolated(op) if op in ISOLATED else NUMERICS[op]
        _check(results, f"numerics:{op}", numerics)
    _check(results, "no-jit", lambda: _no_jit())
    if spec["accelerator"] == "cuda":
        _check(results, "no-toolkit", check_no_toolkit)
    suite = spec.get("suite", "full")
    if suite in ("full", "image"):
        _check(results, "ds_report", lambda: check_ds_report(spec))
        _check(results, "engine:zero2-offload", lambda: check_engine(spec["accelerator"]))
        # Inside a CI image the model-loading checks are skipped with the reason (see _in_image).
        check = _check if suite == "full" else _in_image
        state: dict[str, Any] = {}
        for kind in ("int8", "nf4", "fp4"):
            check(results, f"quantized:{kind}:auto", functools.partial(check_quantized, kind, None, state))
        for kind in ("int8", "nf4"):
            check(
                results,
                f"quantized:{kind}:max_memory",
                functools.partial(lambda k: check_quantized(k, _max_memory(), state), kind),
            )
        check(results, "load:fp16+disk-offload", lambda: check_fp16_and_offload(state))
        check(results, "overflow-scan:fp16", lambda: check_overflow_scan(state))
        worker = spec["dist_worker"]
        _check(results, "dist:gloo:1x2", lambda: check_gloo_one_node(worker))
        _check(results, "dist:gloo:2-nodes", lambda: check_gloo_two_nodes(worker))
        _check(results, "dist:nccl", lambda: check_nccl(worker))
    print(MARKER)
    print(json.dumps(results))


def _in_image(results: list[dict[str, str]], name: str, fn: Callable[[], str | None]) -> None:
    """A check that loads a model with transformers and bitsandbytes, skipped inside a CI image with
    the reason: the image holds what its lock pins, and those are not DeepSpeed's dependencies; the
    wheel's own smoke ran the check before the wheel was published."""
    del fn
    results.append({"name": name, "status": "skipped",
                    "detail": "the image holds its lock's packages only (no transformers or bitsandbytes); the "
                              "wheel's own smoke ran this check before publish"})  # fmt: skip


def _unchecked(op: str, accelerator: str) -> str:
    """An op with no check of what it computes: said, with why, in the op table (a skip)."""
    import torch

    if accelerator == "cuda" and not torch.cuda.is_available():
        raise _Skip(f"no GPU visible: {op} computes on CUDA tensors (it loads from the wheel: load:{op})")
    raise _Skip(f"no check of what {op} computes is written yet; it loads from the wheel (load:{op})")


def _max_memory() -> dict[Any, str]:
    import torch

    if torch.cuda.is_available():
        return {0: "20GiB", "cpu": "4GiB"}
    return {"cpu": "4GiB"}


def check_no_toolkit() -> str:
    """The checks above ran as on a GPU node with no CUDA toolkit: torch finds none (smoke unset
    CUDA_HOME and took nvcc off PATH; torch's last fallback is /usr/local/cuda)."""
    from torch.utils import cpp_extension

    if cpp_extension.CUDA_HOME:
        raise _Skip(
            f"torch still finds a CUDA toolkit at {cpp_extension.CUDA_HOME} (its /usr/local/cuda fallback), so "
            "this machine cannot show that the wheel works without one; smoke it where no toolkit is installed"
        )
    return "torch sees no CUDA toolkit (no CUDA_HOME, no nvcc): import, ds_report and every op load ran without one"


def _no_jit() -> str:
    files = _ext_dir_files()
    if files:
        raise AssertionError(f"TORCH_EXTENSIONS_DIR is not empty after the checks: {files[:5]}")
    return "TORCH_EXTENSIONS_DIR stayed empty"


if __name__ == "__main__":
    main()
