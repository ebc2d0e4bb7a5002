"""Command line: `python -m builder <command>`; every nox session is a thin call into this.

Errors are caught here and only here: one message with its fix, the error's own exit code, and a
traceback only with --debug.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from builder import DEFAULT_RECIPE, __version__, output
from builder.arguments import VARIANTS_HELP, folder_arg, offline_options, port_number, positive_int, seconds
from builder.errors import BuilderError

# Only the standard library is imported at the top: `install` runs on nodes that have nothing
# else, so each command imports what it needs when it runs.


def parser() -> argparse.ArgumentParser:
    core = argparse.ArgumentParser(add_help=False)  # every command's; prove takes the installer's --wheelhouse
    core.add_argument(
        "--work-dir",
        type=Path,
        default=Path("build"),
        help="caches, sources, logs and built wheels (default: %(default)s)",
    )
    core.add_argument("-v", "--verbose", action="store_true", help="stream every command's output")
    core.add_argument("-q", "--quiet", action="store_true", help="print only warnings, errors and results")
    core.add_argument("--debug", action="store_true", help="show a traceback on errors")
    common = argparse.ArgumentParser(add_help=False, parents=[core])
    common.add_argument(
        "--wheelhouse",
        type=folder_arg,
        default=Path("wheelhouse"),
        help="where published wheels and the index go (default: %(default)s)",
    )

    p = argparse.ArgumentParser(
        prog="python -m builder",
        description="Build DeepSpeed wheels with prebuilt ops once per target, prove them in a fresh "
        "environment, and publish them to a local pip index.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    b = sub.add_parser(
        "build-wheel",
        parents=[common],
        help="build, verify, smoke-test and publish a recipe",
        description="Build the recipe's wheel, prove every requested op is inside, then (unless "
        "told not to) smoke-test it in a fresh venv and publish it to the wheelhouse.",
    )
    b.add_argument(
        "--recipe",
        type=Path,
        action="append",
        dest="recipes",
        metavar="PATH",
        help=f"recipe TOML; repeat for several (default: {DEFAULT_RECIPE})",
    )
    b.add_argument(
        "--python",
        action="append",
        dest="pythons",
        metavar="PY",
        help="build for this interpreter (3.12, or a path); repeat for several (default: the recipe's python "
        "list, else the interpreter running the builder). Found on this machine (PATH, pyenv), never downloaded",
    )
    b.add_argument(
        "--matrix",
        type=Path,
        metavar="FILE",
        help="matrix.toml (recipes x pythons, optionally x DeepSpeed versions): build, smoke and publish every "
        "target, go on past a failed one, and write a coverage report (exit 11 if any failed)",
    )
    b.add_argument(
        "--jobs",
        type=positive_int,
        help="targets built at once (default: the matrix file's jobs; for a matrix without one, as "
        "many as cores and memory allow, 8 cores and 24 GB each; else 1)",
    )
    b.add_argument(
        "--target", metavar="NAME", help="build only this target of the matrix (its name: cpu, cpu-cp312, ...)"
    )
    b.add_argument(
        "--slurm",
        action="store_true",
        help="with --matrix: submit it to Slurm instead of building here: a job array of builds (one "
        "compiler cache for all), a smoke job on each GPU partition [slurm.gpu] maps a target's archs to, and "
        "one job that publishes and writes the coverage report; prints the job ids",
    )
    b.add_argument("--partition", help="Slurm partition for the build jobs")
    b.add_argument("--account", help="Slurm account for the jobs")
    b.add_argument("--wait", action="store_true", help="with --slurm: follow the jobs; exit 11 if any target failed")
    b.add_argument("--no-smoke", action="store_true", help="only build and verify (implies --no-publish)")
    b.add_argument("--no-publish", action="store_true", help="build and smoke-test, do not publish")
    b.add_argument("--variants", action="store_true", help=VARIANTS_HELP)
    b.add_argument("--force", action="store_true", help="build even if a wheel with the same build key exists")
    b.add_argument("--no-ccache", action="store_true", help="compile without ccache even where it is installed")
    b.add_argument(
        "--json", action="store_true", help="print each target's result (wheel, smoke, install command) as JSON"
    )
    offline_options(b)

    g = sub.add_parser(
        "gather",
        parents=[common],
        help="gather what a recipe's build, smoke and publish install, for an air-gapped build host",
        description="On a connected machine: fetch the recipe's sdist (sha256 checked) and every wheel its build, "
        "smoke and publish install on a node of the given Python (build tools, DeepSpeed's dependencies, the "
        "smoke's checks, the toolkit's own), except the torch a 'system' recipe's node already has, into DEST "
        "with offline.json listing each with its size, and the build root packed (DEST/root/). On the node: "
        "build-wheel --recipe R --offline DEST.",
    )
    g.add_argument("--recipe", type=Path, default=Path(DEFAULT_RECIPE), metavar="PATH",
                   help=f"recipe TOML (default: {DEFAULT_RECIPE})")  # fmt: skip
    g.add_argument("--dest", type=Path, required=True, metavar="DIR", help="the folder to fill (made if missing)")
    g.add_argument("--python", default=f"{sys.version_info.major}.{sys.version_info.minor}", metavar="X.Y",
                   help="the node's CPython version (default: this one's)")  # fmt: skip
    g.add_argument("--machine", default=platform.machine(), metavar="M",
                   help=f"the machine of the host that reads the folder (default: this one's, {platform.machine()}); "
                   "aarch64 for a GH200/GB200 node that installs the toolkit and proves or builds there: its "
                   "wheels are fetched for aarch64 and no build root is gathered")  # fmt: skip
    g.add_argument("--have", type=Path, metavar="FREEZE",
                   help="the node's `python -m pip freeze`: for a recipe of the node's own torch, what the node "
                   "already holds is left out")  # fmt: skip
    g.add_argument("--no-root", action="store_true",
                   help="leave out the build root (by default the Debian 11 root this machine made, packed into "
                   "DEST/root/, so that a node with no Debian mirror builds a manylinux recipe; made here first "
                   "if missing); for a node that has the root, or a recipe of platform = 'host' or its own "
                   "[root]")  # fmt: skip

    def slurm_command(name: str, help: str, description: str) -> argparse.ArgumentParser:
        """A command about one matrix run on Slurm: its RUN folder first. The ones Slurm's jobs run
        (help starting "(run by") are left out of the top-level --help (argparse lists a command
        only when it is given a help text) and still run, with their own --help."""
        if help.startswith("(run by"):
            cp = sub.add_parser(name, parents=[common], description=f"Internal, {help[1:].replace(')', ':', 1)}. "
                                f"{description}")  # fmt: skip
        else:
            cp = sub.add_parser(name, parents=[common], help=help, description=description)
        cp.add_argument("run", type=Path, metavar="RUN", help="the run folder build-wheel --slurm printed")
        return cp

    slurm_command(
        "slurm-status",
        "each target's state in a matrix run on Slurm (results so far and Slurm's queue)",
        "Read RUN's coverage report (once the collect job wrote it), else each job's result and squeue, and "
        "print one line per target: build, smoke (on which partition) and publish.",
    )
    slurm_command(
        "slurm-collect",
        "(run by the Slurm collect job) publish a matrix run's passing targets, write its coverage",
        "Read every job's result in RUN (checked: other jobs wrote them), publish the wheels whose smoke "
        "passed into the wheelhouse, and write RUN/coverage/coverage.{json,md}.",
    )
    slurm_command(
        "slurm-task",
        "(run by each Slurm array task) build one target of a matrix run",
        "Build TARGET of RUN in its folder WORK_DIR/slurm/targets/TARGET (the same in every run), with the "
        "shared compiler cache; smoke it here unless a GPU smoke job does; write RUN/results/TARGET.build.json.",
    ).add_argument("--target", required=True, metavar="NAME")
    su = slurm_command(
        "slurm-units",
        "(run by each Slurm unit task) build a share of one target's op units",
        "Build group GROUP of OF of TARGET's op units (shared out by the build times earlier runs recorded) "
        "into the unit cache every job of RUN shares, and write RUN/results/TARGET.units-GROUP.json. The "
        "target's build task then assembles its wheel from the cache.",
    )
    su.add_argument("--target", required=True, metavar="NAME")
    su.add_argument("--group", required=True, type=int)
    su.add_argument("--of", required=True, type=int)
    sk = slurm_command(
        "slurm-smoke",
        "(run by a Slurm GPU smoke job) smoke one built target on this node's GPUs",
        "Smoke the wheel RUN's build task made for TARGET on the GPUs Slurm gave this job and write "
        "RUN/results/TARGET.smoke.PARTITION.json (failed when no GPU is seen, unless the matrix says "
        "require_gpu = false).",
    )
    sk.add_argument("--target", required=True, metavar="NAME")
    sk.add_argument("--partition", required=True)

    s = sub.add_parser(
        "smoke",
        parents=[common],
        help="install a wheel in a fresh venv and test it",
        description="Install each wheel with its pinned torch in a new venv and check that its "
        "ops load without JIT and compute what torch computes. Writes <wheel>.smoke.json.",
    )
    s.add_argument(
        "wheels", nargs="*", type=Path, metavar="WHEEL", help="wheels to test (default: the newest in WORK_DIR/dist)"
    )
    s.add_argument("--keep-env", action="store_true", help="keep the smoke venv for inspection")
    offline_options(s)

    pf = sub.add_parser(
        "prove",
        parents=[core],  # its --wheelhouse is the node installer's: a folder or a URL
        help="on a GPU node: run a CUDA wheel's GPU checks and write its proof",
        description="On a GPU node: pick the wheel built for this node from a wheelhouse as the node installer "
        "does, install it beside the node's torch from the wheelhouse alone (what the checks import beyond it, "
        "transformers, accelerate, bitsandbytes, from the node or --offline DIR), and run the GPU checks: every "
        "op loads with no JIT, what each CUDA op computes against torch, the quantized loads, NCCL across the "
        "node's GPUs, the CUDA config matrix, with the smoke's blame rules. Writes DEST/<wheel>.proof.json, an "
        "in-toto v1 Statement of the GPUs, driver, CUDA, torch, NCCL and every check, for the build host to take "
        "in with `publish --proof`. Needs no key and no ssh-keygen. Exit 6 when a check of the wheel's failed "
        "(the proof is written and says which), 3 when torch sees no GPU here.",
    )
    pf.add_argument("--wheelhouse", required=True, metavar="PATH_OR_URL", help="folder, file:// or http(s):// URL")
    pf.add_argument("--trust", action="append", default=[], metavar="KEY_OR_FILE",
                    help="check the manifest's signature with this key or allowed-signers file, as the node installer "
                    "does (default: /etc/ds-node-install/allowed_signers where it exists; else unchecked: the proof "
                    "is bound to the wheel's sha256 all the same)")  # fmt: skip
    pf.add_argument("--dest", type=Path, default=Path("."), help="where the proof goes (default: this folder)")
    pf.add_argument("--keep-env", action="store_true", help="keep the proof's venv for inspection")
    offline_options(pf, with_trust=False)

    cc = sub.add_parser(
        "check-config",
        parents=[common],
        help="run DeepSpeed configs from a wheel (or an installed DeepSpeed) with no compiler",
        description="Run each DeepSpeed config (a JSON file, or a .py file holding one dict literal): "
        "deepspeed.initialize and a few steps of a small model, each in its own processes, with an empty "
        "TORCH_EXTENSIONS_DIR and no compiler on PATH. Every op DeepSpeed asks its builders for is recorded and "
        "every JIT compile refused. Says per config: passed (the ops it loaded), needs op X (the recipe line "
        "that adds it), or not supported by DeepSpeed on this accelerator (its own error). With --wheel, in a "
        "fresh venv of that wheel and its torch (a build host); else against the DeepSpeed installed for "
        "--python (a node). Exit 0 when every config passed, 14 otherwise.",
    )
    cc.add_argument("configs", nargs="+", type=Path, metavar="CONFIG", help="DeepSpeed config files")
    where = cc.add_mutually_exclusive_group()
    where.add_argument("--wheel", type=Path, help="a built wheel: run the configs in a fresh venv of it")
    where.add_argument("--python", type=Path, help="the interpreter of an environment where DeepSpeed is installed "
                       "(default: this one)")  # fmt: skip
    cc.add_argument("--timeout", type=seconds, default=180.0, metavar="SECONDS",
                    help="time limit per config (default 180)")  # fmt: skip
    cc.add_argument("--json", action="store_true", help="print the results as JSON")
    offline_options(cc)

    u = sub.add_parser(
        "publish",
        parents=[common],
        help="put smoke-passed wheels into the wheelhouse",
        description="Copy wheels whose smoke report passed into the wheelhouse and rewrite its "
        "PEP 503 index and manifest.json. A wheel without a passing report is refused.",
    )
    u.add_argument(
        "wheels",
        nargs="*",
        type=Path,
        metavar="WHEEL",
        help="wheels to publish (default: every smoke-passed wheel in WORK_DIR/dist)",
    )
    u.add_argument("--variants", action="store_true", help=VARIANTS_HELP)
    u.add_argument("--proof", dest="proofs", action="extend", nargs="+", type=Path, default=[], metavar="FILE",
                   help="take in GPU proofs (`prove` wrote them on GPU nodes): each must name the sha256 of a wheel "
                   "the wheelhouse holds, have checked every CUDA op of it on GPUs it has code for, and hold no "
                   "failure of the wheel's, and be signed (FILE.sig, written by `prove`) by a prover key this "
                   "host trusts (`key trust --prover`); it is kept beside the wheel and signed into the manifest "
                   "(exit 7 otherwise, nothing written)")  # fmt: skip
    u.add_argument(
        "--unsigned-proof",
        action="store_true",
        help="take in a proof with no signature beside it, on this host's word (the page says so)",
    )
    d = sub.add_parser(
        "detect",
        parents=[common],
        help="report GPUs, CUDA toolkits, torch, compilers, CPU, libraries",
        description="Report what this machine has for building DeepSpeed ops, and known bad "
        "combinations with their fixes. --json prints the versioned schema for scripts.",
    )
    _torch_source(d)
    d.add_argument("--json", action="store_true", help="print JSON (schema version in the 'schema' field)")

    t = sub.add_parser(
        "toolchain",
        parents=[common],
        help="prepare the compilers and environment nvcc needs",
        description="Choose the CUDA toolkit matching torch, make a private folder of gcc/g++ "
        "symlinks when the default gcc is outside nvcc's range, and print the environment a "
        "build gets (PATH, LD_LIBRARY_PATH, CPATH, CUDA_HOME, CC/CXX, NVCC_PREPEND_FLAGS).",
    )
    _torch_source(t)
    t.add_argument("--folder", type=Path, help="where the compiler symlinks go (default: WORK_DIR/toolchain/bin)")
    t.add_argument("--dry-run", action="store_true", help="print what would be done, change nothing")
    v = sub.add_parser(
        "verify",
        parents=[common],
        help="check a wheelhouse's signature, then its hashes, index, page and manifest",
        description="Check manifest.json's signature (manifest.json.sig) against the keys this host trusts (or "
        "--trust), its serial against this host's record and its expiry; then every listed file's sha256 against "
        "the manifest, that the PEP 503 index links exactly the listed files with the right hashes, and that "
        "index.html is the page the manifest renders. Says who signed and until when. Exit 8 on any problem.",
    )
    v.add_argument("--json", action="store_true", help="print the problems as JSON on stdout")
    v.add_argument(
        "--trust",
        action="append",
        metavar="KEY_OR_FILE",
        help="check the signature against this key "
        "line or allowed-signers file (repeat for several; default: this host's allowed_signers)",
    )

    sg = sub.add_parser(
        "sign",
        parents=[common],
        help="re-sign a wheelhouse's manifest (extends its expiry)",
        description="Sign WHEELHOUSE/manifest.json again with this host's key: a new serial and a new expiry "
        "(DS_BUILDER_SIGN_DAYS, default 28 days). Every publish, lock, image, prune and repair signs by itself; run "
        "this to keep an unchanged wheelhouse valid, after a key rotation, or with --adopt to sign a wheelhouse "
        "an older toolkit published (its files are verified first).",
    )
    sg.add_argument("--days", type=int, help="days until the signature expires (default: DS_BUILDER_SIGN_DAYS or 28)")
    sg.add_argument(
        "--new-id",
        action="store_true",
        help="make this copy of a wheelhouse a wheelhouse of its own (a new id, its serials its own), so the "
        "copy and its source can both be published into; nodes that read it before are told it is another "
        "wheelhouse and accept it once given --wheelhouse-id",
    )
    sg.add_argument(
        "--adopt",
        action="store_true",
        help="sign a manifest that has no signature (an older toolkit published it), or put back an older one "
        "this host signed, after every file checks out against it; never one whose signature fails",
    )

    ky = sub.add_parser(
        "key",
        help="this build host's signing key: create, show, rotate, trust another, revoke",
        description="The key that signs every wheelhouse manifest lives in DS_BUILDER_KEYS (default "
        "~/.config/ds-wheel-builder, mode 0700), never in a wheelhouse. `show` prints its public line for nodes "
        "(--trust) and the trusted keys; `create` makes it (the first publish does too); `rotate` makes a new one "
        "and keeps the old trusted until `revoke FINGERPRINT`; `trust LINE` adds another host's key.",
    )
    ky.add_argument("action", choices=("show", "create", "rotate", "trust", "revoke"))
    ky.add_argument("value", nargs="?", help="trust: the key line; revoke: the key's fingerprint (SHA256:...)")
    ky.add_argument("--prover", metavar="KEY_LINE",
                    help="with trust: a GPU node's prover key (the line `prove` printed there) instead: proofs it "
                    "signed are taken in by publish --proof; it never signs a wheelhouse")  # fmt: skip
    ky.add_argument("-q", "--quiet", action="store_true", help="print only the public key line")
    ky.add_argument("--debug", action="store_true", help="show a traceback on errors")

    lk = sub.add_parser(
        "lock",
        parents=[common],
        help="hash-pinned requirements and a Containerfile for a wheel",
        description="Resolve a published wheel with everything it needs (its torch included) and write "
        "WHEELHOUSE/locks/<recipe>.lock (every file pinned by sha256, for pip --require-hashes) and "
        "WHEELHOUSE/locks/<recipe>.Containerfile.",
    )
    lk.add_argument("--wheel", help="wheel file name in the wheelhouse (default: the newest for this Python)")

    im = sub.add_parser(
        "image",
        parents=[common],
        help="build a CI image (OCI) from the wheelhouse with podman, smoke it inside, publish it",
        description="Build a reproducible OCI image holding one venv (/opt/deepspeed) with a lock's files: the "
        "DeepSpeed wheel, its torch and every dependency, installed by pip with --require-hashes from the "
        "wheelhouse alone (no index, no network). Run the smoke checks inside it (podman run --network none), "
        "save it as an OCI archive into WHEELHOUSE/images/ and list it in manifest.json. The same lock, wheels and "
        "base give the same image digest (file times and the creation date are SOURCE_DATE_EPOCH, default 0). "
        "Needs podman and runc; the toolkit's own containers.conf is used for its runs only. Exit 12 when the image "
        "cannot be built, proven or published; a failed run leaves no archive and no container or image of its own.",
    )
    which = im.add_mutually_exclusive_group()
    which.add_argument("--lock", help="a lock of the wheelhouse: locks/<recipe>.lock (written by `lock`)")
    which.add_argument("--wheel", help="a published wheel; its lock is written if it has none "
                       "(default: the newest wheel for this Python)")  # fmt: skip
    im.add_argument("--base", help="base image podman holds or can pull, with python3 and venv (default: a Debian "
                    "bookworm base made here with debootstrap from the host's mirror, once, and kept)")  # fmt: skip
    im.add_argument("--no-publish", action="store_true", help="build and smoke only; nothing is written to the "
                    "wheelhouse (the image stays in podman's storage)")  # fmt: skip
    im.add_argument("--no-smoke", action="store_true", help="with --no-publish: build only (to compare a rebuild's "
                    "image ID); an image is published only after its smoke checks")  # fmt: skip
    im.add_argument("--squashfs", action="store_true",
                    help="also make the Slurm container image: the image's root filesystem as a squashfs in Enroot's "
                    "layout (srun --container-image=FILE.sqsh with Pyxis), reproducible (the same archive gives the "
                    "same bytes), proven by the smoke suite run from its files, published beside the archive as "
                    "images/<name>.sqsh with its sha256 in the signed manifest. Needs mksquashfs "
                    "(squashfs-tools) and squashfuse or unsquashfs")  # fmt: skip

    pr = sub.add_parser(
        "prune",
        parents=[common],
        help="remove wheels no recipe or lock refers to",
        description="Remove published wheels built from recipes that no longer exist and pinned by no lock, "
        "keeping the index and manifest consistent. A missing or empty recipes folder is an error (exit 2), and a "
        "prune that would remove every wheel is refused (exit 2) unless --all is given.",
    )
    pr.add_argument(
        "--recipes-dir",
        type=Path,
        default=Path("recipes"),
        help="the folder of current recipes; it must exist and hold at least one (default: %(default)s)",
    )
    pr.add_argument("--dry-run", action="store_true", help="only list what would be removed")
    pr.add_argument(
        "--all",
        dest="remove_all",
        action="store_true",
        help="allow removing every wheel of the wheelhouse (without it, a prune that would empty it is refused)",
    )

    pv = sub.add_parser(
        "provision",
        parents=[common],
        help="install the right wheel on every host of a hostfile (pdsh) or of a Slurm partition (srun)",
        description="Write provision/<host>.sh for every host of a DeepSpeed hostfile; with --run, execute "
        "them on all hosts at once with pdsh. With --launcher slurm, write provision/node.sh and, with --run, "
        "run it once on every node of --partition or --nodelist with srun --ntasks-per-node=1; each node's "
        "result (the installer's JSON) is checked and reported.",
    )
    pv.add_argument("--hostfile", type=Path, help="DeepSpeed hostfile: `host slots=N [python=PY]`")
    pv.add_argument("--partition", help="with --launcher slurm: install on this partition's nodes")
    pv.add_argument("--nodelist", help="with --launcher slurm: install on these nodes (Slurm's syntax: n[01-04])")
    pv.add_argument("--python", help="with --launcher slurm: the nodes' Python (default: python3)")
    pv.add_argument("--url", help="the wheelhouse as the hosts reach it (default: WHEELHOUSE's absolute path)")
    pv.add_argument("--ssh-config", type=Path, metavar="FILE",
                    help="with --launcher ssh: the ssh config pdsh's ssh reads (ssh -F FILE: the cluster's host "
                    "names, user, key and known hosts), instead of ~/.ssh/config")  # fmt: skip
    pv.add_argument("--out", type=Path, default=Path("provision"), help="where the scripts go (default: %(default)s)")
    pv.add_argument("--run", action="store_true", help="execute the scripts on the hosts with pdsh")
    pv.add_argument("--module", metavar="PREFIX",
                    help="install the wheel and its lock as an Lmod module under PREFIX, a software tree every node "
                    "mounts: once, from the first host (or node) alone, with its Python (`module --help`)")  # fmt: skip
    pv.add_argument("--require-gpu-proof", action="store_true",
                    help="the nodes refuse a CUDA wheel with no GPU proof for their compute capability (the node "
                    "installer's --require-gpu-proof)")  # fmt: skip
    pv.add_argument(
        "--launcher",
        choices=("ssh", "local", "slurm"),
        default="ssh",
        help="how hosts are reached: pdsh over ssh, pdsh with a local shell per host, or Slurm's srun "
        "(default: %(default)s)",
    )

    bn = sub.add_parser(
        "bench",
        parents=[common],
        help="time this toolkit against the plain DeepSpeed command, as ratios",
        description="Cold build, unchanged rebuild, one-op rebuild, wheel size and time to a usable op on a "
        "fresh node, each against the plain DeepSpeed path, in one run; writes OUT/bench.md and OUT/bench.json.",
    )
    bn.add_argument(
        "--recipe", type=Path, default=Path(DEFAULT_RECIPE), help="recipe to measure (default: %(default)s)"
    )
    bn.add_argument("--runs", type=int, default=3, help="runs to take the median of (default: %(default)s)")
    bn.add_argument("--out", type=Path, default=Path("build/bench"), help="results folder (default: %(default)s)")
    bn.add_argument(
        "--all-ops",
        action="store_true",
        help='instead: for an ops = "all" recipe, a cold build as op units (less one op) vs plain DeepSpeed '
        "building the same ops in one run, then the op added; peak memory and a projection over 1-64 nodes; "
        "writes OUT/bench-all.md",
    )
    bn.add_argument(
        "--full-ops",
        type=Path,
        metavar="RECIPE",
        help='also, in the same run and bench.md: the --all-ops rows for this ops = "all" recipe '
        "(recipes/cpu-all.toml: the full-op CPU recipe; about 15 minutes more)",
    )
    bn.add_argument(
        "--slurm-matrix",
        type=Path,
        metavar="FILE",
        help="instead: time this matrix built here one target after another and as a Slurm job array, cold, "
        "then again after adding one op to its first recipe (shared compiler cache); writes OUT/bench-slurm.md",
    )
    bn.add_argument(
        "--image",
        action="store_true",
        help="instead: the CI image of the wheelhouse's newest wheel for this Python, cold (the toolkit's "
        "debootstrap base made anew) and rebuilt with the base cached, not published; writes OUT/bench-image.md",
    )
    bn.add_argument(
        "--cluster",
        type=Path,
        metavar="FOLDER",
        help="instead: on a test cluster (python tests/cluster.py up FOLDER, with a wheel published into "
        "FOLDER/shared/wheelhouse), --installs installs at once from its nodes against nginx on its web node and "
        "against serve on this host; writes OUT/bench-cluster.md",
    )
    bn.add_argument("--installs", type=int, default=64, help="with --cluster: installs at once (default: %(default)s)")
    bn.add_argument("--dry-runs", type=int, metavar="N",
                    help="with --cluster: node installer runs at once, where fewer than --installs (each starts "
                    "Python and torch: CPU-bound on a small machine; the downloads stay --installs)")  # fmt: skip

    sub.add_parser(
        "install",
        add_help=False,
        help="on a node: install the wheel built for it (standard library + pip only; see install --help)",
        description="The node installer (builder/node/, also published as WHEELHOUSE/tools/ds-node-install.py).",
    )
    sub.add_parser(
        "module",
        add_help=False,
        help="install a wheel and its lock as an Lmod module on a shared software tree (see module --help)",
        description="The node installer's --module mode: python -m builder module --wheelhouse W --prefix PREFIX.",
    )
    rp = sub.add_parser(
        "repair",
        parents=[common],
        help="remove what interrupted publishes left in a wheelhouse",
        description="Under the publish lock, remove the temporary files and the unlisted wheels an interrupted "
        "publish left (only files its journal names, with the hashes it wrote) and rewrite the index from "
        "manifest.json. Files the toolkit did not write are reported by verify and never removed.",
    )
    rp.set_defaults()
    w = sub.add_parser(
        "serve",
        help="serve a wheelhouse over HTTP for many nodes",
        description="Serve the wheelhouse folder (wheels, simple/ index, metadata, manifest) with "
        "a static HTTP server; pip never falls back to PyPI through it.",
    )
    w.add_argument("--wheelhouse", type=folder_arg, default=Path("wheelhouse"), help="folder (or file:// URL) to serve")
    w.add_argument("--bind", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    w.add_argument("--port", type=port_number, default=8765, help="port, 0 to 65535 (default: %(default)s)")
    w.add_argument("--debug", action="store_true", help="show a traceback on errors")
    return p


def _torch_source(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--python", help="interpreter whose torch to inspect (default: this one)")
    g.add_argument("--recipe", type=Path, help="inspect the recipe's build environment (made if needed)")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["install"], ["module"]):  # the node installer has its own CLI: one file, the same on every node
        from builder import node
        from builder.commands.provisioning import host_trust

        return node.main(host_trust(argv[1:]), prog=f"python -m builder {argv[0]}", module_only=argv[0] == "module")
    args = parser().parse_args(argv)
    from builder import commands
    from builder.node import InstallError  # the contract's errors (a bad manifest or report)

    output.set_quiet(getattr(args, "quiet", False))
    os.umask(0o022)  # what the toolkit makes is 0755/0644 (0700 where private) under any umask, its tools' too
    _terminate_cleanly()
    try:
        return commands.HANDLERS[args.command](args)
    except (BuilderError, InstallError) as exc:
        if args.debug:
            traceback.print_exc()
        output.error(str(exc))
        return exc.exit_code
    except OSError as exc:  # a path the system refuses (too long, a file where a folder is): one line
        if args.debug or exc.filename is None:
            raise
        from builder.files import path_error  # the install path imports only the standard library

        error = path_error(exc)
        output.error(str(error))
        return error.exit_code
    except KeyboardInterrupt:
        output.error("interrupted")
        return 130
    except Terminated as exc:
        name = str(exc) or "SIGTERM"
        output.error(f"terminated ({name}): what this run made in its temporary folders was removed")
        return 129 if name == "SIGHUP" else 143


class Terminated(BaseException):
    """SIGTERM (a Slurm time limit, `kill`, a CI's cancel): raised where the process is, so every
    `finally` runs and temporary folders go, as Ctrl-C does. Python's default ends the process at once
    (`image` left its 265 MB context and debootstrap tree in the work folder)."""


def _terminate_cleanly() -> None:
    """SIGTERM and SIGHUP raise Terminated once; the same signal again (Slurm and `timeout` signal the
    whole process group, a cluster's scheduler twice) is ignored while the `finally` blocks remove what the
    run made: a second SIGTERM once ended a run mid-cleanup, printing nothing and leaving its root-tmp
    folder. SIGKILL still ends it at once, and the next run sweeps what it left (names carry the PID)."""
    import signal
    import threading

    def raise_terminated(signum: int, frame: object) -> None:
        del frame
        for each in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(each, signal.SIG_IGN)
        raise Terminated(signal.Signals(signum).name)

    if threading.current_thread() is threading.main_thread():
        for each in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(each, raise_terminated)
