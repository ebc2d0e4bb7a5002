"""A model through DeepSpeed's engine: ZeRO-2 with CPU offload, quantized loads with transformers
and bitsandbytes, fp16 with disk offload, and an overflow scan.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

from builder.resources.smoke.common import Skip


def check_engine(accelerator: str) -> str:
    """deepspeed.initialize, ZeRO stage 2 with the optimizer offloaded to CPU: the loss goes down.

    Runs with its own TORCH_EXTENSIONS_DIR and reports any op the engine JIT-compiled that the
    wheel does not carry (on CPU, DeepSpeed's comm layer wants deepspeed_shm_comm).
    """
    import torch

    if accelerator == "cuda" and not torch.cuda.is_available():
        raise Skip("no GPU visible: DeepSpeed's CUDA accelerator runs the engine over NCCL, which needs GPUs")
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
            raise Skip(
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
        raise Skip("the tiny model was not created (quantized checks did not run)")
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
        raise Skip("the tiny model was not created (quantized checks did not run)")
    model = AutoModelForCausalLM.from_pretrained(state["folder"], dtype=torch.float16)
    DebugUnderflowOverflow(model, max_frames_to_save=3)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), torch.no_grad():
        model(state["ids"])
    if "Detected inf/nan" in out.getvalue():
        raise AssertionError("inf/nan in the float16 forward:\n" + out.getvalue()[:1500])
    return "float16 forward: no inf/nan detected"


def in_image(results: list[dict[str, str]], name: str, fn: Callable[[], str | None]) -> None:
    """A check that loads a model with transformers and bitsandbytes, skipped inside a CI image with
    the reason: the image holds what its lock pins, and those are not DeepSpeed's dependencies; the
    wheel's own smoke ran the check before the wheel was published."""
    del fn
    results.append({"name": name, "status": "skipped",
                    "detail": "the image holds its lock's packages only (no transformers or bitsandbytes); the "
                              "wheel's own smoke ran this check before publish"})  # fmt: skip


def max_memory() -> dict[Any, str]:
    import torch

    if torch.cuda.is_available():
        return {0: "20GiB", "cpu": "4GiB"}
    return {"cpu": "4GiB"}
