"""What a lock file holds: the hash-pinned requirements lock and its PEP 751 twin, rendered from
the files pip resolved, and read back against the signed manifest (pure: no file is touched)."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping

from packaging.utils import parse_sdist_filename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from builder import node
from builder.node import WheelhouseManifest, check_wheel_name


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


class LockFileError(ValueError):
    """A lock that is not what `lock` writes; the message names the file and the line."""


def parse_lock(text: str, where: str) -> tuple[str, dict[str, str]]:
    """The wheel a lock was written for (its first line) and its pins: requirement -> sha256 (the
    node installer's reading, which its --module mode uses on the node)."""
    try:
        return node.parse_lock(text, where)
    except ValueError as exc:
        raise LockFileError(str(exc)) from exc


def served_files(manifest: WheelhouseManifest) -> dict[str, str]:
    """Every wheel file the wheelhouse serves (DeepSpeed's and their dependencies) -> its sha256."""
    return {n: e.sha256 for table in (manifest.wheels, manifest.dependencies) for n, e in table.items()}


def _version(text: str) -> str:
    try:
        return str(Version(text))
    except InvalidVersion:
        return text


def lock_problems(rel: str, text: str, manifest: WheelhouseManifest) -> list[str]:
    """What is wrong with a lock `lock` wrote, read back against the signed manifest: a line that is
    not a pin with its hash (an option such as --find-links or --index-url, a path, a URL), or a pin
    whose hash is not the one of the file the wheelhouse serves for that name and version."""
    if rel.endswith(".Containerfile"):
        return []  # no pins of its own: it installs the .lock beside it, and its bytes are signed
    if rel.endswith(".toml"):
        return _pylock_problems(rel, text, manifest)
    try:
        wheel, pins = parse_lock(text, rel)
    except LockFileError as exc:
        return [str(exc)]
    by_digest = {digest: check_wheel_name(name) for name, digest in served_files(manifest).items()}
    problems = [] if wheel in manifest.wheels else [f"{rel}: written for {wheel[:100]!r}, which is not published"]
    for requirement, digest in sorted(pins.items()):
        name, _, version = requirement.partition("==")
        served = by_digest.get(digest)
        if served is None:
            problems.append(f"{rel}: pins {requirement} to sha256 {digest[:16]}..., which no served file has")
        elif (served.project, _version(served.version)) != (name, _version(version)):
            problems.append(f"{rel}: pins {requirement} to the sha256 of {served.project}=={served.version}")
    return problems


def _pylock_problems(rel: str, text: str, manifest: WheelhouseManifest) -> list[str]:
    """A pylock.toml holds only wheels of the wheelhouse itself: `path = "../<file>"`, the file the
    manifest lists, its sha256; no URL, no index, no sdist, archive, directory or VCS source."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        return [f"{rel}: not TOML ({exc})"]
    served, problems = served_files(manifest), []
    packages = data.get("packages")
    if not isinstance(packages, list) or not packages:
        return [f"{rel}: lists no packages"]
    for package in packages:
        if not isinstance(package, dict):
            problems.append(f"{rel}: a [[packages]] entry that is not a table")
            continue
        who = str(package.get("name", "?"))[:60]
        odd = sorted(set(package) - {"name", "version", "wheels"})
        if odd:
            problems.append(f"{rel}: {who}: {', '.join(odd)} (only wheels from the wheelhouse itself are allowed)")
        wheels = package.get("wheels")
        if not isinstance(wheels, list) or not wheels:
            problems.append(f"{rel}: {who}: no wheels")
            continue
        for wheel in wheels:
            if not isinstance(wheel, dict):
                problems.append(f"{rel}: {who}: a wheel entry that is not a table")
                continue
            name, other = wheel.get("name"), sorted(set(wheel) - {"name", "path", "hashes"})
            if other:
                problems.append(f"{rel}: {who}: a wheel with {', '.join(other)} (a URL or a source outside it)")
            elif not isinstance(name, str) or name not in served:
                problems.append(f"{rel}: {who}: {str(name)[:80]!r} is not a file the wheelhouse serves")
            elif wheel.get("path") != f"../{name}":
                problems.append(f"{rel}: {who}: path {str(wheel.get('path'))[:80]!r} is not the wheelhouse's ../{name}")
            elif wheel.get("hashes") != {"sha256": served[name]}:
                problems.append(f"{rel}: {who}: the hash of {name} is not the served file's")
    return problems


# The Containerfile `lock` writes beside a lock (images builds it with podman: builder.images).
VENV = "/opt/deepspeed"
IMAGE_LOCK = f"{VENV}/ds-image.lock"  # the lock the image was installed from, kept inside it
DEFAULT_EPOCH = 0  # SOURCE_DATE_EPOCH when none is set: 1970-01-01, the usual reproducible choice
SEARCH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def python_version(tag: str) -> str:
    return f"{tag[2]}.{tag[3:]}"


def render_containerfile(base: str, lock: str, wheel: str, epoch: int = DEFAULT_EPOCH) -> str:
    """The Containerfile of an image, with the wheelhouse (or a folder holding the lock's files
    and the lock at the same paths) as the build context."""
    return (
        f"# CI image of {wheel}, written by ds-wheel-builder: python -m builder image --lock {lock}\n"
        f"# builds it with podman, runs the smoke checks inside and publishes it. By hand, with the\n"
        f"# wheelhouse as the build context (nothing is fetched):\n"
        f"#   podman build --network none --timestamp {epoch} -f {lock.removesuffix('.lock')}.Containerfile .\n"
        f"FROM {base}\n"
        f"RUN --mount=type=bind,source=.,target=/wheelhouse,ro \\\n"
        f"    export SOURCE_DATE_EPOCH={epoch} PIP_CONFIG_FILE=/dev/null && \\\n"
        f"    python3 -m venv {VENV} && \\\n"
        f"    {VENV}/bin/python -m pip install --no-index --no-cache-dir --disable-pip-version-check \\\n"
        f"        --require-hashes --find-links /wheelhouse -r /wheelhouse/{lock} && \\\n"
        f"    cp /wheelhouse/{lock} {IMAGE_LOCK}\n"
        f"ENV VIRTUAL_ENV={VENV} PATH={VENV}/bin:{SEARCH_PATH}\n"
    )
