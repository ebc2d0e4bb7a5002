"""The smoke stage's commands: smoke a wheel, run DeepSpeed configs against it or a node's DeepSpeed.

Errors are raised, never printed here; `cli.main` turns them into one message and an exit code.
Each handler imports what it needs: a command's start stays fast."""

from __future__ import annotations

import argparse
import json

from builder import output
from builder.commands.common import _newest_wheel, _trust_arg, _workspace
from builder.errors import ConfigError


def smoke(args: argparse.Namespace) -> int:
    from builder.smoke import smoke as smoke_wheel

    ws = _workspace(args)
    _go_offline(args)
    for wheel in args.wheels or [_newest_wheel(ws.dist)]:
        smoke_wheel(wheel, ws, args.verbose, args.keep_env)
    return 0


def prove(args: argparse.Namespace) -> int:
    from builder.proof import check_dest
    from builder.proof import prove as prove_wheel

    check_dest(args.dest)  # before the work folder is made: a refused run leaves nothing
    ws = _workspace(args)
    _go_offline(args)
    prove_wheel(args.wheelhouse, ws, args.dest, args.trust, args.offline, args.verbose, args.keep_env)
    return 0


def _go_offline(args: argparse.Namespace) -> None:
    """With --offline DIR: before the first install, every later pip and uv reads only the folder."""
    if getattr(args, "offline", None) is not None:
        from builder import offline

        offline.use(args.offline, [], _trust_arg(args))


def check_config(args: argparse.Namespace) -> int:

    from builder import configs
    from builder.node import printable
    from builder.smoke import check_configs

    if args.timeout <= 0:
        raise ConfigError(f"--timeout {args.timeout:g} is not a time limit", "give seconds above 0, e.g. --timeout 120")
    ws = _workspace(args)
    _go_offline(args)
    outcomes = check_configs(args.configs, ws, args.wheel, args.python, args.verbose, args.timeout)
    accelerator = "this accelerator"
    if args.wheel is not None:
        from builder.contracts import BuildManifest

        accelerator = BuildManifest.from_wheel(args.wheel.resolve()).accelerator
    if args.json:
        output.result(json.dumps([{"config": str(f), "status": o.status, "ops": list(o.ops), "needs": list(o.jit),
                                   "means": configs.explain(o, accelerator), "detail": o.detail,
                                   "world_size": o.world_size, "seconds": o.seconds}
                                  for f, o in zip(args.configs, outcomes, strict=True)], indent=2))  # fmt: skip
    else:
        for f, o in zip(args.configs, outcomes, strict=True):  # a newline in a file's name is shown escaped
            output.result(f"{o.status:14} {printable(str(f))}: {printable(configs.explain(o, accelerator))}")
    code = configs.exit_status(outcomes)
    if code:
        bad = [printable(str(f)) for f, o in zip(args.configs, outcomes, strict=True) if o.status != "passed"]
        output.error(f"{len(bad)} of {len(outcomes)} configs do not run from the wheel: {', '.join(bad)}")
    return code
