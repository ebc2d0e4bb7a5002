"""detect: what this machine has for building and running DeepSpeed ops.

Each external fact comes from one small probe (a command, a file, a library call) and is turned
into data by a pure parser beside it, tested against captured outputs. `detect()` takes the world
as arguments (environment, command runner, filesystem roots) so tests can hand it fake toolkits
and fake nvidia-smi output for GPUs this machine lacks.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from builder.cmd import query
from builder.detect.model import (
    INT8_MIN_CC,
    KNOWN_HOST_LIMITS,
    NEEDED_HEADERS,
    SCHEMA_VERSION,
    Compiler,
    Cpu,
    Gpu,
    HostRange,
    Libraries,
    Problem,
    Report,
    Runner,
    Toolkit,
    TorchFacts,
    arch_list,
)
from builder.detect.parsers import (
    cuda_major_minor,
    host_range_fallback,
    parse_compiler_version,
    parse_gpu_archs,
    parse_host_config,
    parse_meminfo,
    parse_nvcc_version,
    parse_smi,
    parse_smi_cuda,
)
from builder.detect.probes import (
    available_memory_gb,
    is_toolkit,
    parse_torch_probe,
    probe_compilers,
    probe_cpu,
    probe_gpus,
    probe_libraries,
    probe_toolkits,
    probe_torch,
    toolkit_roots,
    total_memory_gb,
)
from builder.detect.problems import (
    choose_toolkit,
    cpu_problems,
    cuda_setup_problems,
    find_problems,
)
from builder.detect.render import (
    render_table,
)

__all__ = [
    "INT8_MIN_CC",
    "KNOWN_HOST_LIMITS",
    "NEEDED_HEADERS",
    "SCHEMA_VERSION",
    "Compiler",
    "Cpu",
    "Gpu",
    "HostRange",
    "Libraries",
    "Problem",
    "Report",
    "Runner",
    "Toolkit",
    "TorchFacts",
    "arch_list",
    "available_memory_gb",
    "choose_toolkit",
    "cpu_problems",
    "cuda_major_minor",
    "detect",
    "find_problems",
    "host_range_fallback",
    "parse_compiler_version",
    "parse_gpu_archs",
    "parse_host_config",
    "parse_meminfo",
    "parse_nvcc_version",
    "parse_smi",
    "parse_smi_cuda",
    "parse_torch_probe",
    "probe_compilers",
    "probe_cpu",
    "probe_gpus",
    "probe_libraries",
    "probe_toolkits",
    "probe_torch",
    "render_table",
    "toolkit_roots",
    "total_memory_gb",
]


def detect(
    env: Mapping[str, str],
    python: str,
    run: Runner = query,
    search: Sequence[Path] = (Path("/usr/local"), Path("/opt")),
    wanted_archs: Sequence[str] = (),
) -> Report:
    # py-cpuinfo asks in a process of its own (1.1 s), as torch's probe does (1.4 s): side by side,
    # on the serial start of every build.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="probe-cpu") as pool:
        asked = pool.submit(probe_cpu)
        torch, torch_gpus = probe_torch(python, run)
        cpu = asked.result()
    gpus, gpu_source, driver, driver_cuda = probe_gpus(run, torch_gpus)
    toolkits = probe_toolkits(env, run, search, torch.site_packages)
    chosen = choose_toolkit(toolkits, torch.cuda)
    compilers, default_gcc = probe_compilers(env, run)
    first_nvcc = shutil.which("nvcc", path=env.get("PATH", ""))
    return Report(
        gpus=tuple(gpus),
        gpu_source=gpu_source,
        driver=driver,
        driver_cuda=driver_cuda,
        toolkits=tuple(toolkits),
        chosen_toolkit=chosen.root if chosen else None,
        torch=torch,
        compilers=tuple(compilers),
        default_gcc=default_gcc,
        cpu=cpu,
        libraries=probe_libraries(chosen.root if chosen else None, torch.site_packages, torch.nccl),
        problems=tuple(
            find_problems(gpus, toolkits, chosen, torch, compilers, default_gcc, driver_cuda, wanted_archs)
            + cuda_setup_problems(env, is_toolkit, first_nvcc, run([first_nvcc, "--version"]) if first_nvcc else "")
            + cpu_problems(cpu)
        ),
    )
