"""provision: install the right wheel on many hosts, driven by pdsh (as DeepSpeed's own launcher
does) or by Slurm's srun (one task on every node of a partition or a nodelist).

Each host gets a generated install script holding the build host's trusted keys: it fetches the
manifest and its signature, verifies the signature with the node's own ssh-keygen, then fetches
the node installer the wheelhouse publishes (`tools/ds-node-install.py`, builder/node/ built into one
file, standard library only) and runs it only if its sha256 is the one the verified manifest
records. Hosts need Python, pip and OpenSSH 8.1+; a forged wheelhouse or installer never runs.
`plan_*` functions are pure; `write` and `run` act.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from builder import cmd, output
from builder.errors import BuilderError, ToolError, WheelhouseError
from builder.files import make_dirs, sha256_of, write_atomic
from builder.node import INSTALLER, NAMESPACE, ManifestError, Trust, check_wheel_name, read_bounded

_HOST_LINE = re.compile(r"^\s*([A-Za-z0-9._-]+)((?:\s+\w+=\S+)*)\s*$")


@dataclass(frozen=True)
class Host:
    name: str
    slots: int | None = None
    python: str = "python3"  # our extension of DeepSpeed's hostfile: python=/path/to/python


@dataclass(frozen=True)
class NodeOutcome:
    node: str
    installed: bool
    detail: str  # the wheel installed, or the installer's error and fix


def parse_hostfile(text: str, where: str = "hostfile") -> list[Host]:
    """DeepSpeed's hostfile format: `name slots=N`, one host a line, '#' comments."""
    hosts: list[Host] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _HOST_LINE.match(line)
        if not m:
            raise BuilderError(f"{where}:{number}: cannot read {raw.strip()!r}", "write `hostname slots=8`")
        options = dict(opt.split("=", 1) for opt in m.group(2).split())
        unknown = set(options) - {"slots", "python"}
        if unknown:
            raise BuilderError(
                f"{where}:{number}: unknown option {', '.join(sorted(unknown))}", "use slots= or python="
            )
        slots_text = options.get("slots")
        if slots_text is not None and not (slots_text.isdigit() and int(slots_text) > 0):
            raise BuilderError(f"{where}:{number}: slots={slots_text!r} is not a whole number of at least 1",
                               "write `hostname slots=8`")  # fmt: skip
        slots = int(slots_text) if slots_text is not None else None
        hosts.append(Host(m.group(1), slots, options.get("python", "python3")))
    if not hosts:
        raise BuilderError(f"{where} lists no hosts", "one host a line: `node1 slots=8`")
    if len({h.name for h in hosts}) != len(hosts):
        raise BuilderError(f"{where} lists a host twice", "list each host once")
    return hosts


def fetch_script() -> str:
    """The node-side fetcher (builder/resources/provision_fetch.py), carried inside each script."""
    return (Path(__file__).parents[1] / "resources" / "provision_fetch.py").read_text(encoding="utf-8")


def host_script(host: Host, wheelhouse: str, trust: Trust, json_result: bool = False, wheelhouse_id: str = "",
                module: str = "", require_gpu_proof: bool = False) -> str:  # fmt: skip
    """The install script for one host, with the trusted keys inline: fetch the manifest and its
    signature, verify the signature with ssh-keygen (nothing else runs if it fails), fetch the
    installer and check it against the sha256 the verified manifest lists, then run it with the
    same keys (it checks the signature again, the expiry, the serial and every file). With
    json_result the installer's result goes to stdout as JSON: srun keeps one file per node. With
    wheelhouse_id the installer accepts that wheelhouse only (another one signed by the same key,
    copied into its place, is refused). With module (a prefix), the installer puts the wheel and its
    lock there as an Lmod module instead (install --module). With require_gpu_proof a CUDA wheel with
    no GPU proof for the node's compute capability is refused."""
    allowed = "".join(f'{NAMESPACE} namespaces="{NAMESPACE}" {k.line()}\n' for k in trust.keys)
    revoked = "".join(f"{k.line()}\n" for k in trust.revoked)
    q = shlex.quote
    lines = [
        "#!/bin/sh",
        f"# ds-wheel-builder: install the DeepSpeed wheel built for {host.name} from {wheelhouse},",
        f"# only once its manifest is signed by a key trusted here ({trust.describe()})",
        "set -eu",
        f"PY={q(host.python)}",
        f"WH={q(wheelhouse)}",
        'tmp="$(mktemp -d)"',
        "trap 'rm -rf \"$tmp\"' EXIT",
        "cat > \"$tmp/allowed_signers\" <<'DS_TRUST'",
        allowed.rstrip("\n"),
        "DS_TRUST",
        "cat > \"$tmp/fetch.py\" <<'DS_FETCH'",
        fetch_script().rstrip("\n"),
        "DS_FETCH",
        '"$PY" "$tmp/fetch.py" manifest "$WH" "$tmp"',
        "if ! command -v ssh-keygen >/dev/null 2>&1; then",
        "  echo 'error: ssh-keygen is missing: the wheelhouse signature cannot be checked, nothing is installed' >&2",
        "  echo '  fix: install OpenSSH 8.1 or newer (openssh-clients on RHEL, openssh-client on Debian)' >&2",
        "  exit 9",
        "fi",
    ]
    check = f'ssh-keygen -Y verify -f "$tmp/allowed_signers" -I {NAMESPACE} -n {NAMESPACE} -s "$tmp/manifest.json.sig"'
    trust_args = '--trust "$tmp/allowed_signers"'
    if revoked:
        lines += ["cat > \"$tmp/revoked\" <<'DS_REVOKED'", revoked.rstrip("\n"), "DS_REVOKED",
                  "sed 's/^/@revoked /' \"$tmp/revoked\" > \"$tmp/revoked.trust\""]  # fmt: skip
        check += ' -r "$tmp/revoked"'
        trust_args += ' --trust "$tmp/revoked.trust"'
    lines += [
        f'if ! {check} < "$tmp/manifest.json" > "$tmp/verify.log" 2>&1; then',
        '  echo "error: the manifest of $WH is not signed by a key trusted here: $(cat "$tmp/verify.log")" >&2',
        "  echo '  fix: the wheelhouse was changed after the build host signed it (or signed by another key): do not "
        "install from it; run python -m builder verify on the build host' >&2",
        "  exit 8",
        "fi",
        '"$PY" "$tmp/fetch.py" installer "$WH" "$tmp"',
        f'"$PY" "$tmp/install.py" --wheelhouse "$WH" {trust_args}'
        + (f" --wheelhouse-id {q(wheelhouse_id)}" if wheelhouse_id else "")
        + (f' --module {q(module)} --python "$PY"' if module else "")
        + (" --require-gpu-proof" if require_gpu_proof else "")
        + (" --json" if json_result else ""),
    ]
    return "\n".join(lines) + "\n"


