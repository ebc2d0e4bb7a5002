"""Nodes installing the default build's wheel: the command build-wheel printed, the node installer over
HTTP from `serve`, the page's node-installer command (on a copy of the wheelhouse: it tampers with the
installer), and check-config against the real wheel.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from conftest import DefaultBuild, copy_house, work_sharing_cache
from nodes import node_venv
from pipeline_common import OPS, ROOT, VERSION, WHEEL, builder

pytestmark = pytest.mark.integration


def test_check_config_says_what_each_config_needs_and_every_bad_one(
    pipeline: tuple[Path, subprocess.CompletedProcess[str]], default_build: DefaultBuild, tmp_path: Path
) -> None:
    """check-config against the real wheel (a fresh venv, no compiler): ZeRO-3 with NVMe offload asks
    for async_io, which the default wheel lacks (found by running it, with the recipe line); the bad
    configs each get their line and the others are still reported; exit 14."""
    house, _ = pipeline
    workspace = work_sharing_cache(default_build.work, tmp_path / "work")
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    base = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}}
    files = {
        "nvme.json": {**base, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme",
                                                                                      "nvme_path": str(nvme)}}},
        "adamw.json": {**base, "optimizer": {"type": "AdamW"}, "bf16": {"enabled": True}},
        "unwritable.json": {**base, "zero_optimization": {"stage": 3, "offload_optimizer": {
            "device": "nvme", "nvme_path": str(tmp_path / "no-such-disk")}}},
        "system.json": {**base, "zero_optimization": {"stage": 3, "offload_optimizer": {
            "device": "nvme", "nvme_path": "/etc"}}},
        "typo-top.json": {**base, "zero_optimisation": {"stage": 2}},
        "too-many.json": {**base, "train_batch_size": 4096},
        "typo.json": {**base, "zero_optimization": {"stage": 2, "offload_optimiser": {"device": "cpu"}}},
    }  # fmt: skip
    for name, config in files.items():
        (tmp_path / name).write_text(json.dumps(config))
    (tmp_path / "broken.json").write_text("{'single': quotes}")
    names = [*files, "broken.json", "absent.json"]
    done = builder("check-config", "--work-dir", str(workspace), "--wheel", str(house / WHEEL), "--json",
                   *(str(tmp_path / n) for n in names))  # fmt: skip
    assert done.returncode == 14, done.stderr[-3000:]
    got = {Path(r["config"]).name: r for r in json.loads(done.stdout)}
    # async_io's builder loads pin_memory first: the wheel has neither, so both are named.
    assert got["nvme.json"]["status"] == "needs-op" and got["nvme.json"]["needs"] == ["async_io", "pin_memory"]
    assert got["nvme.json"]["means"] == ('needs op async_io, pin_memory, which the wheel lacks: add "async_io", '
                                         '"pin_memory" to the recipe\'s ops')  # fmt: skip
    assert got["adamw.json"]["status"] == "passed" and "fused_adam" in got["adamw.json"]["ops"]
    assert "torch.bfloat16" in got["adamw.json"]["detail"]
    assert got["unwritable.json"]["detail"] == (f"the config offloads to nvme_path {str(tmp_path / 'no-such-disk')!r}, "
                                                "which is not a folder this user can write: create it or name "
                                                "another")  # fmt: skip
    assert "the system folder /etc: DeepSpeed would write its swap files there" in got["system.json"]["detail"]
    assert got["typo-top.json"]["status"] == "invalid"  # DeepSpeed itself would run it at ZeRO 0 and say nothing
    assert "'zero_optimisation' (did you mean 'zero_optimization'?)" in got["typo-top.json"]["detail"]
    assert list(nvme.iterdir()) == [] and not Path("/etc/zero_stage_3").exists()  # the checks' scratch is gone
    assert got["too-many.json"]["detail"].startswith("the config needs 1024 processes")
    assert got["typo.json"]["status"] == "invalid" and "offload_optimiser" in got["typo.json"]["detail"]
    assert got["broken.json"]["detail"].startswith(f"{tmp_path / 'broken.json'} is not JSON")
    assert got["absent.json"]["detail"] == f"{tmp_path / 'absent.json'} does not exist"
    assert "error: 8 of 9 configs do not run from the wheel" in done.stderr
    assert not list((workspace / "tmp").glob("check-config-*"))  # its venv is gone
    # Issue 56, item 5: the GPU node's way, on CPU: each config's processes forked from a server that
    # imported torch and DeepSpeed (a CUDA context cannot be forked from the runner). The same results.
    served = builder("check-config", "--work-dir", str(workspace), "--wheel", str(house / WHEEL), "--json",
                     *(str(tmp_path / n) for n in names),
                     env={**os.environ, "DS_CONFIG_RUNNER_START": "forkserver"})  # fmt: skip
    assert served.returncode == 14, served.stderr[-3000:]
    again = {Path(r["config"]).name: r for r in json.loads(served.stdout)}
    assert {n: r["status"] for n, r in again.items()} == {n: r["status"] for n, r in got.items()}
    assert again["adamw.json"]["ops"] == got["adamw.json"]["ops"]
    log = (workspace / "logs" / "check-config.log").read_text()
    assert "a fork server imported torch and DeepSpeed" in log
    # A time limit per config: one that runs past it is stopped and said to. Muon starts torch.compile
    # (importing inductor alone takes over a second here), so 0.3 s stops it mid-way.
    muon = tmp_path / "muon.json"
    muon.write_text(json.dumps({**base, "optimizer": {"type": "Muon"}, "zero_optimization": {"stage": 1}}))
    slow = builder("check-config", "--work-dir", str(workspace), "--wheel", str(house / WHEEL), "--timeout", "0.3",
                   str(muon))  # fmt: skip
    assert slow.returncode == 14
    assert "the config did not finish within 0.3 s (its time limit)" in slow.stdout


def test_the_printed_install_command_works_with_only_the_wheelhouse_reachable(
    pipeline: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    """An air-gapped node: torch installed, no pip configuration, only the wheelhouse's index.
    The command build-wheel printed is run exactly as printed; DeepSpeed's dependencies must
    come from the wheelhouse."""
    _, result = pipeline
    printed = [line for line in result.stderr.splitlines() if line.startswith("==> install it with: ")]
    assert len(printed) == 1, result.stderr[-3000:]
    command = shlex.split(printed[0].removeprefix("==> install it with: "))
    assert command[:3] == ["pip", "install", "--index-url"] and command[3].startswith("file://")
    env_dir = tmp_path / "node"
    python = node_venv(env_dir, "torch==2.13.0")  # nodes have torch
    offline = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    offline.update(PIP_CONFIG_FILE="/dev/null", PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    done = subprocess.run([str(env_dir / "bin" / "pip"), *command[1:]], capture_output=True, text=True, env=offline)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert WHEEL.replace("+", "%2B") in done.stdout or WHEEL in done.stdout
    probe = subprocess.run(
        [
            python,
            "-c",
            "import deepspeed, json; from deepspeed.git_version_info import installed_ops as o; "
            "print(json.dumps([deepspeed.__version__, o]))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    version, installed = json.loads(probe.stdout.strip().splitlines()[-1])
    assert version == VERSION
    assert all(installed[op] for op in OPS)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_node_installs_its_wheel_from_the_served_wheelhouse(
    pipeline: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    """An air-gapped node with only Python, pip and its torch (no pip configuration, the index on a
    closed port): `builder install` over HTTP from `builder serve` installs the real wheel and its
    14-odd dependency wheels from the wheelhouse alone, every file hash-checked (issue 20)."""
    import time
    import urllib.request

    house, _ = pipeline
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "builder", "serve", "--wheelhouse", str(house), "--port", str(port)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}/"
        for _ in range(100):
            try:
                urllib.request.urlopen(url + "simple/", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        node = tmp_path / "node"
        python = node_venv(node, "torch==2.13.0")
        no_packaging = subprocess.run([python, "-c", "import packaging"], capture_output=True)
        assert no_packaging.returncode != 0  # the node has nothing of the builder's dependencies
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
        env.update(PYTHONPATH=str(ROOT), PIP_CONFIG_FILE="/dev/null", PIP_INDEX_URL="http://127.0.0.1:9/simple/",
                   PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1")  # fmt: skip
        done = subprocess.run(
            [python, "-m", "builder", "install", "--wheelhouse", url, "--json"], env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"==> chosen: {WHEEL}" in done.stderr and "verified" in done.stderr
        deps = json.loads(done.stdout)["dependencies"]
        assert any(d.startswith("hjson-") for d in deps) and any(d.startswith("psutil-") for d in deps), deps
        version = (
            subprocess.run(
                [python, "-c", "import deepspeed; print(deepspeed.__version__)"],
                capture_output=True,
                text=True,
                check=True,
            )
            .stdout.strip()
            .splitlines()[-1]
        )
        assert version == VERSION
        # Issue 29 on the node: its own configs against what is installed, with the wheelhouse's
        # checker (tools/ds-config-check.py, its sha256 from the manifest): Adam ZeRO-0 runs from
        # the wheel; ZeRO-3 with NVMe offload needs ops the default wheel lacks; exit 14.
        nvme = tmp_path / "nvme.json"
        (tmp_path / "disk").mkdir()
        nvme.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "Adam"},
                                    "zero_optimization": {"stage": 3, "offload_optimizer": {
                                        "device": "nvme", "nvme_path": str(tmp_path / "disk")}}}))  # fmt: skip
        adam = ROOT / "recipes" / "configs" / "adam-zero0.json"
        done = subprocess.run([python, "-m", "builder", "install", "--wheelhouse", url, "--dry-run", "--json",
                               "--check-config", str(adam), "--check-config", str(nvme)],
                              env=env, capture_output=True, text=True)  # fmt: skip
        assert done.returncode == 14, done.stdout + done.stderr
        checked = {Path(r["name"]).name: r for r in json.loads(done.stdout)["configs_checked"]}
        assert checked["adam-zero0.json"]["status"] == "passed" and "fused_adam" in checked["adam-zero0.json"]["ops"]
        assert checked["nvme.json"]["status"] == "needs-op"
        assert checked["nvme.json"]["jit"] == ["async_io", "pin_memory"]
        assert "error: 1 config(s) do not run from the installed wheel" in done.stderr
        # And plain pip through the same server.
        other = tmp_path / "plain"
        venv.create(other, with_pip=True)
        done = subprocess.run(
            [str(other / "bin" / "python"), "-m", "pip", "download", "--no-deps", "-d", str(tmp_path / "dl"),
             "--index-url", url + "simple/", f"deepspeed=={VERSION}"],
            capture_output=True, text=True,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
    finally:
        server.terminate()
        server.wait(10)


@pytest.mark.skipif(not shutil.which("curl"), reason="curl is not installed (apt-get install curl)")
def test_the_pages_node_installer_command_installs_on_an_air_gapped_node(
    default_build: DefaultBuild, tmp_path: Path
) -> None:
    """The node installer's command exactly as the page shows it (read from the page, unescaped),
    run by bash on a node with only Python, pip and its torch: no pip configuration, no index
    reachable, WH the wheelhouse's file:// URL. It fetches tools/ds-node-install.py, checks its
    sha256 and installs the wheel that fits. On a copy of the wheelhouse: it tampers with the installer
    there for a moment, while other workers install from the original."""
    import html
    import re

    from builder import node
    from builder.wheelhouse.page import node_installer_command

    house = copy_house(default_build, tmp_path / "wheelhouse")
    page = (house / "index.html").read_text()
    (shown,) = re.findall(r'<pre class="cmd" data-kind="node-installer" data-wheel=""><code>(.*?)</code></pre>', page,
                          re.S)  # fmt: skip
    command = html.unescape(shown)
    manifest = node.parse_manifest((house / "manifest.json").read_text())
    assert command == node_installer_command(manifest)
    python = node_venv(tmp_path / "node", "torch==2.13.0")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_", "PYTHON"))}
    env.update(
        PATH=f"{tmp_path / 'node' / 'bin'}{os.pathsep}{env['PATH']}",
        PIP_CONFIG_FILE="/dev/null",
        PIP_INDEX_URL="http://127.0.0.1:9/simple/",
        PIP_NO_CACHE_DIR="1",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        TMPDIR=str(tmp_path / "tmp"),  # the command's `mktemp -d` folders: the test's, not /tmp's
    )
    (tmp_path / "run").mkdir()
    (tmp_path / "tmp").mkdir()
    done = subprocess.run(["bash", "-c", f'WH="{house.resolve().as_uri()}"\n{command}'], cwd=tmp_path / "run",
                          env=env, capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "ds-node-install.py: OK" in done.stdout and f"==> chosen: {WHEEL}" in done.stderr
    version = subprocess.run([python, "-c", "import deepspeed; print(deepspeed.__version__)"], capture_output=True,
                             text=True, check=True).stdout.strip().splitlines()[-1]  # fmt: skip
    assert version == VERSION
    assert f"manifest signed by {node.fingerprint_of(manifest.signer)}" in done.stderr
    # A tampered installer in the wheelhouse is refused by the command's own check: nothing runs.
    tool = house / "tools" / "ds-node-install.py"
    original = tool.read_bytes()
    try:
        tool.write_bytes(original + b"\nraise SystemExit('tampered installer ran')\n")
        refused = subprocess.run(["bash", "-c", f'WH="{house.resolve().as_uri()}"\n{command}'],
                                 cwd=tmp_path / "run", env=env, capture_output=True, text=True)  # fmt: skip
        assert refused.returncode != 0 and "FAILED" in refused.stdout + refused.stderr
        assert "tampered installer ran" not in refused.stdout + refused.stderr
    finally:
        tool.write_bytes(original)
    # Issue 28's forgery on the real wheel, on a copy of the wheelhouse: a line planted in DeepSpeed's
    # __init__.py, the new sha256 put into the smoke report and the manifest. The page's command
    # stops at the signature: neither the installer nor pip runs.
    forged = tmp_path / "forged"
    shutil.copytree(house, forged)
    wheel = forged / WHEEL
    with zipfile.ZipFile(house / WHEEL) as src, zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            data = src.read(info)
            dst.writestr(info, data + b"\nraise SystemExit('planted line ran')\n" if info.filename ==
                         "deepspeed/__init__.py" else data)  # fmt: skip
    data = json.loads((forged / "manifest.json").read_text())
    data["wheels"][WHEEL]["sha256"] = hashlib.sha256(wheel.read_bytes()).hexdigest()
    (forged / "manifest.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    refused = subprocess.run(["bash", "-c", f'WH="{forged.as_uri()}"\n{command}'], cwd=tmp_path / "run", env=env,
                             capture_output=True, text=True)  # fmt: skip
    assert refused.returncode != 0 and "Could not verify signature" in refused.stdout + refused.stderr
    assert "==> chosen" not in refused.stderr and "pip install" not in refused.stderr


def test_prove_installs_the_nodes_wheel_from_the_wheelhouse_alone_beside_the_nodes_torch(
    pipeline: tuple[Path, subprocess.CompletedProcess[str]], default_build: DefaultBuild, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Issue 58, on CPU: `prove`'s own path up to its checks, for real, against the default build's
    wheelhouse: the manifest read and the wheel chosen as the installer does, the wheel and its closure
    downloaded and checked by sha256, a venv that sees this (node's) torch and gets everything else from
    the wheelhouse alone (an index that answers nothing is set and never asked), the wheel shown to be
    in it, the proof written. FAKE, as this machine has no GPU: the node's GPU (the probe says 9.0; the
    wheel is chosen for this CPU node), the GPU facts (an H200's), and the checks (one import in the venv,
    standing in for the smoke's checks, which other tests run)."""
    from builder import node, proof, smoke
    from builder.contracts import Check, Gpu, GpuFacts, Proof
    from builder.errors import ToolError
    from builder.workspace import Workspace

    house, _ = pipeline
    ws = Workspace(work_sharing_cache(default_build.work, tmp_path / "work"))
    probe, choose = node.probe_node, node.choose
    monkeypatch.setattr(node, "probe_node", lambda python: dataclasses.replace(probe(python), gpus=("9.0",)))
    monkeypatch.setattr(node, "choose", lambda m, here, ops=(): choose(m, dataclasses.replace(here, gpus=())))
    h200 = GpuFacts((Gpu("NVIDIA H200", "9.0", 143771),), "580.95.05", "13.0", "2.13.0", "", "3.11.9", "n1")
    monkeypatch.setattr(proof, "gpu_facts", lambda python, env: h200)
    for name in ("UV_INDEX_URL", "PIP_INDEX_URL"):  # nothing answers there: an index asked would fail the install
        monkeypatch.setenv(name, "http://127.0.0.1:9/simple")
    seen: dict[str, str] = {}

    def checks(manifest: object, python: Path, env: dict[str, str], *rest: object) -> tuple[Check, ...]:
        code = "import deepspeed, numpy, torch\nprint(deepspeed.__file__)\nprint(torch.__file__)"
        said = subprocess.run([str(python), "-c", code], env=env, capture_output=True, text=True, check=False)
        assert said.returncode == 0, said.stderr[-2000:]
        seen["deepspeed"], seen["torch"] = said.stdout.split()
        seen["venv"] = str(python.parent.parent)
        return (Check("import", "passed", said.stdout.split()[0]),)

    monkeypatch.setattr(smoke, "run_checks", checks)
    # This node has none of what the quantized checks import, and the wheelhouse serves DeepSpeed's closure
    # alone: said, with the two ways out. Without them (the stand-in checks import none), it is proven.
    with pytest.raises(ToolError, match="the proof's environment cannot be made from the wheelhouse and this node"):
        proof.prove(str(house), ws, tmp_path / "proofs")
    assert not (tmp_path / "proofs").exists() or not list((tmp_path / "proofs").iterdir())
    monkeypatch.setattr(proof, "PROVE_EXTRAS", ())
    made = proof.prove(str(house), ws, tmp_path / "proofs")
    assert made.wheel == WHEEL and made.sha256 == hashlib.sha256((house / WHEEL).read_bytes()).hexdigest()
    assert seen["deepspeed"].startswith(seen["venv"])  # the wheel, in the proof's own venv
    assert not seen["torch"].startswith(seen["venv"]) and seen["torch"].startswith(sys.prefix)  # the node's torch
    written = Proof.from_json((tmp_path / "proofs" / f"{WHEEL}.proof.json").read_bytes(), "proof")
    assert written == made and not list(ws.scratch.iterdir())
