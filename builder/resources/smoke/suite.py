"""The smoke suite: which checks run for a wheel (its ops, its accelerator, the full suite or the
one inside a CI image), each check that may abort its process run in a child, the report printed
after the marker.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from builder.resources.smoke.common import MARKER, Skip, ext_dir_files, record, seconds
from builder.resources.smoke.dist import check_gloo_one_node, check_gloo_two_nodes, check_nccl
from builder.resources.smoke.engine import (
    check_engine,
    check_fp16_and_offload,
    check_overflow_scan,
    check_quantized,
    in_image,
    max_memory,
)
from builder.resources.smoke.numerics import (
    check_async_io,
    check_cpu_adagrad,
    check_cpu_adam,
    check_cpu_lion,
    check_fused_adam,
    check_fused_lamb,
    check_fused_lion,
    check_pin_memory,
    check_quantizer,
    check_transformer_inference,
    check_utils,
)
from builder.resources.smoke.wheel import (
    check_ds_report,
    check_import,
    check_no_toolkit,
    check_op_loads,
    check_torch,
    no_jit,
    unchecked,
)


def _isolated(name: str) -> Callable[[], str]:
    """A check run in a child process, so an op that aborts the process fails its own check instead
    of the whole report: DeepSpeed's aio asserts (SIGABRT) when io_pgetevents is refused, which a
    container's seccomp profile may do (podman 4.3's default profile does)."""

    def run() -> str:
        done = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--one", name],
            capture_output=True, text=True, errors="replace", timeout=seconds(900), check=False,
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
            raise Skip(result["detail"])
        if result["status"] == "failed":
            raise AssertionError(result["detail"])
        return str(result["detail"])

    return run


def _one(name: str) -> None:
    """`--one CHECK`: run one numerics check and print its result after the marker (_isolated)."""
    results: list[dict[str, str]] = []
    record(results, f"numerics:{name}", NUMERICS[name])
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
    "quantizer": check_quantizer,
    "transformer_inference": check_transformer_inference,
}


def main() -> None:
    if sys.argv[1] == "--one":
        _one(sys.argv[2])
        return
    spec = json.loads(sys.argv[1])
    results: list[dict[str, str]] = []
    if ext_dir_files():
        raise SystemExit("TORCH_EXTENSIONS_DIR is not empty at the start")
    record(results, "torch", lambda: check_torch(spec["torch"]))
    record(results, "import", lambda: check_import(spec["version"], spec.get("record")))
    for op in spec["ops"]:
        record(results, f"load:{op}", functools.partial(check_op_loads, op))
    for op in spec["ops"]:
        numerics: Callable[[], str | None] = functools.partial(unchecked, op, spec["accelerator"])
        if op in NUMERICS:
            numerics = _isolated(op) if op in ISOLATED else NUMERICS[op]
        record(results, f"numerics:{op}", numerics)
    record(results, "no-jit", lambda: no_jit())
    if spec["accelerator"] == "cuda":
        record(results, "no-toolkit", check_no_toolkit)
    suite = spec.get("suite", "full")
    if suite in ("full", "image"):
        record(results, "ds_report", lambda: check_ds_report(spec))
        record(results, "engine:zero2-offload", lambda: check_engine(spec["accelerator"]))
        # Inside a CI image the model-loading checks are skipped with the reason (see in_image).
        check = record if suite == "full" else in_image
        state: dict[str, Any] = {}
        for kind in ("int8", "nf4", "fp4"):
            check(results, f"quantized:{kind}:auto", functools.partial(check_quantized, kind, None, state))
        for kind in ("int8", "nf4"):
            check(
                results,
                f"quantized:{kind}:max_memory",
                functools.partial(lambda k: check_quantized(k, max_memory(), state), kind),
            )
        check(results, "load:fp16+disk-offload", lambda: check_fp16_and_offload(state))
        check(results, "overflow-scan:fp16", lambda: check_overflow_scan(state))
        worker = spec["dist_worker"]
        record(results, "dist:gloo:1x2", lambda: check_gloo_one_node(worker))
        record(results, "dist:gloo:2-nodes", lambda: check_gloo_two_nodes(worker))
        record(results, "dist:nccl", lambda: check_nccl(worker))
    print(MARKER)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
