"""A made root as one file, for a node that cannot make it: no Debian mirror, no debootstrap, no apt.

`gather` (a connected machine) packs the toolkit's root this machine made, once per machine, into the
roots folder beside it (`<name>.tar.xz` and its record `<name>.pack.json`) and copies both into the
gathered folder's root/; on the node, `--offline DIR` names that folder (PACKED_ENV), and the first
build unpacks the root from it instead of running debootstrap. The record carries the root's facts
(its identity: the package list), so units built on either machine have the same keys. What no
compiler reads (documentation, manual pages, translations, apt's lists and caches, device nodes: /dev
is the host's, bound in) is left out of the file.
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from builder import archives, cmd, output
from builder.buildroot.spec import RootFacts, RootSpec
from builder.errors import RootError, ToolError
from builder.files import held, make_dirs, sha256_of, write_atomic

PACKED_ENV = "DS_BUILDER_PACKED_ROOTS"  # a folder of packed roots (an offline folder's root/)
PACK_SCHEMA = 1
# Left out of the file: what no compile or link of an op reads. Documentation and translations; apt's
# lists and caches; /dev, /proc and /sys (the host's are bound in); perl (dpkg's, 45 MB); the LTO dump
# tool (24 MB); the sanitizers' runtimes (30 MB: ops are not built with -fsanitize); time zones.
# And the trust boundary's stamp of this machine's check of the root (node.STAMP).
LEFT_OUT = ("./.ds-builder-trusted", "./dev/*", "./proc/*", "./sys/*", "./tmp/*", "./usr/share/doc/*",
            "./usr/share/man/*", "./usr/share/info/*",
            "./usr/share/locale/*", "./usr/share/lintian/*", "./usr/share/zoneinfo/*", "./var/cache/*",
            "./var/lib/apt/lists/*", "./var/log/*", "./usr/share/perl/*", "./usr/lib/x86_64-linux-gnu/perl/*",
            "./usr/lib/x86_64-linux-gnu/perl-base/*", "./usr/lib/x86_64-linux-gnu/libperl.so*", "*lto-dump*",
            "./usr/lib/x86_64-linux-gnu/lib[altu]san.so*", "./usr/lib/gcc/*/*/lib[altu]san*")  # fmt: skip
CHANGED = "file changed as we read it"  # GNU tar's words (exit 1) when a file's ctime moved during the pack
MAX_MEMBERS = 200_000  # a Debian 11 buildd root holds about 20,000 files


@dataclass(frozen=True)
class PackedRoot:
    """A packed root's record: what it was made of (to match a spec), its facts, its file's size and sha256."""

    name: str
    suite: str
    variant: str
    packages: tuple[str, ...]
    facts: RootFacts
    file: str
    size: int
    sha256: str

    def matches(self, spec: RootSpec) -> bool:
        """The same root as `spec` asks for; the mirror it came from is not its content."""
        return (spec.kind == "debian" and (self.suite, self.variant) == (spec.suite, spec.variant)
                and sorted(self.packages) == sorted(spec.packages))  # fmt: skip

    def to_json(self) -> dict[str, object]:
        facts = {k: v for k, v in self.facts.to_json().items() if k != "path"}
        return {"schema": PACK_SCHEMA, "name": self.name, "suite": self.suite, "variant": self.variant,
                "packages": list(self.packages), "facts": facts, "file": self.file, "size": self.size,
                "sha256": self.sha256}  # fmt: skip


def record_path(folder: Path, name: str) -> Path:
    return folder / f"{name}.pack.json"


def read_record(path: Path) -> PackedRoot:
    """A packed root's record, every field checked; RootError naming the file otherwise."""
    try:
        if path.stat().st_size > 1 << 20:
            raise ValueError("larger than 1 MB")
        data = json.loads(path.read_text(encoding="utf-8"))
        facts = data["facts"]
        if data["schema"] != PACK_SCHEMA:
            raise ValueError(f"schema {data['schema']!r}, not {PACK_SCHEMA}")
        texts = [data["name"], data["suite"], data["variant"], data["file"], data["sha256"],
                 *(facts[k] for k in ("identity", "glibc", "gcc", "describe", "cc", "cxx"))]  # fmt: skip
        if not all(isinstance(t, str) and t and "\n" not in t for t in texts) or not isinstance(data["size"], int):
            raise ValueError("a field is not what pack writes")
        if "/" in data["file"] or data["file"].startswith(".") or not data["file"].endswith(".tar.xz"):
            raise ValueError(f"file {data['file'][:80]!r} is not a file name of this folder")
        packages = tuple(data["packages"])
        if not all(isinstance(p, str) for p in packages):
            raise ValueError("packages is not a list of names")
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise RootError(f"{path} is not a packed root's record ({exc})",
                        "gather the folder again on a connected machine") from exc  # fmt: skip
    return PackedRoot(data["name"], data["suite"], data["variant"], packages,
                      RootFacts(Path("/"), facts["identity"], facts["glibc"], facts["gcc"], facts["describe"],
                                facts["cc"], facts["cxx"]), data["file"], data["size"], data["sha256"])  # fmt: skip


