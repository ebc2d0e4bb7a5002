"""lock: a hash-pinned requirements file, the same as a PEP 751 pylock.toml, and a Containerfile.

pip resolves the published wheel with everything it needs (its pinned torch included) and
downloads them; the lock pins each file by name, version and sha256, so
`pip install --require-hashes` installs exactly these bytes or nothing, and every file it pins is
added to the wheelhouse, so the image (builder.images) installs from the wheelhouse alone.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from packaging.utils import parse_sdist_filename, parse_wheel_filename

from builder import cmd, output
from builder.errors import WheelhouseError
from builder.files import write_atomic
from builder.images.plan import python_version, render_containerfile
from builder.node import version_key
from builder.wheelbuild.source import sha256_of
from builder.wheelhouse.layout import load_manifest, lock_headers
from builder.wheelhouse.publish import add_files, refresh_page

LOCKS = "locks"


def requirement_of(filename: str) -> str:
    """'name==version' of a downloaded wheel or sdist file."""
    if filename.endswith(".whl"):
        name, version, _, _ = parse_wheel_filename(filename)
    else:
        name, version = parse_sdist_filename(filename)
    return f"{name}=={version}"


def render_lock(wheel: str, files: Mapping[str, str]) -> str:
    """The lock text: one requirement per downloaded file, with its sha256, sorted by name."""
    lines = [
        f"# Lock for {wheel}, written by ds-wheel-builder. Install exactly these files with:",
        "#   pip install --require-hashes --find-links <wheelhouse> -r <this file>",
    ]
    for filename, digest in sorted(files.items(), key=lambda item: requirement_of(item[0]).lower()):
        lines.append(f"{requirement_of(filename)} \\\n    --hash=sha256:{digest}")
    return "\n".join(lines) + "\n"


def render_pylock(wheel: str, files: Mapping[str, str]) -> str:
    """The same files as a PEP 751 lock (`locks/pylock.<recipe>.toml`, read by uv and pip 26.1+):
    one package per file, its wheel by a path relative to the lock (the wheelhouse's own copy,
    `../<file>`) with its sha256, so it installs from the wheelhouse alone, offline."""
    lines = [f"# Lock for {wheel}, written by ds-wheel-builder (PEP 751). Install exactly these files with:",
             "#   uv pip install --offline -r <this file>     (or pip 26.1+: pip install --no-index -r <this file>)",
             'lock-version = "1.0"', 'created-by = "ds-wheel-builder"', ""]  # fmt: skip
    for filename, digest in sorted(files.items(), key=lambda item: requirement_of(item[0]).lower()):
        name, version = requirement_of(filename).split("==")
        lines += ["[[packages]]", f'name = "{name}"', f'version = "{version}"', "",
                  "[[packages.wheels]]", f'name = "{filename}"', f'path = "../{filename}"',
                  f'hashes = {{ sha256 = "{digest}" }}', ""]  # fmt: skip
    return "\n".join(lines)


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
    with tempfile.TemporaryDirectory() as tmp:
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
    out = wheelhouse / LOCKS
    name = entry.recipe
    target = write_atomic(out / f"{name}.lock", render_lock(wheel, files))
    write_atomic(out / f"pylock.{name}.toml", render_pylock(wheel, files))
    rel = f"{LOCKS}/{name}.lock"
    write_atomic(out / f"{name}.Containerfile", render_containerfile(default_base(entry.python_tag), rel, wheel))
    refresh_page(wheelhouse)  # the page lists the locks
    output.step(f"{target}: {len(files)} files pinned by sha256 ({len(added)} added to the wheelhouse); "
                f"the same as {out / f'pylock.{name}.toml'} (PEP 751); {out / (name + '.Containerfile')}")  # fmt: skip
    return target


def locks_by_wheel(wheelhouse: Path) -> dict[str, Path]:
    """Each wheel some lock of the wheelhouse was written for (its first line), with that lock."""
    found: dict[str, Path] = {}
    for rel, wheel in lock_headers(wheelhouse).items():
        found.setdefault(wheel, wheelhouse / rel)
    return found


def locked_wheels(wheelhouse: Path) -> set[str]:
    """Wheel files of the wheelhouse that some lock pins (prune keeps them)."""
    return set(locks_by_wheel(wheelhouse))
