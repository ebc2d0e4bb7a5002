"""lock: a hash-pinned requirements file, the same as a PEP 751 pylock.toml, and a Containerfile.

pip resolves the published wheel with everything it needs (its pinned torch included) and
downloads them; the lock pins each file by name, version and sha256, so
`pip install --require-hashes` installs exactly these bytes or nothing, and every file it pins is
added to the wheelhouse, so the image (builder.images) installs from the wheelhouse alone.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from builder import cmd, node, output
from builder.errors import WheelhouseError
from builder.files import sha256_of
from builder.node import WheelhouseManifest, version_key
from builder.wheelhouse.extras import publish_locks
from builder.wheelhouse.layout import load_manifest, lock_headers
from builder.wheelhouse.lockfile import python_version, render_containerfile, render_lock, render_pylock
from builder.wheelhouse.publish import add_files

LOCKS = "locks"


def default_base(python_tag: str) -> str:
    """The base the lock's Containerfile names for a site that reaches Docker Hub (`image --base`
    builds from any other)."""
    return f"docker.io/library/python:{python_version(python_tag)}-slim"


def lock(wheelhouse: Path, wheel: str | None, log: Path) -> Path:
    """Write locks/<recipe>.lock and locks/<recipe>.Containerfile for one published wheel."""
    wheels = load_manifest(wheelhouse).wheels
    if not wheels:
        raise WheelhouseError(f"{wheelhouse} has no published wheels", "publish one first (nox -s build-wheel)")
    if wheel is None:
        tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
        mine = [n for n, e in wheels.items() if e.python_tag == tag]
        if not mine:
            raise WheelhouseError(f"no wheel for this Python ({tag}) in {wheelhouse}", "pass --wheel NAME")
        wheel = max(mine, key=lambda n: version_key(wheels[n].version))  # newest by version, not publish time
    if wheel not in wheels:
        raise WheelhouseError(f"{wheel} is not in {wheelhouse}/manifest.json", f"choose one of: {', '.join(wheels)}")
    entry = wheels[wheel]
    tmp = node.scratch_dir("ds-lock-")  # what pip downloads; a kill -9 leaves it, the next lock removes it
    try:
        cmd.run(
            [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--find-links", wheelhouse, "-d", tmp,
             f"deepspeed=={entry.version}"],
            log=log,
            fix="the lock is resolved for this Python from wheels only; run it with the Python the wheel was built "
            "for, where pip reaches an index (or find-links) with wheels of torch and DeepSpeed's dependencies",
        )  # fmt: skip
        got = sorted(p for p in Path(tmp).iterdir() if p.is_file())
        files = {p.name: sha256_of(p) for p in got}
        if files.get(wheel) != entry.sha256:
            raise WheelhouseError(f"pip did not resolve {wheel} from {wheelhouse}", "run verify on the wheelhouse")
        # Every file the lock pins goes into the wheelhouse (torch too), so an image or a node
        # installs from the wheelhouse alone.
        added = add_files(wheelhouse, [p for p in got if p.name != wheel], f"the lock of {wheel}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out = wheelhouse / LOCKS
    name = entry.recipe
    rel = f"{LOCKS}/{name}.lock"
    publish_locks(wheelhouse, {
        rel: render_lock(wheel, files),
        f"{LOCKS}/pylock.{name}.toml": render_pylock(wheel, files),
        f"{LOCKS}/{name}.Containerfile": render_containerfile(default_base(entry.python_tag), rel, wheel),
    })  # fmt: skip
    target = wheelhouse / rel
    output.step(f"{target}: {len(files)} files pinned by sha256 ({len(added)} added to the wheelhouse); "
                f"the same as {out / f'pylock.{name}.toml'} (PEP 751); {out / (name + '.Containerfile')}; all three "
                "listed in the signed manifest")  # fmt: skip
    return target


def locks_by_wheel(wheelhouse: Path, manifest: WheelhouseManifest | None = None) -> dict[str, Path]:
    """Each wheel some lock of the wheelhouse was written for (its first line), with that lock: only
    locks the signed manifest lists."""
    found: dict[str, Path] = {}
    listed = manifest if manifest is not None else load_manifest(wheelhouse)
    for rel, wheel in lock_headers(wheelhouse, listed).items():
        found.setdefault(wheel, wheelhouse / rel)
    return found


def locked_wheels(wheelhouse: Path) -> set[str]:
    """Wheel files of the wheelhouse that some lock pins (prune keeps them)."""
    return set(locks_by_wheel(wheelhouse))
