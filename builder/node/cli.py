"""The node installer's command line: its flags, exit codes and the handling of signals and a full
disk; `main` is what `tools/ds-node-install.py` and `python -m builder install` run.
"""

import argparse
import errno
import json
import os
import sys
from collections.abc import Sequence

from builder.node.contract import EXIT_BAD_WHEELHOUSE, EXIT_CONFIGS, EXIT_INSTALL, OP_RE, InstallError
from builder.node.fetch import TIMEOUT_ENV, wheelhouse_base
from builder.node.files import printable, say
from builder.node.install import check_configs, install, load_verified
from builder.node.module import EXIT_MODULE, MODULE, ModuleError
from builder.node.state import STATE_ENV
from builder.node.trust import DEFAULT_TRUST, SKIP_FLAG, load_trust


def parser(prog: "str | None" = None, module_only: bool = False) -> argparse.ArgumentParser:
    """The installer's options (also read by the docs test, which checks every command the docs show)."""
    p = argparse.ArgumentParser(
        prog=prog,
        description="On a node: detect Python, torch, CUDA, GPU compute capabilities and CPU features, pick the "
        "wheel built for them from a wheelhouse's manifest, check its sha256 and build manifest, and pip-install "
        "it. Standard library and pip only.",
        epilog=f"Exit codes: {EXIT_BAD_WHEELHOUSE} the wheelhouse failed a check (a file's sha256, the manifest's "
        f"signature, expiry or serial); {EXIT_INSTALL} no wheel fits, a download failed, pip failed, or this node "
        "has no tool to check signatures with (ssh-keygen -Y or openssl). A download that stalls fails after "
        f"{TIMEOUT_ENV} seconds (default 120), nothing installed. {EXIT_MODULE} the Lmod module cannot be "
        "installed (an unsafe or unwritable prefix, another lock's module at that version, Lmod or venv missing, "
        "a module that does not load).",
    )
    p.add_argument("--wheelhouse", required=True, metavar="PATH_OR_URL", help="folder, file:// or http(s):// URL")
    p.add_argument("--python", default=sys.executable, help="the node's Python (default: this one)")
    p.add_argument("--dry-run", action="store_true", help="choose and check the wheel, install nothing")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    p.add_argument("--pip-arg", dest="pip_args", action="append", default=[], metavar="ARG", help="extra pip argument")
    p.add_argument("--trust", action="append", default=[], metavar="KEY_OR_FILE",
                   help="the build host's public key (the line `python -m builder key show` prints) or an "
                   "allowed-signers file; repeat for several. The manifest is then read only if its signature "
                   f"(manifest.json.sig) is by one of them, it has not expired, and its serial is not older than "
                   f"the last one this node accepted (kept in {STATE_ENV}, default /var/lib/ds-node-install for "
                   f"root). Default: {DEFAULT_TRUST} where it exists")  # fmt: skip
    p.add_argument("--wheelhouse-id", metavar="ID",
                   help="the wheelhouse this must be (its id: `python -m builder verify` prints it; provision passes "
                   "it). Without it, a place (folder or URL) that served one wheelhouse is refused if it serves "
                   "another")  # fmt: skip
    p.add_argument(SKIP_FLAG, action="store_true",
                   help="install without checking the manifest's signature when no key is given (by default a "
                   "node given no key refuses: whoever can write the wheelhouse would decide what it "
                   "runs)")  # fmt: skip
    p.add_argument("--ops", default="", metavar="OP,OP",
                   help="choose a wheel holding these ops (where the wheelhouse has several op sets of one target, "
                   "e.g. cpu and cpu-all; default: the fitting wheel with the most ops)")  # fmt: skip
    p.add_argument("--check-config", dest="check_configs", action="append", default=[], metavar="CONFIG",
                   help="after installing (or with --dry-run, against what is installed), run this DeepSpeed config "
                   "(JSON, or .py of one dict) with the wheelhouse's config checker: initialize and a few steps, no "
                   f"compile at first use allowed; repeat for several. Exit {EXIT_CONFIGS} unless all run")  # fmt: skip
    p.add_argument("--prefix" if module_only else "--module", dest="module", metavar="PREFIX",
                   required=module_only,
                   help=("instead of installing into --python's environment: " if not module_only else "")
                   + f"install the wheel with everything its lock pins (torch included) as an Lmod module: a venv "
                   f"made with --python under PREFIX/{MODULE}/<version>/<lock id>, readable by every user, and the "
                   f"modulefile MODULEFILES/{MODULE}/<version>.lua, written last once the module has loaded with "
                   "Lmod and ds_report lists every op [YES]. Run it once for a shared tree, not on every node; the "
                   f"same lock again does nothing. Exit {EXIT_MODULE} where it cannot")  # fmt: skip
    p.add_argument(
        "--modulefiles",
        metavar="MODULEFILES",
        help="the folder users `module use` (default: PREFIX/modulefiles); not writable by others",
    )
    p.add_argument("--replace-module", action="store_true",
                   help="switch a module of another lock at the same version to this lock (a new folder, then "
                   "the modulefile replaced in one rename; the old folder stays for running jobs)")  # fmt: skip
    p.add_argument("--require-gpu-proof", action="store_true",
                   help="refuse a CUDA wheel with no GPU proof for this node's compute capability (a proof is what "
                   "`python -m builder prove` wrote on a GPU node and the build host signed in with `publish "
                   f"--proof`); exit {EXIT_INSTALL}")  # fmt: skip
    p.add_argument("--debug", action="store_true", help="show a traceback on errors")
    return p


