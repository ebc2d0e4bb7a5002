"""What the installed wheel is: the DeepSpeed and torch it was built for, each op loading from the
wheel's own files with nothing compiled, ds_report's view, and no CUDA toolkit needed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

from builder.resources.smoke.common import Skip, ext_dir_files, seconds


def check_import(expected_version: str, record: str | None = None) -> str:
    """DeepSpeed imports, and it is the wheel: every file its RECORD lists, byte for byte (a version
    string proves nothing: the node's own DeepSpeed of the same version once passed for it)."""
    import deepspeed

    if deepspeed.__version__ != expected_version:
        raise AssertionError(f"deepspeed.__version__ is {deepspeed.__version__}, expected {expected_version}")
    where = os.path.dirname(deepspeed.__file__)
    if record is None:
        return f"deepspeed {deepspeed.__version__} from {where}"
    compared = compare_record(os.path.dirname(where), record)
    return f"deepspeed {deepspeed.__version__} from {where}: {compared} files the wheel's RECORD lists, byte for byte"


def compare_record(site: str, record: str) -> int:
    """Each file of `record` (the wheel's RECORD lines) under `site` has the sha256 the wheel says;
    AssertionError names the first that differs or is missing. The number compared."""
    import base64
    import hashlib

    wrong: list[str] = []
    count = 0
    with open(record, encoding="utf-8") as f:
        for line in f:
            path, _, rest = line.rstrip("\n").partition(",")
            algorithm, _, want = rest.partition(",")[0].partition("=")
            if algorithm != "sha256" or not path:
                continue
            count += 1
            try:
                with open(os.path.join(site, path), "rb") as installed:
                    got = base64.urlsafe_b64encode(hashlib.sha256(installed.read()).digest()).rstrip(b"=").decode()
            except OSError:
                got = "missing"
            if got != want:
                wrong.append(f"{path} ({'missing' if got == 'missing' else 'other bytes'})")
    if wrong:
        raise AssertionError(f"the DeepSpeed imported from {site} is not the wheel's: {len(wrong)} of {count} files "
                             f"differ from its RECORD, e.g. {', '.join(wrong[:3])}")  # fmt: skip
    if count == 0:
        raise AssertionError("the wheel's RECORD lists no DeepSpeed file to compare")
    return count


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


def load_op(op: str) -> Any:
    """The op's module as DeepSpeed loads it; an op linked against the NVIDIA driver (async_io and
    gds of a CUDA build) cannot load where there is none, which is a missing-hardware skip."""
    from deepspeed.ops.op_builder.all_ops import ALL_OPS

    try:
        return ALL_OPS[op].load(verbose=False)
    except (ImportError, OSError) as exc:
        if "libcuda.so" in str(exc) and not os.path.exists("/dev/nvidiactl"):
            raise Skip(f"{op} links the NVIDIA driver (libcuda.so.1) and this machine has none: "
                        "load it on a GPU node") from exc  # fmt: skip
        raise


def check_op_loads(op: str) -> str:
    import deepspeed

    module = load_op(op)
    where = os.path.realpath(module.__file__)
    package = os.path.realpath(os.path.dirname(deepspeed.__file__))
    if not where.startswith(package + os.sep):
        raise AssertionError(f"{op} loaded from {where}, not from the installed wheel")
    compiled = ext_dir_files()
    if compiled:
        raise AssertionError(f"loading {op} wrote to TORCH_EXTENSIONS_DIR (a JIT compile): {compiled[:5]}")
    return f"{op} loaded from {os.path.relpath(where, os.path.dirname(package))}, no JIT"


def parse_ds_report(text: str) -> set[str]:
    """The ops ds_report's 'installed' column marks [YES] (colour codes removed)."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)
    return {m.group(1) for m in re.finditer(r"^(\w+)\s*\.*\s*\[YES\]", plain, re.MULTILINE)}


def check_ds_report(spec: dict[str, Any]) -> str:
    """`ds_report` runs and its installed column agrees with the ops the manifest says were built."""
    exe = os.path.join(os.path.dirname(sys.executable), "ds_report")
    done = subprocess.run([exe], capture_output=True, text=True, timeout=seconds(300))
    if done.returncode != 0:
        raise AssertionError(f"ds_report exited {done.returncode}: {done.stderr[-500:]}")
    installed = parse_ds_report(done.stdout)
    if installed != set(spec["ops"]):
        raise AssertionError(
            f"ds_report lists installed ops {sorted(installed)}, the manifest says {sorted(spec['ops'])}"
        )
    return f"ds_report: installed {', '.join(sorted(installed))}"


def unchecked(op: str, accelerator: str) -> str:
    """An op with no check of what it computes: said, with why, in the op table (a skip)."""
    import torch

    if accelerator == "cuda" and not torch.cuda.is_available():
        raise Skip(f"no GPU visible: {op} computes on CUDA tensors (it loads from the wheel: load:{op})")
    raise Skip(f"no check of what {op} computes is written yet; it loads from the wheel (load:{op})")


def check_no_toolkit() -> str:
    """The checks above ran as on a GPU node with no CUDA toolkit: torch finds none (smoke unset
    CUDA_HOME and took nvcc off PATH; torch's last fallback is /usr/local/cuda)."""
    from torch.utils import cpp_extension

    if cpp_extension.CUDA_HOME:
        raise Skip(
            f"torch still finds a CUDA toolkit at {cpp_extension.CUDA_HOME} (its /usr/local/cuda fallback), so "
            "this machine cannot show that the wheel works without one; smoke it where no toolkit is installed"
        )
    return "torch sees no CUDA toolkit (no CUDA_HOME, no nvcc): import, ds_report and every op load ran without one"


def no_jit() -> str:
    files = ext_dir_files()
    if files:
        raise AssertionError(f"TORCH_EXTENSIONS_DIR is not empty after the checks: {files[:5]}")
    return "TORCH_EXTENSIONS_DIR stayed empty"
