"""Precompiled torch headers for the op units' C++ compiles: torch/extension.h parsed once per flag set.

Nearly every op source includes torch/extension.h, and parsing it is most of each compile (26.8 s of
a 27 s compile at -O3 here). A build in a root runs every compile through the toolchain folder's
`enter` script; with a header cache named (PCH_ENV), `enter` hands each C++ compile to `front` here,
which decides:

- a compile that is not one C++ source compiled with -c (nvcc's host passes, -E, headers), or whose
  source does not reach torch/extension.h through includes alone (nothing defined before it), runs
  as it was;
- else its flags less what names the unit (its source folder, TORCH_EXTENSION_NAME) are the flag
  set; the header for that set, with the compiler's root and torch's headers, is keyed, made once
  under a lock (the first compile of the set makes it), signed like an op unit, and checked
  (signature, size and sha256) before it is first used by a build;
- the compile runs with `-include <key>/ds-torch.h -Winvalid-pch -Werror=invalid-pch` first. That
  ds-torch.h is an `#error`: gcc reads it only where the .gch beside it does not fit, so a header
  that does not fit stops the compile instead of being ignored; the front then compiles without it
  and says so in the unit's header log, which the build's summary reads.

gcc's own checks (-Winvalid-pch: another compiler, other macros, other -f/-m flags) are the second
line behind the key. The objects are the same bytes as without the header (tests compare the .so).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PCH_ENV = "DS_BUILDER_PCH"  # the header cache folder (set by the runner for a build in a root); "0": off
MAKE_ENV = "DS_BUILDER_PCH_MAKE"  # "0": use a header already made, make none
LOG_ENV = "DS_BUILDER_PCH_LOG"  # the unit's header log: one JSON line per decision
UNITS_ENV = "DS_BUILDER_PCH_UNITS"  # the units' work folder: paths under it name a unit, not a flag set
HEADER = "torch/extension.h"
STUB = "ds-torch.h"  # what -include names; its .gch is the header
RECORD = "pch.json"
SIGNATURE = "pch.json.sig"
SCHEMA = 1
FOLDER = "pch"  # under the unit cache
# Making a header costs about three compiles (35 s against 22 s a compile, 12 s with it, here): made
# for a flag set with at least this many C++ sources to compile (units.runner.header_env).
MIN_SOURCES = 3
SOURCE = re.compile(r".+\.(cpp|cc|cxx|C|c\+\+)$")
_INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')
_DEFINE = re.compile(r"^\s*#\s*(define|undef)\s+([A-Za-z_]\w*)")
_HARMLESS = re.compile(r"^\s*(#\s*(pragma\s+once|include\b.*)|//.*|)\s*$")
_UNIT_FLAGS = re.compile(r"^-DTORCH_EXTENSION_NAME=")
_OUTPUT_FLAGS = ("-o", "-MF", "-MT", "-MQ")
_DEPENDENCY_FLAGS = ("-MD", "-MMD", "-MP")


@dataclass(frozen=True)
class Compile:
    """One C++ source compiled to an object: its source, and the flags that make its header's key."""

    source: str
    flags: tuple[str, ...]  # what the header is made with (no -c, -o, -M..., source, unit paths or name)
    includes: tuple[str, ...]  # -I folders, in order


def parse(args: Sequence[str], units: str) -> Compile | None:
    """The compile `args` describe, or None where a header does not apply: not `-c` of exactly one
    C++ source, or a language named with -x, or preprocessing only."""
    if "-c" not in args or any(a in ("-E", "-S", "-M", "-MM") or a.startswith("-x") for a in args):
        return None
    flags: list[str] = []
    sources, includes = [], []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in ("-I", "-include", "-isystem"):
            return None  # a two-part form torch never writes: not ours to judge
        if arg in _OUTPUT_FLAGS:
            skip = True
            continue
        if arg == "-c" or arg in _DEPENDENCY_FLAGS or _UNIT_FLAGS.match(arg):
            continue
        if not arg.startswith("-") and SOURCE.match(arg):
            sources.append(arg)
            continue
        if arg.startswith("-I"):
            includes.append(arg[2:])
            if units and _under(arg[2:], units):
                continue
        if arg.startswith("-ffile-prefix-map=") and units and _under(arg.split("=", 2)[1], units):
            continue
        if not arg.startswith("-"):
            return None  # an input gcc would take as another file (an object, a library)
        flags.append(arg)
    if len(sources) != 1:
        return None
    return Compile(sources[0], tuple(flags), tuple(includes))