def installer_sha256(wheelhouse_dir: Path) -> str:
    """The sha256 of the installer the wheelhouse publishes, after checking the manifest's signature
    (load_manifest) and the file against it: provisioning a wheelhouse that fails here is refused."""
    from builder.wheelhouse.layout import load_manifest

    manifest = load_manifest(wheelhouse_dir)
    entry = manifest.tools.get(INSTALLER)
    if entry is None:
        raise WheelhouseError(
            f"{wheelhouse_dir} publishes no node installer ({INSTALLER})", "publish a wheel into it (build-wheel)"
        )
    if sha256_of(wheelhouse_dir / INSTALLER) != entry.sha256:
        raise WheelhouseError(
            f"{wheelhouse_dir / INSTALLER} differs from the sha256 in manifest.json: it was changed",
            "run python -m builder verify; re-publish a wheel to restore the installer",
        )
    return entry.sha256


def write(hosts: list[Host], wheelhouse: str, out: Path, trust: Trust, wheelhouse_id: str = "", module: str = "",
          require_gpu_proof: bool = False) -> list[Path]:  # fmt: skip
    """Write provision/<host>.sh for every host (mode 0755)."""
    return [write_atomic(out / f"{h.name}.sh", host_script(h, wheelhouse, trust, wheelhouse_id=wheelhouse_id,
                                                           module=module, require_gpu_proof=require_gpu_proof),
                         mode=0o755) for h in hosts]  # fmt: skip


def pdsh_command(hosts: list[Host], out: Path, launcher: str, ssh_config: Path | None = None) -> list[str]:
    """pdsh over all hosts at once. 'ssh': each script is piped to `sh -s` on its host (with
    `ssh -F ssh_config` where the site keeps its cluster's ssh settings in a file of their own);
    'local': run each host's script in a local shell (for tests and single-node setups)."""
    names = ",".join(h.name for h in hosts)
    script = shlex.quote(str(out.resolve())) + "/%h.sh"
    config = f"-F {shlex.quote(str(ssh_config.resolve()))} " if ssh_config is not None else ""
    remote = f"ssh {config}-o BatchMode=yes %h sh -s < {script}" if launcher == "ssh" else f"sh {script}"
    return ["pdsh", "-S", "-R", "exec", "-f", str(min(len(hosts), 64)), "-w", names, "sh", "-c", remote]


def host_outcomes(hosts: list[Host], said: str) -> list[NodeOutcome]:
    """What became of each host, from pdsh's output (every line `host: text`; pure): the wheel it
    installed, or the installer's error and fix, or the host's last words."""
    lines: dict[str, list[str]] = {h.name: [] for h in hosts}
    for raw in said.splitlines():
        name, sep, text = raw.partition(": ")
        if sep and name in lines:
            lines[name].append(text)
    outcomes = []
    for host in hosts:
        got = ["".join(c for c in t if c.isprintable()) for t in lines[host.name]]  # a host's words, no escapes
        wheel = next((t.split("==> installed ", 1)[1].strip() for t in got if t.startswith("==> installed ")), None)
        if wheel is not None:
            try:  # what another machine said: a wheel file name, or not believed
                check_wheel_name(wheel, f"{host.name}: installed")
                outcomes.append(NodeOutcome(host.name, True, wheel))
            except ManifestError as exc:
                outcomes.append(NodeOutcome(host.name, False, exc.message[:2000]))
            continue
        error = next((i for i in range(len(got) - 1, -1, -1) if got[i].startswith("error: ")), None)
        if error is not None:  # the error, its indented lines (each wheel and why it does not fit), its fix
            said_more = [t.strip() for t in got[error + 1 :] if t.startswith("  ")]
            fix = next((t for t in said_more if t.startswith("fix:")), "")
            more = said_more[: said_more.index(fix)] if fix else said_more
            detail = " ".join([got[error][len("error: ") :], *more]) + (f" ({fix})" if fix else "")
        else:
            detail = (got[-1] if got else "no output") + " (read the provision log)"
        outcomes.append(NodeOutcome(host.name, False, detail[:2000]))
    return outcomes


