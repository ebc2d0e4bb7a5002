"""The cluster test: a cluster of Linux namespaces on this machine (tests/cluster.py brings it up
and down: four nodes with their own addresses, hostnames and Debian roots, sshd on each, nginx on
node1, slurmd on the three Debian 12 nodes, one slurmctld; node4 runs Debian 11).

The matrix goes through sbatch, each op compiled by a task of the unit array on whichever node
Slurm gives it, into the unit cache every job shares: `adam` (cpu_adam and the shm comm op)
builds and smokes in its array task; `cuadam` (a CUDA recipe for sm_90) builds in its array task
and is smoked by its own job on the `h100` partition with --gres=gpu:1, whose GPUs are FAKE (so
the smoke inside honestly sees none, and the matrix says require_gpu = false); `ccl`
(deepspeed_ccl_comm, which needs Intel oneCCL: refused before compiling) fails in its task and
the run goes on. The collect job publishes the two that passed into the cluster's shared folder.
Then what a site does with it, on the nodes' own roots (no compiler there): provision over pdsh and
ssh from the shared folder and over HTTP from nginx, ds_report on each node, torchrun across
three nodes running a ZeRO step with the CPU optimizer from the wheel, and 64 installs at once
against nginx and against `serve`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import cluster as box
import pytest
from fakes import default_recipe_text, host_platform
from nodes import node_venv

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(box.missing() is not None, reason=str(box.missing())),
    pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the cpu recipe's local torch wheel is for Python 3.11"),
]


_CCACHE_BOOKS = {"stats", "CACHEDIR.TAG", "lock"}  # ccache's own bookkeeping, not cached objects


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The cluster's folder (its shared folder, ssh config, Slurm files, node roots), while it is up."""
    folder = tmp_path_factory.mktemp("cluster")
    try:
        box.up(folder)
        yield folder
    finally:
        box.down(folder)


@pytest.fixture(scope="module")
def cluster(up: Path) -> dict[str, str]:
    """The environment a Slurm client of the cluster runs in."""
    return box.environ(up)


def _variant(
    source: str, folder: Path, name: str, ops: list[str], arch: list[str] | None = None, label: str = ""
) -> None:
    text = default_recipe_text(source)
    start = text.index("ops = [")
    end = text.index("]", start) + 1
    text = text[:start] + f"ops = {json.dumps(ops)}" + text[end:]
    old = tomllib.loads(text)["name"]
    text = text.replace(f'name = "{old}"', f'name = "{name}"' + (f'\nlabel = "{label}"' if label else ""))
    if "[root]" in text:  # a CUDA recipe: pypa's image is its root, not reachable here
        text = host_platform(text)
    if arch is not None:
        start = text.index("arch = [")
        text = text[:start] + f"arch = {json.dumps(arch)}" + text[text.index("]", start) + 1 :]
    (folder / f"{name}.toml").write_text(text)