def _under(path: str, folder: str) -> bool:
    return os.path.normpath(path).startswith(os.path.normpath(folder).rstrip("/") + "/")


@dataclass(frozen=True)
class Reach:
    """How a source reaches the header: `why` not (None: it does), and the macros it defines first."""

    why: str | None
    defines: tuple[str, ...] = ()


def reaches_header(source: str, includes: Sequence[str], within: str, header: str = HEADER) -> Reach:
    """Whether `source` includes `header` (directly or through its own headers, found in its folder
    and the -I folders under `within`) before any line but #include, #pragma once, #define and
    comments (the names it #defines first are checked against the header's files once it is made:
    `defines_unused`); else why not (prepending the header could change what the source means)."""
    seen: set[str] = set()
    defines: list[str] = []

    def walk(path: str, depth: int) -> str | bool | None:
        """True: the header was reached; None: not here; a text: stopped (why)."""
        if depth > 20 or path in seen:
            return None
        seen.add(path)
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                lines = f.read(1 << 20).splitlines()
        except OSError:
            return None
        in_comment = continued = False
        guard = _guard(lines)
        for number, line in enumerate(lines):
            if number in guard:  # #ifndef X / #define X of an include guard: its #endif is at the end
                continue
            if continued:  # a #define's next line
                continued = line.rstrip().endswith("\\")
                continue
            if in_comment:
                in_comment = "*/" not in line
                continue
            if line.strip().startswith("/*"):
                in_comment = "*/" not in line
                continue
            if m := _DEFINE.match(line):
                defines.append(m.group(2))
                continued = line.rstrip().endswith("\\")
                continue
            m = _INCLUDE.match(line)
            if m:
                name = m.group(2)
                if name == header:
                    return True
                for folder in ([os.path.dirname(path)] if m.group(1) == '"' else []) + [
                    d for d in includes if _under(d, within) or d == within
                ]:
                    candidate = os.path.join(folder, name)
                    if os.path.isfile(candidate):
                        found = walk(candidate, depth + 1)
                        if found is not None:
                            return found
                        break
                continue
            if not _HARMLESS.match(line):
                return f"{os.path.basename(path)} has code before {header} ({line.strip()[:60]!r})"
        return None

    found = walk(source, 0)
    if found is True:
        return Reach(None, tuple(dict.fromkeys(defines)))
    return Reach(found if isinstance(found, str) else f"it does not include {header}")


def dependencies(text: str) -> list[str]:
    """The files of a make rule gcc wrote with -MD (`target: a b \\` lines)."""
    _, _, body = text.replace("\\\n", " ").partition(": ")
    return [p for p in body.split() if p != "\\"]


def host_paths(here: str, paths: Sequence[str]) -> list[str]:
    """Paths as the compiler in the root saw them, as this host sees them: a folder bound into the root
    is the host's own (binds), anything else is in the root's folder."""
    try:
        binds = Path(here, "binds").read_text().split("\n")
        root = Path(here, "root").read_text().strip()
    except OSError:
        return list(paths)
    bound = [b for b in binds if b]
    return [p if any(p == b or _under(p, b) for b in bound) else root + os.path.normpath(p) for p in paths]


def _guard(lines: Sequence[str]) -> set[int]:
    """The line numbers of a header's include guard (`#ifndef X` then `#define X` before anything but
    comments and blank lines), or none."""
    code = [(i, line.strip()) for i, line in enumerate(lines) if line.strip() and not line.strip().startswith("//")]
    if len(code) >= 2 and (m := re.match(r"#\s*ifndef\s+(\w+)$", code[0][1])):
        if re.match(rf"#\s*define\s+{m.group(1)}$", code[1][1]):
            return {code[0][0], code[1][0]}
    return set()


