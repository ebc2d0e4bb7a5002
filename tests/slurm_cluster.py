"""A real one-node Slurm cluster on this machine, for the tests: `up FOLDER` / `down FOLDER`.

Debian 12's slurmctld, slurmd, slurm-client and munge (installed by .ci/run with
--no-install-recommends) run as root without systemd; everything the cluster writes (config,
state, spool, logs, pid files) is in FOLDER, and clients find it through SLURM_CONF. Two
partitions share the node: `cpu` (the default) and `h100`, whose GPUs are FAKE: gres.conf names
character devices that are symlinks to /dev/null, so jobs that ask for --gres=gpu:1 really get
CUDA_VISIBLE_DEVICES from Slurm while the smoke inside reports "no GPU" honestly.
Measured pitfalls (../shared/docs/machine.md): DefMemPerCPU, or every job takes all the memory
and jobs run one at a time; DependencyParameters=kill_invalid_depend, or a job whose afterok
parent failed waits forever; MinJobAge=5 so finished jobs leave the queue quickly.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

DAEMONS = ("slurmctld", "slurmd", "munged", "sbatch")
FAKE_GPUS = 2


def missing() -> str | None:
    """Why a cluster cannot be started here (None: it can)."""
    if os.geteuid() != 0:
        return "the one-node Slurm needs root (munged and slurmd run as root here)"
    absent = [d for d in DAEMONS if not shutil.which(d) and not Path("/usr/sbin", d).exists()]
    if absent:
        packages = "slurmctld slurmd slurm-client munge"
        return f"Slurm is not installed ({', '.join(absent)} missing): apt-get install {packages}"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node_line(slurmd_c: str, free_mb: int) -> str:
    """The node definition from `slurmd -C`, memory lowered to 90% of what is free, fake GPUs added."""
    first = slurmd_c.splitlines()[0]
    fields = [f for f in first.split() if not f.startswith(("UpTime=", "RealMemory="))]
    return " ".join([*fields, f"RealMemory={int(free_mb * 0.9)}", f"Gres=gpu:{FAKE_GPUS}"])


def config(folder: Path, host: str, node: str, cpus: int, mem_mb: int) -> str:
    return "\n".join([
        "ClusterName=dsbuilder",
        f"SlurmctldHost={host}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        f"SlurmctldPort={_free_port()}",
        f"SlurmdPort={_free_port()}",
        f"StateSaveLocation={folder}/state",
        f"SlurmdSpoolDir={folder}/spool",
        f"SlurmctldPidFile={folder}/slurmctld.pid",
        f"SlurmdPidFile={folder}/slurmd.pid",
        f"SlurmctldLogFile={folder}/slurmctld.log",
        f"SlurmdLogFile={folder}/slurmd.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/affinity",
        "JobAcctGatherType=jobacct_gather/none",
        "MpiDefault=none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        f"DefMemPerCPU={max(256, int(mem_mb * 0.9) // max(1, cpus))}",
        "DependencyParameters=kill_invalid_depend",
        "ReturnToService=2",
        "MinJobAge=5",
        "GresTypes=gpu",
        node,
        f"PartitionName=cpu Nodes={host} Default=YES MaxTime=INFINITE State=UP",
        f"PartitionName=h100 Nodes={host} MaxTime=INFINITE State=UP",
        "",
    ])  # fmt: skip


def environ(folder: Path) -> dict[str, str]:
    """The environment a client (sbatch, squeue, srun) of this cluster runs in."""
    return {**os.environ, "SLURM_CONF": str(folder / "slurm.conf")}


def up(folder: Path, timeout: float = 60.0) -> dict[str, str]:
    """Start munged (if not running), slurmctld and slurmd; return the clients' environment once
    the node is idle."""
    folder.mkdir(parents=True, exist_ok=True)
    for sub in ("state", "spool"):
        (folder / sub).mkdir(exist_ok=True)
    host = socket.gethostname().split(".")[0]
    probe = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout
    free_mb = int(Path("/proc/meminfo").read_text().split("MemAvailable:")[1].split()[0]) // 1024
    cpus = os.cpu_count() or 1
    node = node_line(probe, free_mb)
    (folder / "slurm.conf").write_text(config(folder, host, node, cpus, free_mb))
    devices = []
    for i in range(FAKE_GPUS):  # FAKE GPU devices: character-device symlinks for Slurm's gres
        dev = folder / f"fake-nvidia{i}"
        if not dev.is_symlink():
            dev.symlink_to("/dev/null")
        devices.append(str(dev))
    (folder / "gres.conf").write_text(f"NodeName={host} Name=gpu File={folder}/fake-nvidia[0-{FAKE_GPUS - 1}]\n")
    if subprocess.run(["pgrep", "-x", "munged"], capture_output=True).returncode != 0:
        if not Path("/etc/munge/munge.key").exists():
            subprocess.run(["mungekey", "--create"], check=True)
        subprocess.run(["install", "-d", "-o", "munge", "-g", "munge", "/run/munge"], check=True)
        subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"], check=True)
        (folder / "started-munged").write_text("1")
    env = environ(folder)
    subprocess.run(["slurmctld", "-f", str(folder / "slurm.conf")], check=True, env=env)
    subprocess.run(["slurmd", "-f", str(folder / "slurm.conf")], check=True, env=env)
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        done = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, env=env)
        state = done.stdout.strip()
        if state and all(s == "idle" for s in state.split()):
            return env
        time.sleep(0.5)
    down(folder)
    raise RuntimeError(f"the one-node Slurm did not come up in {timeout:.0f} s (node state {state!r}); see {folder}")


def down(folder: Path) -> None:
    """Stop what `up` started, by the pids in its pid files."""
    for name in ("slurmd", "slurmctld"):
        pid_file = folder / f"{name}.pid"
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text().strip()), 15)
            except (ValueError, ProcessLookupError):
                pass
    if (folder / "started-munged").exists():  # munged is machine-wide: stopped only if up() started it
        pid = Path("/run/munge/munged.pid")
        try:
            os.kill(int(pid.read_text().strip()), 15)
        except (OSError, ValueError):
            pass
        (folder / "started-munged").unlink()
    for name in ("slurmd", "slurmctld"):
        pid_file = folder / f"{name}.pid"
        for _ in range(50):
            if not pid_file.exists():
                break
            try:
                os.kill(int(pid_file.read_text().strip()), 0)
            except (ValueError, ProcessLookupError, FileNotFoundError):
                break
            time.sleep(0.1)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("up", "down"):
        raise SystemExit("usage: python tests/slurm_cluster.py up|down FOLDER")
    where = Path(sys.argv[2]).resolve()
    if sys.argv[1] == "up":
        if why := missing():
            raise SystemExit(why)
        up(where)
        print(f"export SLURM_CONF={where / 'slurm.conf'}")
    else:
        down(where)