def pack(spec: RootSpec, facts: RootFacts, roots: Path, log: Path) -> PackedRoot:
    """The root at facts.path as `<name>.tar.xz` in the roots folder, made once per machine (a root is
    never changed once made) under the root's own lock; its record beside it."""
    name = facts.path.name
    record = record_path(roots, name)
    with held(roots / f".{name}.lock", f"the build root {name}, which another process is packing or making"):
        if record.is_file():
            packed = read_record(record)
            if (roots / packed.file).is_file() and (roots / packed.file).stat().st_size == packed.size:
                return packed
        file = f"{name}.tar.xz"
        tmp = roots / f".{file}.tmp-{os.getpid()}"
        output.step(f"root: packing {facts.describe} ({facts.path}) into {roots / file}, once per machine")
        excludes = [f"--exclude={p}" for p in LEFT_OUT]
        argv: list[str | Path] = ["tar", "-C", facts.path, "--numeric-owner", "--sort=name", *excludes, "-I",
                                  "xz -T0 -6", "-cf", tmp, "."]  # fmt: skip
        try:
            for attempt in (1, 2):
                try:
                    cmd.run(argv, log=log, fix="check the disk space of the roots folder")
                    break
                except ToolError as exc:
                    if CHANGED not in exc.message:
                        raise
                    if attempt == 2:
                        raise RootError(f"tar saw the root {facts.path}'s files change twice while it packed them: "
                                        "another process on this machine copies or links the shared roots folder "
                                        "(a hard-link copy changes every file's ctime)", "run gather again once that "
                                        "job is done; the root itself is unchanged") from exc  # fmt: skip
                    output.note("root: tar saw a file change while packing (another process linked or touched the "
                                "shared root: its ctime moved, its content did not); packing again")  # fmt: skip
                    tmp.unlink(missing_ok=True)
            os.chmod(tmp, 0o644)
            tmp.rename(roots / file)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        path = roots / file
        packed = PackedRoot(name, spec.suite, spec.variant, tuple(spec.packages), facts, file, path.stat().st_size,
                            sha256_of(path))  # fmt: skip
        write_atomic(record, json.dumps(packed.to_json(), indent=2, sort_keys=True) + "\n")
    return packed


def find(spec: RootSpec, env: Mapping[str, str]) -> tuple[Path, PackedRoot] | None:
    """A packed root matching `spec` in the folder PACKED_ENV names (an offline folder's root/), or None."""
    named = env.get(PACKED_ENV)
    if not named:
        return None
    folder = Path(named)
    for record in sorted(folder.glob("*.pack.json")):
        packed = read_record(record)
        if packed.matches(spec):
            return folder, packed
    return None


def unpack(folder: Path, packed: PackedRoot, tmp: Path) -> None:
    """The packed root's files into `tmp` (made here), its file's size and sha256 checked first; every
    member a plain file, folder or link inside the root (no device, no path out of it)."""
    path = folder / packed.file
    if not path.is_file() or path.stat().st_size != packed.size or sha256_of(path) != packed.sha256:
        raise RootError(f"{path} is not the packed root its record describes (size or sha256 differs, or missing)",
                        "copy the gathered folder again, or gather it again on a connected machine")  # fmt: skip
    if tmp.exists() or tmp.is_symlink():
        raise RootError(f"{tmp} is in the way of the root being unpacked", f"remove {tmp}")
    make_dirs(tmp)
    output.step(f"root: unpacking {packed.facts.describe} from {path} ({packed.size / 1e6:.0f} MB): no mirror needed")
    try:
        with tarfile.open(path, "r:xz") as tf:
            archives.extract(tf, tmp, str(path), MAX_MEMBERS)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise RootError(f"cannot unpack {path}: {exc}", "copy the gathered folder again") from exc
    os.chmod(tmp, 0o755)


def copy_into(packed: PackedRoot, roots: Path, dest: Path) -> int:
    """The packed root and its record into `dest` (an offline folder's root/): a hard link where the
    filesystem allows, else a copy. Its size."""
    make_dirs(dest)
    for name in (packed.file, record_path(roots, packed.name).name):
        target = dest / name
        target.unlink(missing_ok=True)
        try:
            os.link(roots / name, target)
        except OSError:
            shutil.copy2(roots / name, target)
    return packed.size
