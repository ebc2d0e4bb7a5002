"""A node of another machine (aarch64) on this one: a Debian root of that architecture, entered with
qemu-user, where a cross-built wheel is smoke-tested with the node's own Python.

Made once per machine, into the roots folder, by root: debootstrap's first stage unpacks the arm64
packages (no emulation), its second stage configures them under qemu, and torch's wheel for that
machine with the wheel's dependencies is installed into the root's Python by uv on this machine (the
files are the same; 4.5 GB unpacked natively in seconds, not under emulation).

Entered the way the build root is (builder/buildroot/spec.py: an overlay of the root, writes going to
a tmpfs, the run's folders bound in at their own paths, chroot), always in a user namespace of its
own, where binfmt_misc is mounted privately (Linux 6.7+) and qemu registered for the machine with the
F flag: aarch64 programs run in that namespace only, and nothing of the host's binfmt_misc is changed.
Making the root maps the host's ids 0-65535 into its namespace (root writes the map), so the
packages' owners are real; running in it maps the user to root only.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from builder import cmd, output
from builder.buildroot import make
from builder.buildroot.spec import INSIDE, bind_paths, outermost
from builder.debian import debootstrap_stage
from builder.errors import RootError, SmokeError
from builder.files import held, make_dirs, write_atomic
from builder.machines import Machine

SUITE = "bookworm"  # Debian 12: Python 3.11, glibc 2.36 (a node above the wheel's manylinux_2_28 floor)
PACKAGES = ("python3", "python3-venv", "python3-pip")  # a node has Python and pip, no compiler
NODE_SCHEMA = 1
# binfmt_misc's magic and mask for 64-bit little-endian ELF executables of each machine (qemu's own).
ELF_MAGIC = {
    "aarch64": (r"\x7f\x45\x4c\x46\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00",
                r"\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff"),
}  # fmt: skip
QEMU_FIX = ("install qemu-user-static (Debian/Ubuntu: apt-get install qemu-user-static; RHEL-likes: dnf install "
            "qemu-user-static), or build with --no-smoke and prove the wheel on a node of that machine")  # fmt: skip


@dataclass(frozen=True)
class NodeSpec:
    """What a node root holds: the machine, Debian's suite and packages, and the Python packages
    installed into its Python (torch for that machine and what the wheel and the smoke need)."""

    machine: Machine
    mirror: str
    requirements: tuple[str, ...]
    suite: str = SUITE
    packages: tuple[str, ...] = PACKAGES

    @property
    def name(self) -> str:
        data = {"schema": NODE_SCHEMA, "machine": self.machine.name, "suite": self.suite, "mirror": self.mirror,
                "packages": sorted(self.packages), "requirements": sorted(self.requirements)}  # fmt: skip
        key = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]
        return f"node-{self.suite}-{self.machine.debian}-{key}"

    def describe(self) -> str:
        torch = [r for r in self.requirements if r.startswith("torch")]
        more = len(self.requirements) - len(torch)
        return f"Debian {self.suite} {self.machine.debian}, {', '.join(torch) or 'no torch'} and {more} more"


def qemu_for(machine: Machine) -> str:
    """qemu-user's static program for `machine` (SmokeError naming the package where it is missing)."""
    found = cmd.which(machine.qemu) or (
        f"/usr/bin/{machine.qemu}" if Path(f"/usr/bin/{machine.qemu}").is_file() else None
    )
    if found is None or machine.name not in ELF_MAGIC:
        raise SmokeError(f"the smoke of a wheel for {machine.name} runs under emulation, and this machine has no "
                         f"{machine.qemu} (qemu-user)", QEMU_FIX)  # fmt: skip
    return os.path.realpath(found)


def binfmt_line(machine: Machine, qemu: str) -> str:
    """binfmt_misc's registration of qemu for the machine's executables; F: qemu is opened now, so it
    runs inside a chroot that does not hold it."""
    magic, mask = ELF_MAGIC[machine.name]
    return f":ds-builder-{machine.name}:M::{magic}:{mask}:{qemu}:F"


