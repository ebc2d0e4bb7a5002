"""A cluster in one box: nodes made of Linux namespaces on this machine, for the tests and for a
person (`python tests/cluster.py up FOLDER`, `... down FOLDER`; needs root).

Each node has its own network namespace (a veth pair on the bridge `dscbr0`, 10.77.0.1 on the
host, 10.77.0.1N on node N), its own hostname, and its own mount and PID namespaces whose root is a
Debian root made with debootstrap, overlaid per node (writes stay in the node's folder), with only
the cluster's shared folder bind-mounted in at /shared: no compiler, no CUDA toolkit, none of the
build host's files. Node 1-3 run Debian 12 (bookworm: glibc 2.36, Python 3.11, OpenSSH 9.2) with
the site's node image: a venv at /opt/ds holding torch 2.13.0 (CPU build) and pip, Lmod, squashfuse
and squashfs-tools; node 4 runs
Debian 11 (bullseye: glibc 2.31, Python 3.9, OpenSSH 8.4). Each node runs sshd (pdsh and ssh reach
it with the key and the host keys in FOLDER/ssh; `ssh -F FOLDER/ssh/config node1`); node1 also
runs nginx (Debian's package) serving /shared as a plain static folder on port 80.

Slurm: one slurmctld on the host (10.77.0.1) and one slurmd per bookworm node, in that node's
network namespace and hostname. A slurmd's jobs see the build host's filesystem, not the node's
Debian root: its jobs compile DeepSpeed's ops, and a build partition's nodes carry the build
host's image (compilers, the toolkit, its work folders); the Debian roots are the install side,
where nothing may compile. The bullseye node is therefore not a Slurm node. The `h100` partition's
GPUs (on node1) are FAKE: character-device symlinks to /dev/null for Slurm's gres.

The Debian roots are made once per machine (about 1-2 minutes each, from the host's Debian
mirror) and kept in DS_CLUSTER_ROOTS (default /var/tmp/ds-builder-roots); everything a running
cluster writes is under FOLDER.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOTS = Path(os.environ.get("DS_CLUSTER_ROOTS", "/var/tmp/ds-builder-roots"))
BRIDGE = "dscbr0"
SUBNET = "10.77.0"
HOST_ADDR = f"{SUBNET}.1"
TORCH = "torch==2.13.0+cpu"
COMMON = ("python3", "python3-venv", "openssh-server", "iproute2", "ca-certificates")
IMAGES = {  # suite: what the node image holds beyond debootstrap's minimal base
    # lmod: the site's module system (issue 40); squashfuse and squashfs-tools: a node mounting (or
    # unpacking) the Slurm container image.
    "bookworm": {"packages": (*COMMON, "nginx", "lmod", "squashfuse", "squashfs-tools"), "venv": TORCH},
    # Debian 11's own python3 is 3.9, for which torch 2.13 has no wheel: the node gets the Python a site
    # would give it (a module or conda Python), here CPython 3.11 built from Debian's own source package
    # in a bullseye root (ensure_python), with the site's torch in /opt/ds.
    "bullseye": {"packages": COMMON, "venv": TORCH, "python": "/opt/python3.11/bin/python3.11"},
}
# bookworm's python3.11 source package (3.11.2), from the Debian mirror's pool; sha256 as its Sources index
# lists it. Built with bullseye's gcc 10 and glibc 2.31, it runs on the Debian 11 node.
PYTHON_SOURCE = ("pool/main/p/python3.11/python3.11_3.11.2.orig.tar.gz",
                 "2411c74bda5bbcfcddaf4531f66d1adc73f247f529aee981b029513aefdbf849")  # fmt: skip
PYTHON_BUILD_DEPS = ("libssl-dev", "zlib1g-dev", "libffi-dev", "libsqlite3-dev", "libbz2-dev", "liblzma-dev",
                     "uuid-dev")  # fmt: skip
FAKE_GPUS = 2
TOOLS = ("ip", "unshare", "debootstrap", "pdsh", "ssh", "slurmctld", "slurmd", "munged")


@dataclass(frozen=True)
class Node:
    name: str
    suite: str
    addr: str
    python: str  # the interpreter installs run with (the hostfile's python=)
    slurm: bool
    web: bool = False

    @property
    def netns(self) -> str:
        return f"dsc-{self.name}"

    @property
    def veth(self) -> str:
        """The host's end of the node's veth pair (its cable)."""
        return f"dsc{self.name[-1]}h"


NODES = (
    Node("node1", "bookworm", f"{SUBNET}.11", "/opt/ds/bin/python", True, web=True),
    Node("node2", "bookworm", f"{SUBNET}.12", "/opt/ds/bin/python", True),
    Node("node3", "bookworm", f"{SUBNET}.13", "/opt/ds/bin/python", True),
    Node("node4", "bullseye", f"{SUBNET}.14", "/opt/ds/bin/python", False),
)


def missing() -> str | None:
    """Why the cluster cannot be started here (None: it can)."""
    if os.geteuid() != 0:
        return "the namespace cluster needs root (network namespaces, mounts, slurmd)"
    absent = [t for t in TOOLS if not shutil.which(t) and not Path("/usr/sbin", t).exists()]
    if absent:
        return f"missing {', '.join(absent)}: apt-get install iproute2 util-linux debootstrap pdsh openssh-client " \
            "slurmctld slurmd slurm-client munge"  # fmt: skip
    return None


def _run(args: list[str], log: Path | None = None, **kw: object) -> str:
    done = subprocess.run(args, capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    if log is not None:
        with log.open("a") as f:
            f.write(f"+ {' '.join(map(str, args))}\n{done.stdout}{done.stderr}")
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(map(str, args))} failed ({done.returncode}): {(done.stderr or done.stdout)[-1500:]}"
        )
    return str(done.stdout)


# ------------------------------------------------------------------ the node images (made once)


def _local_sources() -> tuple[list[str], list[str]]:
    """pip's arguments for this machine's package sources, and the local folders they name (bound
    read-only into the image while torch is installed: nothing outside loopback is reached)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from builder.envs import pip_sources

    sources = pip_sources()
    args: list[str] = []
    folders: list[str] = []
    indexes = [sources.index_url] if sources.index_url else []
    indexes += list(sources.extra_index_urls)  # no PyPI from inside: the first local index leads
    for flag, values in (("--index-url", indexes[:1]), ("--extra-index-url", indexes[1:]),
                         ("--find-links", list(sources.find_links))):  # fmt: skip
        for value in values:
            args += [flag, value]
            path = value[len("file://") :] if value.startswith("file://") else value
            if path.startswith("/"):
                top = Path(path)
                while top.parent != Path("/") and top.parent.parent != Path("/"):
                    top = top.parent  # /opt/pypi/simple -> /opt/pypi (its files are ../../files)
                folders.append(str(top))
    return args, sorted(set(folders))


