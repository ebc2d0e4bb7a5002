"""Making the toolkit's root (debootstrap), exporting an image's (podman), reading a site's folder:
each once per machine, into the roots folder, under a lock, renamed into place only when complete."""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

from filelock import FileLock

from builder import cmd, node, output
from builder.buildroot import pack
from builder.buildroot.spec import RootFacts, RootSpec, identity_of, root_name
from builder.debian import debootstrap_stage
from builder.errors import RootError
from builder.files import env_folder, held, make_dirs, write_atomic

ROOTS_ENV = "DS_BUILDER_ROOTS"
# What a machine that cannot make the root (no mirror, no debootstrap, no apt, not root) can do instead.
WAYS_OUT = ("bring the root in a folder `python -m builder gather` made on a connected machine (build with --offline "
            'DIR: its root/ holds the root packed), name a root of your own in the recipe ([root] folder = "..."), '
            'or build for this machine\'s own OS only with platform = "host"')  # fmt: skip


MACHINE_ROOTS = Path("/var/tmp/ds-builder-roots")  # root's: the machine's roots, every user may build with them


def roots_folder(env: Mapping[str, str]) -> Path:
    """Where roots are kept, once per machine: DS_BUILDER_ROOTS, else /var/tmp/ds-builder-roots for
    root (the folder the cluster test's node images share), else the user's cache."""
    named = env_folder(env, ROOTS_ENV, "build roots, their lock, log and a temporary tree")
    if named is not None:
        return named
    if os.geteuid() == 0:
        return MACHINE_ROOTS
    return Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ds-builder" / "roots"


def _made(spec: RootSpec, roots: Path) -> RootFacts | None:
    """The root already made, read without a lock (a root is renamed into place whole and never changed
    after): in `roots`, else, for a plain user, in the machine's roots an administrator made (root's
    lock file there is 0644: taking it made every user's build exit 10 on a root it only needed to read)."""
    name = root_name(spec)
    places = [roots]
    if os.geteuid() != 0 and roots != MACHINE_ROOTS and node.folder_problem(str(MACHINE_ROOTS)) is None:
        places.append(MACHINE_ROOTS)
    for place in places:
        facts = read_facts(_facts_file(place, name))
        if facts is not None and (place / name).is_dir() and facts.path == place / name:
            return facts
    return None


def debootstrap(tools: Path, log: Path) -> tuple[str, dict[str, str]]:
    """debootstrap and the environment it runs in: the one on PATH, else Debian's package fetched with
    the host's own apt sources (`apt-get download`, as any user) and unpacked into the roots folder's
    tools/ (a fresh machine has none; nothing is installed into the system)."""
    found = cmd.which("debootstrap")
    if found:
        return found, dict(os.environ)
    unpacked = tools / "debootstrap"
    program = unpacked / "usr" / "sbin" / "debootstrap"
    if not program.is_file():
        if cmd.which("apt-get") is None or cmd.which("dpkg-deb") is None:
            raise RootError(
                "making the build root needs debootstrap, which is not installed, and this machine has no apt-get "
                "to fetch it",
                f"install debootstrap, or {WAYS_OUT}",
            )
        make_dirs(tools)
        with tempfile.TemporaryDirectory(dir=tools, prefix=".fetch-") as tmp:
            cmd.run(["apt-get", "download", "debootstrap"], cwd=Path(tmp), log=log,
                    fix="apt-get download needs the host's Debian package sources (this machine reaches none?); "
                        f"install debootstrap, or {WAYS_OUT}")  # fmt: skip
            (deb,) = Path(tmp).glob("debootstrap_*.deb")
            staged = Path(tmp) / "tree"
            cmd.run(["dpkg-deb", "-x", deb, staged], log=log)
            shutil.rmtree(unpacked, ignore_errors=True)
            staged.rename(unpacked)
        output.note(f"root: fetched Debian's debootstrap package into {unpacked} (none was installed)")
    env = {**os.environ, "DEBOOTSTRAP_DIR": str(unpacked / "usr" / "share" / "debootstrap")}
    return str(program), env


