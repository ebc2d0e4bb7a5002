"""Node-side wheel choice (pure), and the rule that install needs only the standard library."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from builder import bundle, node
from builder.errors import PublishError
from builder.node import (
    InstallError,
    ManifestError,
    Node,
    WheelEntry,
    WheelhouseManifest,
    arch_covers,
    choose,
    mismatches,
    narrowed_for,
    parse_wheel_entry,
)
from builder.wheelhouse import installer

ROOT = Path(__file__).resolve().parents[1]
NODE = ROOT / "builder" / "node"
AVX2 = frozenset({"sse4_2", "popcnt", "avx", "avx2", "fma", "bmi2"})


def wheel_name(label: str, version: str = "0.19.8") -> str:
    return f"deepspeed-{version}+{label}-cp311-cp311-linux_x86_64.whl"


def entry(label: str = "cpu.torch2.13", ds: str = "0.19.8", **changes: Any) -> WheelEntry:
    """A wheelhouse entry, made through the same loader that reads manifest.json."""
    base = {
        "python_tag": "cp311", "torch": "2.13.0+cpu", "accelerator": "cpu", "cuda": None, "archs": [],
        "cpu_target": "x86-64-v3", "cpu_flags": [], "ops": ["cpu_adam"], "recipe": "cpu",
        "smoke": {"passed": True, "finished_at": "", "checks": {"import": {"status": "passed", "detail": ""}}},
        "published_at": "2026-11-01", "sha256": "0" * 64, "version": f"{ds}+{label}",
    }  # fmt: skip
    return parse_wheel_entry(wheel_name(label, ds), {**base, **changes}, "test")


FAILED_SMOKE = {"passed": False, "finished_at": "", "checks": {"import": {"status": "failed", "detail": "x"}}}
CPU, H100, AMPERE, OLD, FAILED = (
    entry(),
    entry("cu130.torch2.14.sm90", torch="2.14.1+cu130", accelerator="cuda", cuda="13.0", archs=["9.0"]),
    entry("cu130.torch2.14.sm80", torch="2.14.1+cu130", accelerator="cuda", cuda="13.0", archs=["8.0"]),
    entry("cu130.torch2.14.sm90", "0.19.7", torch="2.14.1+cu130", accelerator="cuda", cuda="13.0", archs=["9.0"],
          published_at="2026-12-01"),  # an older DeepSpeed published later
    entry("cpu.torch2.12", torch="2.12.0+cpu", smoke=FAILED_SMOKE),
)  # fmt: skip
MANIFEST = WheelhouseManifest({e.name: e for e in (CPU, H100, AMPERE, OLD, FAILED)})


def test_the_newest_wheel_is_chosen_by_version_not_by_text_or_publish_time() -> None:
    """Issue 20, "newest by version": 0.19.10 sorts before 0.19.9 as text; 0.19.9 was published later."""
    nine = entry(ds="0.19.9", published_at="2026-12-24")
    ten = entry(ds="0.19.10", published_at="2026-01-01")
    rc = entry(ds="0.19.11rc1", published_at="2026-12-31")
    node = Node("cp311", "2.13.0+cpu", None, (), AVX2)
    assert choose(WheelhouseManifest({e.name: e for e in (nine, ten)}), node) == ten
    assert choose(WheelhouseManifest({e.name: e for e in (nine, ten, rc)}), node) == rc


def test_two_op_sets_of_one_target_sit_side_by_side_and_the_node_chooses() -> None:
    """Issue 29: cpu and cpu-all make one target; cpu-all's label ("all") gives it its own file name.
    A node takes the one with the most ops, or with --ops the ones holding them (0.19.9 still beats 0.19.8)."""
    few = entry(ops=["cpu_adam", "fused_adam"])
    every = entry("cpu.torch2.13.all", ops=["cpu_adam", "fused_adam", "async_io", "pin_memory"], recipe="cpu-all")
    assert few.name != every.name
    node = Node("cp311", "2.13.0+cpu", None, (), AVX2)
    both = WheelhouseManifest({e.name: e for e in (few, every)})
    assert choose(both, node) == every
    assert choose(both, node, ["async_io"]) == every
    newer = entry(ds="0.19.9", ops=["cpu_adam"])
    assert choose(WheelhouseManifest({e.name: e for e in (few, every, newer)}), node) == newer
    with pytest.raises(InstallError) as err:
        choose(WheelhouseManifest({few.name: few}), node, ["async_io"])
    assert f"{few.name}: lacks op async_io (--ops)" in err.value.message


@pytest.mark.parametrize(
    "order", [["0.9", "0.19.8", "0.19.10", "1.0.dev1", "1.0a1", "1.0rc2", "1.0", "1.0.post1", "1.0.1", "2!0.1"]]
)
def test_version_key_orders_as_pep440(order: list[str]) -> None:
    from packaging.version import Version

    from builder.node import version_key

    assert sorted(order, key=version_key) == sorted(order, key=Version) == order


def test_arch_coverage() -> None:
    assert arch_covers(["9.0"], "9.0")
    assert arch_covers(["8.0"], "8.6")  # SASS runs on a newer minor of the same major
    assert not arch_covers(["8.6"], "8.0")
    assert not arch_covers(["8.0"], "9.0")
    assert arch_covers(["8.0+PTX"], "9.0")  # PTX is JIT-compiled for newer GPUs
    assert not arch_covers(["9.0a"], "10.0") and arch_covers(["9.0a"], "9.0")


def test_each_node_gets_its_wheel() -> None:
    cpu_node = Node("cp311", "2.13.0+cpu", None, (), AVX2)
    assert choose(MANIFEST, cpu_node) == CPU
    h100 = Node("cp311", "2.14.1+cu130", "13.0", ("9.0",), AVX2)
    assert choose(MANIFEST, h100) == H100  # the newer DeepSpeed of the two sm_90 wheels, not the later published
    a100x8 = Node("cp311", "2.14.1+cu130", "13.0", ("8.0",) * 8, AVX2)
    assert choose(MANIFEST, a100x8) == AMPERE
    bare = Node("cp311", None, None, (), AVX2)  # no torch yet: pip installs the pinned one
    assert choose(MANIFEST, bare) == CPU


def test_the_node_says_which_narrowed_ops_have_no_code_for_its_gpu() -> None:
    both = entry("cu130.torch2.14.sm75.sm90", torch="2.14.1+cu130", accelerator="cuda", cuda="13.0",
                 archs=["7.5", "9.0"], ops=["fused_adam", "fp_quantizer"],
                 narrowed_ops={"fp_quantizer": ["9.0"]})  # fmt: skip
    assert both.narrowed_ops == {"fp_quantizer": ("9.0",)}
    t4 = Node("cp311", "2.14.1+cu130", "13.0", ("7.5",), AVX2)
    assert not mismatches(both, t4)  # the wheel fits: fused_adam has code for the T4
    assert narrowed_for(both, t4) == ["op fp_quantizer has code only for 9.0, not for this node's GPU 7.5"]
    assert narrowed_for(both, Node("cp311", "2.14.1+cu130", "13.0", ("9.0",), AVX2)) == []
    with pytest.raises(ManifestError, match="narrowed_ops"):
        entry("cu130.torch2.14.sm90", accelerator="cuda", cuda="13.0", archs=["9.0"], narrowed_ops={"x/../y": ["9.0"]})
    with pytest.raises(ManifestError, match=r"narrowed_ops: field 'fp_quantizer' holds an invalid item"):
        entry("cu130.torch2.14.sm90", accelerator="cuda", cuda="13.0", archs=["9.0"],
              narrowed_ops={"fp_quantizer": ["sm_90; rm -rf"]})  # fmt: skip


def test_no_fit_says_what_the_node_needs_and_what_the_wheelhouse_has() -> None:
    v100 = Node("cp311", "2.14.1+cu130", "13.0", ("7.0", "9.0"), AVX2)
    with pytest.raises(InstallError) as err:
        choose(MANIFEST, v100)
    text = err.value.message
    assert "GPU compute capabilities 7.0, 9.0" in text
    assert f"{H100.name}: no code for GPU compute capability 7.0 (wheel has 9.0)" in text
    assert f"{CPU.name}: built for torch 2.13.0+cpu, node has 2.14.1+cu130" in text
    assert f"{FAILED.name}:" in text and "its smoke tests did not pass" in text
    assert err.value.fix == (
        'build one for this node, smoke it and publish it: a recipe with python = ["3.11"]; '
        '[torch] version = "2.14.1", variant = "cu130"; arch = ["7.0", "9.0"]'
    )
    # A Debian 11 node (Python 3.9, glibc 2.31, no torch yet): the fix names the floor it needs.
    bullseye = Node("cp39", None, None, (), AVX2, glibc="2.31")
    with pytest.raises(InstallError) as err:
        choose(MANIFEST, bullseye)
    assert err.value.fix == ('build one for this node, smoke it and publish it: a recipe with python = ["3.9"]; '
                             'platform = "manylinux_2_31" or lower (the default, "manylinux_2_28", reaches glibc '
                             "2.28 and newer: RHEL 8+, Debian 10+, Ubuntu 18.10+)")  # fmt: skip


def test_cpu_features_and_python_tag() -> None:
    old_cpu = Node("cp311", "2.13.0+cpu", None, (), frozenset({"sse4_2", "avx"}))
    assert mismatches(CPU, old_cpu) == ["CPU ops built for x86-64-v3, node CPU lacks avx2, fma, bmi2"]
    assert mismatches(CPU, Node("cp312", "2.13.0", None, (), AVX2)) == ["built for cp311, node has cp312"]
    gpu_node = Node("cp311", "2.13.0+cu126", "12.6", ("9.0",), AVX2)
    assert "a CPU wheel, but the node has GPUs" in mismatches(CPU, gpu_node)[0]


def stdlib_only(path: Path) -> list[str]:
    """Top-level imports of a module that are neither standard library nor stdlib-only builder modules."""
    allowed = {"builder", "builder.arguments", "builder.cli", "builder.errors", "builder.node"}
    bad = []
    for stmt in ast.parse(path.read_text()).body:
        if isinstance(stmt, ast.Import):
            names = [a.name for a in stmt.names]
        elif isinstance(stmt, ast.ImportFrom) and stmt.level == 0 and stmt.module:
            names = [stmt.module]
        else:
            continue
        bad += [
            n
            for n in names
            if n.split(".")[0] not in sys.stdlib_module_names and n not in allowed and not n.startswith("builder.node.")
        ]
    return bad


def test_install_path_imports_only_the_standard_library() -> None:
    """`python -m builder install` runs on a node's Python too: it imports builder's stdlib-only
    modules and the node package, nothing else."""
    modules = [
        "__init__.py",
        "__main__.py",
        "arguments.py",
        "cli.py",
        "errors.py",
        *(f"node/{p.name}" for p in NODE.glob("*.py")),
    ]
    for module in modules:
        assert stdlib_only(ROOT / "builder" / module) == [], module


@pytest.mark.spawns
def test_the_node_installer_is_the_node_package_in_one_standalone_file(tmp_path: Path) -> None:
    """Issue 50: the file nodes run is built from builder/node/, the same bytes each time, with every
    module of the package in it; it imports nothing outside the standard library at any depth
    (functions included) and parses as Python 3.6, so an old interpreter gets the one-line refusal.
    It runs alone, from a folder with nothing else in it."""
    from builder import bundle

    first = installer.build()
    bundle._BUILT.clear()  # built again from the package, not handed the bytes this process built
    second = installer.build()
    assert first == second and first is not second
    modules = {p.stem for p in NODE.glob("*.py")} - {"__init__"}
    assert set(node.BUNDLE) == modules
    text = first.decode()
    assert [m for m in node.BUNDLE if f"# ==================== builder/node/{m}.py" not in text] == []
    tree = ast.parse(text, feature_version=(3, 6))
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert {m for m in imported if m.split(".")[0] not in sys.stdlib_module_names} == set()
    assert not any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(tree))  # no relative imports
    tool = tmp_path / "ds-node-install.py"
    tool.write_bytes(first)
    done = subprocess.run([sys.executable, "-I", str(tool), "--help"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0 and "--wheelhouse" in done.stdout and "Exit codes" in done.stdout, done.stderr
    piped = subprocess.run([sys.executable, "-I", "-", "--help"], input=first, cwd=tmp_path, capture_output=True)
    assert piped.returncode == 0 and b"--wheelhouse" in piped.stdout, piped.stderr


@pytest.mark.parametrize(
    ("modules", "said"),
    [
        ({"a": "from builder.node.b import X\n", "b": "X = 1\n"}, "builder.node.b, which is not a module before"),
        ({"a": "X = 1\n", "b": "X = 2\n"}, "defines X, which a.py defines too"),
        ({"a": "import re\n", "b": "re = 2\n"}, "defines re, which a.py defines too"),
        ({"a": "X = 1\n", "b": "from builder.node.a import Y\n"}, "imports Y from builder.node.a, which does not"),
        ({"a": "X = 1\n", "b": "def f():\n    from builder.node.a import X\n"}, "other than by `from"),
        ({"a": "import requests\n", "b": ""}, "imports requests, which is not in the standard library"),
        ({"a": "from builder.files import write_atomic\n", "b": ""}, "imports builder.files, which is not"),
        ({"a": "from . import b\n", "b": ""}, "is a relative import"),
        ({"a": "if (x := 1):\n    pass\n", "b": ""}, "does not parse as Python 3.6"),
    ],
)  # fmt: skip
def test_a_package_that_breaks_the_bundles_rules_is_refused(modules: dict[str, str], said: str, tmp_path: Path) -> None:
    """What makes laying the modules one after another sound, each checked: imports only of modules
    before it, by name; no name defined twice; the standard library only; Python 3.6 syntax."""
    for name, text in modules.items():
        (tmp_path / f"{name}.py").write_text(text)
    with pytest.raises(PublishError) as err:
        bundle.build(tmp_path, "builder.node", '"""x"""\n', order=["a", "b"])
    assert said in str(err.value) and "builder.node cannot be built into one file" in str(err.value)
    assert "bundle.py's docstring" in err.value.fix


def test_a_bundles_future_imports_are_said_once_at_its_top(tmp_path: Path) -> None:
    """`from __future__` must open a file: each module's are taken out and said once after the docstring."""
    (tmp_path / "a.py").write_text('"""A."""\n\nfrom __future__ import annotations\n\nX: int = 1\n')
    (tmp_path / "b.py").write_text("from __future__ import annotations\n\nfrom pkg.a import X\n\nY = X + 1\n")
    text = bundle.build(tmp_path, "pkg", '"""One file: {order}."""\n', python=(3, 9), order=["a", "b"]).decode()
    assert text.startswith('"""One file: a, b."""\n\nfrom __future__ import annotations\n')
    assert text.count("from __future__") == 1 and "from pkg" not in text and "# A." in text
    space: dict[str, object] = {}
    exec(compile(text, "bundle", "exec"), space)
    assert space["Y"] == 2
