"""verify: everything wrong with a wheelhouse, recomputed from the files themselves.

Every listed file is hash-checked; every manifest field that can be recomputed is (a wheel's facts
from its embedded build manifest, its smoke result from the report beside it); every file nobody
listed, every project or link the manifest does not know, and every leftover of a killed publish
is reported.
"""

from __future__ import annotations

import datetime
import hashlib
from pathlib import Path
from urllib.parse import quote, unquote

from builder.contracts import BuildManifest, SmokeReport
from builder.errors import WheelhouseError
from builder.files import is_temp_name, sha256_of
from builder.node import (
    IMAGES,
    ManifestError,
    TooLarge,
    Trust,
    WheelEntry,
    WheelhouseManifest,
    check_expiry,
    entry_differences,
    image_files,
    printable,
    read_bounded,
)
from builder.wheelhouse.archive import SQUASHFS_MAGIC
from builder.wheelhouse.index import (
    parse_links,
)
from builder.wheelhouse.layout import (
    DOCS,
    INTERRUPTED,
    JOURNAL,
    LOCK,
    LOCKS,
    MANIFEST,
    SIG_PENDING,
    SIGNATURE,
    check_signed,
    publish_traces,
    read_manifest,
    symlinked_folders,
)
from builder.wheelhouse.lockfile import lock_problems
from builder.wheelhouse.proofs import verify_proofs


def _read_text(path: Path) -> str | None:
    try:
        return read_bounded(path, "index page").decode("utf-8")
    except (OSError, ValueError):
        return None


def signature_problems(wheelhouse: Path, data: bytes, manifest: WheelhouseManifest, trust: Trust | None) -> list[str]:
    """The manifest's signature by a trusted key, its serial against this host's record, its expiry."""
    try:
        check_signed(wheelhouse, data, manifest, trust)
    except WheelhouseError as exc:
        if (wheelhouse / SIG_PENDING).is_file() or (wheelhouse / JOURNAL).is_file():
            return [f"{SIGNATURE}: {exc.message} ({INTERRUPTED})"]
        return [exc.message]
    try:
        check_expiry(manifest, str(wheelhouse / MANIFEST), datetime.datetime.now(datetime.UTC))
    except ManifestError as exc:
        return [f"{exc.message}: re-sign it with `python -m builder sign`"]
    return []


def _in_progress(wheelhouse: Path) -> str:
    """What a journal means now: a publish holding the lock is still running; otherwise one was killed."""
    from filelock import FileLock, Timeout

    try:
        with FileLock(str(wheelhouse / LOCK), timeout=0):
            return INTERRUPTED
    except Timeout:
        return "a publish is in progress (it holds the wheelhouse's lock): run verify again when it is done"
    except OSError:
        return INTERRUPTED


REPLACED = "someone replaced it: restore the wheelhouse from the build host, or move it away and re-publish"


NOT_A_WHEELHOUSE = "not a wheelhouse (pass --wheelhouse with the folder publish wrote; this one is not the toolkit's)"


def verify(wheelhouse: Path, trust: Trust | None = None, signature: bool = True) -> list[str]:
    """Everything wrong with a wheelhouse; empty only when every file is listed, linked and hash-checked.

    Every manifest field that can be recomputed is: a wheel's facts from its embedded build
    manifest, its smoke result from the report published beside it.
    """
    if not wheelhouse.is_dir():
        return [f"{wheelhouse} does not exist or is not a folder"]
    if not (wheelhouse / MANIFEST).exists() and not (wheelhouse / MANIFEST).is_symlink():
        left = sorted(p.name for p in wheelhouse.iterdir() if p.name != LOCK)
        shown = ", ".join(printable(n) for n in left[:5]) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
        if left and publish_traces(wheelhouse):  # a first publish killed before its manifest: repair's to remove
            return [f"{wheelhouse} has no {MANIFEST} but holds {shown}: {INTERRUPTED}"]
        if left:  # files no publish wrote (repair removes only a publish's own, so it is not the fix: a loop)
            return [f"{wheelhouse} has no {MANIFEST} and holds files no publish wrote ({shown}): {NOT_A_WHEELHOUSE}"]
        return [f"{wheelhouse} has no {MANIFEST}: nothing was published there"]
    if not (wheelhouse / MANIFEST).is_file():
        return [
            f"{wheelhouse / MANIFEST} is not a regular file (a folder, a FIFO, a device or a dangling link): "
            f"not what publish writes; {REPLACED}"
        ]
    try:
        found = read_manifest(wheelhouse)
    except WheelhouseError as exc:
        return [exc.message]
    assert found is not None
    manifest = found[1]
    problems = signature_problems(wheelhouse, *found, trust) if signature else []  # first: what vouches for the rest
    problems += [f"{rel}: a symlink where the toolkit writes" for rel in symlinked_folders(wheelhouse)]
    if not manifest.wheels:
        problems.append(f"{MANIFEST} lists no DeepSpeed wheel: the wheelhouse is empty")
    for name, entry in sorted(manifest.wheels.items()):
        problems += _verify_wheel(wheelhouse, name, entry)
    for name, dep in sorted({**manifest.dependencies, **manifest.tools, **manifest.reports}.items()):
        problems += _listed_file(wheelhouse, name, dep.sha256, dep.size)
    problems += _verify_tree(wheelhouse, manifest)
    problems += _verify_locks(wheelhouse, manifest)
    problems += _verify_images(wheelhouse, manifest)
    problems += _verify_index(wheelhouse, manifest)
    problems += _verify_variants(wheelhouse, manifest)
    problems += _verify_page(wheelhouse, manifest)
    if any(INTERRUPTED in p for p in problems):  # a journal while a publish holds the lock: still running
        state = _in_progress(wheelhouse)
        problems = [p.replace(INTERRUPTED, state) for p in problems]
    return problems


