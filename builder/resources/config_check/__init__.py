"""Run DeepSpeed configs the way a user does, and record every op DeepSpeed asks its builders for.

Run as one file, built from this package by builder/bundle.py (`builder.configs.checker_source`;
published as tools/ds-config-check.py), by an environment's Python (standard library, torch and
DeepSpeed only), on a build host against a wheel's fresh environment or on a node against what is
installed:
    python ds-config-check.py '{"configs": [{"name": ..., "config": {...}}], "accelerator": "cpu"}'
Each config runs in processes of its own (forked after one import of DeepSpeed, so a matrix of
dozens costs seconds, and a config that hangs or aborts is that config's failure only), with an
empty TORCH_EXTENSIONS_DIR: `deepspeed.initialize` on a small model and a few steps. Every
builder's load() is recorded, and a JIT compile is refused and recorded instead of run (the
builder's jit_load and torch's cpp_extension.load/load_inline), so nothing compiles silently.
Results (one per config, in order) are printed as JSON after the MARKER line:
  passed       ran its steps, loss finite; `ops` are the ops it loaded, all from the installed wheel
  needs-op     DeepSpeed asked for an op the wheel lacks (`jit`): the config cannot run without a compiler
  unsupported  DeepSpeed itself refused the config on this accelerator (its error in `detail`)
  needs-compiler  torch.compile compiles at first use (Muon on CPU): no wheel can carry that
  invalid      DeepSpeed rejected the config's contents (its validation error in `detail`)
  no-gpu       a CUDA config where no GPU is visible (nothing ran)
  failed       anything else: a crash, a time limit, a loss that is not finite
"""

# The modules in the order the one file holds them: each imports only those before it.
BUNDLE = ("jit", "outcome", "screen", "rank", "pool", "cli")