def defines_unused(names: Sequence[str], headers: Sequence[str]) -> str | None:
    """None where no file the header was made from mentions any of `names` (a macro the source
    defines before it, which the header, included first, would not see); else the first that does."""
    if not names:
        return None
    pattern = re.compile(r"\b(" + "|".join(re.escape(n) for n in names) + r")\b")
    for path in headers:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                if m := pattern.search(f.read()):
                    return f"{m.group(1)}, defined before {HEADER}, is used in {path}"
        except OSError:
            return f"cannot read {path}, one of the header's files"
    return None


def key(flags: Sequence[str], compiler: str, root_identity: str, torch_identity: str) -> str:
    """The header's key: the compiler of which root, torch's headers, and every flag of the set."""
    data = {"schema": SCHEMA, "compiler": compiler, "root": root_identity, "torch": torch_identity,
            "header": HEADER, "flags": list(flags)}  # fmt: skip
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:24]


def torch_identity(includes: Sequence[str]) -> str:
    """torch's headers, by the files that say which build they are (version and configuration)."""
    digest = hashlib.sha256()
    for folder in includes:
        for rel in ("torch/csrc/api/include/torch/version.h", "torch/version.h", "ATen/Config.h", HEADER):
            path = os.path.join(folder, rel)
            if os.path.isfile(path):
                digest.update(f"{path}\n".encode())
                with open(path, "rb") as f:
                    digest.update(f.read(1 << 20))
    return digest.hexdigest()[:24]


# ---------------------------------------------------------------- the cache (builder process and front)


@dataclass(frozen=True)
class HeaderRecord:
    key: str
    size: int
    sha256: str
    seconds: float
    made_at: str
    flags: tuple[str, ...]
    headers: tuple[str, ...]  # every file it was made from, as the host sees it (gcc's -MD list)

    def to_json(self) -> str:
        return json.dumps({"schema": SCHEMA, "kind": "precompiled header", "key": self.key, "size": self.size,
                           "sha256": self.sha256, "seconds": self.seconds, "made_at": self.made_at,
                           "flags": list(self.flags), "headers": list(self.headers)}, indent=2,
                          sort_keys=True) + "\n"  # fmt: skip


def read_record(folder: Path) -> HeaderRecord:
    """The signed record of the header in `folder` (ManifestError, TrustError or OSError otherwise)."""
    from builder import signing
    from builder.node import SHA256_RE, Fields, read_bounded

    text = read_bounded(folder / RECORD, "report")
    signing.check_unit(text, read_bounded(folder / SIGNATURE, "signature"), str(folder / SIGNATURE))
    f = Fields(json.loads(text), str(folder / RECORD))
    if f.get("schema", int) != SCHEMA or f.get("kind", str) != "precompiled header":
        raise f.fail("kind", "is not a precompiled header's record")
    return HeaderRecord(f.get("key", str), f.get("size", int), f.text("sha256", SHA256_RE),
                        float(f.get("seconds", (int, float))), f.get("made_at", str),
                        tuple(f.texts("flags", re.compile(r"^-.{0,4000}$"))),
                        tuple(f.texts("headers", re.compile(r"^/.{0,4000}$"))))  # fmt: skip


def cache_bytes(cache: Path) -> int:
    """What the headers in the unit cache take on disk."""
    total = 0
    for path in (cache / FOLDER).glob("*/*.gch") if (cache / FOLDER).is_dir() else ():
        try:
            total += path.stat().st_size
        except OSError:
            continue
    return total


