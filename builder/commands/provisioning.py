"""Installing on every node: provision over pdsh or Slurm.

Errors are raised, never printed here; `cli.main` turns them into one message and an exit code.
Each handler imports what it needs: a command's start stays fast."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from builder import output
from builder.commands.common import _wheelhouse_id, _workspace
from builder.errors import ToolError, WheelhouseError
from builder.workspace import Workspace


def provision(args: argparse.Namespace) -> int:
    from builder.errors import RecipeError
    from builder.wheelhouse import provision as prov

    ws = _workspace(args)
    url = args.url or str(args.wheelhouse.resolve())
    if args.launcher == "slurm":
        return _provision_slurm(args, ws, url)
    if args.hostfile is None:
        raise RecipeError("provision needs --hostfile (or --launcher slurm with --partition or --nodelist)",
                          "pass a DeepSpeed hostfile: `host slots=N` a line")  # fmt: skip
    try:
        text = args.hostfile.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ToolError(
            f"cannot read the hostfile {args.hostfile}: {exc}", "pass --hostfile with a readable file"
        ) from exc
    hosts = prov.parse_hostfile(text, str(args.hostfile))
    if args.module:
        hosts = _once(hosts, [h.name for h in hosts])
    prov.installer_sha256(args.wheelhouse)  # the wheelhouse verifies here before any node is asked to trust it
    scripts = prov.write(hosts, url, args.out, _provision_trust(), _wheelhouse_id(args.wheelhouse), args.module or "",
                         args.require_gpu_proof)  # fmt: skip
    output.step(f"wrote {len(scripts)} host scripts in {args.out}/ for wheelhouse {url}")
    if args.run:
        outcomes = prov.run(hosts, args.out, args.launcher, ws.logs / "provision.log", args.ssh_config)
        return _provision_report(outcomes, "hosts", ws.logs / "provision.log")
    return 0


def _once(items: list[Any], names: list[str]) -> list[Any]:
    """A module goes on a shared tree: it is installed from the first host alone, not from each."""
    output.step(f"--module: the module is installed once, from {names[0]} (the tree it names is shared); "
                f"{len(names) - 1} other host(s) load it from there")  # fmt: skip
    return items[:1]


def _provision_report(outcomes: list[Any], what: str, log: Path) -> int:
    """One line per host or node: the wheel it installed, or why not; an error unless all installed."""
    done = [o.node for o in outcomes if o.installed]
    output.step(f"installed on {len(done)}/{len(outcomes)} {what}: {', '.join(done) or 'none'}")
    for o in outcomes:
        output.note(f"  {o.node}: {'installed ' if o.installed else 'NOT installed: '}{o.detail}")
    failed = [o.node for o in outcomes if not o.installed]
    if failed:
        raise ToolError(f"provisioning did not finish on {len(failed)} of {len(outcomes)} {what}: "
                        f"{', '.join(failed)} (log {log})",
                        "fix what each one's line above says, then run provision again (the others are left as "
                        "they are)")  # fmt: skip
    return 0


def _provision_trust() -> Any:
    """The keys provision scripts carry: this host's trusted keys (its own first) and revoked ones."""
    from builder import signing

    trust = signing.keys().trust()
    if not trust.keys:
        raise WheelhouseError("this host has no signing key to give the nodes", "publish first, or `python -m "
                              "builder key create`")  # fmt: skip
    return trust


def _provision_slurm(args: argparse.Namespace, ws: Workspace, url: str) -> int:
    from builder.errors import RecipeError
    from builder.files import write_atomic
    from builder.wheelhouse import provision as prov

    if args.hostfile is not None or not (args.partition or args.nodelist):
        raise RecipeError("--launcher slurm installs on a partition's or a nodelist's nodes, not a hostfile's",
                          "pass --partition NAME or --nodelist LIST (and no --hostfile)")  # fmt: skip
    prov.installer_sha256(args.wheelhouse)
    host = prov.Host("every node", python=args.python or "python3")
    script = write_atomic(args.out / "node.sh", prov.host_script(host, url, _provision_trust(), json_result=True,
                                                                 wheelhouse_id=_wheelhouse_id(args.wheelhouse),
                                                                 module=args.module or "",
                                                                 require_gpu_proof=args.require_gpu_proof),
                         mode=0o755)  # fmt: skip
    output.step(f"wrote {script} for wheelhouse {url}")
    if not args.run:
        return 0
    nodes, down = prov.slurm_nodes(args.partition, args.nodelist)
    if down:
        output.warn(f"skipping {len(down)} nodes Slurm reports down or draining: {', '.join(down)}")
    if args.module and nodes:
        nodes = _once(nodes, nodes)
    outcomes = prov.run_slurm(nodes, args.partition, script.resolve(), args.out, ws.logs / "provision.log")
    return _provision_report(outcomes, "nodes", args.out / "logs")


def host_trust(args: list[str]) -> list[str]:
    """On the build host, `install` without --trust checks the signature with the keys this host
    trusts (its allowed_signers), as every other command here does; the node installer alone has
    no such default and refuses without a key."""
    from builder import node, signing
    from builder.errors import BuilderError

    given = any(a == "--trust" or a.startswith("--trust=") or a == node.SKIP_FLAG for a in args)
    if given or os.path.isfile(node.DEFAULT_TRUST):
        return args
    try:
        k = signing.keys()
        has_keys = k.trust_file.is_file() and bool(k.trust().keys)
    except (BuilderError, OSError):
        return args  # the node installer then says what is missing
    return ["--trust", str(k.trust_file), *args] if has_keys else args
