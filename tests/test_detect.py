"""Detection parsers on captured outputs, and detect() against fake toolkits and fake GPUs.

Everything named FAKE stands in for what this machine lacks (other CUDA versions, GPUs).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Sequence
from pathlib import Path

import pytest

from builder import cmd
from builder.detect import (
    Compiler,
    Gpu,
    HostRange,
    Toolkit,
    TorchFacts,
    arch_list,
    choose_toolkit,
    detect,
    find_problems,
    parse_compiler_version,
    parse_gpu_archs,
    parse_host_config,
    parse_meminfo,
    parse_nvcc_version,
    parse_smi,
    parse_smi_cuda,
    parse_torch_probe,
    render_table,
)

DATA = Path(__file__).with_name("data")
# FAKE nvidia-smi --query-gpu outputs for GPUs this machine lacks.
SMI_8xA100 = "".join(f"{i}, NVIDIA A100-SXM4-80GB, 8.0, 81920, 550.54.15\n" for i in range(8))
SMI_MIXED = "0, Tesla V100-SXM2-32GB, 7.0, 32768, 535.104.05\n1, NVIDIA H100 80GB HBM3, 9.0, 81559, 535.104.05\n"
SMI_PLAIN = "| NVIDIA-SMI 580.159.04   Driver Version: 580.159.04   CUDA Version: 13.0     |\n"


def test_nvcc_version_captured_here() -> None:
    assert parse_nvcc_version((DATA / "nvcc-13.0.txt").read_text()) == "13.0"
    assert parse_nvcc_version("nvcc: command not found") is None


def test_gpu_arch_list_of_nvcc_13() -> None:
    archs = parse_gpu_archs((DATA / "nvcc-13.0-list-gpu-arch.txt").read_text())
    assert archs[0] == "7.5" and "9.0" in archs and "12.0" in archs and "7.0" not in archs  # CUDA 13 dropped Volta


def test_host_config_of_cuda_13_read_from_the_real_header() -> None:
    got = parse_host_config((DATA / "host_config" / "cuda-13.0.h").read_text())
    assert got == HostRange(None, 15, 3, 20, "host_config.h")
    assert got.accepts("gcc", 12) and got.accepts("gcc", 15) and not got.accepts("gcc", 16)
    assert got.accepts("clang", 20) and not got.accepts("clang", 21)


def test_host_config_of_a_fake_cuda_12_4() -> None:
    got = parse_host_config((DATA / "host_config" / "FAKE-cuda-12.4.h").read_text())
    assert got is not None
    assert (got.gcc_max, got.clang_max) == (13, 17)


def test_compiler_versions() -> None:
    assert parse_compiler_version("12.2.0\n") == "12.2.0"
    assert parse_compiler_version("Debian clang version 14.0.6\nTarget: x86_64-pc-linux-gnu\n") == "14.0.6"
    assert parse_compiler_version("") is None


def test_smi_and_arch_list() -> None:
    gpus, driver = parse_smi(SMI_8xA100)
    assert len(gpus) == 8 and driver == "550.54.15" and arch_list(gpus) == ["8.0"]
    gpus, _ = parse_smi(SMI_MIXED)
    assert arch_list(gpus) == ["7.0", "9.0"]
    assert gpus[1] == Gpu(1, "NVIDIA H100 80GB HBM3", "9.0", 81559)
    assert parse_smi("No devices were found\n") == ([], None)
    assert parse_smi_cuda(SMI_PLAIN) == "13.0"
    assert arch_list([Gpu(0, "a", "10.0", 1), Gpu(1, "b", "9.0", 1), Gpu(2, "c", "12.0", 1)]) == ["9.0", "10.0", "12.0"]


def tk(version: str, root: str = "", archs: Sequence[str] = ("7.5", "8.0", "9.0")) -> Toolkit:
    return Toolkit(
        root or f"/usr/local/cuda-{version}",
        "nvcc",
        version,
        ("test",),
        HostRange(None, 13, None, 17, "t"),
        (),
        tuple(archs),
    )


def test_choose_toolkit_matches_torch_cuda() -> None:
    kits = [tk("11.8"), tk("12.4"), tk("13.0")]
    assert choose_toolkit(kits, "12.4").version == "12.4"  # type: ignore[union-attr]
    assert choose_toolkit([tk("12.1"), tk("12.4"), tk("13.0")], "12.6").version == "12.4"  # type: ignore[union-attr]
    assert choose_toolkit([tk("13.0")], "12.4") is None
    assert choose_toolkit(kits, None).version == "13.0"  # type: ignore[union-attr]
    assert choose_toolkit([], "12.4") is None


def torch_facts(cuda: str | None = "12.4") -> TorchFacts:
    return TorchFacts(python="python", version="2.5.1", cuda=cuda, cxx11_abi=False)


def test_known_bad_combinations_each_with_a_fix() -> None:
    v100 = Gpu(0, "Tesla V100", "7.0", 32768)
    gcc13 = Compiler("gcc", "gcc-13", "/usr/bin/gcc-13", "13.2.0")
    gxx13 = Compiler("gcc", "g++-13", "/usr/bin/g++-13", "13.2.0")
    kit = tk("12.4")
    problems = find_problems([v100], [kit], kit, torch_facts(), [gcc13, gxx13], "14.1.0", "12.2", ["9.0", "10.0"])
    text = "\n".join(f"{p.severity}: {p.message} | {p.fix}" for p in problems)
    assert "GPU 0 (Tesla V100, compute capability 7.0) cannot run bitsandbytes int8" in text
    assert "nvcc 12.4 cannot compile for compute capability 10.0" in text
    assert "compute capability 9.0" not in text
    assert "default gcc 14.1.0 is outside what nvcc 12.4 accepts" in text and "g++-13 13.2.0" in text
    assert "the driver supports CUDA 12.2, torch needs 12.4" in text
    mismatch = find_problems([], [tk("13.0")], None, torch_facts("12.4"), [], "12.2.0", None)
    assert mismatch[0].severity == "error"
    assert "torch was built with CUDA 12.4 but no CUDA 12.x toolkit is here" in mismatch[0].message
    none = find_problems([], [], None, torch_facts("12.4"), [], "12.2.0", None)
    assert "no nvcc was found" in none[0].message
    no_gcc = find_problems([], [kit], kit, torch_facts(), [], "14.1.0", None)
    assert no_gcc[0].severity == "error" and "install a gcc" in no_gcc[0].fix


def test_torch_probe_parsing() -> None:
    line = json.dumps({
        "version": "2.14.1+cu130", "cuda": "13.0", "cxx11_abi": True, "site_packages": "/v/site",
        "arch_list": ["sm_90"], "nccl": "2.28.9", "gpus": [[0, "NVIDIA H100", "9.0", 81000]],
        "pip_cuda_include": ["/v/site/nvidia/cu13/include"],
    })  # fmt: skip
    facts, gpus = parse_torch_probe("py", line)
    assert (
        facts.cuda == "13.0" and facts.nccl == "2.28.9" and facts.pip_cuda_include == ("/v/site/nvidia/cu13/include",)
    )
    assert gpus == [Gpu(0, "NVIDIA H100", "9.0", 81000)]
    missing, _ = parse_torch_probe("py", '{"error": "ModuleNotFoundError: No module named \'torch\'"}')
    assert missing.version is None and "No module named" in missing.error


def make_fake_toolkit(root: Path, version: str, header: str | None) -> Path:
    """FAKE toolkit: a shell-script nvcc printing this version, and optionally a host_config.h."""
    (root / "bin").mkdir(parents=True)
    (root / "include" / "crt").mkdir(parents=True)
    (root / "include" / "cuda_runtime.h").write_text("/* fake */\n")
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "--version" ]; then echo "Cuda compilation tools, release {version}, V{version}.99"; exit 0; fi\n'
        'if [ "$1" = "--list-gpu-arch" ]; then echo compute_70; echo compute_80; echo compute_90; exit 0; fi\n'
        "exit 1\n"
    )
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IEXEC)
    if header:
        (root / "include" / "crt" / "host_config.h").write_text((DATA / "host_config" / header).read_text())
    return root


@pytest.mark.spawns
def test_detect_finds_every_fake_toolkit_and_picks_torchs(tmp_path: Path) -> None:
    opt = tmp_path / "opt"
    make_fake_toolkit(opt / "cuda-12.4", "12.4", "FAKE-cuda-12.4.h")
    make_fake_toolkit(opt / "cuda-11.8", "11.8", None)  # no readable header: fallback table
    home = make_fake_toolkit(tmp_path / "home-cuda", "12.1", None)
    fake_torch = json.dumps({
        "version": "2.5.1+cu124", "cuda": "12.4", "cxx11_abi": False, "site_packages": str(tmp_path / "site"),
        "arch_list": [], "nccl": "2.21.5", "gpus": [], "pip_cuda_include": [],
    })  # fmt: skip

    def run(args: Sequence[str]) -> str:
        if args[0] == "fake-python":  # FAKE torch with CUDA 12.4
            return fake_torch + "\n"
        if args[0] == "nvidia-smi":  # FAKE GPUs
            return SMI_MIXED if len(args) > 1 else SMI_PLAIN
        return cmd.query(args)

    env = {"CUDA_HOME": str(home), "PATH": os.environ["PATH"]}
    report = detect(env, "fake-python", run=run, search=[opt])
    by_version = {t.version: t for t in report.toolkits}
    assert {"11.8", "12.1", "12.4"} <= set(by_version)
    assert by_version["12.1"].found_by == ("CUDA_HOME",)
    assert by_version["12.4"].host_range == HostRange(None, 13, 3, 17, "host_config.h")
    assert by_version["11.8"].host_range is not None and by_version["11.8"].host_range.source == "known-limits table"
    assert report.chosen_toolkit == str((opt / "cuda-12.4").resolve())
    if not os.path.exists("/dev/nvidiactl"):  # NVML answers first on a real GPU machine
        assert report.gpu_source == "nvidia-smi" and report.arch_list == ["7.0", "9.0"]
        assert report.driver_cuda == "13.0"
        assert any("bitsandbytes int8" in p.message for p in report.problems)
    data = json.loads(report.to_json())
    assert data["schema"] == 1 and data["torch"]["cuda"] == "12.4" and data["libraries"]["nccl"] == "2.21.5"
    assert "*CUDA 12.4" in render_table(report)


@pytest.mark.spawns
@pytest.mark.skipif(not Path("/usr/local/cuda/bin/nvcc").exists(), reason="no CUDA toolkit at /usr/local/cuda")
def test_detect_on_this_machine_sees_the_real_nvcc_and_compilers() -> None:
    report = detect(os.environ, "no-such-python")
    real = [t for t in report.toolkits if Path(t.root) == Path("/usr/local/cuda").resolve()]
    assert real, render_table(report)
    kit = real[0]
    assert kit.version == parse_nvcc_version(cmd.query(["/usr/local/cuda/bin/nvcc", "--version"]))
    assert kit.host_range is not None and kit.host_range.source == "host_config.h"
    assert "9.0" in kit.archs
    assert report.default_gcc == cmd.query(["gcc", "-dumpfullversion"]).strip()
    assert any(c.name == "g++" for c in report.compilers)
    assert report.torch.version is None and report.torch.error  # that python does not exist
    assert report.cpu.simd


def test_missing_headers_without_a_pip_provider_is_an_error(tmp_path: Path) -> None:
    kit = Toolkit("/usr/local/cuda-13.0", "nvcc", "13.0", ("PATH",), None, ("cusparse.h",), ("9.0",))
    bare = find_problems([], [kit], kit, torch_facts("13.0"), [], "12.2.0", None)
    assert bare[0].severity == "error" and "lacks cusparse.h" in bare[0].message
    inc = tmp_path / "nvidia" / "cu13" / "include"
    inc.mkdir(parents=True)
    (inc / "cusparse.h").write_text("")
    facts = TorchFacts("python", "2.14.1", "13.0", True, pip_cuda_include=(str(inc),))
    assert find_problems([], [kit], kit, facts, [], "12.2.0", None) == []


def test_parse_meminfo() -> None:
    text = "MemTotal:       24000000 kB\nMemFree:         1000000 kB\nMemAvailable:   23068672 kB\n"
    assert parse_meminfo(text) == 22.0
    assert parse_meminfo("MemTotal: 1 kB\n") is None
