"""The base an image starts from: the image the user names, or one made here with debootstrap.

No registry is reachable from an air-gapped build host (nor from this machine), so the default
base is Debian's minimal system with python3 and venv, made by debootstrap from the host's own
Debian mirror (about 2 minutes), imported into podman and kept there under a name that says what
went into it: it is made once and reused by every image built from it.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

from builder import cmd, output, podman
from builder.debian import debootstrap_stage, host_mirror
from builder.errors import ImageError
from builder.files import scratch_folder
from builder.images.plan import SEARCH_PATH

SUITE = "bookworm"
PACKAGES = ("python3", "python3-venv", "ca-certificates")
BASE_REPO = "localhost/ds-builder-base"
# What debootstrap leaves that no image needs and that differs run to run.
SCRUB = ("var/cache/apt", "var/lib/apt/lists", "var/log", "tmp", "var/tmp")


def debootstrap_ref(mirror: str) -> str:
    """The podman name of the debootstrap base for this suite, package set and mirror."""
    key = hashlib.sha256(f"{SUITE} {' '.join(PACKAGES)} {mirror}".encode()).hexdigest()[:12]
    return f"{BASE_REPO}:{SUITE}-{key}"


TREE_PREFIX = "debootstrap-"


def ensure_debootstrap_base(scratch: Path, log: Path, epoch: int) -> str:
    """The toolkit's own base, made now unless podman already holds it; its reference."""
    mirror = host_mirror()
    ref = debootstrap_ref(mirror)
    if podman.image_id(ref):
        output.note(f"base: {ref} (made earlier with debootstrap; reused)")
        return ref
    if cmd.which("debootstrap") is None:
        raise ImageError("debootstrap was not found on PATH, and no --base was given",
                         "install debootstrap (apt-get install -y debootstrap), or pass --base with an image "
                         "podman holds")  # fmt: skip
    output.step(f"base: making {ref} with debootstrap ({SUITE}, {', '.join(PACKAGES)}) from {mirror}; "
                "about 2 minutes, once")  # fmt: skip
    root = scratch_folder(scratch, TREE_PREFIX)
    try:
        cmd.run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, root, mirror],
            log=log,
            progress=debootstrap_stage,
            fix="debootstrap needs root and the Debian mirror the host's apt uses; or pass --base with an image "
            "podman holds",
        )  # fmt: skip
        for rel in SCRUB:
            for child in (root / rel).glob("*"):
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        _import(root, ref, log, epoch)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return ref


def _import(root: Path, ref: str, log: Path, epoch: int) -> None:
    """tar the tree (sorted names, file times clamped to the epoch, numeric owners) into podman."""
    tar = subprocess.Popen(
        ["tar", "-C", str(root), "--sort=name", f"--mtime=@{epoch}", "--clamp-mtime", "--numeric-owner", "-cf", "-",
         "."],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    assert tar.stdout is not None
    try:
        done = subprocess.run(
            ["podman", "import", "--change", f"ENV PATH={SEARCH_PATH}", "--change", 'CMD ["/bin/bash"]', "-", ref],
            stdin=tar.stdout, capture_output=True, text=True, env=podman.environ(), check=False,
        )  # fmt: skip
    finally:
        tar.stdout.close()
        tar.wait()
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"+ tar -C {root} ... | podman import - {ref}\n{done.stdout}{done.stderr}")
    if done.returncode != 0 or tar.returncode != 0:
        podman.remove_image(ref)
        raise ImageError(f"podman import of the debootstrap base failed: {done.stderr.strip()[-300:]}",
                         f"read {log}")  # fmt: skip


def resolve_base(base: str | None, scratch: Path, log: Path, epoch: int) -> tuple[str, str]:
    """(reference, image ID) of the base: the one named (it must be in podman's storage or
    pullable), else the debootstrap base."""
    if base is None:
        ref = ensure_debootstrap_base(scratch, log, epoch)
    else:
        ref = base
        if podman.image_id(ref) is None:
            output.note(f"base: {ref} is not in podman's storage; pulling it")
            pulled = podman.ask(["pull", ref], timeout=1800)
            if pulled.returncode != 0:
                raise ImageError(
                    f"the base image {ref} does not exist here and could not be pulled: "
                    f"{(pulled.stderr.strip().splitlines() or ['no output'])[-1][:300]}",
                    "name an image podman holds (podman images), load one (podman load -i FILE), or leave "
                    "--base out to use the toolkit's debootstrap base",
                )
    found = podman.image_id(ref)
    if found is None:
        raise ImageError(f"the base image {ref} is not in podman's storage", "podman images lists what it holds")
    return ref, found
