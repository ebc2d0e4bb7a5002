"""image: build a CI image from the wheelhouse with podman, prove it, save it, publish it.

The image holds one venv (/opt/deepspeed) with the lock's files only (the DeepSpeed wheel, its
pinned torch and every dependency), installed by pip in hash-checking mode from the wheelhouse
with no index and no network. The smoke checks then run inside it (`podman run --network none`);
only a proven image is saved as an OCI archive into the wheelhouse's images/ and listed in its
manifest. A run that fails leaves no archive in the wheelhouse and no container or image of its
own in podman's storage.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from builder import cmd, node, output, podman
from builder.contracts import Check, verdict
from builder.errors import ImageError, ToolError
from builder.files import make_dirs, scratch_folder, sha256_of, sweep_dead
from builder.images import base as bases
from builder.images import plan as plans
from builder.node import LOCK_NAME_RE, ImageEntry, SmokeSummary, WheelhouseManifest
from builder.smoke import parse_checks, write_checks
from builder.wheelhouse.archive import ArchiveError, make_reproducible, read_facts
from builder.wheelhouse.layout import LOCKS, load_manifest
from builder.workspace import Workspace

CDI_SPECS = (Path("/etc/cdi"), Path("/var/run/cdi"))  # where NVIDIA's container toolkit writes its device spec


@dataclass(frozen=True)
class ImageResult:
    ref: str
    image_id: str
    digest: str
    archive: Path | None  # in the wheelhouse, when published
    size: int
    sha256: str  # of the archive: the same for the same image (archive.make_reproducible)
    base: str
    checks: tuple[Check, ...]
    seconds: dict[str, float]
    squashfs_sha256: str = ""  # of the squashfs, made with --squashfs: the same for the same archive
    squashfs_size: int = 0
    squashfs: Path | None = None  # in the wheelhouse, when published


def epoch() -> int:
    value = os.environ.get("SOURCE_DATE_EPOCH", "")
    if not value:
        return plans.DEFAULT_EPOCH
    if not value.isdigit():
        raise ImageError(f"SOURCE_DATE_EPOCH is {value[:40]!r}, not a number of seconds", "unset it or set it to one")
    return int(value)


def find_lock(wheelhouse: Path, manifest: WheelhouseManifest, lock: str | None, wheel: str | None, log: Path) -> str:
    """The lock to build from, as locks/<name>.lock: the one named, or the wheel's (written now
    when it has none), or the newest wheel's for this Python."""
    from builder.wheelhouse.lock import lock as write_lock
    from builder.wheelhouse.lock import locks_by_wheel

    if lock is not None:  # a name, or locks/<name>: only its last part is joined to the wheelhouse
        rel = f"{LOCKS}/{Path(lock).name.removesuffix('.lock')}.lock"
        if not LOCK_NAME_RE.match(rel) or rel not in manifest.locks or not (wheelhouse / rel).is_file():
            raise ImageError(f"no lock {lock} in {wheelhouse / LOCKS} that the signed manifest lists",
                             "name a lock of the wheelhouse (ls WHEELHOUSE/locks), or write one: "
                             "python -m builder lock --wheel NAME")  # fmt: skip
        return rel
    if wheel is not None:
        if wheel not in manifest.wheels:
            names = ", ".join(sorted(manifest.wheels))
            raise ImageError(f"{wheel} is not published in {wheelhouse}", f"choose one of: {names}")
        if wheel in (known := locks_by_wheel(wheelhouse, manifest)):
            return f"{LOCKS}/{known[wheel].name}"
    return f"{LOCKS}/{write_lock(wheelhouse, wheel, log).name}"


def plan_image(wheelhouse: Path, manifest: WheelhouseManifest, lock: str, base: str, ref_epoch: int) -> plans.ImagePlan:
    """The image's inputs, every lock file checked against the wheelhouse's bytes."""
    path = wheelhouse / lock
    text = path.read_text(encoding="utf-8")
    wheel, pins = plans.parse_lock(text, str(path))
    if wheel not in manifest.wheels:
        raise ImageError(f"{lock} was written for {wheel}, which the wheelhouse does not list",
                         "write the lock again for a published wheel: python -m builder lock --wheel NAME")  # fmt: skip
    files = plans.locked_files(pins, manifest, lock)
    for f in files:
        on_disk = wheelhouse / f.name
        if not on_disk.is_file() or sha256_of(on_disk) != f.sha256:
            raise ImageError(f"{f.name} in {wheelhouse} is missing or not the file {lock} pins",
                             "run python -m builder verify on the wheelhouse, and repair or re-publish it")  # fmt: skip
    entry = manifest.wheels[wheel]
    return plans.ImagePlan(entry, lock, sha256_of(path), files, base, plans.image_ref(entry), ref_epoch)


