"""Ask DeepSpeed's own op builders which ops exist for an accelerator, and torch what it is.

Run as a script by the build environment's Python with the DeepSpeed source as working directory
(it imports `op_builder` and `accelerator` from there, exactly as DeepSpeed's setup.py does), so
the op list is DeepSpeed's, not a hand-kept copy. Standard library only besides torch/DeepSpeed.
Prints one JSON document after the MARKER line; everything before it is DeepSpeed's own chatter.

With an arch list as its argument ("8.0;9.0+PTX") it also asks every op's `filter_ccs`, before
anything compiles, which of those archs the op accepts: DeepSpeed drops the others silently
while building (and narrows the list for the ops built after it).
"""

import contextlib
import functools
import importlib.util
import io
import json
import sys
from typing import Any

MARKER = "==== ds_probe json ===="
BUILD_MODULES = ("dskernels",)


def _sources(builder: Any) -> list[Any]:
    try:
        return builder.sources()
    except Exception:  # some builders compute sources from the accelerator; no .cu then
        return []


def _builder_list(builder: Any, method: str) -> list[str]:
    """What the op's builder's `method` lists, empty entries dropped and its chatter silenced: [] if
    it cannot say. cxx_args: its flag set, less torch's own; include_paths: its -I folders (relative
    ones are in the source tree)."""
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            return [str(a) for a in builder.strip_empty_entries(getattr(builder, method)())]
        except Exception:
            return []


def _accepted(builder: Any, archs: list[str]) -> list[str] | None:
    """The requested archs this op's builder keeps, in torch's spelling; None if it cannot say."""
    if not archs or not hasattr(builder, "filter_ccs"):
        return None
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            kept = builder.filter_ccs(list(archs))
        except Exception:
            return None
    kept_pairs = {(str(cc[0]), str(cc[1]).split("+")[0]) for cc in kept}
    return [a for a in archs if tuple(a.split("+")[0].split(".")) in kept_pairs]


def _cpu_info_once() -> None:
    """py-cpuinfo asked once for the whole probe: every CPU op builder asks it twice (cpu_arch,
    simd_width) where the recipe's CPU target does not answer first, and each call starts a process
    (2.2 s an op here). The machine does not change while the probe runs."""
    try:
        import cpuinfo
    except ImportError:
        return
    cpuinfo.get_cpu_info = functools.lru_cache(maxsize=None)(cpuinfo.get_cpu_info)


def main() -> None:
    archs = [a for a in (sys.argv[1] if len(sys.argv) > 1 else "").split(";") if a]
    sys.path.insert(0, ".")
    _cpu_info_once()
    import torch
    from op_builder.all_ops import ALL_OPS, accelerator_name

    ops = {}
    for name, builder in sorted(ALL_OPS.items()):
        said = io.StringIO()
        with contextlib.redirect_stdout(said):
            try:
                compatible = bool(builder.is_compatible(verbose=True))
            except Exception as exc:  # a broken check is an incompatibility, with its reason
                compatible = False
                print(f"is_compatible() raised {type(exc).__name__}: {exc}")
        why = " ".join(
            line.replace("\x1b[93m", "").replace("\x1b[0m", "").replace("[WARNING]", "").strip()
            for line in said.getvalue().splitlines()
            if line.strip()
        )
        ops[name] = {
            "build_var": getattr(builder, "BUILD_VAR", ""),
            "module": builder.absolute_name(),
            "compatible": compatible,
            "why": "" if compatible else why,
            "device_code": any(str(src).endswith(".cu") for src in _sources(builder)),
            "sources": [str(src) for src in _sources(builder)],
            "cxx_args": _builder_list(builder, "cxx_args"),
            "include_paths": _builder_list(builder, "include_paths"),
            "accepted_archs": _accepted(builder, archs),
        }
    report = {
        "accelerator": accelerator_name,
        "torch": {
            "version": torch.__version__,
            "cuda": torch.version.cuda,
            "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        },
        "python_tag": f"cp{sys.version_info.major}{sys.version_info.minor}",
        "ops": ops,
        # Packages some op builders import while building, which their compatibility check does
        # not look for (cutlass_ops and ragged_device_ops import dskernels).
        "modules": {name: importlib.util.find_spec(name) is not None for name in BUILD_MODULES},
    }
    print(MARKER)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