def _in_root(root: Path, args: list[str]) -> str:
    done = subprocess.run(["chroot", str(root), *args], capture_output=True, text=True, check=False,
                          env={"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "LC_ALL": "C"})  # fmt: skip
    if done.returncode != 0:
        raise RootError(f"cannot run {' '.join(args)} in the new root {root}: {done.stderr.strip()[-300:]}",
                        "remove the folder and run the build again")  # fmt: skip
    return done.stdout


def _facts_file(roots: Path, name: str) -> Path:
    return roots / f"{name}.json"


def read_facts(path: Path) -> RootFacts | None:
    """A made root's recorded facts (None where missing or not ours: the root is then made again)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return RootFacts(Path(data["path"]), str(data["identity"]), str(data["glibc"]), str(data["gcc"]),
                         str(data["describe"]), str(data["cc"]), str(data["cxx"]))  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError):
        return None


def ensure_debian(spec: RootSpec, roots: Path) -> RootFacts:
    """The toolkit's own root, made now (about a minute) unless this machine has it; its making's log
    is kept beside it."""
    made = _made(spec, roots)
    if made is not None:
        return made
    name = root_name(spec)
    path = roots / name
    make_dirs(roots)
    log = roots / f"{name}.log"
    with held(roots / f".{name}.lock", f"the build root {name} (made once per machine by whoever holds it)"):
        facts = read_facts(_facts_file(roots, name))
        if facts is not None and path.is_dir() and facts.path == path:
            return facts
        found = pack.find(spec, os.environ)
        if found is not None:  # an offline folder's packed root: no mirror, no debootstrap, no apt
            return _unpacked(*found, roots, name)
        if os.geteuid() != 0:
            raise RootError(
                f"making the build root ({spec.describe()}) needs root (debootstrap), and this is user {os.geteuid()}",
                f"have root make it once (the roots folder {roots}, or DS_BUILDER_ROOTS), or {WAYS_OUT}",
            )
        program, env = debootstrap(roots / "tools", log)
        for stale in roots.glob(f".{name}.tmp-*"):  # a killed making: ours, never a root in use
            shutil.rmtree(stale, ignore_errors=True)
        tmp = roots / f".{name}.tmp-{os.getpid()}"
        output.step(f"root: making {spec.describe()} from {spec.mirror} in {path}: about a minute, once per machine")
        try:
            cmd.run(
                [
                    program,
                    f"--variant={spec.variant}",
                    f"--include={','.join(spec.packages)}",
                    spec.suite,
                    tmp,
                    spec.mirror,
                ],
                env=env,
                log=log,
                progress=debootstrap_stage,
                fix=f"debootstrap needs the Debian mirror the host's apt uses (read the log); or {WAYS_OUT}",
            )
            for rel in ("var/cache/apt/archives", "var/lib/apt/lists"):
                for child in (tmp / rel).glob("*"):
                    if child.is_file():
                        child.unlink()
            packages = _in_root(tmp, ["dpkg-query", "-W", "-f", "${Package}=${Version}\\n"])
            gcc = _in_root(tmp, [spec.cxx, "-dumpfullversion"]).strip()
            glibc = _in_root(tmp, ["getconf", "GNU_LIBC_VERSION"]).split()[-1]
            os.chmod(tmp, 0o755)
            tmp.rename(path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        facts = RootFacts(path, identity_of(sorted(packages.splitlines())), glibc, gcc,
                          f"Debian {spec.suite}", spec.cc, spec.cxx)  # fmt: skip
        write_atomic(_facts_file(roots, name), json.dumps(facts.to_json(), indent=2, sort_keys=True) + "\n")
        output.note(f"root: {path} (gcc {gcc}, glibc {glibc}, {len(packages.splitlines())} packages)")
        return facts


def _unpacked(folder: Path, packed: pack.PackedRoot, roots: Path, name: str) -> RootFacts:
    """The root unpacked from an offline folder into the roots folder under this machine's name for it,
    with the facts recorded where it was made (its identity, so the unit keys are the same)."""
    path = roots / name
    for stale in roots.glob(f".{name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = roots / f".{name}.tmp-{os.getpid()}"
    try:
        pack.unpack(folder, packed, tmp)
        shutil.rmtree(path, ignore_errors=True)  # a root of ours whose record was lost: made again
        tmp.rename(path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    facts = dataclasses.replace(packed.facts, path=path)
    write_atomic(_facts_file(roots, name), json.dumps(facts.to_json(), indent=2, sort_keys=True) + "\n")
    output.note(f"root: {path} (gcc {facts.gcc}, glibc {facts.glibc}, unpacked from {folder / packed.file})")
    return facts


_GLIBC_FILE = re.compile(r"libc-(\d+\.\d+)\.so$")
_GLIBC_TEXT = re.compile(rb"GNU C Library [^\n]*?version (\d+\.\d+)")


def glibc_of_root(root: Path) -> str | None:
    """The root's glibc version, read from its files (libc-2.28.so, or the version string in libc.so.6)."""
    for pattern in ("lib*/libc-*.so", "usr/lib*/libc-*.so", "lib*/*/libc-*.so", "usr/lib*/*/libc-*.so"):
        for found in glob.glob(str(root / pattern)):
            if m := _GLIBC_FILE.search(found):
                return m[1]
    for pattern in ("lib*/libc.so.6", "usr/lib*/libc.so.6", "lib*/*/libc.so.6", "usr/lib*/*/libc.so.6"):
        for found in glob.glob(str(root / pattern)):
            try:
                data = Path(found).read_bytes()
            except OSError:
                continue
            if text := _GLIBC_TEXT.search(data):
                return text[1].decode()
    return None


def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def inside(root: Path, path: str) -> Path | None:
    """`path` (absolute, as the root sees it) resolved inside the root: links followed as the root
    would follow them (never out of it); None where it does not exist."""
    current = root
    parts = [p for p in Path(path).parts if p != "/"]
    hops = 0
    while parts:
        part = parts.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            current = current.parent if current != root else root
            continue
        nxt = current / part
        if nxt.is_symlink():
            hops += 1
            if hops > 40:
                return None
            target = os.readlink(nxt)
            parts = [p for p in Path(target).parts if p != "/"] + parts
            current = root if target.startswith("/") else current
            continue
        if not nxt.exists():
            return None
        current = nxt
    return current


def folder_facts(spec: RootSpec, root: Path, gcc: str) -> RootFacts:
    """A site's root (a folder, or an exported image): its identity is its compilers' and C library's
    content, hashed now (a rebuilt or replaced root is a new identity)."""
    parts = [f"root {root}"]
    for rel in (spec.cc, spec.cxx):
        found = inside(root, rel)
        if found is not None and found.is_file():
            parts.append(f"{rel} {_sha(found)}")
    compilers = ("usr/lib/gcc/*/*/cc1plus", "usr/libexec/gcc/*/*/cc1plus", "opt/rh/*/root/usr/libexec/gcc/*/*/cc1plus")
    for pattern in (*compilers,
                    "lib*/*/libc.so.6", "usr/lib*/*/libc.so.6", "lib64/libc.so.6", "usr/lib64/libc.so.6"):  # fmt: skip
        for name in sorted(glob.glob(str(root / pattern))):
            parts.append(f"{Path(name).relative_to(root)} {_sha(Path(name))}")
    glibc = glibc_of_root(root) or "unknown"
    return RootFacts(root, identity_of(parts), glibc, gcc, spec.describe(), spec.cc, spec.cxx)


def export_image(spec: RootSpec, roots: Path) -> Path:
    """An OCI image's filesystem, exported once into the roots folder (named by the image's ID) with
    podman: create a container of it, export its files, remove the container."""
    from builder import podman

    assert spec.image
    if cmd.which("podman") is None:
        raise RootError(f"the recipe's root is the image {spec.image}, and podman is not installed",
                        "install podman (apt-get install podman runc), or name a root folder instead")  # fmt: skip
    image_id = podman.image_id(spec.image)
    if image_id is None:
        raise RootError(f"the recipe's root image {spec.image} is not in podman's storage",
                        f"pull or load it first (podman pull {spec.image}; podman load -i FILE), or name a root "
                        "folder")  # fmt: skip
    name = root_name(spec, image_id)
    path = roots / name
    make_dirs(roots)
    log = roots / f"{name}.log"
    with FileLock(str(roots / f".{name}.lock")):
        if path.is_dir():
            return path
        tmp = roots / f".{name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        make_dirs(tmp)
        output.step(f"root: exporting the image {spec.image} ({image_id[:12]}) into {path}, once")
        made = podman.ask(["create", "--network", "none", spec.image, "/bin/true"])
        if made.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise RootError(f"podman cannot create a container of {spec.image}: {made.stderr.strip()[-300:]}",
                            "check the image (podman image inspect)")  # fmt: skip
        container = made.stdout.strip()
        try:
            exported = subprocess.Popen(["podman", "export", container], stdout=subprocess.PIPE, env=podman.environ())
            assert exported.stdout is not None
            tar = subprocess.run(["tar", "-x", "--numeric-owner", "-C", str(tmp)], stdin=exported.stdout,
                                 capture_output=True, text=True, check=False)  # fmt: skip
            exported.stdout.close()
            if exported.wait() != 0 or tar.returncode != 0:
                raise RootError(f"exporting {spec.image} failed: {tar.stderr.strip()[-300:]}", f"read {log}")
            os.chmod(tmp, 0o755)
            tmp.rename(path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            podman.ask(["rm", "-f", container])
    return path


def image_path(image: str) -> str:
    """The PATH an image's own configuration sets (pypa's manylinux images put gcc-toolset first)."""
    from builder import podman

    said = podman.ask(["image", "inspect", "--format", "{{json .Config.Env}}", image])
    try:
        env = json.loads(said.stdout) if said.returncode == 0 else []
    except ValueError:
        env = []
    found = (
        [e.split("=", 1)[1] for e in env if isinstance(e, str) and e.startswith("PATH=")]
        if isinstance(env, list)
        else []
    )
    return found[0] if found else "/usr/local/bin:/usr/bin:/bin"


def first_on_path(root: Path, path: str, name: str) -> str | None:
    """The first `name` on a root's PATH, as a path inside the root."""
    for folder in path.split(":"):
        if folder and (found := inside(root, f"{folder}/{name}")) is not None and found.is_file():
            return f"{folder.rstrip('/')}/{name}"
    return None
