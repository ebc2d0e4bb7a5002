"""prove: a CUDA wheel's checks run on a GPU node, written as its GPU proof (`<wheel>.proof.json`).

Most sites compile CUDA wheels where no GPU is; their smoke there runs no CUDA kernel. On a GPU
node, `prove` picks the wheel for the node from a wheelhouse exactly as the node installer does
(the same manifest reader, probe and choice), installs it with its dependency closure from the
wheelhouse alone into a fresh venv that sees the node's own torch, and runs the smoke's checks and
config matrix there with their blame rules. It needs no key: the statement it writes (an in-toto
v1 Statement, contracts.Proof) is signed into the wheelhouse by the build host (`publish --proof`).
"""

from __future__ import annotations

import dataclasses
import datetime
import re
import shutil
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from builder import __version__, cmd, envs, output, smoke
from builder.contracts import BuildManifest, Check, Gpu, GpuFacts, Proof, wheel_failures
from builder.errors import SmokeError, ToolError
from builder.files import dest_folder, scratch_folder, sweep_dead, write_atomic
from builder.node import ManifestError
from builder.workspace import Workspace

# What the quantized-load checks import beyond the wheel's closure: the node's own, or a gathered
# folder's (--offline). Unpinned where the smoke pins: the node's bitsandbytes is the one to prove with.
PROVE_EXTRAS = ("transformers>=5,<6", "accelerate>=1.10", "bitsandbytes", "safetensors>=0.4")


def proof_path(dest: Path, wheel: str) -> Path:
    return dest / f"{wheel}.proof.json"


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def host_name() -> str:
    """This node's name as a proof records it: printable, at most 253 characters."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname()).lstrip("._-")[:253]
    return name or "unknown"


def facts_of(torch_version: str | None, cuda: str | None, nccl: str | None, gpus: Sequence[Gpu], driver: str | None,
             python: str, host: str, error: str = "") -> GpuFacts:  # fmt: skip
    """What a proof says of the node (pure), or the error that says why there is nothing to prove on."""
    if torch_version is None:
        raise SmokeError(f"torch cannot be imported in the proof's environment ({error[:300] or 'no answer'})",
                         "read the log; the node's torch must import in a venv that sees it")  # fmt: skip
    if not cuda or not gpus:
        raise no_gpu(torch_version, cuda)
    if not driver:
        raise ToolError("the NVIDIA driver's version cannot be read (NVML and nvidia-smi both failed)",
                        "check the driver with nvidia-smi; a proof records the driver it ran on")  # fmt: skip
    major_minor = ".".join(cuda.split(".")[:2])
    return GpuFacts(tuple(gpus), driver, major_minor, torch_version, nccl or "", python, host)


def no_gpu(torch_version: str | None, cuda: str | None) -> ToolError:
    """Why there is nothing to prove on here: torch sees no GPU."""
    if torch_version is None:  # not "a CPU build of torch" where there is no torch at all
        return ToolError("torch is not installed in this Python: prove runs the CUDA checks with the node's own torch",
                         "run prove with the Python of the node's torch environment (its CUDA build)")  # fmt: skip
    return ToolError(f"torch {torch_version} here sees no GPU{'' if cuda else ' (a CPU build of torch)'}: "
                     "prove runs the CUDA checks on a GPU node",
                     "run it on a node with the GPUs the wheel is built for, its driver loaded (nvidia-smi lists "
                     "them) and CUDA_VISIBLE_DEVICES not hiding them")  # fmt: skip


def gpu_name(name: str) -> str:
    """A GPU's name as a proof records it (pure): printable ASCII letters, digits and ._()/+- only."""
    return re.sub(r"[^A-Za-z0-9 ._()/+-]", "-", name).lstrip(" ._()/+-")[:100] or "unnamed GPU"