def mirror() -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from builder.debian import host_mirror

    return host_mirror()


def image_path(suite: str) -> Path:
    spec = IMAGES[suite]
    made = [suite, spec, mirror(), *([python_key()] if spec.get("python") else [])]
    key = hashlib.sha256(json.dumps(made, sort_keys=True).encode()).hexdigest()[:10]
    return ROOTS / f"{suite}-{key}"


def python_key() -> str:
    """What the Debian 11 node's CPython is built from and how (its folder's name, and part of the
    node image's: a Python built another way makes another image)."""
    return hashlib.sha256(json.dumps([PYTHON_SOURCE, PYTHON_BUILD_DEPS, mirror(), "shm"]).encode()).hexdigest()[:10]


def ensure_python(log: Path) -> Path:
    """CPython 3.11 for bullseye (its /opt/python3.11 tree), built once per machine: a bullseye buildd
    root with CPython's build dependencies, Debian's source of python3.11 (sha256 checked),
    configure, make, make install; only the installed tree is kept."""
    import urllib.request

    from filelock import FileLock

    final = ROOTS / f"cpython-3.11-bullseye-{python_key()}"
    ROOTS.mkdir(parents=True, exist_ok=True)
    with FileLock(str(final) + ".lock"):
        if (final / "python3.11" / "bin" / "python3.11").is_file():
            return final / "python3.11"
        started = time.monotonic()
        work = final.with_name(final.name + ".partial")
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(final, ignore_errors=True)
        _run(["debootstrap", "--variant=buildd", f"--include={','.join(PYTHON_BUILD_DEPS)}", "bullseye", str(work),
              mirror()], log=log, timeout=1800)  # fmt: skip
        (work / "build").mkdir()
        with urllib.request.urlopen(f"{mirror()}/{PYTHON_SOURCE[0]}", timeout=300) as r:
            data = r.read()
        if hashlib.sha256(data).hexdigest() != PYTHON_SOURCE[1]:
            raise RuntimeError(f"{PYTHON_SOURCE[0]} from {mirror()} does not match its sha256")
        (work / "build" / "src.tar.gz").write_bytes(data)
        # /dev/shm mounted: configure tests sem_open there, and without it multiprocessing (torchrun) fails.
        check = "import multiprocessing.synchronize, ssl, ctypes, sqlite3, lzma, bz2, zlib, uuid"
        build = (f"mount -t proc proc {work}/proc && mkdir -p {work}/dev/shm && mount -t tmpfs tmpfs {work}/dev/shm "
                 f"&& chroot {work} sh -ec 'cd /build && tar xzf src.tar.gz && "
                 "cd Python-3.11.2 && ./configure --prefix=/opt/python3.11 >/dev/null && "
                 f"make -j{os.cpu_count() or 1} >/dev/null 2>&1 && make install >/dev/null 2>&1 && "
                 f"/opt/python3.11/bin/python3.11 -c \"{check}\"'")  # fmt: skip
        _run(["unshare", "--mount", "--propagation", "private", "sh", "-ec", build], log=log, timeout=3600)
        final.mkdir()
        (work / "opt" / "python3.11").rename(final / "python3.11")
        shutil.rmtree(work)
        with log.open("a") as f:
            f.write(f"CPython 3.11.2 for bullseye built in {time.monotonic() - started:.0f} s\n")
        return final / "python3.11"