def run(hosts: list[Host], out: Path, launcher: str, log: Path, ssh_config: Path | None = None) -> list[NodeOutcome]:
    """pdsh the scripts on every host at once; each host's outcome, even where some failed (pdsh
    then exits non-zero: its output says which and why)."""
    said = cmd.run(pdsh_command(hosts, out, launcher, ssh_config), log=log, check=False,
                   fix="install pdsh (apt-get install pdsh) and make sure every host is reachable")  # fmt: skip
    return host_outcomes(hosts, said)


# ---------------------------------------------------------------- through Slurm


_DOWN = ("down", "drain", "fail", "maint", "unk", "futr", "reboot")


def slurm_nodes(partition: str | None, nodelist: str | None) -> tuple[list[str], list[str]]:
    """The nodes to install on (from `sinfo`: a partition's, or a nodelist's) and those skipped
    because Slurm reports them down or draining."""
    args = ["sinfo", "-h", "-N", "-o", "%N %t"]
    args += ["-p", partition] if partition else []
    args += ["-n", nodelist] if nodelist else []
    said = cmd.run(args, fix="check the partition or nodelist against `sinfo`")
    up: list[str] = []
    down: list[str] = []
    for line in said.splitlines():
        parts = line.split()
        if len(parts) == 2 and re.match(r"^[A-Za-z0-9._-]+$", parts[0]):
            bucket = down if parts[1].rstrip("*~#!%$@^-+").startswith(_DOWN) or parts[1].endswith("*") else up
            if parts[0] not in bucket:
                bucket.append(parts[0])
    if not up:
        where = f"partition {partition}" if partition else f"nodelist {nodelist}"
        raise BuilderError(f"Slurm has no usable node in {where} ({len(down)} down or draining)",
                           "check `sinfo`, or name other nodes with --nodelist")  # fmt: skip
    return up, down


def srun_command(nodes: list[str], partition: str | None, script: Path, out: Path) -> list[str]:
    """One task on each node; each node's stdout (the installer's JSON) and stderr in its own file (pure)."""
    args = ["srun", "--job-name=ds-provision", f"--nodes={len(nodes)}", "--ntasks-per-node=1",
            f"--nodelist={','.join(nodes)}", f"--output={out}/results/%N.json",
            f"--error={out}/logs/%N.log"]  # fmt: skip
    if partition:
        args.append(f"--partition={partition}")
    return [*args, "sh", str(script)]


def node_outcome(node: str, out: Path) -> NodeOutcome:
    """What the installer on `node` printed (a file a remote job wrote: checked, never trusted)."""
    path = out / "results" / f"{node}.json"
    log = out / "logs" / f"{node}.log"
    try:
        data = json.loads(read_bounded(path, "report"))
    except FileNotFoundError:
        return NodeOutcome(node, False, f"no result: read {log}")
    except (OSError, ValueError):
        return NodeOutcome(node, False, f"its result is not the installer's JSON: read {path} and {log}")
    if not isinstance(data, dict):
        return NodeOutcome(node, False, f"its result is not a JSON object: read {path}")
    if isinstance(data.get("error"), str):
        fix = data.get("fix") if isinstance(data.get("fix"), str) else ""
        return NodeOutcome(node, False, f"{data['error'][:500]} (fix: {str(fix)[:300]})")
    wheel = data.get("wheel")
    if data.get("installed") is not True or not isinstance(wheel, str):
        return NodeOutcome(node, False, f"the installer did not report an install: read {log}")
    try:
        check_wheel_name(wheel, f"{path}: wheel")
    except ManifestError as exc:
        return NodeOutcome(node, False, exc.message)
    return NodeOutcome(node, True, wheel)


def run_slurm(nodes: list[str], partition: str | None, script: Path, out: Path, log: Path) -> list[NodeOutcome]:
    """srun the install script once on every node; each node's outcome, even where some failed."""
    for node in nodes:  # an earlier provision's result must not pass for this one's
        (out / "results" / f"{node}.json").unlink(missing_ok=True)
    make_dirs(out / "results")
    make_dirs(out / "logs")
    try:
        cmd.run(srun_command(nodes, partition, script, out.resolve()), log=log,
                fix="read each node's log below")  # fmt: skip
    except ToolError as exc:
        if not (out / "results").is_dir():
            raise
        output.note(f"srun: {exc.message.splitlines()[0]}")
    return [node_outcome(n, out) for n in nodes]
