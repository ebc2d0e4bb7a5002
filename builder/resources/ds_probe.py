"""Ask DeepSpeed's own op builders which ops exist for an accelerator, and torch what it is.

Run as a script by the build environment's Python with the DeepSpeed source as working directory
(it imports `op_builder` and `accelerator` from there, exactly as DeepSpeed's setup.py does), so
the op list is DeepSpeed's, not a hand-kept copy. Standard library only besides torch/DeepSpeed.
Prints one JSON document after the MARKER line; everything before it is DeepSpeed's own chatter.
"""

import contextlib
import io
import json
import sys
from typing import Any

MARKER = "==== ds_probe json ===="


def _sources(builder: Any) -> list[Any]:
    try:
        return builder.sources()
    except Exception:  # some builders compute sources from the accelerator; no .cu then
        return []


def main() -> None:
    sys.path.insert(0, ".")
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
    }
    print(MARKER)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