def ensure_image(suite: str, log: Path) -> Path:
    """The node image for `suite`, made now (debootstrap, then the venv) unless the machine has it."""
    from filelock import FileLock

    final = image_path(suite)
    ROOTS.mkdir(parents=True, exist_ok=True)
    with FileLock(str(final) + ".lock"):
        if final.is_dir():
            return final
        spec = IMAGES[suite]
        tmp = final.with_name(final.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        started = time.monotonic()
        _run(["debootstrap", "--variant=minbase", f"--include={','.join(spec['packages'])}", suite, str(tmp), mirror()],
             log=log, timeout=1800)  # fmt: skip
        for key in tmp.glob("etc/ssh/ssh_host_*"):
            key.unlink()  # each node makes its own host keys
        if spec.get("python"):  # the site's Python for this OS, built once per machine
            shutil.copytree(ensure_python(log), tmp / "opt" / "python3.11", symlinks=True)
        if spec["venv"]:
            _run(["chroot", str(tmp), str(spec.get("python") or "python3"), "-m", "venv", "/opt/ds"], log=log)
            args, folders = _local_sources()
            script = ["set -e", "mount --make-rprivate /"]
            for folder in folders:
                script += [f"mkdir -p {tmp}{folder}", f"mount --bind -o ro {folder} {tmp}{folder}"]
            script.append(f"chroot {tmp} /opt/ds/bin/pip install --quiet --disable-pip-version-check "
                          f"{' '.join(args)} '{spec['venv']}'")  # fmt: skip
            _run(["unshare", "--mount", "sh", "-c", "\n".join(script)], log=log, timeout=1800)
            for folder in folders:  # the empty mount points
                Path(f"{tmp}{folder}").rmdir()
        for rel in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for child in (tmp / rel).glob("*.deb"):
                child.unlink()
        tmp.rename(final)
        with log.open("a") as f:
            f.write(f"node image {final} made in {time.monotonic() - started:.0f} s\n")
        return final


# ------------------------------------------------------------------ up and down


def _ssh_files(folder: Path, nodes: tuple[Node, ...]) -> None:
    ssh = folder / "ssh"
    ssh.mkdir(parents=True, exist_ok=True)
    key = ssh / "id_ed25519"
    if not key.exists():
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ds-cluster", "-f", str(key)])
    lines = [f"Host {n.name}\n  HostName {n.addr}\n  HostKeyAlias {n.name}\n" for n in nodes]
    lines.append(
        f"Host *\n  User root\n  IdentityFile {key}\n  IdentitiesOnly yes\n  UserKnownHostsFile {ssh}/known_hosts\n"
        "  StrictHostKeyChecking yes\n  BatchMode yes\n  LogLevel ERROR\n  ConnectTimeout 10\n"
    )
    (ssh / "config").write_text("\n".join(lines))


def _node_root(folder: Path, node: Node, image: Path, log: Path) -> Path:
    """The node's root: its image under an overlay whose writes stay in the node's folder."""
    base = folder / "nodes" / node.name
    upper, work, root = base / "upper", base / "work", base / "root"
    for d in (upper, work, root):
        d.mkdir(parents=True, exist_ok=True)
    if not os.path.ismount(root):
        layers = f"lowerdir={image},upperdir={upper},workdir={work}"
        _run(["mount", "-t", "overlay", "overlay", "-o", layers, str(root)], log=log)
    hostkey = root / "etc" / "ssh" / "ssh_host_ed25519_key"
    if not hostkey.exists():
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", node.name, "-f", str(hostkey)])
    pub = (root / "etc" / "ssh" / "ssh_host_ed25519_key.pub").read_text().split()
    with (folder / "ssh" / "known_hosts").open("a") as f:
        f.write(f"{node.name} {pub[0]} {pub[1]}\n")
    auth = root / "root" / ".ssh"
    auth.mkdir(mode=0o700, parents=True, exist_ok=True)
    (auth / "authorized_keys").write_text((folder / "ssh" / "id_ed25519.pub").read_text())
    (root / "etc" / "hostname").write_text(node.name + "\n")
    hosts = "127.0.0.1 localhost\n" + "".join(f"{n.addr} {n.name}\n" for n in NODES) + f"{HOST_ADDR} buildhost\n"
    (root / "etc" / "hosts").write_text(hosts)
    (root / "etc" / "resolv.conf").unlink(missing_ok=True)  # no DNS on the nodes (see _names)
    (root / "etc" / "resolv.conf").write_text("nameserver 127.0.0.1\n")
    (root / "shared").mkdir(exist_ok=True)
    if node.web:
        (root / "etc" / "nginx" / "ds-cluster.conf").write_text(NGINX_CONF)
    return root


# nginx as a site runs it for a wheelhouse: a plain static folder, no module, no rewrite.
NGINX_CONF = """\
worker_processes 2;
pid /run/nginx.pid;
error_log /var/log/nginx/error.log;
events { worker_connections 1024; }
http {
    include /etc/nginx/mime.types;
    default_type application/octet-stream;
    access_log /var/log/nginx/access.log;
    sendfile on;
    server {
        listen 80;
        root /shared;
        # The same folder through a congested link (64 kB/s a download): the fault tests cut a node's
        # network while its install is still fetching.
        location /slow/ {
            alias /shared/;
            limit_rate 64k;
        }
    }
}
"""


def _network(node: Node, log: Path) -> None:
    host_side = node.veth
    _run(["ip", "netns", "add", node.netns], log=log)
    _run(["ip", "link", "add", host_side, "type", "veth", "peer", "name", "eth0", "netns", node.netns], log=log)
    _run(["ip", "link", "set", host_side, "master", BRIDGE, "up"], log=log)
    inside = ["ip", "netns", "exec", node.netns]
    _run([*inside, "ip", "addr", "add", f"{node.addr}/24", "dev", "eth0"], log=log)
    _run([*inside, "ip", "link", "set", "eth0", "up"], log=log)
    _run([*inside, "ip", "link", "set", "lo", "up"], log=log)
    _run([*inside, "ip", "route", "add", "default", "via", HOST_ADDR], log=log)


def _start_node(folder: Path, node: Node, root: Path) -> int:
    """sshd (and nginx on the web node) in the node's own mount, UTS and PID namespaces, chrooted
    into its root; returns the pid of the `unshare` that holds them (killing it kills the node)."""
    shared = folder / "shared"
    script = [
        "set -e",
        "mount --make-rprivate /",
        f"mount --bind {shared} {root}/shared",
        f"mount --rbind /dev {root}/dev",
        f"mount -t proc proc {root}/proc",
        f"mount -t sysfs sysfs {root}/sys",
        f"mount -t tmpfs -o mode=1777 tmpfs {root}/tmp",
        f"mount -t tmpfs tmpfs {root}/run",
        f"mkdir -p {root}/run/sshd {root}/var/log/nginx",
        f"hostname {node.name}",
    ]
    if node.web:
        script.append(f"chroot {root} /usr/sbin/nginx -c /etc/nginx/ds-cluster.conf")
    script.append(f"exec chroot {root} /usr/sbin/sshd -D -e")
    log = (folder / "nodes" / node.name / "node.log").open("a")
    proc = subprocess.Popen(
        ["ip", "netns", "exec", node.netns, "unshare", "--mount", "--uts", "--pid", "--fork", "--kill-child",
         "sh", "-c", "\n".join(script)],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    return proc.pid


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST_ADDR, 0))
        return int(s.getsockname()[1])