def _terminated(signum: int, frame: object) -> None:
    import signal

    for each in (signal.SIGTERM, signal.SIGHUP):  # the same signal again (a whole group, twice): cleanup goes on
        signal.signal(each, signal.SIG_IGN)
    raise SystemExit(128 + signum)  # unwinds: every temporary folder is removed, pip or a config run killed


# A write that found no room: a full disk, a quota, a read-only mount (builder.files reads it too).
NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG)


def no_room(exc: OSError, module: bool) -> InstallError:
    """A full disk, a quota or a read-only mount met while installing: one message with what to do."""
    where = exc.filename or "the target folder"
    if exc.errno == errno.EROFS and module:
        fix = (f"{where} is on a read-only mount here: install the module from a node that mounts the tree "
               "read-write (its file server)")  # fmt: skip
    elif exc.errno == errno.EROFS:
        fix = f"{where} is read-only: install where it can be written"
    else:
        fix = f"free space where {where} is (df -h), or raise the quota, then run it again"
    said = f"cannot write {where}: {exc.strerror or exc}"
    return ModuleError(said, fix) if module else InstallError(said, fix)


def main(argv: "Sequence[str] | None" = None, prog: "str | None" = None, module_only: bool = False) -> int:
    import signal

    p = parser(prog, module_only)
    args = p.parse_args(argv)
    import threading

    os.umask(0o022)  # run as root by provisioning: pip under umask 000 made site-packages anyone could write

    if threading.current_thread() is threading.main_thread():  # signal handlers live there only
        signal.signal(signal.SIGTERM, _terminated)
        signal.signal(signal.SIGHUP, _terminated)
    ops = [op.strip() for op in args.ops.split(",") if op.strip()]
    bad = [op for op in ops if not OP_RE.match(op)]
    if bad:  # a name no op has ('../../x'): never suggested to a recipe
        p.error(f"--ops {printable(bad[0])[:80]!r} is not an op's name (lowercase letters, digits and _): name the "
                "ops the wheel must hold, e.g. --ops cpu_adam,fused_adam")  # fmt: skip
    try:
        trust = load_trust(args.trust)
        result = install(args.wheelhouse, args.python, args.dry_run, args.pip_args, trust, ops,
                         args.skip_signature_check, args.wheelhouse_id, args.module, args.modulefiles,
                         args.replace_module, args.require_gpu_proof)  # fmt: skip
    except (InstallError, OSError) as caught:
        if args.debug or (isinstance(caught, OSError) and caught.errno not in NO_ROOM):
            raise
        exc = caught if isinstance(caught, InstallError) else no_room(caught, bool(args.module))
        say(f"error: {exc}")
        if args.json:
            print(json.dumps({"error": exc.message, "fix": exc.fix, "exit_code": exc.exit_code}))
        return exc.exit_code
    code = 0
    if args.check_configs:
        try:
            base = wheelhouse_base(args.wheelhouse)
            verified = load_verified(base, trust, expected_id=args.wheelhouse_id)
            python = os.path.join(result["root"], "bin", "python") if args.module else args.python
            code, result["configs_checked"] = check_configs(base, verified.manifest, python,
                                                            args.check_configs)  # fmt: skip
        except InstallError as exc:
            say(f"error: {exc}")
            return exc.exit_code
        if code:
            bad = [r["name"] for r in result["configs_checked"] if r.get("status") != "passed"]
            say(f"error: {len(bad)} config(s) do not run from the installed wheel: {', '.join(bad)}")
    if args.json:
        print(json.dumps(result, indent=2))
    return code


if __name__ == "__main__":
    sys.exit(main())