def _verify_variants(wheelhouse: Path, manifest: WheelhouseManifest) -> list[str]:
    """Variant wheels and variants.json files: each listed, with its sha256, and exactly what the
    published wheels make (a variant is rebuilt from its source wheel and compared byte for byte)."""
    from builder.wheelhouse import variants

    if not manifest.variants and not manifest.variant_indexes:
        return []
    problems = []
    planned = variants.plan(manifest.wheels)
    listed = {n: (v.wheel, v.label, v.properties) for n, v in manifest.variants.items()}
    if listed != {n: (p.wheel, p.label, p.properties) for n, p in planned.items()}:
        problems.append(f"{MANIFEST}: the variants it lists are not the ones its CUDA wheels make "
                        "(run `python -m builder repair` to make them again)")  # fmt: skip
    for name, entry in sorted(manifest.variants.items()):
        if wrong := _listed_file(wheelhouse, name, entry.sha256):
            problems += wrong
        elif name in planned and sha256_of(wheelhouse / entry.wheel) == manifest.wheels[entry.wheel].sha256:
            if hashlib.sha256(variants.variant_bytes(wheelhouse / entry.wheel, planned[name])).hexdigest() != (
                entry.sha256
            ):
                problems.append(f"{name}: not the variant of {entry.wheel} (its files or variant.json differ)")
    docs = variants.indexes(planned)
    for name, index in sorted(manifest.variant_indexes.items()):
        if wrong := _listed_file(wheelhouse, name, index.sha256):
            problems += wrong
        elif docs.get(name) != (wheelhouse / name).read_text(encoding="utf-8", errors="replace"):
            problems.append(f"{name}: not the variants index the published wheels make")
    return problems


def _head(path: Path, size: int) -> bytes:
    with path.open("rb") as f:
        return f.read(size)


def _listed_file(wheelhouse: Path, name: str, sha256: str, size: int | None = None) -> list[str]:
    """A file the manifest lists: there, a regular file, with its size (where listed) and sha256."""
    path = wheelhouse / name
    if path.is_symlink() or not path.is_file():
        return [f"{name}: listed in {MANIFEST} but missing"]
    if size is not None and path.stat().st_size != size:
        return [f"{name}: {path.stat().st_size} bytes, {MANIFEST} says {size} (tampered or replaced)"]
    if sha256_of(path) != sha256:
        return [f"{name}: sha256 differs from {MANIFEST} (tampered or replaced)"]
    return []


def _verify_page(wheelhouse: Path, manifest: WheelhouseManifest) -> list[str]:
    """index.html must be exactly what the manifest renders (an edited page could show people
    other commands than the ones the manifest backs)."""
    from builder.wheelhouse.page import PAGE, gather, render

    path = wheelhouse / PAGE
    if path.is_symlink() or not path.is_file():
        return [f"{PAGE}: missing (run `python -m builder repair` to write it)"]
    try:
        text = read_bounded(path, "index page").decode("utf-8", errors="replace")
    except (OSError, TooLarge) as exc:  # one over 8 MiB (or a FIFO in its place): a problem named, not a traceback
        return [f"{PAGE}: {exc}; run `python -m builder repair` to write it anew"]
    if text != render(gather(wheelhouse, manifest)):
        if (wheelhouse / JOURNAL).is_file():  # a publish was killed between the page and the manifest
            return [f"{PAGE}: out of step with {MANIFEST}, {INTERRUPTED}"]
        return [f"{PAGE}: not the page {MANIFEST} renders here (edited, or the wheelhouse was moved): "
                "run `python -m builder repair` to rewrite it"]  # fmt: skip
    return []


