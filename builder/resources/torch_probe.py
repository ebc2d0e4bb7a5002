"""Run by the Python whose torch detect inspects: its version, CUDA, ABI, archs, NCCL, GPUs.

Standard library and torch only; prints one JSON line (or {"error": ...} when torch is unusable).
"""

import glob
import json
import os
import sysconfig
from typing import Any


def main() -> None:
    try:
        import torch
    except Exception as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        return
    site = sysconfig.get_paths()["purelib"]
    out: dict[str, Any] = {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        "site_packages": site,
        "arch_list": [],
        "nccl": None,
        "gpus": [],
        "pip_cuda_include": sorted(glob.glob(os.path.join(site, "nvidia", "*", "include"))),
    }
    if torch.version.cuda:
        out["arch_list"] = torch.cuda.get_arch_list() if torch.cuda.is_available() else []
        try:
            v = torch.cuda.nccl.version()
            out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception:
            pass
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                out["gpus"].append([i, p.name, f"{p.major}.{p.minor}", p.total_memory // (1 << 20)])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
