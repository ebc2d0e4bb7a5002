"""The build key: a hash of everything that determines a wheel, so an unchanged recipe is not rebuilt.

`key_inputs` and `build_key` are pure. `gather` asks the machine only cheap questions (toolkit
and compiler versions, the installed torch's version for "system" recipes, the GPUs for
arch = "auto"), so deciding "up to date" takes well under the time of any build step.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder import __version__
from builder.buildroot import sandbox
from builder.cmd import query
from builder.detect import arch_list, probe_compilers, probe_gpus, probe_toolkits
from builder.glibc import HOST
from builder.recipe import Recipe
from builder.wheelbuild.cudakit import search_roots

# Variables that change what the compilers produce (MAX_JOBS and friends only change how fast).
RELEVANT_ENV = (
    "CC", "CXX", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "CPATH", "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS",
    "CUDA_HOME", "CUDA_PATH", "DS_BUILD_OPS", "DS_ACCELERATOR", "SOURCE_DATE_EPOCH", "LIBRARY_PATH",
    "CCL_ROOT", "CUTLASS_PATH",
)  # fmt: skip


@dataclass(frozen=True)
class MachineFacts:
    """What the build key needs to know about this machine (`gather`), as the key records it."""

    python: str  # 3.11.7
    toolkits: tuple[str, ...] = ()  # 13.0@/usr/local/cuda-13.0
    compilers: tuple[str, ...] = ()  # g++=12.2.0
    system_torch: str | None = None  # for torch = "system"
    gpu_archs: tuple[str, ...] = ()  # for arch = "auto"
    root: str | None = None  # the identity of the build root the ops compile in (None: platform = "host")


def key_inputs(recipe: Recipe, machine: MachineFacts, env: Mapping[str, str]) -> dict[str, Any]:
    """Everything the wheel depends on, as plain data (recorded in the wheel's manifest too)."""
    return {
        "builder": __version__,
        "python": machine.python,
        # Everything that names or fills the wheel: its version (DeepSpeed's and the local label the
        # rest of these make), the recipe name, file and op order its embedded manifest records.
        "deepspeed": recipe.deepspeed.version,
        "deepspeed_sdist_sha256": recipe.deepspeed.sha256,
        "recipe": {"name": recipe.name, "file": recipe.path.name if recipe.path else None},
        "accelerator": recipe.accelerator,
        "ops": recipe.ops_spec,
        **({"label": recipe.label} if recipe.label else {}),
        # The site's configs are embedded in the wheel's manifest (the smoke proves each one).
        **({"configs": recipe.config_table} if recipe.configs else {}),
        **({"known_failures": recipe.known_table} if recipe.known_failures else {}),
        **({"on_op_failure": recipe.on_op_failure} if recipe.on_op_failure != "fail" else {}),
        "archs": list(recipe.archs) if not recipe.auto_arch else ["auto:" + ";".join(machine.gpu_archs)],
        "cpu_target": recipe.cpu_target,
        "strip": recipe.strip,
        **({"narrow_ops": sorted(recipe.narrow_ops)} if recipe.narrow_ops else {}),
        **(
            {"compress_device_code": recipe.compress_device_code, "cuda_toolkit": recipe.cuda_toolkit}
            if recipe.accelerator == "cuda"
            else {}
        ),
        "torch": recipe.torch.describe() if not recipe.torch.system else "system:" + str(machine.system_torch),
        "toolkits": list(machine.toolkits),
        "compilers": list(machine.compilers),
        "platform": recipe.platform,
        # x86_64 keys as before machines were named; another machine's with the glibc pins its compiles get
        **(
            {"machine": {"name": recipe.machine, "pins": pins_sha(recipe.machine)}}
            if recipe.machine != "x86_64"
            else {}
        ),
        **({"root": machine.root} if machine.root else {}),
        "env": {k: env[k] for k in RELEVANT_ENV if env.get(k)},
    }


def pins_sha(machine: str) -> str:
    """The glibc pins header the build root's wrappers force-include for `machine`, hashed."""
    from builder.buildroot.spec import MACHINE_PINS, pins_header

    return hashlib.sha256(pins_header(*MACHINE_PINS[machine]).encode()).hexdigest()[:16]


def build_key(inputs: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:24]


def gather(recipe: Recipe, env: Mapping[str, str], python_version: str | None = None) -> MachineFacts:
    """The machine facts the key needs, each from a quick query."""
    toolkits = probe_toolkits(env, query, search_roots(env), None) if recipe.accelerator == "cuda" else []
    compilers, _ = probe_compilers(env, query)
    system_torch = None
    if recipe.torch.system:
        system_torch = query(
            [sys.executable, "-c", "import importlib.metadata as m; print(m.version('torch'))"]
        ).strip()
    gpu_archs = arch_list(probe_gpus(query)[0]) if recipe.auto_arch else []
    root = None
    if recipe.platform != HOST:  # made now where this machine has none: the build needs it anyway
        root = sandbox.resolve(recipe.root, env, recipe.machine).identity
    return MachineFacts(
        root=root,
        python=python_version or sys.version.split()[0],
        toolkits=tuple(sorted(f"{t.version}@{t.root}" for t in toolkits)),
        compilers=tuple(sorted(f"{c.name}={c.version}" for c in compilers)),
        system_torch=system_torch,
        gpu_archs=tuple(gpu_archs),
    )


def find_built(dist: Path, key: str) -> Path | None:
    """A finished wheel in `dist` whose embedded build manifest (validated) carries this build key.

    A wheel whose manifest does not pass the loader is never reused: it is rebuilt.
    """
    from builder.contracts import BuildManifest
    from builder.node import ManifestError

    for wheel in sorted(dist.glob("*.whl"), key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            if BuildManifest.from_wheel(wheel).build_key == key:
                return wheel
        except ManifestError:
            continue
    return None