def _verify_images(wheelhouse: Path, manifest: WheelhouseManifest) -> list[str]:
    """Each image archive: a regular file with its sha256, holding the image (ID and manifest
    digest) its entry names; and nothing in images/ the manifest does not list."""
    from builder.wheelhouse.archive import ArchiveError, read_facts

    problems = []
    for name, entry in sorted(manifest.images.items()):
        path = wheelhouse / name
        if path.is_symlink() or not path.is_file():
            problems.append(f"{name}: listed in {MANIFEST} but missing (or not a regular file)")
            continue
        if path.stat().st_size != entry.size or sha256_of(path) != entry.sha256:
            problems.append(f"{name}: size or sha256 differs from {MANIFEST} (tampered or replaced)")
            continue
        try:
            facts = read_facts(path)
        except ArchiveError as exc:
            problems.append(f"{name}: not a usable OCI archive: {exc}")
            continue
        if facts.digest != entry.digest or facts.image_id != entry.image_id:
            problems.append(f"{name}: holds image {facts.image_id[:12]} ({facts.digest}), but {MANIFEST} says "
                            f"{entry.image_id[:12]} ({entry.digest})")  # fmt: skip
        if entry.squashfs:
            wrong = _listed_file(wheelhouse, entry.squashfs, entry.squashfs_sha256, entry.squashfs_size)
            if not wrong and _head(wheelhouse / entry.squashfs, 4) != SQUASHFS_MAGIC:
                wrong.append(f"{entry.squashfs}: not a squashfs (no squashfs superblock)")
            problems += wrong
    folder = wheelhouse / IMAGES
    listed = image_files(manifest)
    if folder.is_dir() and not folder.is_symlink():
        for path in sorted(folder.iterdir()):
            rel = f"{IMAGES}/{path.name}"
            if rel not in listed:
                problems.append(f"{rel}: {INTERRUPTED if is_temp_name(path.name) else 'not in ' + MANIFEST}")
    return problems


def _verify_wheel(wheelhouse: Path, name: str, entry: WheelEntry) -> list[str]:
    wheel = wheelhouse / name
    if not wheel.is_file():
        return [f"{name}: listed in {MANIFEST} but missing"]
    problems = _listed_file(wheelhouse, name, entry.sha256, entry.size)
    if not problems:  # the wheel's bytes are the published ones: its own build manifest is the truth
        try:
            build = BuildManifest.from_wheel(wheel)
            problems += [f"{name}: {d}" for d in entry_differences(entry, build.data)]
        except ManifestError as exc:
            problems.append(f"{name}: {exc.message}")
    for suffix, digest in ((".metadata", entry.metadata_sha256), (".smoke.json", entry.report_sha256)):
        path = wheelhouse / f"{name}{suffix}"
        if digest is None:
            problems.append(f"{name}: {MANIFEST} records no sha256 for {name}{suffix} (published by an older toolkit)")
        elif not path.is_file():
            problems.append(f"{name}{suffix}: missing")
        elif sha256_of(path) != digest:
            problems.append(f"{name}{suffix}: sha256 differs from {MANIFEST}")
        elif suffix == ".smoke.json":
            problems += _verify_report(path, name, entry)
    return problems + verify_proofs(wheelhouse, entry)


def _verify_report(path: Path, name: str, entry: WheelEntry) -> list[str]:
    try:
        report = SmokeReport.from_json(read_bounded(path, "report"), path.name)
    except ManifestError as exc:
        return [exc.message]
    except (OSError, ValueError) as exc:
        return [f"{path.name}: {exc}"]
    problems = []
    if report.wheel != name or report.sha256 != entry.sha256:
        problems.append(f"{path.name}: the report is for other bytes than {name}")
    if report.passed != entry.smoke.passed or dict(report.summary_checks()) != dict(entry.smoke.checks):
        problems.append(f"{name}: the smoke result in {MANIFEST} differs from {path.name}")
    return problems