# In the namespace, before the root is entered: binfmt_misc mounted privately and qemu registered.
_BINFMT = r"""mount -t binfmt_misc ds-binfmt /proc/sys/fs/binfmt_misc
printf '%s' "$(cat "$here/binfmt")" > /proc/sys/fs/binfmt_misc/register
"""
# The node's CPU as its programs read it. FAKE (labelled): qemu-user shows an aarch64 program the host's x86
# /proc/cpuinfo and /sys CPU entries; torch's cpuinfo then fails ("Failed to initialize cpuinfo!", which
# float16 conversions raise) and oneDNN's aarch64 code generator crashed on the host's /sys. An Arm server
# CPU's description (cpu_description) is bound over them; the host's /etc/hosts is bound in too (a
# torchrun rendezvous by the host's name).
_NODE_MOUNTS = r"""mount --bind "$here/cpuinfo" "$mnt/root/proc/cpuinfo"
mkdir -p "$mnt/root/sys"
mount -t tmpfs -o mode=0755 ds-node-sys "$mnt/root/sys"
mkdir -p "$mnt/root/sys/devices/system/cpu"
mount --rbind "$here/sys-cpu" "$mnt/root/sys/devices/system/cpu"
[ -e "$mnt/root/etc/hosts" ] || : > "$mnt/root/etc/hosts"
mount --bind /etc/hosts "$mnt/root/etc/hosts"
"""
NODE_INSIDE = INSIDE.replace("shift 3\n", "shift 3\n" + _BINFMT, 1).replace(
    'mount --rbind /proc "$mnt/root/proc"\n', 'mount --rbind /proc "$mnt/root/proc"\n' + _NODE_MOUNTS, 1
)
# The Arm CPUs a node may be shown: (MIDR_EL1's variant, part, revision, Features). Neoverse N1 (MIDR
# 0x413fd0c1) with armv8.2-a's features: what an armv8-a wheel's code may use and more, and no SVE.
# Neoverse V2 (0x410fd4f0), Grace's core, with the Features line of a GH200 node: SVE and SVE2, for the
# smoke of an armv8.2-a+sve wheel (qemu-user's default CPU, "max", runs SVE2 code; it is no Grace).
CPUS = {
    "neoverse-n1": ("0x3", "0xd0c", "1", "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid "
                    "asimdrdm lrcpc dcpop asimddp"),
    "neoverse-v2": ("0x0", "0xd4f", "0", "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid "
                    "asimdrdm jscvt fcma lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc "
                    "flagm ssbs sb paca pacg dcpodp sve2 sveaes svepmull svebitperm svesha3 svesm4 flagm2 frint "
                    "svei8mm svebf16 i8mm bf16 dgh bti"),
}  # fmt: skip


def cpu_for(cpu_target: str) -> str:
    """The CPU a node is shown for the smoke of a wheel built for `cpu_target`: one with what it needs."""
    from builder.node.contract import TARGET_FLAGS

    needs = set(TARGET_FLAGS.get(cpu_target, ()))
    return next(name for name, (*_, features) in CPUS.items() if needs <= set(features.split()))


def cpu_description(count: int, cpu: str = "neoverse-n1") -> tuple[str, dict[str, str]]:
    """FAKE (labelled, see above): /proc/cpuinfo's text and /sys/devices/system/cpu's files (relative path
    -> text) of an aarch64 node with `count` CPUs of model `cpu` (CPUS)."""
    variant, part, revision, features = CPUS[cpu]
    block = (f"processor\t: {{n}}\nBogoMIPS\t: 50.00\nFeatures\t: {features}\nCPU implementer\t: 0x41\n"
             f"CPU architecture: 8\nCPU variant\t: {variant}\nCPU part\t: {part}\n"
             f"CPU revision\t: {revision}\n\n")  # fmt: skip
    cpuinfo = "".join(block.format(n=n) for n in range(count))
    span = f"0-{count - 1}\n" if count > 1 else "0\n"
    midr = f"0x0000000041{int(variant, 16):x}f{int(part, 16):03x}{int(revision):x}"
    files = {"possible": span, "present": span, "online": span}
    files.update({f"cpu{n}/regs/identification/midr_el1": f"{midr}\n" for n in range(count)})
    return cpuinfo, files