def slurm_config(folder: Path, nodes: tuple[Node, ...], cpus: int, mem_mb: int) -> str:
    host = socket.gethostname().split(".")[0]
    names = ",".join(n.name for n in nodes)
    lines = [
        "ClusterName=dscluster",
        f"SlurmctldHost={host}({HOST_ADDR})",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        f"SlurmctldPort={_free_port()}",
        f"SlurmdPort={_free_port()}",
        f"StateSaveLocation={folder}/slurm/state",
        f"SlurmdSpoolDir={folder}/slurm/spool-%n",
        f"SlurmctldPidFile={folder}/slurm/slurmctld.pid",
        f"SlurmdPidFile={folder}/slurm/slurmd-%n.pid",
        f"SlurmctldLogFile={folder}/slurm/slurmctld.log",
        f"SlurmdLogFile={folder}/slurm/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/affinity",
        "JobAcctGatherType=jobacct_gather/none",
        "MpiDefault=none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        f"DefMemPerCPU={max(256, mem_mb // max(1, cpus))}",
        "DependencyParameters=kill_invalid_depend",
        "ReturnToService=2",
        "MinJobAge=5",
        "SlurmdTimeout=10",
        "SlurmctldTimeout=10",
        "GresTypes=gpu",
    ]
    for n in nodes:
        gres = f" Gres=gpu:{FAKE_GPUS}" if n.web else ""
        lines.append(f"NodeName={n.name} NodeAddr={n.addr} CPUs={cpus} RealMemory={mem_mb}{gres} State=UNKNOWN")
    gpu_node = next(n.name for n in nodes if n.web)
    lines += [f"PartitionName=cpu Nodes={names} Default=YES MaxTime=INFINITE State=UP",
              f"PartitionName=h100 Nodes={gpu_node} MaxTime=INFINITE State=UP", ""]  # fmt: skip
    return "\n".join(lines)


def environ(folder: Path) -> dict[str, str]:
    """The environment a Slurm client (sbatch, squeue, srun) of this cluster runs in, and its jobs
    (sbatch passes it on): the nodes reach nothing beyond the bridge but the build host's proxy,
    which the build's package downloads (uv, pip) go through, as on a site whose compute nodes
    reach the internet only through the login node's proxy."""
    env = {**os.environ, "SLURM_CONF": str(folder / "slurm" / "slurm.conf")}
    try:
        port = json.loads((folder / "cluster.json").read_text())["proxy_port"]
    except (OSError, ValueError, KeyError):
        return env
    proxy = f"http://{HOST_ADDR}:{port}"
    local = ",".join(["localhost", "127.0.0.1", f"{SUBNET}.0/24", *(n.name for n in NODES)])
    return {**env, "HTTPS_PROXY": proxy, "https_proxy": proxy, "NO_PROXY": local, "no_proxy": local}


def serve_proxy(bind: str, port: int, log: Path) -> None:
    """A CONNECT-only HTTP proxy on the build host's bridge address (the login node's proxy of a
    cluster whose compute nodes have no route out): HTTPS tunnels to the package index, each logged."""
    import select
    import socketserver

    class Tunnel(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            request = self.rfile.readline(65536).decode("latin-1").split()
            while self.rfile.readline(65536) not in (b"\r\n", b"\n", b""):
                pass
            if len(request) < 2 or request[0] != "CONNECT":
                self.wfile.write(b"HTTP/1.1 405 CONNECT only\r\n\r\n")
                return
            host, _, port_text = request[1].rpartition(":")
            with log.open("a") as f:
                f.write(f"{time.strftime('%H:%M:%S')} {self.client_address[0]} CONNECT {request[1]}\n")
            try:
                upstream = socket.create_connection((host, int(port_text)), timeout=30)
            except (OSError, ValueError) as exc:
                self.wfile.write(f"HTTP/1.1 502 {exc}\r\n\r\n".encode("latin-1", "replace"))
                return
            self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            self.wfile.flush()
            ends = [self.connection, upstream]
            with upstream:
                while True:
                    ready, _, _ = select.select(ends, [], [], 300)
                    if not ready:
                        return
                    for end in ready:
                        data = end.recv(65536)
                        if not data:
                            return
                        (upstream if end is self.connection else self.connection).sendall(data)

    class Server(socketserver.ThreadingTCPServer):
        daemon_threads = True
        allow_reuse_address = True

    with Server((bind, port), Tunnel) as server:
        server.serve_forever()


def _names(folder: Path) -> tuple[Path, Path]:
    """The cluster's /etc/hosts (the host's own lines, then every node and the build host on the
    bridge) and a resolv.conf that answers at once: the nodes have no DNS server to reach, and a
    lookup sent to an unreachable one waits out its timeouts (torchrun's rendezvous does several)."""
    hosts, resolv = folder / "etc-hosts", folder / "resolv.conf"
    own = Path("/etc/hosts").read_text() if Path("/etc/hosts").exists() else "127.0.0.1 localhost\n"
    hosts.write_text(own + "".join(f"{n.addr} {n.name}\n" for n in NODES) + f"{HOST_ADDR} buildhost\n")
    resolv.write_text("# the cluster's nodes have no DNS: names come from /etc/hosts\nnameserver 127.0.0.1\n")
    return hosts, resolv


def _start_slurmd(folder: Path, node: Node) -> int:
    """slurmd in the node's network namespace and hostname, with the build host's files but the
    cluster's names (its own mount namespace, /etc/hosts and /etc/resolv.conf bound over)."""
    conf = folder / "slurm" / "slurm.conf"
    log = (folder / "slurm" / f"slurmd-{node.name}.out").open("a")
    hosts, resolv = _names(folder)
    proc = subprocess.Popen(
        # nsenter, not `ip netns exec`: that one mounts a sysfs of the netns over /sys, hiding the
        # host's /sys/fs/cgroup, and slurmd refuses to start without it.
        ["nsenter", f"--net=/run/netns/{node.netns}", "unshare", "--uts", "--mount", "sh", "-c",
         f"mount --make-rprivate / && mount --bind {hosts} /etc/hosts && mount --bind {resolv} /etc/resolv.conf && "
         f"hostname {node.name} && exec slurmd -D -f {conf} -N {node.name}"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        env=environ(folder),
    )  # fmt: skip
    return proc.pid


def start_slurmctld(folder: Path) -> None:
    """At a raised priority (nice -10): a site's controller has a host of its own, this one shares
    two cores with the suite's compilers, and starved of them it left squeue unanswered for a
    minute in CI. Its jobs are slurmd's children, not its own, so they keep the normal priority."""
    _run(["nice", "-n", "-10", "slurmctld", "-f", str(folder / "slurm" / "slurm.conf")], env=environ(folder))


def stop_slurmctld(folder: Path) -> None:
    _kill_pidfile(folder / "slurm" / "slurmctld.pid")


def _kill_pidfile(path: Path, sig: int = signal.SIGTERM) -> None:
    try:
        pid = int(path.read_text().strip())
        os.kill(pid, sig)
    except (OSError, ValueError):
        return
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)


def wait_idle(folder: Path, count: int, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        said = subprocess.run(["sinfo", "-h", "-N", "-p", "cpu", "-o", "%N %T"], capture_output=True, text=True,
                              env=environ(folder))  # fmt: skip
        state = said.stdout.strip()
        if len(state.splitlines()) == count and all(line.split()[1] == "idle" for line in state.splitlines()):
            return
        time.sleep(0.5)
    raise RuntimeError(f"the Slurm nodes did not come up idle in {timeout:.0f} s ({state!r}); see {folder}/slurm")


def ssh(
    folder: Path, node: str, command: str, timeout: float = 600, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run `command` on `node` over ssh, as pdsh does."""
    done = subprocess.run(["ssh", "-F", str(folder / "ssh" / "config"), node, command], capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip
    if check and done.returncode != 0:
        raise RuntimeError(f"ssh {node} {command!r} failed ({done.returncode}): {done.stderr[-2000:]}")
    return done


def up(folder: Path, log: Path | None = None) -> dict[str, object]:
    """Make (or reuse) the node images, start the nodes, munged (if not running), slurmctld and the
    slurmds; return what a test needs: the nodes, the Slurm clients' environment, the hostfile."""
    folder = folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    log = log or folder / "cluster.log"
    if subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True).returncode == 0:
        raise RuntimeError(f"a namespace cluster is already up (bridge {BRIDGE} exists): "
                           "python tests/cluster.py down FOLDER")  # fmt: skip
    started = time.monotonic()
    images = {suite: ensure_image(suite, log) for suite in sorted({n.suite for n in NODES})}
    made = time.monotonic() - started
    (folder / "shared").mkdir(exist_ok=True)
    os.chmod(folder / "shared", 0o755)
    _ssh_files(folder, NODES)
    (folder / "ssh" / "known_hosts").write_text("")
    web = next(n.name for n in NODES if n.web)
    state: dict[str, object] = {"folder": str(folder), "nodes": {}, "images_s": round(made, 1), "host_addr": HOST_ADDR,
                                "web": web}  # fmt: skip
    (folder / "cluster.json").write_text(json.dumps(state))
    _run(["ip", "link", "add", BRIDGE, "type", "bridge"], log=log)
    _run(["ip", "addr", "add", f"{HOST_ADDR}/24", "dev", BRIDGE], log=log)
    _run(["ip", "link", "set", BRIDGE, "up"], log=log)
    proxy_port = _free_port()
    proxy = subprocess.Popen([sys.executable, __file__, "proxy", str(folder), str(proxy_port)],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=(folder / "proxy.err").open("a"), start_new_session=True)  # fmt: skip
    state.update({"proxy_port": proxy_port, "proxy_pid": proxy.pid})
    nodes: dict[str, dict[str, object]] = {}
    for node in NODES:
        root = _node_root(folder, node, images[node.suite], log)
        _network(node, log)
        nodes[node.name] = {"pid": _start_node(folder, node, root), "addr": node.addr, "suite": node.suite,
                            "root": str(root), "python": node.python,
                            "torch": IMAGES[node.suite]["venv"] == TORCH}  # fmt: skip
        state["nodes"] = nodes
        (folder / "cluster.json").write_text(json.dumps(state, indent=1))
    (folder / "hostfile").write_text("".join(f"{n.name} slots=1 python={n.python}\n" for n in NODES))
    # Slurm: munged is machine-wide (started only if not running), slurmctld on the bridge address.
    slurm_nodes = tuple(n for n in NODES if n.slurm)
    (folder / "slurm" / "state").mkdir(parents=True, exist_ok=True)
    for n in slurm_nodes:
        (folder / "slurm" / f"spool-{n.name}").mkdir(exist_ok=True)
    cpus = os.cpu_count() or 1
    free_mb = int(Path("/proc/meminfo").read_text().split("MemAvailable:")[1].split()[0]) // 1024
    (folder / "slurm" / "slurm.conf").write_text(slurm_config(folder, slurm_nodes, cpus, int(free_mb * 0.9)))
    devices = []
    for i in range(FAKE_GPUS):  # FAKE GPU devices: character-device symlinks for Slurm's gres
        dev = folder / "slurm" / f"fake-nvidia{i}"
        if not dev.is_symlink():
            dev.symlink_to("/dev/null")
        devices.append(str(dev))
    gpu_node = next(n.name for n in slurm_nodes if n.web)
    (folder / "slurm" / "gres.conf").write_text(
        f"NodeName={gpu_node} Name=gpu File={folder}/slurm/fake-nvidia[0-{FAKE_GPUS - 1}]\n"
    )
    if subprocess.run(["pgrep", "-x", "munged"], capture_output=True).returncode != 0:
        if not Path("/etc/munge/munge.key").exists():
            _run(["mungekey", "--create"])
        _run(["install", "-d", "-o", "munge", "-g", "munge", "/run/munge"])
        _run(["nice", "-n", "-10", "runuser", "-u", "munge", "--", "/usr/sbin/munged"])  # as slurmctld
        (folder / "slurm" / "started-munged").write_text("1")
    start_slurmctld(folder)
    state["slurmd"] = {n.name: _start_slurmd(folder, n) for n in slurm_nodes}
    (folder / "cluster.json").write_text(json.dumps(state, indent=1))
    for node in NODES:  # sshd answers on every node
        deadline = time.monotonic() + 30
        while True:
            done = ssh(folder, node.name, "true", timeout=15, check=False)
            if done.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{node.name}'s sshd does not answer: {done.stderr.strip()[-500:]}; "
                                   f"see {folder}/nodes/{node.name}/node.log")  # fmt: skip
            time.sleep(0.3)
    wait_idle(folder, len(slurm_nodes))
    state["up_s"] = round(time.monotonic() - started, 1)
    (folder / "cluster.json").write_text(json.dumps(state, indent=1))
    return state


def node_pids(node: Node | str) -> list[int]:
    netns = node.netns if isinstance(node, Node) else f"dsc-{node}"
    said = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
    return [int(p) for p in said.stdout.split()]


def set_link(node: str, up: bool) -> None:
    """Cable in or out: the host side of the node's veth pair up or down."""
    _run(["ip", "link", "set", next(n.veth for n in NODES if n.name == node), "up" if up else "down"])


def kill_node(node: str) -> list[int]:
    """Every process of the node dies at once (SIGKILL): its sshd, slurmd and their jobs."""
    pids = node_pids(node)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


def revive(folder: Path, name: str, timeout: float = 90.0) -> None:
    """Power a killed node back on: its sshd (and nginx) and slurmd again, in the namespaces and
    root it kept, and Slurm told to use it again once it answers."""
    folder = folder.resolve()
    node = next(n for n in NODES if n.name == name)
    state = json.loads((folder / "cluster.json").read_text())
    state["nodes"][name]["pid"] = _start_node(folder, node, folder / "nodes" / name / "root")
    if node.slurm:
        state["slurmd"][name] = _start_slurmd(folder, node)
    (folder / "cluster.json").write_text(json.dumps(state, indent=1))
    deadline = time.monotonic() + timeout
    while ssh(folder, name, "true", timeout=15, check=False).returncode != 0:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name}'s sshd does not answer after revive; see {folder}/nodes/{name}/node.log")
        time.sleep(0.3)
    if node.slurm:
        subprocess.run(["scontrol", "update", f"nodename={name}", "state=resume"], capture_output=True,
                       env=environ(folder))  # fmt: skip
        wait_idle(folder, sum(1 for n in NODES if n.slurm), timeout)


def down(folder: Path) -> None:
    """Stop everything `up` started and remove its namespaces, links and mounts (FOLDER stays)."""
    folder = folder.resolve()
    for node in NODES:
        kill_node(node.name)
    stop_slurmctld(folder)
    try:
        os.kill(int(json.loads((folder / "cluster.json").read_text())["proxy_pid"]), signal.SIGTERM)
    except (OSError, ValueError, KeyError):
        pass
    if (folder / "slurm" / "started-munged").exists():  # machine-wide: stopped only if up() started it
        _kill_pidfile(Path("/run/munge/munged.pid"))
        (folder / "slurm" / "started-munged").unlink()
    for node in NODES:
        subprocess.run(["ip", "netns", "del", node.netns], capture_output=True)
        subprocess.run(["ip", "link", "del", node.veth], capture_output=True)
        root = folder / "nodes" / node.name / "root"
        for _ in range(20):
            if not os.path.ismount(root):
                break
            if subprocess.run(["umount", str(root)], capture_output=True).returncode != 0:
                time.sleep(0.25)
    subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "proxy":  # started by up(), in a session of its own
        serve_proxy(HOST_ADDR, int(sys.argv[3]), Path(sys.argv[2]) / "proxy.log")
    if len(sys.argv) != 3 or sys.argv[1] not in ("up", "down", "images"):
        raise SystemExit("usage: python tests/cluster.py up|down FOLDER   (images FOLDER: make the node images only)")
    where = Path(sys.argv[2]).resolve()
    if sys.argv[1] == "down":
        down(where)
        raise SystemExit(0)
    if why := missing():
        raise SystemExit(why)
    where.mkdir(parents=True, exist_ok=True)
    if sys.argv[1] == "images":
        for suite in IMAGES:
            print(ensure_image(suite, where / "cluster.log"))
        raise SystemExit(0)
    got = up(where)
    print(json.dumps(got, indent=1))
    print(f"export SLURM_CONF={where}/slurm/slurm.conf   # then: sinfo; ssh -F {where}/ssh/config node1")