CONTEXT_PREFIX = "image-"


def _context(plan: plans.ImagePlan, wheelhouse: Path, scratch: Path) -> Path:
    """A build context holding only the lock's files (linked, else copied) and the lock, at the
    paths the Containerfile names, so podman reads no more than the image needs."""
    ctx = scratch_folder(scratch, CONTEXT_PREFIX)
    for f in plan.files:
        try:
            os.link(wheelhouse / f.name, ctx / f.name)
        except OSError:
            shutil.copyfile(wheelhouse / f.name, ctx / f.name)
    (ctx / LOCKS).mkdir()
    shutil.copyfile(wheelhouse / plan.lock, ctx / plan.lock)
    (ctx / "Containerfile").write_text(plan.containerfile(), encoding="utf-8")
    return ctx


def _check_base_python(plan: plans.ImagePlan, base_id: str, log: Path) -> None:
    want = plans.python_version(plan.wheel.python_tag)
    try:
        said = podman.run(
            ["run", "--rm", "--network", "none", base_id, "python3", "-c",
             "import sys, venv, ensurepip; print('python=%d.%d' % sys.version_info[:2])"],
            log,
        )  # fmt: skip
    except ToolError as exc:
        raise ImageError(f"the base {plan.base} has no python3 with venv and ensurepip",
                         f"use a base with Python {want} and its venv module (python:{want}-slim, or Debian's "
                         f"python3-venv), or leave --base out; log: {log}") from exc  # fmt: skip
    got = said.rpartition("python=")[2].strip()
    if got != want:
        raise ImageError(
            f"the base {plan.base} has Python {got}; {plan.wheel.name} is for Python {want}",
            f"use a base with Python {want} (python:{want}-slim), or lock a wheel built for {got}",
        )


LOCKS_FOLDER = Path("/var/tmp")  # the machine's: every clone, work folder and CI run on it shares the lock