@pytest.fixture(scope="module")
def matrix_run(up: Path, cluster: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    folder = tmp_path_factory.mktemp("slurm-matrix")
    _variant("cpu.toml", folder, "adam", ["cpu_adam", "deepspeed_shm_comm"])
    _variant("cpu.toml", folder, "ccl", ["deepspeed_ccl_comm"])
    _variant("cu130-multi-min.toml", folder, "cuadam", ["cpu_adam"], ["9.0"])
    matrix = folder / "matrix.toml"
    matrix.write_text(
        'recipes = ["adam.toml", "ccl.toml", "cuadam.toml"]\n\n[slurm]\ncpus = 2\nmem = "6G"\ntime = "00:40:00"\n\n'
        "[slurm.gpu]  # FAKE GPUs (see tests/cluster.py): the smoke job runs there, its torch sees none\n"
        '"9.0" = { partition = "h100", gres = "gpu:1", require_gpu = false }\n'
    )
    work, house = folder / "work", up / "shared" / "wheelhouse"  # the nodes see it at /shared/wheelhouse
    done = subprocess.run(
        [sys.executable, "-m", "builder", "build-wheel", "--matrix", str(matrix), "--slurm", "--wait",
         "--work-dir", str(work), "--wheelhouse", str(house)],
        cwd=ROOT, capture_output=True, text=True, env=cluster, timeout=2400,
    )  # fmt: skip
    return {"done": done, "work": work, "house": house, "folder": folder, "cluster": up}


def _lost_task(run: Path, name: str, up: object) -> str:
    """Whose failure a unit task without a result is: the machine's where the controller lost its
    nodes (CI, once: the machine stalled for minutes, every node was marked down and its job killed;
    the run still passed, the build task compiling what the dead task held), else the task's own log."""
    ctld = Path(str(up)) / "slurm" / "slurmctld.log"
    lost = [line for line in ctld.read_text(errors="replace").splitlines()
            if "not responding" in line or "on failed node" in line] if ctld.is_file() else []  # fmt: skip
    if lost:
        return f"{name}: the machine's failure, not the toolkit's: slurmctld lost its nodes:\n" + "\n".join(lost[:12])
    logs = sorted((run / "logs").glob("units-*.log"))
    return f"{name} wrote no result; its unit logs end:\n" + "\n".join(p.read_text()[-1500:] for p in logs)


def test_a_matrix_runs_as_a_job_array_gpu_smoke_jobs_and_one_collect_job(
    cluster: dict[str, str], matrix_run: dict[str, object]
) -> None:
    done = matrix_run["done"]
    assert isinstance(done, subprocess.CompletedProcess)
    work, house = Path(str(matrix_run["work"])), Path(str(matrix_run["house"]))
    assert done.returncode == 11, done.stderr[-5000:]
    assert "submitted 3 targets: build array " in done.stderr and "GPU smoke jobs: cuadam on h100 (" in done.stderr
    assert "1 of 3 targets failed: ccl" in done.stderr
    assert "cuadam: build passed, smoke on h100 " in done.stderr  # --wait's progress line per target
    (run,) = (work / "slurm").glob("run-*")
    record = json.loads((run / "run.json").read_text())
    report = json.loads((run / "coverage" / "coverage.json").read_text())
    rows = {t["target"]: t for t in report["targets"]}
    status = {name: {s: v["status"] for s, v in row["stages"].items()} for name, row in rows.items()}
    assert status["adam"] == status["cuadam"] == {"build": "passed", "smoke": "passed", "publish": "passed"}
    # Op units (issue 21): each target's op compiled in a unit task of the unit array, into the unit
    # cache every job shares; the build task then assembled its wheel from the cache.
    (units,) = record["unit_arrays"]
    assert units["tasks"] == [["adam", 0, 2], ["adam", 1, 2], ["ccl", 0, 1], ["cuadam", 0, 1]] and units["job"]
    # Spread over the nodes: each unit task records the node it ran on (its slurmd's hostname).
    placed = {}
    for name in ("adam.units-0", "adam.units-1", "cuadam.units-0"):
        assert (run / "results" / f"{name}.json").is_file(), _lost_task(run, name, matrix_run["cluster"])
        task = json.loads((run / "results" / f"{name}.json").read_text())
        assert task["node"] in ("node1", "node2", "node3"), task
        placed.update({(name.split(".")[0], u["op"]): (u["status"], task["node"]) for u in task["units"]})
    assert {k: v[0] for k, v in placed.items()} == {
        ("adam", "cpu_adam"): "built", ("adam", "deepspeed_shm_comm"): "built", ("cuadam", "cpu_adam"): "built"
    }  # fmt: skip
    assert len({node for _, node in placed.values()}) >= 2, placed  # three tasks of 2 CPUs on nodes of 2 CPUs
    units_on = rows["adam"]["slurm"]["units_on"]
    assert f"cpu_adam ({placed['adam', 'cpu_adam'][1]})" in units_on
    assert f"deepspeed_shm_comm ({placed['adam', 'deepspeed_shm_comm'][1]})" in units_on
    (built,) = (work / "slurm" / "targets" / "adam" / "dist").glob("*.whl.build.json")
    assert {op: u["status"] for op, u in json.loads(built.read_text())["units"].items()} == {
        "cpu_adam": "cached", "deepspeed_shm_comm": "cached"
    }  # fmt: skip
    assert not (run / "results" / "ccl.units-0.json").exists()  # refused before compiling: the build task says so
    assert (
        rows["adam"]["slurm"]["job"] == f"{record['arrays'][0]['job']}_0"
        and Path(rows["adam"]["slurm"]["log"]).is_file()
    )
    assert rows["adam"]["slurm"]["smoke_on"] == "cpu"
    # The GPU smoke ran in its own job on the h100 partition with the GPUs Slurm gave it (fake ones).
    (smoke,) = record["targets"][2]["smoke"]
    assert smoke["partition"] == "h100" and rows["cuadam"]["slurm"]["smoke_on"] == f"h100 ({smoke['job']})"
    gpu = json.loads((run / "results" / "cuadam.smoke.h100.json").read_text())
    assert gpu["gpus"] and gpu["saw_gpu"] is False  # Slurm set CUDA_VISIBLE_DEVICES; torch honestly saw none
    assert "saw no GPU" in rows["cuadam"]["stages"]["smoke"]["reason"] and "require_gpu = false" in done.stderr
    ccl_build = rows["ccl"]["stages"]["build"]
    assert ccl_build["status"] == "failed" and "deepspeed_ccl_comm" in ccl_build["reason"]
    assert rows["ccl"]["stages"]["publish"]["status"] == "skipped"
    table = (run / "coverage" / "coverage.md").read_text()
    assert "| adam | 3.11." in table and "| op units on | smoked on |" in table and units_on in table
    # One compiler cache for every build task; each target in its own folder, the same in every run.
    cached = [p for p in (work / "cache" / "ccache").rglob("*") if p.is_file() and p.name not in _CCACHE_BOOKS]
    assert len(cached) >= 4 and not (work / "slurm" / "targets" / "adam" / "cache" / "ccache").exists()
    # Each unit task counts its own compiles (adam's is the unit array's first task).
    assert re.search(r"ccache: \d+ hits, \d+ misses", (run / "logs" / f"units-{units['job']}_0.log").read_text())
    # The collect job was the wheelhouse's only writer, and what it published verifies.
    wheels = json.loads((house / "manifest.json").read_text())["wheels"]
    assert sorted(e["recipe"] for e in wheels.values()) == ["adam", "cuadam"]
    # The run's coverage is published with them and shown on the wheelhouse page, job ids and all.
    assert (house / "coverage.json").read_bytes() == (run / "coverage" / "coverage.json").read_bytes()
    page = (house / "index.html").read_text()
    assert '<tr data-target="adam">' in page and f"<td>{rows['adam']['slurm']['job']}</td>" in page
    assert f"<td>h100 ({smoke['job']})</td>" in page and f"<td>{units_on}</td>" in page
    assert "2 of 3 targets passed every stage they ran" in page
    verify = subprocess.run([sys.executable, "-m", "builder", "verify", "--wheelhouse", str(house)],
                            cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    assert verify.returncode == 0, verify.stderr[-2000:]
    status_cmd = subprocess.run([sys.executable, "-m", "builder", "slurm-status", str(run)], cwd=ROOT,
                                capture_output=True, text=True, env=cluster)  # fmt: skip
    assert "cuadam: build passed, smoke passed, publish passed" in status_cmd.stdout, status_cmd.stderr


def test_a_second_run_reuses_unchanged_targets_and_their_gpu_smoke(
    cluster: dict[str, str], matrix_run: dict[str, object]
) -> None:
    folder, work = Path(str(matrix_run["folder"])), Path(str(matrix_run["work"]))
    again = folder / "again.toml"
    again.write_text((folder / "matrix.toml").read_text().replace('"ccl.toml", ', ""))  # adam and cuadam again
    done = subprocess.run(
        [sys.executable, "-m", "builder", "build-wheel", "--matrix", str(again), "--slurm", "--wait",
         "--work-dir", str(work), "--wheelhouse", str(matrix_run["house"])],
        cwd=ROOT, capture_output=True, text=True, env=cluster, timeout=1200,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-5000:]
    run = max((work / "slurm").glob("run-*"), key=lambda p: p.stat().st_mtime)
    rows = json.loads((run / "coverage" / "coverage.json").read_text())["targets"]
    assert [(r["target"], r["stages"]["build"]["status"], r["stages"]["smoke"]["status"]) for r in rows] == [
        ("adam", "reused", "reused"), ("cuadam", "reused", "reused")
    ]  # fmt: skip
    # The GPU smoke job still ran on h100, and found these bytes already smoked there.
    assert "passed on node1 in an earlier run, for these bytes" in rows[1]["stages"]["smoke"]["reason"]


def test_provisioning_through_srun_installs_on_every_node(
    cluster: dict[str, str], matrix_run: dict[str, object], tmp_path: Path
) -> None:
    house = Path(str(matrix_run["house"]))
    python = node_venv(tmp_path / "node", "torch==2.13.0")  # the node's Python, with the torch the wheel needs
    out = tmp_path / "provision"
    done = subprocess.run(
        [sys.executable, "-m", "builder", "provision", "--launcher", "slurm", "--nodelist", "node2",
         "--python", python, "--wheelhouse", str(house), "--out", str(out), "--run",
         "--work-dir", str(tmp_path / "work")],
        cwd=ROOT, capture_output=True, text=True, env=cluster, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-5000:]
    assert "installed on 1/1 nodes: node2" in done.stderr
    result = json.loads((out / "results" / "node2.json").read_text())
    assert result["installed"] is True and result["wheel"].startswith("deepspeed-")
    shown = subprocess.run([python, "-m", "pip", "show", "deepspeed"],
                           capture_output=True, text=True)  # fmt: skip
    assert "Version: 0.19.8+" in shown.stdout


def test_a_submission_sbatch_refuses_leaves_no_job_and_no_run(cluster: dict[str, str], tmp_path: Path) -> None:
    """The build array goes in, then the GPU smoke job's partition does not exist: sbatch's own
    message is shown, the array is cancelled and the run folder removed."""
    _variant("cu130-multi-min.toml", tmp_path, "cuadam", ["cpu_adam"], ["9.0"])
    matrix = tmp_path / "matrix.toml"
    matrix.write_text('recipes = ["cuadam.toml"]\n\n[slurm.gpu]\n"9.0" = { partition = "nope" }\n')
    done = subprocess.run(
        [sys.executable, "-m", "builder", "build-wheel", "--matrix", str(matrix), "--slurm",
         "--work-dir", str(tmp_path / "work")],
        cwd=ROOT, capture_output=True, text=True, env=cluster, timeout=300,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr[-3000:]
    # The unit array and the build array went in first: both cancelled.
    assert "invalid partition" in done.stderr.lower() and "(cancelled the 2 jobs already submitted)" in done.stderr
    assert list((tmp_path / "work" / "slurm").glob("run-*")) == []
    queued = subprocess.run(["squeue", "-h", "-n", "ds-build", "-t", "PENDING,RUNNING"], capture_output=True,
                            text=True, env=cluster)  # fmt: skip
    assert queued.stdout.strip() == ""


# ---------------------------------------------------------------- on the nodes' own roots


def _builder(*args: str, env: dict[str, str] | None = None, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder", *args], cwd=ROOT, capture_output=True, text=True,
                          env=env, timeout=timeout)  # fmt: skip


def _on(up: Path, node: str, command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return box.ssh(up, node, command, check=check)


DEBIAN12 = ("node1", "node2", "node3")
INSTALLED = (*DEBIAN12, "node4")  # node4: Debian 11 (glibc 2.31), its site Python 3.11 and torch 2.13 in /opt/ds


@pytest.fixture(scope="module")
def provisioned(
    up: Path, matrix_run: dict[str, object], tmp_path_factory: pytest.TempPathFactory
) -> subprocess.CompletedProcess[str]:
    """`provision --hostfile` with pdsh over ssh, every node reading the shared folder at /shared."""
    tmp = tmp_path_factory.mktemp("provision-shared")
    return _builder("provision", "--hostfile", str(up / "hostfile"), "--wheelhouse", str(matrix_run["house"]),
                    "--url", "/shared/wheelhouse", "--ssh-config", str(up / "ssh" / "config"),
                    "--out", str(tmp / "scripts"), "--run", "--work-dir", str(tmp / "work"))  # fmt: skip


def test_provision_over_ssh_installs_on_every_node_the_debian_11_one_included(
    up: Path, provisioned: subprocess.CompletedProcess[str]
) -> None:
    """The default floor, manylinux_2_28, reaches the Debian 11 node (glibc 2.31): provision installs
    the same wheel on all four nodes, none of which has a compiler."""
    done = provisioned
    assert done.returncode == 0, done.stderr[-5000:]
    assert "installed on 4/4 hosts: node1, node2, node3, node4" in done.stderr
    for node in INSTALLED:
        os_line = _on(up, node, ". /etc/os-release && echo $VERSION_CODENAME; command -v cc gcc g++ nvcc || true")
        want = "bullseye" if node == "node4" else "bookworm"
        assert os_line.stdout.split() == [want], os_line.stdout  # the node has no compiler at all
        shown = _on(up, node, "/opt/ds/bin/python -m pip show deepspeed")
        assert "Version: 0.19.8+cpu" in shown.stdout
    glibc = _on(up, "node4", "getconf GNU_LIBC_VERSION; /opt/ds/bin/python -c 'import sys; print(sys.version)'")
    assert glibc.stdout.startswith("glibc 2.31\n3.11.2"), glibc.stdout


def test_the_debian_11_nodes_own_python_is_told_why_nothing_fits(
    up: Path, matrix_run: dict[str, object], tmp_path: Path
) -> None:
    """node4's system python3 (3.9) runs the installer: no wheel fits, and each one says why; the wheel
    built for the build host's own OS (the CUDA one, platform = "host") also names the glibc it needs."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node4 slots=1 python=/usr/bin/python3\n")
    done = _builder("provision", "--hostfile", str(hostfile), "--wheelhouse", str(matrix_run["house"]),
                    "--url", "/shared/wheelhouse", "--ssh-config", str(up / "ssh" / "config"),
                    "--out", str(tmp_path / "scripts"), "--run", "--work-dir", str(tmp_path / "work"))  # fmt: skip
    assert done.returncode == 3, done.stderr[-5000:]  # not every host installed: a tool error, each host's line
    (node4,) = [line for line in done.stderr.splitlines() if line.strip().startswith("node4: NOT installed")]
    assert "python cp39" in node4 and "glibc 2.31" in node4 and "built for cp311, node has cp39" in node4
    # The CPU wheels hold manylinux_2_28 (compiled in the Debian 11 root): only the Python rules them out;
    # the CUDA one was built for the host's own OS (platform = "host") and is also told the glibc it needs.
    assert "manylinux_2_28_x86_64.whl: built for cp311, node has cp39" in node4
    assert "needs glibc 2.35 or newer: RHEL 10+, Debian 12+, Ubuntu 22.04+" in node4
    assert 'python = ["3.9"]' in node4 and 'platform = "manylinux_2_31" or lower' in node4
    left = _on(up, "node4", "python3 -c 'import deepspeed' 2>&1; ls /usr/local/lib/python3.9/dist-packages",
               check=False)  # fmt: skip
    assert "No module named 'deepspeed'" in left.stdout and "deepspeed" not in left.stdout.replace("'deepspeed'", "")


def test_ds_report_on_each_node_lists_the_wheels_ops_and_compiles_nothing(
    up: Path, provisioned: subprocess.CompletedProcess[str]
) -> None:
    for node in INSTALLED:
        report = re.sub(r"\x1b\[[0-9;]*m", "", _on(up, node, "cd /tmp && /opt/ds/bin/ds_report 2>&1").stdout)
        ops = {m[1]: m[2] for m in re.finditer(r"^(\w+) \.+ \[(\w+)\]", report, re.M)}
        assert ops.get("cpu_adam") == "YES" and ops.get("deepspeed_shm_comm") == "YES", report[-3000:]
        assert ops.get("fused_adam") == "NO"  # not in this wheel, and ds_report did not build it
        # No JIT folder anywhere in the node's root (its writes are the overlay's upper layer).
        upper = up / "nodes" / node / "upper"
        assert not list(upper.rglob("torch_extensions")), node


def test_the_sites_configs_run_on_the_debian_11_node_with_no_compiler(
    up: Path, provisioned: subprocess.CompletedProcess[str]
) -> None:
    """The default recipe's DeepSpeed configs, run by the wheelhouse's config checker on node4 (Debian 11,
    no compiler) against the installed manylinux_2_28 wheel: the ones whose ops this wheel holds run, the
    others say which op they need; nothing is compiled."""
    configs = up / "shared" / "configs"
    configs.mkdir(exist_ok=True)
    for config in sorted((ROOT / "recipes" / "configs").glob("*.json")):
        shutil.copy(config, configs / config.name)
    done = _on(up, "node4", "cd /tmp && /opt/ds/bin/python /shared/wheelhouse/tools/ds-config-check.py --json "
               "/shared/configs/*.json", check=False)  # fmt: skip
    assert done.returncode in (0, 14), done.stderr[-3000:]
    results = {Path(r["name"]).name: r for r in json.loads(done.stdout)}
    assert set(results) == {c.name for c in configs.glob("*.json")}
    for name in ("adam-zero2-offload.json",):  # DeepSpeedCPUAdam: cpu_adam, which the wheel holds
        assert results[name]["status"] == "passed" and results[name]["jit"] == [], results[name]
    for name, needed in (("adam-zero0.json", "fused_adam"), ("adagrad-zero2-offload.json", "cpu_adagrad"),
                         ("lion-zero2-offload.json", "cpu_lion")):  # fmt: skip
        said = results[name]
        assert said["status"] == "needs-op" and said["detail"].startswith(f"needs {needed}, which the installed"), said
    # DeepSpeed's attempts to JIT-compile what the wheel lacks were refused: nothing was compiled.
    assert not list((up / "nodes" / "node4" / "upper").rglob("torch_extensions"))


MODULE_CHECK = """\
module use /shared/software/modulefiles
module load deepspeed || exit 20
command -v python
cd /tmp && ds_report 2>&1
python /shared/wheelhouse/tools/ds-config-check.py --json /shared/configs/*.json > /tmp/configs.json
echo "CONFIGS $(tr -d '\\n' < /tmp/configs.json)"
module purge
echo "PURGED $(command -v python || echo none) ${VIRTUAL_ENV-}"
"""


def test_provision_installs_the_module_once_and_the_other_nodes_load_it_with_no_compiler(
    up: Path, matrix_run: dict[str, object], provisioned: subprocess.CompletedProcess[str], tmp_path: Path
) -> None:
    """Issue 40 on the cluster: `provision --module` installs the adam wheel and its lock (torch
    included) as an Lmod module on the shared tree, once, from node1 (with the Python every Debian 12
    node has); node2 and node3, which never ran the installer and have no compiler, load it in a login
    shell: its python, ds_report listing the wheel's ops [YES], the default recipe's DeepSpeed configs
    run from it (those whose ops it holds run, the others say which op they need; nothing compiled),
    and `module purge` gives the shell back."""
    house = Path(str(matrix_run["house"]))
    wheels = json.loads((house / "manifest.json").read_text())["wheels"]
    (wheel,) = [n for n, e in wheels.items() if e["recipe"] == "adam"]
    locked = _builder("lock", "--wheelhouse", str(house), "--wheel", wheel, "--work-dir", str(tmp_path / "work"))
    assert locked.returncode == 0, locked.stderr[-3000:]
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{n} slots=1 python=/opt/ds/bin/python\n" for n in DEBIAN12))
    done = _builder("provision", "--hostfile", str(hostfile), "--wheelhouse", str(house), "--url", "/shared/wheelhouse",
                    "--ssh-config", str(up / "ssh" / "config"), "--out", str(tmp_path / "scripts"), "--run",
                    "--module", "/shared/software", "--work-dir", str(tmp_path / "work"))  # fmt: skip
    assert done.returncode == 0, done.stderr[-5000:]
    assert "the module is installed once, from node1" in done.stderr and "installed on 1/1 hosts: node1" in done.stderr
    modulefiles = up / "shared" / "software" / "modulefiles" / "deepspeed"
    (lua,) = modulefiles.iterdir()
    assert lua.name == f"{wheels[wheel]['version']}-py3.11.lua"
    configs = up / "shared" / "configs"
    configs.mkdir(exist_ok=True)
    for config in sorted((ROOT / "recipes" / "configs").glob("*.json")):  # the default recipe's configs
        shutil.copy(config, configs / config.name)
    (up / "shared" / "module-check.sh").write_text(MODULE_CHECK)
    for node in ("node2", "node3"):
        shell = _on(up, node, "bash -l /shared/module-check.sh", check=False)
        out = re.sub(r"\x1b\[[0-9;]*m", "", shell.stdout)
        assert shell.returncode == 0, shell.stdout[-3000:] + shell.stderr[-3000:]
        lines = out.splitlines()
        assert lines[0].startswith("/shared/software/deepspeed/") and lines[0].endswith("/bin/python"), lines[:3]
        ops = {m[1]: m[2] for m in re.finditer(r"^(\w+) \.+ \[(\w+)\]", out, re.M)}
        assert ops.get("cpu_adam") == "YES" and ops.get("deepspeed_shm_comm") == "YES", out[-3000:]
        (configs_line,) = [line for line in lines if line.startswith("CONFIGS ")]
        results = {Path(r["name"]).name: r for r in json.loads(configs_line[len("CONFIGS ") :])}
        assert set(results) == {c.name for c in configs.glob("*.json")}
        adam = results["adam-zero2-offload.json"]  # DeepSpeedCPUAdam: cpu_adam, which the module's wheel holds
        assert adam["status"] == "passed" and adam["jit"] == [], adam
        # The others need ops this wheel lacks, or DeepSpeed refuses them on CPU; none fails, none compiles.
        assert {r["status"] for r in results.values()} <= {"passed", "needs-op", "unsupported"}, results
        assert results["adam-zero0.json"]["status"] == "needs-op"  # fused_adam: not in this wheel
        assert lines[-1].split() == ["PURGED", "none"], lines[-1]  # no python on PATH, VIRTUAL_ENV unset
        assert not list((up / "nodes" / node / "upper").rglob("torch_extensions"))
        assert _on(up, node, "command -v cc gcc g++ || echo no-compiler").stdout.split() == ["no-compiler"]


def test_provision_over_http_from_nginx(up: Path, matrix_run: dict[str, object], tmp_path: Path) -> None:
    """The same wheelhouse, served by nginx on node1 as a plain static folder, unchanged."""
    done = _builder("provision", "--hostfile", str(up / "hostfile"), "--wheelhouse", str(matrix_run["house"]),
                    "--url", "http://node1/wheelhouse", "--ssh-config", str(up / "ssh" / "config"),
                    "--out", str(tmp_path / "scripts"), "--run", "--work-dir", str(tmp_path / "work"))  # fmt: skip
    assert "installed on 4/4 hosts: node1, node2, node3, node4" in done.stderr, done.stderr[-4000:]
    log = (up / "nodes" / "node1" / "upper" / "var" / "log" / "nginx" / "access.log").read_text()
    wheel = next(n for n in json.loads((Path(str(matrix_run["house"])) / "manifest.json").read_text())["wheels"]
                 if "+cpu" in n)  # fmt: skip
    for node in INSTALLED:
        addr = next(n.addr for n in box.NODES if n.name == node)
        assert re.search(rf"^{re.escape(addr)} .*\"GET /wheelhouse/manifest.json.sig HTTP/1.1\" 200 ", log, re.M), node
    for node in INSTALLED:
        addr = next(n.addr for n in box.NODES if n.name == node)
        assert re.search(
            rf"^{re.escape(addr)} .*\"GET /wheelhouse/{re.escape(quote(wheel))} HTTP/1.1\" 200 ", log, re.M
        )


def test_pip_and_uv_install_from_nginx_unchanged(
    up: Path, matrix_run: dict[str, object], provisioned: subprocess.CompletedProcess[str], tmp_path: Path
) -> None:
    """The wheelhouse's PEP 503 index as nginx serves it: pip on node2 (its own venv, no other index)
    and the toolkit's uv on the build host install the published wheel from it as from any index."""
    manifest = json.loads((Path(str(matrix_run["house"])) / "manifest.json").read_text())
    version = next(e["version"] for n, e in manifest["wheels"].items() if "+cpu" in n)
    _on(up, "node2", "/opt/ds/bin/python -m pip uninstall -y -q deepspeed")
    # --trusted-host: pip ignores an index over plain HTTP without it (its own rule, not the wheelhouse's).
    pip = _on(up, "node2", "/opt/ds/bin/python -m pip install --trusted-host node1 --index-url "
              f"http://node1/wheelhouse/simple/ 'deepspeed=={version}'", check=False)  # fmt: skip
    assert pip.returncode == 0, pip.stdout[-2000:] + pip.stderr[-2000:]
    assert f"Successfully installed deepspeed-{version}" in pip.stdout
    from builder.envs import TOOLS, uv_binary

    python = node_venv(tmp_path / "venv", "torch==2.13.0")
    uv = subprocess.run([uv_binary(TOOLS), "pip", "install", "--python", python, "--index-url",
                         "http://10.77.0.11/wheelhouse/simple/", f"deepspeed=={version}"],
                        capture_output=True, text=True, env={**os.environ, "NO_PROXY": "*"})  # fmt: skip
    assert uv.returncode == 0, uv.stderr[-2000:]
    assert f"+ deepspeed=={version}" in uv.stderr
    log = (up / "nodes" / "node1" / "upper" / "var" / "log" / "nginx" / "access.log").read_text()
    assert re.search(r'^10\.77\.0\.12 .*"GET /wheelhouse/simple/deepspeed/ HTTP/1.1" 200 .*pip/', log, re.M)
    assert re.search(r'^10\.77\.0\.1 .*"GET /wheelhouse/simple/deepspeed/ HTTP/1.1" 200 .*uv/', log, re.M)


ZERO_STEP = {
    "train_batch_size": 4, "train_micro_batch_size_per_gpu": 1,  # one a rank, four ranks
    "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
}  # fmt: skip


def test_torchrun_across_four_nodes_debian_11_included_runs_a_zero_step_with_the_cpu_optimizer_from_the_wheel(
    up: Path, provisioned: subprocess.CompletedProcess[str]
) -> None:
    """torchrun on each node (c10d rendezvous at node1, gloo between the nodes' own addresses) runs the
    wheelhouse's config checker as one rank each: ZeRO-2 with the optimizer offloaded to DeepSpeedCPUAdam,
    the Debian 11 node's rank from the same manylinux_2_28 wheel as the Debian 12 nodes'."""
    (up / "shared" / "zero2-cpu-offload.json").write_text(json.dumps(ZERO_STEP))
    command = ("cd /tmp && /opt/ds/bin/torchrun --nnodes 4 --nproc-per-node 1 --rdzv-backend c10d "
               "--rdzv-endpoint node1:29400 --rdzv-id ds-cluster-test /shared/wheelhouse/tools/ds-config-check.py "
               "--launched --json /shared/zero2-cpu-offload.json")  # fmt: skip
    ssh = ["ssh", "-F", str(up / "ssh" / "config")]
    procs = {n: subprocess.Popen([*ssh, n, command], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for n in INSTALLED}  # fmt: skip
    try:
        said = {n: p.communicate(timeout=300) for n, p in procs.items()}
    finally:  # a rank that never came leaves the others waiting in the rendezvous: none outlives the test
        for p in procs.values():
            p.kill()
    ranks = {}
    for node, (out, err) in said.items():
        assert procs[node].returncode == 0, (node, out, err[-3000:])
        result = json.loads(out.strip().splitlines()[-1])
        assert result["host"] == node and result["status"] == "passed", result
        ranks[result["rank"]] = result
    assert sorted(ranks) == [0, 1, 2, 3] and {r["world"] for r in ranks.values()} == {4}
    for r in ranks.values():
        assert r["backend"] == "gloo" and r["master"].split(":")[0] in ("10.77.0.11", "node1"), r
        assert r["ops"] == ["deepspeed_shm_comm", "cpu_adam"] and r["jit"] == [], r
        assert "with DeepSpeedCPUAdam" in r["detail"]
    assert len({r["detail"] for r in ranks.values()}) == 1  # one model, one loss on every rank: they talked


def test_64_installs_at_once_against_nginx_and_against_serve(
    up: Path, matrix_run: dict[str, object], tmp_path: Path
) -> None:
    """The bench's cluster row, run here: 64 downloads at once of the files an install fetches,
    each sha256 checked (a share on each Debian 12 node), and 9 node installer dry runs at once
    (signature, manifest, every file fetched and checked: each starts Python and torch, so on 2
    cores CI runs 9, `nox -s bench -- --cluster` 64), against nginx on node1 and against `serve`
    on the build host; every result checked against the manifest."""
    done = _builder("bench", "--cluster", str(up), "--out", str(tmp_path), "--installs", "64", "--dry-runs", "9",
                    timeout=1200)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads((tmp_path / "bench-cluster.json").read_text())
    assert result["nodes"] == list(INSTALLED)
    for server, count in (("nginx", 9), ("serve", 9), ("nginx_downloads", 64), ("serve_downloads", 64)):
        got = result[server]
        assert got["installs"] == got["ok"] == count and got["problems"] == [], got
        assert 0 < got["median_install_s"] <= got["seconds"]
    # Downloads only: the files one install fetched (the wheel and its dependencies), 64 times over.
    files = result["nginx_downloads"]["files"]
    assert files == result["nginx"]["files"] and files[0].startswith("deepspeed-") and len(files) > 5
    assert result["serve_downloads"]["megabytes"] == result["nginx_downloads"]["megabytes"] > 64
    assert result["nginx"]["url"] == "http://node1/wheelhouse" and result["serve"]["url"].startswith(
        "http://10.77.0.1:"
    )
    log = (up / "nodes" / "node1" / "upper" / "var" / "log" / "nginx" / "access.log").read_text()
    wheel = next(n for n in json.loads((Path(str(matrix_run["house"])) / "manifest.json").read_text())["wheels"]
                 if "+cpu" in n)  # fmt: skip
    assert len(re.findall(rf"\"GET /wheelhouse/{re.escape(quote(wheel))} HTTP/1.1\" 200 ", log)) >= 64 + 9
    print((tmp_path / "bench-cluster.md").read_text())  # the figures, in the test's output


# ---------------------------------------------------------------- faults


def _trust_line() -> str:
    shown = _builder("key", "show")
    assert shown.returncode == 0, shown.stderr
    return shown.stdout.strip().splitlines()[-1]


def _wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"waited {timeout:.0f} s for {what}"
        time.sleep(0.2)


def test_a_node_whose_network_goes_down_during_an_install_fails_cleanly_and_a_rerun_succeeds(
    up: Path, provisioned: subprocess.CompletedProcess[str]
) -> None:
    """node3 installs through a slow link (nginx's /slow/, 64 kB/s); once it has chosen its wheel
    and is fetching it, its cable is pulled: the download stalls, the installer gives up after its
    fetch timeout (5 s here) with one clear line, pip never ran, nothing is left; with the cable
    back the same command installs."""
    _on(up, "node3", "/opt/ds/bin/python -m pip uninstall -y -q deepspeed")
    out, rc = up / "shared" / "net-fault.out", up / "shared" / "net-fault.rc"
    install = (f"/opt/ds/bin/python /shared/wheelhouse/tools/ds-node-install.py --trust {shlex.quote(_trust_line())} "
               "--wheelhouse http://node1/slow/wheelhouse")  # fmt: skip
    background = shlex.quote(f"{install} > /shared/{out.name} 2>&1; echo $? > /shared/{rc.name}")
    _on(up, "node3", f"DS_NODE_FETCH_TIMEOUT=5 nohup sh -c {background} > /dev/null 2>&1 &")
    _wait_for(lambda: out.exists() and "==> chosen: " in out.read_text(), 120, "node3 to choose its wheel")
    box.set_link("node3", False)
    try:
        _wait_for(rc.exists, 60, "the installer on node3 to give up")
    finally:
        box.set_link("node3", True)
    said = out.read_text()
    assert rc.read_text().strip() == "9", said[-3000:]
    assert re.search(r"error: cannot fetch http://node1/slow/wheelhouse/deepspeed-\S+\.whl: .*timed out", said), said
    assert "nothing was installed" in said and "pip install" not in said
    left = _on(up, "node3", "/opt/ds/bin/python -m pip show deepspeed; ls /tmp", check=False)
    assert "Name: deepspeed" not in left.stdout and "ds-install-" not in left.stdout
    again = _on(up, "node3", install.replace("/slow/", "/"), check=False)
    assert again.returncode == 0 and "==> installed deepspeed-" in again.stderr, again.stderr[-3000:]


def test_a_publish_into_a_share_that_stops_taking_writes_says_so_and_leaves_the_wheelhouse_as_it_was(
    up: Path, matrix_run: dict[str, object]
) -> None:
    """The shared folder stops taking writes in the middle of a publish, once its journal is
    written. Remounting the share read-only at that moment is what a failing NFS server does, but
    the kernel refuses to remount a mount read-only while a file on it is open for writing (the
    publish lock is, throughout: "mount point is busy"), so the folder is made immutable instead
    (chattr +i: every new file and rename in it refused, as on a read-only share)."""
    house = Path(str(matrix_run["house"]))
    before = {p.name: p.read_bytes() for p in (house / "manifest.json", house / "manifest.json.sig")}
    work = Path(str(matrix_run["work"])) / "slurm" / "targets" / "adam"
    publisher = subprocess.Popen([sys.executable, "-m", "builder", "publish", "--work-dir", str(work),
                                  "--wheelhouse", str(house)], cwd=ROOT, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        journal, deadline = house / ".publish-journal.json", time.monotonic() + 120
        while not journal.exists() and publisher.poll() is None and time.monotonic() < deadline:
            time.sleep(0.001)  # the journal is written a fraction of a second before the first copy
        subprocess.run(["chattr", "+i", str(house)], check=True)
        said = publisher.communicate(timeout=300)[0]
    finally:
        subprocess.run(["chattr", "-i", str(house)], check=True)
    assert publisher.returncode == 7, said[-3000:]
    assert "Traceback" not in said and f"error: the wheelhouse {house} refused a write during the update" in said
    assert "its signed manifest, what nodes read, is still the one it had" in said and "repair --wheelhouse" in said
    assert {p: (house / p).read_bytes() for p in before} == before  # nodes still read the previous wheelhouse
    repaired = _builder("repair", "--wheelhouse", str(house))
    assert repaired.returncode == 0, repaired.stderr
    verified = _builder("verify", "--wheelhouse", str(house))
    assert verified.returncode == 0, verified.stderr[-3000:]


def test_the_slurm_controller_restarted_while_jobs_wait(
    up: Path, cluster: dict[str, str], matrix_run: dict[str, object]
) -> None:
    """The matrix is submitted and followed (--wait); slurmctld is stopped as soon as the jobs are
    in and started again 15 s later: the jobs wait in its saved state, `--wait` asks again until it
    answers, and the run ends as it would have."""
    folder = Path(str(matrix_run["folder"]))
    matrix = folder / "restart.toml"
    matrix.write_text((folder / "matrix.toml").read_text().replace('"ccl.toml", ', "").replace(', "cuadam.toml"', ""))
    follow = subprocess.Popen(
        [sys.executable, "-m", "builder", "build-wheel", "--matrix", str(matrix), "--slurm", "--wait",
         "--work-dir", str(matrix_run["work"]), "--wheelhouse", str(matrix_run["house"])],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=cluster,
    )  # fmt: skip
    assert follow.stderr is not None
    said = []
    for line in follow.stderr:
        said.append(line)
        if "submitted 1 targets" in line or "submitted 1 target" in line:
            break
    box.stop_slurmctld(up)
    time.sleep(15)  # past SlurmctldTimeout (10 s), as long as Slurm's clients wait for a controller
    box.start_slurmctld(up)
    rest = follow.communicate(timeout=900)[1]
    text = "".join(said) + rest
    assert follow.returncode == 0, text[-4000:]
    if "squeue failed" in text:  # the controller was away when squeue asked: asked again until it answered
        assert "asking again" in text and "squeue answers again" in text
    assert "adam: build reused, smoke reused, publish passed" in text
    assert re.search(r"Recovered information about \d+ jobs", (up / "slurm" / "slurmctld.log").read_text())


def test_a_node_killed_while_its_unit_task_compiles_is_named_and_its_unit_built_on_a_live_node(
    up: Path, cluster: dict[str, str], matrix_run: dict[str, object]
) -> None:
    """A new target (cpu_adagrad, in no cache yet) goes through the unit array; once its unit task
    has started compiling, every process of the node it runs on is killed at once (its slurmd,
    the task, the compiler). Slurm marks the node down and ends the task (NODE_FAIL, not requeued);
    the build task, on a node left, compiles the unit the dead task held, and the run passes,
    naming the node that died and the unit. Then the node is powered on again."""
    folder = Path(str(matrix_run["folder"]))
    # Its own label: its wheel would otherwise take the name of the matrix's adam wheel (both manylinux_2_28).
    _variant("cpu.toml", folder, "adagrad", ["cpu_adagrad"], label="adagrad")
    matrix = folder / "kill.toml"
    matrix.write_text('recipes = ["adagrad.toml"]\n\n[slurm]\ncpus = 2\nmem = "6G"\ntime = "00:40:00"\n')
    follow = subprocess.Popen(
        [sys.executable, "-m", "builder", "build-wheel", "--matrix", str(matrix), "--slurm", "--wait",
         "--work-dir", str(matrix_run["work"]), "--wheelhouse", str(matrix_run["house"])],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=cluster,
    )  # fmt: skip
    work = Path(str(matrix_run["work"]))
    marker: list[Path] = []

    def started() -> bool:
        newest = max((work / "slurm").glob("run-*"), key=lambda p: p.stat().st_mtime)
        marker[:] = list((newest / "results").glob("adagrad.units-0.started.json"))
        return bool(marker)

    _wait_for(started, 300, "the unit task to start")
    victim = json.loads(marker[0].read_text())["node"]
    time.sleep(3)  # into its compile (cpu_adagrad takes tens of seconds)
    killed = box.kill_node(victim)
    try:
        rest = follow.communicate(timeout=1200)[1]
    finally:
        box.revive(up, victim)
    assert killed and follow.returncode == 0, rest[-5000:]
    run = marker[0].parents[1]
    assert not (run / "results" / "adagrad.units-0.json").exists()  # the task died without a result
    (row,) = json.loads((run / "coverage" / "coverage.json").read_text())["targets"]
    assert {s: v["status"] for s, v in row["stages"].items()} == {"build": "passed", "smoke": "passed",
                                                                  "publish": "passed"}  # fmt: skip
    task = json.loads(marker[0].read_text())["job"]
    assert row["slurm"]["units_on"] == f"cpu_adagrad (its unit task {task} died on {victim}: built by the build task)"
    assert row["slurm"]["node"] != victim  # the build task ran on a node left
    build = json.loads(next((work / "slurm" / "targets" / "adagrad" / "dist").glob("*.whl.build.json")).read_text())
    assert build["units"]["cpu_adagrad"]["status"] == "built"
    state = subprocess.run(["sinfo", "-h", "-N", "-n", victim, "-o", "%T"], capture_output=True, text=True,
                           env=cluster).stdout.split()  # fmt: skip
    assert state and state[0] == "idle"  # powered on again, back in service
    assert "Traceback" not in rest