@dataclass
class Summary:
    """What the header logs of a build's units say: for the build's summary line."""

    made: list[tuple[str, int, float]]  # (key, bytes, seconds)
    used: int
    skipped: int
    fallbacks: list[str]  # why a compile went on without its header
    rebuilt: list[str] = field(default_factory=list)  # why a header in the cache was made again

    def to_json(self) -> dict[str, Any]:
        return {"summary": self.describe(), "used": self.used, "skipped": self.skipped, "fallbacks": self.fallbacks,
                "made": [{"key": k, "bytes": b, "seconds": s} for k, b, s in self.made],
                "rebuilt": self.rebuilt}  # fmt: skip

    def describe(self) -> str | None:
        if not (self.made or self.used or self.fallbacks or self.rebuilt):
            return None
        made = "; ".join(f"made {k[:12]} ({b / 1e6:.0f} MB in {s:.0f}s)" for k, b, s in self.made) or "none made"
        text = (f"precompiled torch header: {made}; used by {self.used} C++ translation unit(s), "
                f"{self.skipped} without it by design")  # fmt: skip
        if self.rebuilt:
            text += f"; {len(self.rebuilt)} made again, the cache's copy refused: " + " | ".join(self.rebuilt)[:300]
        if self.fallbacks:
            text += f"; {len(self.fallbacks)} compiled WITHOUT it: " + " | ".join(dict.fromkeys(self.fallbacks))[:600]
        return text


def summarize(logs: Sequence[Path]) -> Summary:
    out = Summary([], 0, 0, [])
    for log in logs:
        for event in read_log(log):
            kind = event.get("event")
            if kind == "made":
                out.made.append((str(event.get("key")), int(event.get("bytes", 0)), float(event.get("seconds", 0))))
            elif kind == "used":
                out.used += 1
            elif kind == "skipped":
                out.skipped += 1
            elif kind == "fallback":
                out.fallbacks.append(str(event.get("why", ""))[:300])
            elif kind == "rebuilt":
                out.rebuilt.append(str(event.get("why", ""))[:300])
    return out


def read_log(log: Path) -> Iterator[dict[str, Any]]:
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            yield event


def environment(cache: Path, units: Path) -> dict[str, str]:
    """The variables that turn the header on for the units' compiles (read by `enter` and `front`;
    each unit adds its own LOG_ENV)."""
    home = str(Path(__file__).resolve().parents[2])
    return {PCH_ENV: str(cache / FOLDER), UNITS_ENV: str(units), "DS_BUILDER_PCH_PYTHON": sys.executable,
            "DS_BUILDER_PCH_HOME": home}  # fmt: skip


# ---------------------------------------------------------------- the front (runs as each compile)


def _log(event: str, **fields: Any) -> None:
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    line = json.dumps({"event": event, **fields}, sort_keys=True) + "\n"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError:
        pass


def _compiler(enter: str, tool: str, args: Sequence[str]) -> list[str]:
    return ["/bin/sh", enter, tool, *args]


def front(here: str, tool: str, args: Sequence[str]) -> int:
    """Compile `args` with `tool` through `enter`, with the flag set's header where it applies (see
    the module). The compiler's own output and exit status are the compile's. The front is the
    compile itself, its streams the compiler's: it starts the compiler directly (not cmd.run, which
    prints)."""
    enter = os.path.join(here, "enter")
    os.environ["DS_BUILDER_PCH_FRONT"] = "1"  # `enter` runs the tool itself from here on
    units = os.environ.get(UNITS_ENV, "")
    compile_ = parse(args, units)
    if compile_ is None:
        return subprocess.call(_compiler(enter, tool, args))
    reach = reaches_header(compile_.source, compile_.includes, units)
    if reach.why:
        _log("skipped", source=os.path.basename(compile_.source), why=reach.why)
        return subprocess.call(_compiler(enter, tool, args))
    try:
        folder = _header(here, tool, compile_)
        if why := _defines_checked(here, folder, reach.defines):
            _log("skipped", source=os.path.basename(compile_.source), why=why)
            return subprocess.call(_compiler(enter, tool, args))
    except _Unwanted:
        _log("skipped", source=os.path.basename(compile_.source),
             why=f"fewer than {MIN_SOURCES} C++ sources of its flag set in this build: not made")  # fmt: skip
        return subprocess.call(_compiler(enter, tool, args))
    except _NoHeader as exc:
        _log("fallback", source=os.path.basename(compile_.source), why=str(exc))
        return subprocess.call(_compiler(enter, tool, args))
    stub = str(folder / STUB)
    done = subprocess.run(_compiler(enter, tool, ["-include", stub, "-Winvalid-pch", "-Werror=invalid-pch", *args]),
                          stderr=subprocess.PIPE)  # fmt: skip
    said = done.stderr.decode("utf-8", "replace")
    if done.returncode != 0 and ("invalid-pch" in said or "precompiled header" in said or STUB in said):
        first = next((line for line in said.splitlines() if "pch" in line or STUB in line), said[:200])
        _log("fallback", source=os.path.basename(compile_.source), why=f"gcc refused the header: {first.strip()}")
        return subprocess.call(_compiler(enter, tool, args))
    os.write(2, done.stderr)  # the compiler's own warnings, as it wrote them
    if done.returncode == 0:
        _log("used", source=os.path.basename(compile_.source), key=folder.name)
    return done.returncode


