"""Every op DeepSpeed asks its builders for, recorded; a compile at first use (the builder's
jit_load, torch's cpp_extension.load and load_inline) refused and recorded instead of run, or,
where the caller allows it, recorded and run.
"""

from __future__ import annotations

import os
from typing import Any

MARKER = "==== config runner json ===="
STEPS = 3
NOT_IMPLEMENTED = (
    "not been implemented"  # DeepSpeed's NotImplementedBuilder: "This op had not been implemented on CPU backend."
)

loaded_ops: list[str] = []
jit_asked: list[str] = []
refused_loads: list[str] = []
_intercepted: list[bool] = []


class JitRefused(RuntimeError):
    """Raised where DeepSpeed would have compiled an op at first use."""


load_stack: list[str] = []  # the builders whose load() is running (async_io's load loads pin_memory first)


def _record_load(load: Any) -> Any:
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        load_stack.append(self.name)
        try:
            module = load(self, *args, **kwargs)
        except JitRefused:
            raise
        except Exception as exc:
            if NOT_IMPLEMENTED in str(exc):
                refused_loads.append(f"{self.name}: {exc}")
            raise
        finally:
            load_stack.pop()
        if self.name not in loaded_ops:
            loaded_ops.append(self.name)
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
    for name in [self.name, *reversed(load_stack)]:
        if name not in jit_asked and (name == self.name or not _installed(name)):
            jit_asked.append(name)
    raise JitRefused(f"DeepSpeed tried to JIT-compile the op {self.name}: it is not in the installed wheel")


def _refuse_cpp_load(name: str, *args: Any, **kwargs: Any) -> Any:
    del args, kwargs
    if name not in jit_asked:
        jit_asked.append(name)
    raise JitRefused(f"torch.utils.cpp_extension was asked to compile {name} at first use")


# The reference run (the smoke's blame of a failure): DeepSpeed with none of the wheel's ops, compiling
# at first use what it needs as upstream does, into one extensions folder every config shares. On the CPU
# accelerator the engine compiles deepspeed_shm_comm at initialize: with JIT refused no config runs at all.
ALLOW_JIT_ENV = "DS_CONFIG_RUNNER_ALLOW_JIT"  # the shared TORCH_EXTENSIONS_DIR; set: compiles are recorded, run


def jit_allowed() -> str:
    return os.environ.get(ALLOW_JIT_ENV, "")


def _record_jit(jit_load: Any) -> Any:
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.name not in jit_asked:
            jit_asked.append(self.name)
        return jit_load(self, *args, **kwargs)

    wrapper.__wrapped__ = jit_load  # type: ignore[attr-defined]
    return wrapper


def _wrap(cls: Any) -> None:
    if "load" in cls.__dict__ and not hasattr(cls.__dict__["load"], "__wrapped__"):
        cls.load = _record_load(cls.__dict__["load"])
    if "jit_load" in cls.__dict__ and not hasattr(cls.__dict__["jit_load"], "__wrapped__"):
        cls.jit_load = _record_jit(cls.__dict__["jit_load"]) if jit_allowed() else _refuse_jit


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
    if not jit_allowed():
        cpp.load = _refuse_cpp_load
        cpp.load_inline = _refuse_cpp_load