def base_lock(base_id: str) -> FileLock:
    """This machine's lock on building from the base `base_id`, held from before the build until what it
    made is removed. buildah's working container of a build carries no name or label of the run (its
    name and the image's history come from the base's name, which must not change: the image ID would),
    so a run knows its own containers only as those made from the base while it holds the lock: a second
    build from the same base (another CI run's) waits rather than have its container removed."""
    folder = LOCKS_FOLDER / f"ds-builder-image-locks-{os.geteuid()}"
    why = node.folder_problem(str(folder))
    make_dirs(folder, mode=0o700)
    st = folder.lstat()
    if why or folder.is_symlink() or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise ImageError(f"the image builds' lock folder {folder} is not this user's own "
                         f"({why or 'a link, or open to others'})",
                         f"remove {folder}: the next image build makes it again")  # fmt: skip
    lock = FileLock(str(folder / f"{base_id[:24]}.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        output.note(f"image: another image build from this base ({base_id[:12]}) is running; waiting for it")
        lock.acquire()
    return lock


def _containers_of(image_ids: set[str]) -> set[str]:
    """Containers (podman's, and buildah's working containers of a build) made from these images."""
    done = podman.ask(["ps", "--all", "--external", "--format", "json"])
    try:
        rows = json.loads(done.stdout or "[]")
    except ValueError:
        return set()
    return {str(r.get("Id")) for r in rows if isinstance(r, dict) and str(r.get("ImageID", "")) in image_ids}


def gpu_flags(accelerator: str) -> tuple[list[str], str | None]:
    """podman flags that hand the GPUs to the container (NVIDIA's CDI spec), or why there are none."""
    if accelerator != "cuda":
        return [], "a CPU wheel: no GPU checks"
    specs = [p for folder in CDI_SPECS if folder.is_dir() for p in folder.glob("nvidia*.y*ml")]
    if not specs:
        return [], ("no NVIDIA container device spec (/etc/cdi/nvidia.yaml): GPU checks inside the image skipped; "
                    "make one with `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml` on a GPU host")  # fmt: skip
    return ["--device", "nvidia.com/gpu=all"], None


AIO_OPS = ("async_io", "gds")
SYSTEM_SECCOMP = (Path("/etc/containers/seccomp.json"), Path("/usr/share/containers/seccomp.json"))
AIO_SYSCALL = "io_pgetevents"


def seccomp_for(ops: tuple[str, ...], scratch: Path) -> tuple[list[str], Check | None]:
    """DeepSpeed's aio calls io_pgetevents and aborts when it fails; podman 4.3's default seccomp
    profile denies it (EPERM). For a wheel with async_io or gds, the checks run with that profile
    plus io_pgetevents allowed (written to `scratch`), and a row says so: users of podman run the
    image the same way (docs/images.md)."""
    if not set(ops) & set(AIO_OPS):
        return [], None
    system = next((p for p in SYSTEM_SECCOMP if p.is_file()), None)
    if system is None:
        return [], None
    data = json.loads(system.read_text(encoding="utf-8"))
    rules = data.get("syscalls", []) if isinstance(data, dict) else []
    denying = [r for r in rules if AIO_SYSCALL in (r.get("names") or []) and r.get("action") != "SCMP_ACT_ALLOW"]
    allowed = any(AIO_SYSCALL in (r.get("names") or []) and r.get("action") == "SCMP_ACT_ALLOW" for r in rules)
    if not denying and (allowed or data.get("defaultAction") == "SCMP_ACT_ALLOW"):
        return [], None
    for rule in denying:
        rule["names"] = [n for n in rule["names"] if n != AIO_SYSCALL]
    rules.append({"names": [AIO_SYSCALL], "action": "SCMP_ACT_ALLOW", "args": [], "comment": "DeepSpeed aio",
                  "includes": {}, "excludes": {}})  # fmt: skip
    path = scratch / "seccomp-aio.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    why = (f"async_io calls {AIO_SYSCALL}, which podman's default seccomp profile ({system}) denies (DeepSpeed then "
           f"aborts): the checks ran with that profile plus {AIO_SYSCALL}; run the image with such a profile "
           "(--security-opt seccomp=FILE) for NVMe offload")  # fmt: skip
    return ["--security-opt", f"seccomp={path}"], Check("seccomp:io_pgetevents", "passed", why)


def smoke_inside(
    plan: plans.ImagePlan, image: list[str], log: Path, verbose: bool, env: tuple[str, ...] = ()
) -> tuple[Check, ...]:
    """The smoke suite inside the image (`image`: its reference, or `--rootfs FOLDER:O` and the
    image's `env`), with no network: torch, import, every op loads (no JIT) and computes, ds_report,
    the ZeRO-Offload engine, torchrun with gloo (and NCCL with GPUs)."""
    ref = image[-1]
    w = plan.wheel
    spec = {"version": w.version, "ops": list(w.ops), "accelerator": w.accelerator, "suite": "image",
            "torch": {"version": w.torch, "cuda": w.cuda}, "dist_worker": "/smoke/smoke_dist.py"}  # fmt: skip
    flags, no_gpu = gpu_flags(w.accelerator)
    seccomp, seccomp_row = seccomp_for(w.ops, log.parent)
    name = f"ds-builder-smoke-{os.getpid()}"
    checks_folder = Path(tempfile.mkdtemp(prefix=".smoke-checks-", dir=log.parent))
    try:
        write_checks(checks_folder)
        said = podman.run(
            ["run", "--rm", "--name", name, "--network", "none", "--volume", f"{checks_folder}:/smoke:ro",
             "--env", "TORCH_EXTENSIONS_DIR=/tmp/torch_extensions", "--env", f"DS_ACCELERATOR={w.accelerator}",
             "--workdir", "/tmp", *flags, *seccomp, *(a for e in env for a in ("--env", e)), *image, "sh", "-c",
             'mkdir -p "$TORCH_EXTENSIONS_DIR" && exec python /smoke/smoke_checks.py "$0"', json.dumps(spec)],
            log, verbose,
        )  # fmt: skip
    except ToolError as exc:
        last = exc.message.strip().splitlines()[-3:]
        raise ImageError(f"the smoke checks did not finish inside {ref}: {' | '.join(last)[-500:]}",
                         f"read {log}") from exc  # fmt: skip
    finally:
        podman.remove_container(name)
        shutil.rmtree(checks_folder, ignore_errors=True)
    checks = parse_checks(said)
    if seccomp_row is not None:
        checks = (*checks, seccomp_row)
    if no_gpu and w.accelerator == "cuda":
        checks = (*checks, Check("gpu-in-image", "skipped", no_gpu))
    return checks


def _mounted(sqsh: Path, folder: Path, log: Path) -> tuple[Path, str, bool]:
    """The squashfs's files at a folder: mounted with squashfuse (read-only, as a node mounts it),
    else unpacked with unsquashfs where FUSE is not available (said so). (folder, how, mounted)."""
    mnt = folder / "mnt"
    mnt.mkdir()
    if shutil.which("squashfuse") and os.path.exists("/dev/fuse"):
        try:
            cmd.run(["squashfuse", "-o", "ro", sqsh, mnt], log=log)
            return mnt, "mounted with squashfuse", True
        except ToolError:
            pass
    if shutil.which("unsquashfs") is None:
        raise ImageError("neither squashfuse (with /dev/fuse) nor unsquashfs can open the squashfs to prove it",
                         "apt-get install squashfuse squashfs-tools")  # fmt: skip
    mnt.rmdir()
    cmd.run(["unsquashfs", "-no-progress", "-d", mnt, sqsh], log=log, fix=f"check the free space of {folder}")
    return mnt, "UNPACKED with unsquashfs (a stand-in for mounting it: FUSE is not available here)", False


def make_slurm_image(
    plan: plans.ImagePlan, archive: Path, name: str, folder: Path, log: Path, verbose: bool, smoke: bool
) -> tuple[Path, Check]:
    """The archive's root filesystem as an Enroot squashfs, and the smoke suite run from its files
    (podman --rootfs over them, read-only, writes to an overlay) with no network."""
    from builder.images.squashfs import make_squashfs

    sqsh = folder / "image.sqsh"
    start = time.monotonic()
    config = make_squashfs(archive, sqsh, folder, f"ds-wheel-builder:{name}", plan.epoch, log)
    made = time.monotonic() - start
    output.note(f"squashfs: {sqsh.stat().st_size / 1e6:.0f} MB in {made:.0f}s")
    if not smoke:
        return sqsh, Check("squashfs", "skipped", "--no-smoke")
    mnt, how, mounted = _mounted(sqsh, folder, log)
    try:
        checks = smoke_inside(plan, ["--rootfs", f"{mnt}:O"], log, verbose, config.env)
    finally:
        if mounted:
            cmd.ask(["umount", str(mnt)])
            if os.path.ismount(mnt):
                cmd.ask(["umount", "-l", str(mnt)])  # a smoke process still holding it: detached now, gone after
        if not os.path.ismount(mnt):
            shutil.rmtree(mnt, ignore_errors=True)
    passed = sum(c.status == "passed" for c in checks)
    if not verdict(checks):
        failed = [c.name for c in checks if c.status == "failed"]
        raise ImageError(f"the smoke checks failed in the squashfs ({how}): {', '.join(failed) or 'nothing passed'}",
                         f"read {log}")  # fmt: skip
    return sqsh, Check("squashfs", "passed", f"the smoke suite ran from its files, {how}, no network: {passed} "
                       f"checks passed; {made:.0f}s to make")  # fmt: skip


def build_image(
    wheelhouse: Path,
    ws: Workspace,
    lock: str | None = None,
    wheel: str | None = None,
    base: str | None = None,
    publish: bool = True,
    verbose: bool = False,
    smoke: bool = True,
    squashfs: bool = False,
) -> ImageResult:
    """Build, smoke, save and (unless told not to) publish the CI image of a lock; only a proven
    image is published."""
    if publish and not smoke:
        raise ImageError("an image is published only after its smoke checks", "add --no-publish, or drop --no-smoke")
    podman.require()
    seconds: dict[str, float] = {}
    ws.logs.mkdir(parents=True, exist_ok=True)
    ws.scratch.mkdir(parents=True, exist_ok=True)
    for prefix in (CONTEXT_PREFIX, bases.TREE_PREFIX):  # what a killed image run left (265 MB once)
        for gone in sweep_dead(ws.scratch, prefix):
            output.note(f"removed {gone}, left by an image run that was killed")
    manifest = load_manifest(wheelhouse)
    if not manifest.wheels:
        raise ImageError(f"{wheelhouse} has no published wheel", "publish one first (nox -s build-wheel)")
    log = ws.logs / "image.log"
    log.unlink(missing_ok=True)
    lock_rel = find_lock(wheelhouse, manifest, lock, wheel, log)
    manifest = load_manifest(wheelhouse)  # the lock may have added the files it pins
    when = epoch()
    plan = plan_image(wheelhouse, manifest, lock_rel, base or "", when)  # checks the lock's files first
    start = time.monotonic()
    base_ref, base_id = bases.resolve_base(base, ws.scratch, log, when)
    seconds["base"] = time.monotonic() - start
    plan = dataclasses.replace(plan, base=base_ref)
    output.step(f"image: {plan.ref} from {base_ref}, {len(plan.files)} files of {lock_rel}; full log: {log}")
    _check_base_python(plan, base_id, log)
    held = base_lock(base_id)
    before = _containers_of({base_id})
    prior = podman.image_id(plan.ref)
    built: str | None = None
    ctx: Path | None = None
    try:
        ctx = _context(plan, wheelhouse, ws.scratch)
        start = time.monotonic()
        podman.run(
            ["build", "--network", "none", "--pull=never", "--no-cache", "--layers=false", "--force-rm",
             "--timestamp", str(when), "--file", ctx / "Containerfile", "--tag", plan.ref, ctx],
            log, verbose, progress=lambda line: line if line.startswith("STEP ") else None,
            fix=f"read {log}",
        )  # fmt: skip
        seconds["build"] = time.monotonic() - start
        built = podman.image_id(plan.ref)
        if built is None:
            raise ImageError(f"podman build finished but {plan.ref} is not in its storage", f"read {log}")
        output.note(f"image {plan.ref}: ID {built[:12]} ({seconds['build']:.0f}s)")
        start = time.monotonic()
        checks = smoke_inside(plan, [plan.ref], log, verbose) if smoke else (Check("smoke", "skipped", "--no-smoke"),)
        seconds["smoke"] = time.monotonic() - start
        for c in checks:
            output.note(f"  {c.status:7} {c.name:24} {c.detail.splitlines()[0] if c.detail else ''}")
        if smoke and not verdict(checks):
            failed = [c.name for c in checks if c.status == "failed"]
            raise ImageError(f"the smoke checks failed inside {plan.ref}: {', '.join(failed) or 'nothing passed'}",
                             f"read {log}")  # fmt: skip
        start = time.monotonic()
        archive = ctx / "image.oci.tar"
        podman.run(["save", "--format", "oci-archive", "--output", archive, plan.ref], log,
                   fix=f"check the free space of {ws.scratch} (df -h); read {log}")  # fmt: skip
        try:
            make_reproducible(archive, plan.epoch)
            seconds["save"] = time.monotonic() - start
            facts = read_facts(archive)
        except ArchiveError as exc:
            raise ImageError(f"the archive podman saved is unusable: {exc}", f"read {log}") from exc
        if facts.image_id != built:
            raise ImageError(f"the archive holds image {facts.image_id[:12]}, not {built[:12]}", f"read {log}")
        name = plans.archive_name(plan.wheel, built)
        sqsh: Path | None = None
        if squashfs:
            start = time.monotonic()
            sqsh, row = make_slurm_image(plan, archive, node.squashfs_name(name), ctx, log, verbose, smoke)
            seconds["squashfs"] = time.monotonic() - start
            checks = (*checks, row)
            output.note(f"  {row.status:7} {row.name:24} {row.detail}")
        entry = ImageEntry(
            name=name, sha256=sha256_of(archive), image_id=built,
            digest=facts.digest, size=archive.stat().st_size, ref=plan.ref, base=base_ref, base_id=base_id,
            lock=lock_rel, lock_sha256=plan.lock_sha256, wheel=plan.wheel.name, python_tag=plan.wheel.python_tag,
            smoke=SmokeSummary(True, time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
                               {c.name: (c.status, c.detail.splitlines()[0] if c.detail else "") for c in checks}),
        )  # fmt: skip
        if sqsh is not None:
            entry = dataclasses.replace(entry, squashfs=node.squashfs_name(name), squashfs_sha256=sha256_of(sqsh),
                                        squashfs_size=sqsh.stat().st_size)  # fmt: skip
        published: Path | None = None
        if publish:
            from builder.wheelhouse.extras import publish_image

            published = publish_image(wheelhouse, archive, entry, sqsh)
    except BaseException as exc:  # an error, Ctrl-C, SIGTERM (cli.Terminated): what this run made goes
        # What this run made, and only that: containers from the base (a build's working container)
        # or from the new image that were not there before it took the base's lock, then the new image.
        for cid in _containers_of({base_id, built or base_id}) - before:
            podman.remove_container(cid)
        if built and built != prior:
            podman.remove_image(built if prior is None else plan.ref)
        if isinstance(exc, OSError):
            raise ImageError(f"cannot write {exc.filename or 'a file'}: {exc.strerror}",
                             f"free space (df -h {ws.root} {wheelhouse}) and run it again") from exc  # fmt: skip
        raise
    finally:
        if ctx is not None:
            shutil.rmtree(ctx, ignore_errors=True)
        held.release()
    if prior and prior != built:
        podman.ask(["rmi", prior])  # the image this tag named before, now untagged: removed if nothing uses it
    return ImageResult(plan.ref, built, facts.digest, published, entry.size, entry.sha256, base_ref, checks, seconds,
                       entry.squashfs_sha256, entry.squashfs_size,
                       wheelhouse / entry.squashfs if published and entry.squashfs else None)  # fmt: skip