NODE_ENTER = r"""#!/bin/sh
# ds-builder: run a program of a node root of another machine under qemu-user (see builder/buildroot/emulated.py).
set -eu
PATH=/usr/bin:/bin:/usr/sbin:/sbin
here=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd)
tool=$1
shift
exec unshare --user --map-root-user --mount --propagation private -- /bin/sh "$here/inside" "$here" "$PWD" "$tool" "$@"
"""
# Making the root: a user namespace whose ids 0-65535 are the host's (root writes the map), so that
# the second stage's chown to a package's user and group is real.
MAPPED = r"""#!/bin/sh
set -eu
here=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd)
root=$1
shift
unshare --user --mount --propagation private -- /bin/sh -c 'read go < "$0"; shift; exec "$@"' "$here/go" x \
  /bin/sh -c '
here=$1 root=$2; shift 2
mount -t binfmt_misc ds-binfmt /proc/sys/fs/binfmt_misc
printf "%s" "$(cat "$here/binfmt")" > /proc/sys/fs/binfmt_misc/register
mount --rbind /proc "$root/proc"
mount --rbind /dev "$root/dev"
exec chroot "$root" /usr/bin/env -i container=lxc PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"' x "$here" "$root" "$@" &
pid=$!
mine=$(readlink /proc/self/ns/user)
while [ "$(readlink "/proc/$pid/ns/user" 2>/dev/null || echo "$mine")" = "$mine" ]; do sleep 0.01; done
echo "0 0 65536" > "/proc/$pid/uid_map"
echo "0 0 65536" > "/proc/$pid/gid_map"
echo go > "$here/go"
wait "$pid"
"""