def gpu_facts(python: Path, env: Mapping[str, str]) -> GpuFacts:
    """The node as the checks saw it: torch's GPUs, CUDA and NCCL asked of the venv's `python`, the
    driver of NVML (this process) or nvidia-smi."""
    from builder.detect.probes import probe_gpus, probe_torch

    def run(argv: Sequence[str]) -> str:  # detect's runner: "" where the program is missing or fails
        try:
            said = cmd.ask([str(a) for a in argv], timeout=300, env=env)
        except ToolError:
            return ""
        return said.stdout if said.returncode == 0 else ""

    torch, seen = probe_torch(str(python), run)
    driver = probe_gpus(run, seen)[2] if seen else None
    version = run([str(python), "-c", "import platform; print(platform.python_version())"]).strip()
    gpus = [Gpu(gpu_name(g.name), g.capability, g.memory_mib) for g in seen]
    return facts_of(torch.version, torch.cuda, torch.nccl, gpus, driver, version or "0.0.0", host_name(), torch.error)


def check_dest(dest: Path) -> None:
    """--dest, checked before anything runs (FolderError, exit 10; files.dest_folder)."""
    dest_folder(dest, "the proof's folder", "./proofs")


def write_proof(dest: Path, proof: Proof) -> Path:
    """The statement at DEST/<wheel>.proof.json, readable by every user (it is copied to the build host),
    read back by its own loader first: a proof publish could not read is never written."""
    text = proof.to_json()
    try:
        Proof.from_json(text, proof_path(dest, proof.wheel).name)
    except ManifestError as exc:
        raise SmokeError(f"the proof this toolkit made does not pass its own reader: {exc.message}",
                         "report it, with the node's GPUs and driver (nvidia-smi)") from exc  # fmt: skip
    path = write_atomic(proof_path(dest, proof.wheel), text)
    output.step(f"GPU proof written: {path}")
    sign_proof(path)
    return path


def sign_proof(path: Path) -> Path:
    """`path`.sig: the proof's bytes signed by this node's prover key (builder.prover), so the build host
    takes it in for who made it; the key line to trust is printed."""
    from builder import prover, signing

    folder = signing.key_dir()
    key = prover.ensure(folder)
    sig = write_atomic(Path(f"{path}.sig"), prover.sign(path.read_bytes(), folder))
    output.note(f"signed by this node's prover key {key.fingerprint()} ({sig.name}); the build host trusts it once "
                f"with: python -m builder key trust --prover '{key.line()}'")  # fmt: skip
    return sig


def summary(proof: Proof) -> str:
    """One line for people: where it ran and how it went."""
    failed = wheel_failures(proof.checks)
    verdict = "PASSED" if proof.passed else f"FAILED ({', '.join(c.name for c in failed[:6])})"
    return f"prove {verdict} for {proof.wheel} on {proof.facts.describe()}"


def environment(tmp: Path, wheel: Path, files: Path, offline: Path | None, log: Path, verbose: bool) -> Path:
    """The proof's venv: it sees the node's packages (its torch above all) and gets the wheel, its
    closure and what the checks import from `files` (the wheelhouse's, downloaded) and `offline` alone."""
    try:
        with envs.only_from([files, *([offline.resolve() / "wheels"] if offline else [])]):
            return envs.create(tmp / "venv", [str(wheel), *PROVE_EXTRAS], log, verbose, system_site_packages=True)
    except ToolError as exc:
        where = "the wheelhouse" + (f" and {offline}" if offline else "")
        raise ToolError(f"the proof's environment cannot be made from {where} and this node's own packages: "
                        f"{exc.message}", f"the checks import {', '.join(PROVE_EXTRAS)}: install them on the node "
                        "(pip install ...), or pass --offline DIR, a folder `gather` made for the wheel's recipe on a "
                        "connected machine") from exc  # fmt: skip