def _defines_checked(here: str, folder: Path, names: Sequence[str]) -> str | None:
    """defines_unused for the header in `folder`, remembered by this build for these names."""
    if not names:
        return None
    stamp = Path(here) / "pch-checked" / f"{folder.name}.{hashlib.sha256(' '.join(names).encode()).hexdigest()[:16]}"
    if stamp.is_file():
        return stamp.read_text() or None
    try:
        why = defines_unused(names, read_record(folder).headers)
    except Exception as exc:  # the record was checked a moment ago: changed since
        raise _NoHeader(f"its record cannot be read again ({getattr(exc, 'message', exc)})") from exc
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(why or "")
    return why


class _NoHeader(Exception):
    """The header could not be had (made, stored or trusted): the compile goes on without it, logged."""


class _Unwanted(Exception):
    """No usable header, and this build makes none (one source only): compiled without, by design."""


def _header(here: str, tool: str, compile_: Compile) -> Path:
    """The checked header folder of this compile's flag set, made under the cache's lock if needed."""
    cache = Path(os.environ[PCH_ENV])
    try:
        facts = json.loads(Path(here, "root.json").read_text())
    except (OSError, ValueError) as exc:
        raise _NoHeader(f"cannot read the root's facts in {here}: {exc}") from exc
    k = key(compile_.flags, tool, str(facts.get("identity")), torch_identity(compile_.includes))
    folder = cache / k
    stamp = Path(here) / "pch-checked" / k  # this build checked it: by inode and times, not hashed again
    if _stamped(stamp, folder):
        return folder
    from builder.errors import BuilderError
    from builder.files import lock, make_dirs

    try:
        make_dirs(cache)
        with lock(cache / f".{k}.lock"):
            why = _check(folder, k)
            if why:
                if os.environ.get(MAKE_ENV) == "0":
                    raise _Unwanted(why)
                if (folder / RECORD).exists() or (folder / f"{STUB}.gch").exists():
                    _log("rebuilt", key=k, why=why)
                _make(here, tool, compile_, folder, k)
                if why := _check(folder, k):
                    raise _NoHeader(f"the header just made does not check: {why}")
    except OSError as exc:
        raise _NoHeader(f"cannot make the precompiled header in {cache}: {exc.strerror or exc}") from exc
    except BuilderError as exc:  # the signing key cannot sign
        raise _NoHeader(f"cannot sign the precompiled header: {exc.message}") from exc
    _stamp(stamp, folder)
    return folder


def _identity(folder: Path) -> str:
    """The header's .gch and record as files (device, inode, size, times): any replacement changes it."""
    out = []
    for path in (folder / f"{STUB}.gch", folder / RECORD):
        st = path.stat()
        out.append(f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}")
    return " ".join(out)


def _stamped(stamp: Path, folder: Path) -> bool:
    try:
        return stamp.read_text() == _identity(folder)
    except OSError:
        return False


def _stamp(stamp: Path, folder: Path) -> None:
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(_identity(folder))


