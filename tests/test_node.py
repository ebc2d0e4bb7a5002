"""Node-side wheel choice (pure), and the rule that install needs only the standard library."""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Any

import pytest

from builder.node import InstallError, Node, arch_covers, choose, mismatches

ROOT = Path(__file__).resolve().parents[1]
AVX2 = frozenset({"sse4_2", "popcnt", "avx", "avx2", "fma", "bmi2"})


def entry(**changes: Any) -> dict[str, Any]:
    base = {
        "python_tag": "cp311", "torch": "2.13.0+cpu", "accelerator": "cpu", "cuda": None, "archs": [],
        "cpu_target": "x86-64-v3", "ops": ["cpu_adam"], "smoke": {"passed": True}, "published_at": "2026-11-01",
        "sha256": "0" * 64,
    }  # fmt: skip
    return {**base, **changes}


MANIFEST = {
    "wheels": {
        "cpu.whl": entry(),
        "h100.whl": entry(torch="2.14.1+cu130", accelerator="cuda", cuda="13.0", archs=["9.0"]),
        "ampere.whl": entry(torch="2.14.1+cu130", accelerator="cuda", cuda="13.0", archs=["8.0"]),
        "old.whl": entry(torch="2.14.1+cu130", accelerator="cuda", cuda="13.0", archs=["9.0"],
                         published_at="2026-10-01"),
        "failed.whl": entry(torch="2.12.0+cpu", smoke={"passed": False}),
    }
}  # fmt: skip


def test_arch_coverage() -> None:
    assert arch_covers(["9.0"], "9.0")
    assert arch_covers(["8.0"], "8.6")  # SASS runs on a newer minor of the same major
    assert not arch_covers(["8.6"], "8.0")
    assert not arch_covers(["8.0"], "9.0")
    assert arch_covers(["8.0+PTX"], "9.0")  # PTX is JIT-compiled for newer GPUs
    assert not arch_covers(["9.0a"], "10.0") and arch_covers(["9.0a"], "9.0")


def test_each_node_gets_its_wheel() -> None:
    cpu_node = Node("cp311", "2.13.0+cpu", None, (), AVX2)
    assert choose(MANIFEST, cpu_node)[0] == "cpu.whl"
    h100 = Node("cp311", "2.14.1+cu130", "13.0", ("9.0",), AVX2)
    assert choose(MANIFEST, h100)[0] == "h100.whl"  # the newest of the two sm_90 wheels
    a100x8 = Node("cp311", "2.14.1+cu130", "13.0", ("8.0",) * 8, AVX2)
    assert choose(MANIFEST, a100x8)[0] == "ampere.whl"
    bare = Node("cp311", None, None, (), AVX2)  # no torch yet: pip installs the pinned one
    assert choose(MANIFEST, bare)[0] == "cpu.whl"


def test_no_fit_says_what_the_node_needs_and_what_the_wheelhouse_has() -> None:
    v100 = Node("cp311", "2.14.1+cu130", "13.0", ("7.0", "9.0"), AVX2)
    with pytest.raises(InstallError) as err:
        choose(MANIFEST, v100)
    text = err.value.message
    assert "GPU compute capabilities 7.0, 9.0" in text
    assert "h100.whl: no code for GPU compute capability 7.0 (wheel has 9.0)" in text
    assert "cpu.whl: built for torch 2.13.0+cpu, node has 2.14.1+cu130" in text
    assert "failed.whl:" in text and "its smoke tests did not pass" in text
    assert "build one for this node" in err.value.fix


def test_cpu_features_and_python_tag() -> None:
    old_cpu = Node("cp311", "2.13.0+cpu", None, (), frozenset({"sse4_2", "avx"}))
    assert mismatches(entry(), old_cpu) == ["CPU ops built for x86-64-v3, node CPU lacks avx2, fma, bmi2"]
    assert mismatches(entry(), Node("cp312", "2.13.0", None, (), AVX2)) == ["built for cp311, node has cp312"]
    gpu_node = Node("cp311", "2.13.0+cu126", "12.6", ("9.0",), AVX2)
    assert "a CPU wheel, but the node has GPUs" in mismatches(entry(), gpu_node)[0]


def stdlib_only(path: Path) -> list[str]:
    """Top-level imports of a module that are neither standard library nor stdlib-only builder modules."""
    allowed = {"builder", "builder.cli", "builder.errors", "builder.node", "builder.serve"}
    bad = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        bad += [n for n in names if n.split(".")[0] not in sys.stdlib_module_names and n not in allowed]
    return bad


def test_install_path_imports_only_the_standard_library() -> None:
    for module in ("__init__.py", "__main__.py", "cli.py", "errors.py", "node.py", "serve.py"):
        assert stdlib_only(ROOT / "builder" / module) == [], module
