"""The smoke checks, run in a fresh environment where only torch and the DeepSpeed wheel (and the
smoke's extras) are installed, by that environment's Python: standard library at import, torch,
DeepSpeed, transformers and bitsandbytes inside the checks that need them.

A module per what it checks (BUNDLE below, in the order they build on each other). The smoke runs
them as one file, built from this package by builder/bundle.py (`builder.smoke.write_checks`):
    python smoke_checks.py '{"version": ..., "ops": [...]}'
Each check records passed, failed (with why) or skipped (with why). The JSON report is printed
after the MARKER line. TORCH_EXTENSIONS_DIR must point at an empty folder: if any op were
JIT-compiled instead of loaded from the wheel, files would appear there and the check fails.
"""

# The modules in the order the one file holds them: each imports only those before it.
BUNDLE = ("common", "wheel", "numerics", "engine", "dist", "suite")