def _check(folder: Path, k: str) -> str | None:
    """Why the header in `folder` may not be used (None: it may): its record signed by a key this host
    trusts, naming this key, and the .gch of the record's size and sha256, the stub as made."""
    from builder.files import sha256_of

    try:
        record = read_record(folder)
    except Exception as exc:  # any unreadable, unsigned or odd record: made again
        return f"its record is not one this host trusts ({getattr(exc, 'message', exc)})"
    gch = folder / f"{STUB}.gch"
    if record.key != k:
        return f"its record is for {record.key}"
    try:
        if gch.is_symlink() or gch.stat().st_size != record.size or sha256_of(gch) != record.sha256:
            return "its .gch is not the one its record names (truncated or replaced)"
        if (folder / STUB).read_text() != _stub_text(k):
            return f"its {STUB} was changed"
    except OSError as exc:
        return f"cannot read it ({exc.strerror or exc})"
    return None


def _stub_text(k: str) -> str:
    return (f'#error "ds-builder: precompiled header {k} was not used (it does not fit this compile); the unit\'s '
            'header log says why"\n')  # fmt: skip


def _make(here: str, tool: str, compile_: Compile, folder: Path, k: str) -> None:
    """Make the header into a new folder, then swap it in (a reader sees a whole header or none)."""
    from builder import signing
    from builder.files import folder_mode, sha256_of, sweep_dead

    # The folder a cluster shares: named for this host and process, so what a builder killed with -9 left
    # is swept by the next one on the same host (a live one's, or another host's, never).
    mine = f".{k}.{socket.gethostname()}."
    sweep_dead(folder.parent, mine)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f"{mine}{os.getpid()}-", suffix=".tmp"))
    try:
        (tmp / "source.h").write_text(f"#include <{HEADER}>\n")
        (tmp / STUB).write_text(_stub_text(k))
        start = time.monotonic()
        done = subprocess.run(_compiler(os.path.join(here, "enter"), tool, [*compile_.flags, "-MD", "-MF",
                              str(tmp / "deps.d"), "-x", "c++-header", str(tmp / "source.h"), "-o",
                              str(tmp / f"{STUB}.gch")]), capture_output=True, text=True)  # fmt: skip
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines() or ["no output"]
            said = next((line for line in lines if "error" in line), lines[-1])[:300]
            raise _NoHeader(f"the compiler could not make the header: {said}")
        seconds = round(time.monotonic() - start, 1)
        gch = tmp / f"{STUB}.gch"
        headers = host_paths(here, dependencies((tmp / "deps.d").read_text(encoding="utf-8", errors="replace")))
        record = HeaderRecord(k, gch.stat().st_size, sha256_of(gch), seconds,
                              datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                              compile_.flags, tuple(h for h in headers if not h.startswith(str(tmp))))  # fmt: skip
        text = record.to_json()
        (tmp / RECORD).write_text(text)
        (tmp / SIGNATURE).write_bytes(signing.seal_unit(text.encode()))
        (tmp / "source.h").unlink()
        (tmp / "deps.d").unlink()
        for path in tmp.iterdir():
            os.chmod(path, 0o644)
        os.chmod(tmp, folder_mode(folder.parent))
        if folder.exists() or folder.is_symlink():
            shutil.rmtree(folder) if folder.is_dir() and not folder.is_symlink() else folder.unlink()
        tmp.rename(folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _log("made", key=k, bytes=record.size, seconds=seconds)


def main(argv: Sequence[str] | None = None) -> int:
    """`enter`'s call: HERE TOOL ARGS... SIGTERM and SIGHUP (Slurm and `timeout` signal the whole group,
    twice) unwind it, so a header half made is removed, not left in the unit cache a cluster shares."""
    import signal

    def unwind(signum: int, frame: object) -> None:
        del frame
        for each in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(each, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    for each in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(each, unwind)
    args = list(sys.argv[1:] if argv is None else argv)
    return front(args[0], args[1], args[2:])


if __name__ == "__main__":
    sys.exit(main())
