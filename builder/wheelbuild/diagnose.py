"""Read a failed build's output and say which op failed and why, in the compiler's own words.

DeepSpeed's build prints thousands of lines; the user needs the op whose sources failed and the
first error lines, not "read the log". Pure functions over the log text, tested on captured output.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from builder.wheelbuild.ops import OpInfo

# ninja: "FAILED: [code=255] /abs/build/temp.../csrc/fp_quantizer/fp_quantize_impl.o" (older: no [code=N])
_FAILED = re.compile(r"^FAILED: (?:\[code=\d+\] )?(\S+?)\.o\b")
# nvcc: "csrc/x.cu(234): error: ..."; gcc/clang: "/abs/csrc/x.cpp:12:5: error: ..." / "fatal error: ..."
_ERROR = re.compile(r"^(?P<file>\S+?)(?:\((?P<line>\d+)\)|:(?P<gline>\d+)(?::\d+)?):\s+(?:fatal )?error\b.*$")
_SOURCE_SUFFIXES = (".cu", ".cpp", ".cc", ".c", ".cxx")
MAX_QUOTED = 6


@dataclass(frozen=True)
class CompileFailure:
    op: str | None  # None when no requested op owns the failing file
    files: tuple[str, ...]
    errors: tuple[str, ...]  # the compiler's first error lines, as printed

    def describe(self) -> str:
        who = f"op {self.op}" if self.op else "a source no requested op lists"
        where = f" ({', '.join(self.files)})" if self.files else ""
        quoted = "\n".join(f"    {e}" for e in self.errors) or "    (no compiler error line found)"
        return f"{who} failed to compile{where}:\n{quoted}"


def _relative(path: str) -> str:
    """csrc/... part of a path (DeepSpeed's sources all live under csrc/)."""
    i = path.find("csrc/")
    return path[i:] if i >= 0 else path


def owner(path: str, ops: Sequence[OpInfo]) -> str | None:
    """The op whose sources include `path` (a source file, or an object file's stem)."""
    rel = _relative(path)
    stem = rel.rsplit(".", 1)[0] if rel.endswith(_SOURCE_SUFFIXES) else rel
    for op in ops:
        for src in op.sources:
            src_rel = _relative(src)
            if src_rel == rel or src_rel.rsplit(".", 1)[0] == stem:
                return op.name
    return None


def find_failures(log: str, ops: Sequence[OpInfo]) -> list[CompileFailure]:
    """Each op whose compile failed, with its failing files and first error lines."""
    lines = log.splitlines()
    failed_objects = [m.group(1) for line in lines if (m := _FAILED.match(line.strip()))]
    errors = [line.strip() for line in lines if _ERROR.match(line.strip())]
    by_op: dict[str | None, tuple[list[str], list[str]]] = {}
    for obj in failed_objects:
        files, _ = by_op.setdefault(owner(obj, ops), ([], []))
        files.append(_relative(obj) + ".o")
    for line in errors:
        m = _ERROR.match(line)
        assert m is not None
        op = owner(m["file"], ops)
        if op is None and len(by_op) == 1:  # an error in a header: the one failing op's
            op = next(iter(by_op))
        _, quoted = by_op.setdefault(op, ([], []))
        if len(quoted) < MAX_QUOTED and line not in quoted:
            quoted.append(line)
    return [
        CompileFailure(op, tuple(dict.fromkeys(f for f in files)), tuple(quoted))
        for op, (files, quoted) in sorted(by_op.items(), key=lambda kv: kv[0] or "~")
    ]


# GNU ld / collect2, as a failed link of an extension prints them:
# "/usr/bin/ld: cannot find -lcurand: No such file or directory", "undefined reference to `cuFileDriverOpen'".
_LINK_ERROR = re.compile(
    r"(?:\bld(?:\.\w+)?: .*(?:cannot find|undefined reference|error)|undefined reference to |collect2: error)"
)


def find_link_errors(log: str) -> list[str]:
    """The linker's first error lines (a link failure is named like a compile failure)."""
    found: list[str] = []
    for line in log.splitlines():
        text = line.strip()
        if _LINK_ERROR.search(text) and text not in found:
            found.append(text)
            if len(found) == MAX_QUOTED:
                break
    return found


# A compiler the kernel killed (its OOM killer, or a cgroup's memory limit), as gcc and nvcc say it:
# "c++: fatal error: Killed signal terminated program cc1plus",
# "g++: internal compiler error: Killed (program cc1plus)", "nvcc error   : 'cicc' died due to signal 9 (Kill signal)".
_KILLED = re.compile(
    r"(?:fatal error: Killed signal terminated program (?P<gcc>\S+)"
    r"|internal compiler error: Killed \(program (?P<ice>[^)\s]+)\)"
    r"|'(?P<nvcc>[^']+)' died due to signal 9)"
)


def find_killed(log: str) -> list[str]:
    """The lines saying the kernel killed a compiler: memory, not the op's source, and never a
    reason to drop the op."""
    return list(dict.fromkeys(line.strip() for line in log.splitlines() if _KILLED.search(line)))[:MAX_QUOTED]
