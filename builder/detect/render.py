"""The human-readable table of a detect report."""

from __future__ import annotations

from builder.detect.model import (
    Report,
)


def render_table(report: Report) -> str:
    """The human-readable report."""
    rows: list[tuple[str, str]] = []
    if report.gpus:
        for g in report.gpus:
            rows.append((f"GPU {g.index}", f"{g.name}, compute capability {g.capability}, {g.memory_mib} MiB"))
        rows.append(("arch list", ";".join(report.arch_list)))
    else:
        rows.append(("GPUs", "none visible"))
    rows.append(("GPU source", report.gpu_source))
    rows.append(("driver", f"{report.driver or '-'} (CUDA {report.driver_cuda or '-'})"))
    for t in report.toolkits:
        mark = "*" if t.root == report.chosen_toolkit else " "
        host = t.host_range
        limits = f"gcc <= {host.gcc_max}, clang <= {host.clang_max} ({host.source})" if host else "unknown"
        rows.append((f"{mark}CUDA {t.version}", f"{t.root} via {', '.join(t.found_by)}; host {limits}"))
        if t.missing_headers:
            rows.append(("  lacks", ", ".join(t.missing_headers)))
    if not report.toolkits:
        rows.append(("CUDA toolkits", "none found"))
    tf = report.torch
    if tf.version:
        rows.append(("torch", f"{tf.version} (CUDA {tf.cuda or 'none'}, C++11 ABI {tf.cxx11_abi}) in {tf.python}"))
        if tf.pip_cuda_include:
            rows.append(("pip CUDA headers", ", ".join(tf.pip_cuda_include)))
    else:
        rows.append(("torch", f"not usable in {tf.python}: {tf.error}"))
    for c in report.compilers:
        rows.append((c.name, f"{c.version} ({c.path})"))
    rows.append(("CPU", f"{report.cpu.brand}; SIMD {' '.join(report.cpu.simd)}"))
    libs = report.libraries
    rows.append(("libraries", f"libaio {'yes' if libs.libaio else 'no'}, cufile {libs.cufile or 'no'}, "
                              f"NCCL {libs.nccl or 'no'}"))  # fmt: skip
    if report.deepspeed_ops:
        good = [n for n, o in sorted(report.deepspeed_ops.items()) if o["compatible"]]
        rows.append(("DeepSpeed ops", f"buildable here: {', '.join(good)}"))
        for name, op in sorted(report.deepspeed_ops.items()):
            if not op["compatible"]:
                rows.append((f"  {name}", f"not buildable: {op['why'][:160] or 'DeepSpeed says incompatible'}"))
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    for p in report.problems:
        lines.append(f"{p.severity.upper()}: {p.message}\n  fix: {p.fix}")
    return "\n".join(lines) + "\n"