def _verify_tree(wheelhouse: Path, manifest: WheelhouseManifest) -> list[str]:
    """Files nobody listed: leftovers of a killed publish, and anything put there by hand."""
    known = {MANIFEST, SIGNATURE, LOCK, "simple", "tools", LOCKS, IMAGES, "index.html", *manifest.reports, *DOCS,
             *manifest.variants, *manifest.variant_indexes}  # fmt: skip
    for name in manifest.wheels:
        known |= {name, f"{name}.metadata", f"{name}.smoke.json", *(p.name for p in manifest.wheels[name].proofs)}
    known |= set(manifest.dependencies)
    problems = []
    interrupted = INTERRUPTED
    for path in sorted(wheelhouse.iterdir()):
        if path.name == JOURNAL or is_temp_name(path.name):
            problems.append(f"{path.name}: {interrupted}")
        elif path.name not in known:
            problems.append(f"{path.name}: in the wheelhouse but not in {MANIFEST}")
    tools = wheelhouse / "tools"
    if tools.is_dir():
        for path in sorted(tools.iterdir()):
            rel = f"tools/{path.name}"
            if rel not in manifest.tools:
                problems.append(f"{rel}: {interrupted if is_temp_name(path.name) else 'not in ' + MANIFEST}")
    locks = wheelhouse / LOCKS
    if locks.is_dir() and not locks.is_symlink():
        for path in sorted(locks.iterdir()):
            rel = f"{LOCKS}/{path.name}"
            if is_temp_name(path.name):
                problems.append(f"{rel}: {interrupted}")
            elif rel not in manifest.locks:
                problems.append(f"{rel}: not in {MANIFEST}, which lists every lock `lock` wrote (run `lock` "
                                "again for a lock written before locks were signed)")  # fmt: skip
    return problems


def _verify_locks(wheelhouse: Path, manifest: WheelhouseManifest) -> list[str]:
    """Each lock the manifest lists: its sha256, then what it pins read back against the manifest
    (only files the wheelhouse serves, by their hashes; no option, path or URL that reaches elsewhere)."""
    problems = []
    for rel, entry in sorted(manifest.locks.items()):
        wrong = _listed_file(wheelhouse, rel, entry.sha256)
        if wrong:
            problems += wrong
            continue
        text = _read_text(wheelhouse / rel)
        problems += [f"{rel}: unreadable"] if text is None else lock_problems(rel, text, manifest)
    return problems


def _verify_index(wheelhouse: Path, manifest: WheelhouseManifest) -> list[str]:
    problems: list[str] = []
    simple = wheelhouse / "simple"
    projects = manifest.projects()
    root_text = _read_text(simple / "index.html")
    if root_text is None:
        return ["simple/index.html: missing or unreadable"]
    root_links = [a.get("href") or "" for a in parse_links(root_text)]
    for project in projects:
        if f"{quote(project)}/" not in root_links:
            problems.append(f"simple/index.html does not list {project}")
    problems += [
        f"simple/index.html links {href!r}, a project {MANIFEST} does not list"
        for href in root_links
        if href not in {f"{quote(p)}/" for p in projects}
    ]
    if simple.is_dir():
        for path in sorted(simple.iterdir()):
            if path.name == "index.html":
                continue
            if is_temp_name(path.name):
                problems.append(f"simple/{path.name}: {INTERRUPTED}")
            elif not path.is_dir() or path.name not in projects:
                problems.append(f"simple/{path.name}: not a project {MANIFEST} lists")
            else:
                for p in sorted(path.iterdir()):
                    if p.name == "index.html":
                        continue
                    what = INTERRUPTED if is_temp_name(p.name) else "a file no publish wrote"
                    problems.append(f"simple/{path.name}/{p.name}: {what}")
    for project, names in projects.items():
        text = _read_text(simple / project / "index.html")
        if text is None:
            problems.append(f"simple/{project}/index.html: missing")
            continue
        seen: dict[str, tuple[str, str | None]] = {}
        for a in parse_links(text):
            href = a.get("href") or ""
            target, _, fragment = href.partition("#")
            if not target.startswith("../../") or "/" in target[len("../../") :]:
                problems.append(f"simple/{project}/index.html: link {href[:120]!r} points outside the wheelhouse")
                continue
            seen[unquote(target[len("../../") :])] = (fragment, a.get("data-dist-info-metadata"))
        for name in names:
            if name not in seen:
                problems.append(f"simple/{project}/index.html: no link to {name}")
                continue
            fragment, meta_attr = seen.pop(name)
            if fragment != f"sha256={manifest.file_sha256(name)}":
                problems.append(f"simple/{project}/index.html: wrong hash for {name}")
            wheel = manifest.wheels.get(name)
            if wheel and wheel.metadata_sha256 and meta_attr != f"sha256={wheel.metadata_sha256}":
                problems.append(f"simple/{project}/index.html: wrong metadata hash for {name}")
        problems += [f"simple/{project}/index.html: links {n}, which {MANIFEST} does not list" for n in seen]
    return problems