def prove(wheelhouse: str, ws: Workspace, dest: Path, trust: Sequence[str] = (), offline: Path | None = None,
          verbose: bool = False, keep_env: bool = False) -> Proof:  # fmt: skip
    """Pick, fetch and check the wheel for this node as the node installer does, install it beside the
    node's torch from the wheelhouse alone, run every check, write and return the proof (written
    when checks fail too: it says which) into `dest`, which the caller checked (check_dest). SmokeError
    when a check of the wheel's failed."""
    from builder import node

    start, started = time.monotonic(), now()
    base = node.wheelhouse_base(wheelhouse)
    verified = node.load_verified(base, node.load_trust(list(trust)))
    if verified.signature is None:
        output.warn("the wheelhouse's signature is not checked (no --trust, no /etc/ds-node-install/allowed_signers): "
                    "the proof is bound to the wheel's sha256 all the same, and the build host takes it in only for "
                    "the wheel it published")  # fmt: skip
    here = node.probe_node(sys.executable)
    output.step(f"node: {here.describe()}")
    if not here.gpus:
        raise no_gpu(here.torch, here.cuda)
    entry = node.choose(verified.manifest, here)
    output.step(f"prove: {entry.name} (archs {', '.join(entry.archs)}, ops {', '.join(entry.ops)}), chosen as the "
                "node installer chooses")  # fmt: skip
    for folder in (ws.logs, ws.scratch):
        folder.mkdir(parents=True, exist_ok=True)
    log = ws.logs / f"{entry.name}.prove.log"
    log.unlink(missing_ok=True)
    output.note(f"full log: {log}")
    sweep_dead(ws.scratch, "prove-")
    tmp = scratch_folder(ws.scratch, "prove-")
    try:
        files = tmp / "files"
        files.mkdir()
        wheel = Path(node.checked_wheel(base, entry, str(files)))
        deps = node.checked_dependencies(base, verified.manifest, entry, str(files))
        output.note(f"{entry.name}: sha256 {entry.sha256[:16]}... verified, {len(deps)} dependency wheels verified")
        manifest = BuildManifest.from_wheel(wheel)
        venv = environment(tmp, wheel, files, offline, log, verbose)
        env = smoke.check_env(venv, manifest, wheel.name, tmp)
        python = envs.python_in(venv)
        facts = gpu_facts(python, env)
        output.step(f"prove: on {facts.describe()}")
        # The reference run (blame) uses the node's torch too: the wheel was installed against it.
        checks = smoke.run_checks(dataclasses.replace(manifest, recipe_torch="system"), python, env, tmp, log,
                                  verbose, ws, wheel)  # fmt: skip
    finally:
        if keep_env:
            output.note(f"kept the proof's environment at {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    source = node.shown(wheelhouse, 280)  # a tab in the path: escaped, never refused after every check ran
    proof = Proof(entry.name, entry.sha256, facts, checks, started, now(), round(time.monotonic() - start, 1),
                  f"ds-wheel-builder {__version__}", source)  # fmt: skip
    return finish(proof, dest, log)


def finish(proof: Proof, dest: Path, log: Path) -> Proof:
    """Write the proof, print its checks, and raise where the wheel failed one of them."""
    path = write_proof(dest, proof)
    smoke.print_checks(proof.checks)
    output.step(summary(proof))
    if not proof.passed:
        failed = ", ".join(c.name for c in wheel_failures(proof.checks)) or "nothing passed"
        raise SmokeError(f"{proof.wheel} failed on this node's GPUs: {failed} (the proof says so: {path})",
                         f"read {path} and the log {log}; the build host refuses this proof, so fix the build, "
                         "publish it and prove it again")  # fmt: skip
    output.result(f"take it in on the build host (with its .sig beside it): python -m builder publish --proof "
                  f"{path.name}")  # fmt: skip
    return proof


def proof_of_smoke(wheel: Path, checks: tuple[Check, ...], facts: GpuFacts, started: str, seconds: float,
                   source: str) -> Proof:  # fmt: skip
    """A proof from a smoke run on a GPU node (a Slurm matrix's GPU smoke job): the same checks."""
    from builder.files import sha256_of

    return Proof(wheel.name, sha256_of(wheel), facts, checks, started, now(), seconds,
                 f"ds-wheel-builder {__version__}", source[:300])  # fmt: skip
