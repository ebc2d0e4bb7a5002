"""What a config's failure means, in the words the report uses: DeepSpeed refusing the config on
this accelerator, rejecting its contents, an op the wheel lacks, a time limit, or anything else.
"""

from __future__ import annotations

import json
import os
import traceback
from typing import Any

from builder.resources.config_check.jit import NOT_IMPLEMENTED, jit_allowed, jit_asked, refused_loads

# What torch.compile says where no compiler is found: inductor's CPU code (C++), and Triton's launcher on
# a GPU ("Failed to find C compiler. Please specify via CC environment variable": DeepSpeed 0.19.8's Muon
# on an H200 node). Checked after the wheel's own JIT, which is still a missing op.
NO_COMPILER = ("InvalidCxxCompiler", "No working C++ compiler", "Failed to find C compiler")
# Where torch's compile path runs: a failure is "needs a compiler" only when raised there, never for a
# phrase in a config's error (an optimizer named "Failed to find C compiler" is a rejected config).
COMPILE_PATH = (f"{os.sep}torch{os.sep}_inductor{os.sep}", f"{os.sep}torch{os.sep}_dynamo{os.sep}",
                f"{os.sep}triton{os.sep}")  # fmt: skip
NEEDS_COMPILER = "torch.compile (inductor) compiles code"  # the detail's start (node.tables reads it)


def classify(exc: BaseException) -> tuple[str, str]:
    text = f"{type(exc).__name__}: {exc}".strip()
    if jit_asked and not jit_allowed():
        return "needs-op", f"needs {', '.join(jit_asked)}, which the installed wheel lacks ({text.splitlines()[0]})"
    if _from_compile_path(exc) and any(said in text for said in NO_COMPILER):
        return "needs-compiler", (
            f"{NEEDS_COMPILER} for this config at first use, which needs a compiler on the "
            "node (a C++ compiler for its CPU code, a C compiler for Triton's GPU launcher: gcc); torch's need, "
            f"not the wheel's, and no prebuilt wheel can carry it ({text.splitlines()[0]})"
        )
    if refused_loads or NOT_IMPLEMENTED in text:
        return "unsupported", text
    names = {type(e).__name__ for e in _chain(exc)}
    frames = traceback.extract_tb(exc.__traceback__)
    if names & {"ValidationError", "DeepSpeedConfigError"} or _checks_the_config(frames, text):
        return "invalid", " ".join(text.split())[:600]
    if frames and f"{os.sep}deepspeed{os.sep}" in frames[-1].filename:
        return "unsupported", text
    return "failed", text + "\n" + "".join(traceback.format_exception(exc, limit=-4))[-1500:]


def _from_compile_path(exc: BaseException) -> bool:
    """Whether any exception of the chain was raised inside torch's compile path (inductor, dynamo,
    Triton): the structure of the failure, not its words."""
    return any(
        any(marker in frame.filename for marker in COMPILE_PATH)
        for e in _chain(exc)
        for frame in traceback.extract_tb(e.__traceback__)
    )


_CONFIG_FILE = os.path.join("deepspeed", "runtime", "config.py")


def _checks_the_config(frames: Any, text: str) -> bool:
    """Whether the error came from DeepSpeed checking the config's contents, not from running it: its
    config module's asserts (`train_batch_size: NaN`), an optimizer name it does not have. Its other
    sanity checks (Lamb needs dynamic loss scaling) say what DeepSpeed supports, and stay so."""
    return any(f.filename.endswith(_CONFIG_FILE) for f in frames[-2:]) or UNKNOWN_OPTIMIZER in text


UNKNOWN_OPTIMIZER = "is not a supported DeepSpeed Optimizer"


def _chain(exc: BaseException | None) -> list[BaseException]:
    out = []
    while exc is not None and exc not in out:
        out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out


TIMED_OUT = "did not finish within"  # a config's detail when it hit its limit (again_alone reads it)


def explain(result: dict[str, Any], accelerator: str) -> str:
    """One line for people: what the result means and what to do."""
    detail = str(result.get("detail", ""))
    first = detail.splitlines()[0] if detail else ""
    status, jit = result["status"], list(result.get("jit", []))
    if status == "passed":
        return f"runs from the wheel: ops {', '.join(result.get('ops', [])) or 'none'}; {first}"
    if status == "needs-op":
        add = ", ".join(json.dumps(o) for o in jit)
        return f"needs op {', '.join(jit)}, which the wheel lacks: add {add} to the recipe's ops"
    if status == "unsupported":
        return f"not supported by DeepSpeed on {accelerator}: {first}"
    if status == "invalid":
        return "DeepSpeed rejects the config: " + " ".join(detail.split())[:400]
    return first