def ensure_node_root(spec: NodeSpec, roots: Path, uv: str, uv_sources: Sequence[str]) -> Path:
    """The node root, made now unless this machine has it (a few minutes, once): first stage,
    second stage under qemu, then the Python packages. Renamed into place only when complete."""
    path = roots / spec.name
    done = roots / f"{spec.name}.json"
    if done.is_file() and path.is_dir():
        return path
    qemu = qemu_for(spec.machine)
    make_dirs(roots)
    log = roots / f"{spec.name}.log"
    with held(roots / f".{spec.name}.lock", f"the {spec.machine.name} node root {spec.name} (made once per machine)"):
        if done.is_file() and path.is_dir():
            return path
        if os.geteuid() != 0:
            raise RootError(
                f"making the {spec.machine.name} node root ({spec.describe()}) needs root (debootstrap), and this "
                f"is user {os.geteuid()}",
                f"have root make it once (run one smoke of a {spec.machine.name} wheel as root; it is kept in "
                f"{roots}), or build with --no-smoke",
            )
        program, env = make.debootstrap(roots / "tools", log)
        for stale in roots.glob(f".{spec.name}.tmp-*"):  # a killed making: ours, never a root in use
            shutil.rmtree(stale, ignore_errors=True)
        tmp = roots / f".{spec.name}.tmp-{os.getpid()}"
        output.step(f"node root: making {spec.describe()} in {path}: a few minutes under emulation, once per machine")
        try:
            cmd.run([program, "--foreign", f"--arch={spec.machine.debian}", "--variant=minbase",
                     f"--include={','.join(spec.packages)}", spec.suite, tmp, spec.mirror],
                    env=env, log=log, progress=debootstrap_stage,
                    fix=f"debootstrap needs the Debian mirror the host's apt uses (read the log {log})")  # fmt: skip
            with tempfile.TemporaryDirectory(prefix="ds-node-make-") as tools:
                os.mkfifo(Path(tools) / "go")
                write_atomic(Path(tools) / "binfmt", binfmt_line(spec.machine, qemu))
                script = write_atomic(Path(tools) / "mapped", MAPPED, mode=0o755)
                cmd.run(["/bin/sh", script, tmp, "/debootstrap/debootstrap", "--second-stage"], log=log,
                        progress=debootstrap_stage,
                        fix="the second stage runs under qemu in a user namespace with its own binfmt_misc "
                            f"(Linux 6.7 or newer); read the log {log}")  # fmt: skip
            site = tmp / "usr" / "local" / "lib" / f"python{_python_of(tmp)}" / "dist-packages"
            output.step(f"node root: installing {len(spec.requirements)} requirements for {spec.machine.name} with uv")
            cmd.run([uv, "pip", "install", "--python-platform", f"{spec.machine.name}-manylinux_2_28",
                     "--python-version", _python_of(tmp), "--target", site, *uv_sources, *spec.requirements],
                    log=log, fix="uv could not install torch for the node's machine: read the log")  # fmt: skip
            for rel in ("var/cache/apt/archives", "var/lib/apt/lists"):
                for child in (tmp / rel).glob("*.deb"):
                    child.unlink()
            os.chmod(tmp, 0o755)
            tmp.rename(path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        record = {"schema": NODE_SCHEMA, "machine": spec.machine.name, "suite": spec.suite,
                  "requirements": list(spec.requirements), "path": str(path)}  # fmt: skip
        write_atomic(done, json.dumps(record, indent=2, sort_keys=True) + "\n")
        output.note(f"node root: {path}")
        return path


def _python_of(root: Path) -> str:
    """The root's Python version (3.11), from its stdlib folder: its python3 is not run here."""
    found = sorted(p.name.removeprefix("python") for p in (root / "usr" / "lib").glob("python3.*") if p.is_dir())
    if not found:
        raise RootError(f"the node root {root} holds no Python", "remove it and run again")
    return found[-1]


def enter_folder(root: Path, machine: Machine, folder: Path, binds: Sequence[str | os.PathLike[str]],
                 programs: Mapping[str, str], cpu: str = "neoverse-n1") -> dict[str, Path]:  # fmt: skip
    """Write the wrappers of `programs` (name -> a path inside the node root, or in a bound folder) into
    `folder`: each runs its program in the node root under qemu, `binds` bound in at their own paths."""
    qemu = qemu_for(machine)
    make_dirs(folder / "mnt")
    wanted = [str(b) for b in binds] + [os.path.realpath(b) for b in binds]
    files = {"enter": (NODE_ENTER, 0o755), "inside": (NODE_INSIDE, 0o644), "root": (f"{root}\n", 0o644),
             "binds": ("".join(f"{b}\n" for b in outermost(bind_paths(wanted))), 0o644), "covers": ("", 0o644),
             "binfmt": (binfmt_line(machine, qemu), 0o644)}  # fmt: skip
    cpuinfo, cpus = cpu_description(min(os.cpu_count() or 1, 64), cpu)
    files["cpuinfo"] = (cpuinfo, 0o644)
    for rel, text in cpus.items():
        make_dirs((folder / "sys-cpu" / rel).parent)
        files[f"sys-cpu/{rel}"] = (text, 0o644)
    for name, program in programs.items():
        # the folder by its path: the config runner's PATH holds only this folder (no dirname)
        files[name] = (f'#!/bin/sh\nexec {shlex.quote(str(folder / "enter"))} {shlex.quote(program)} "$@"\n', 0o755)
    for name, (text, mode) in files.items():
        write_atomic(folder / name, text, mode=mode)
    return {name: folder / name for name in programs}
