"""What a build root is made of, its key, and the scripts that enter it (pure: nothing here touches
the disk or runs a program)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# The toolkit's own root: Debian 11 (glibc 2.31, gcc 10.2.1, libstdc++ up to GLIBCXX_3.4.28). Debian
# 10, whose glibc is 2.28, is gone from the mirrors (404). With `pow` pinned (PINS) its ops need
# GLIBC_2.17 at most, so the wheel's floor is torch's own: manylinux_2_28.
SUITE = "bullseye"
VARIANT = "buildd"  # build-essential: gcc, g++, libc6-dev, make
PACKAGES = ("libaio-dev",)  # async_io's header and library (the wheel then carries libaio itself)
ROOT_SCHEMA = 1
DEFAULT_FLOOR = "manylinux_2_28"

# glibc symbols that have an older version node than the one a newer glibc links by default, and whose
# older version behaves the same for the ops' use. Each is proven by the symbol check after the build
# (glibc.above_floor); nothing else is pinned. pow: GLIBC_2.29 is the same function without the
# SVID error handling (glibc commit 1e5f2ae, "Remove the error handling wrapper from pow").
PINS = (("pow", "GLIBC_2.2.5"),)
# The same symbols for the other machines a root compiles for (aarch64's first glibc, 2.17, has pow).
MACHINE_PINS = {"x86_64": (PINS, "__x86_64__"), "aarch64": ((("pow", "GLIBC_2.17"),), "__aarch64__")}
PINS_PATH = "/.ds-builder/pins.h"  # where the wrappers bind the toolchain folder inside the root


def pins_header(pins: Sequence[tuple[str, str]] = PINS, machine_macro: str = "__x86_64__") -> str:
    """The header the wrappers force-include into every C and C++ translation unit (nvcc's host pass
    too): one .symver per pinned symbol, for the machine's host code only (not device code, not assembly)."""
    lines = [
        "/* ds-builder: glibc symbols pinned to an older version node (builder/buildroot/spec.py PINS). */",
        f"#if defined({machine_macro}) && defined(__GNUC__) && !defined(__CUDA_ARCH__) && !defined(__ASSEMBLER__)",
        *(f'__asm__(".symver {name},{name}@{version}");' for name, version in pins),
        "#endif",
    ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class RootSpec:
    """A root the op units compile in: the toolkit's own (kind "debian", made here), a site's
    folder, or an OCI image (exported into the roots folder by podman)."""

    kind: str  # debian | folder | image
    suite: str = SUITE
    variant: str = VARIANT
    packages: tuple[str, ...] = PACKAGES
    mirror: str = ""
    folder: Path | None = None
    image: str | None = None
    cc: str = "/usr/bin/gcc"  # the compilers, as paths inside the root
    cxx: str = "/usr/bin/g++"

    def describe(self) -> str:
        if self.kind == "folder":
            return f"the root folder {self.folder}"
        if self.kind == "image":
            return f"the image {self.image}"
        return f"Debian {self.suite} ({self.variant}, {', '.join(self.packages)})"


def default_spec(mirror: str) -> RootSpec:
    return RootSpec("debian", mirror=mirror)


def spec_key(spec: RootSpec) -> str:
    """What a made root holds, hashed: its folder name in the roots folder."""
    data = {"schema": ROOT_SCHEMA, "kind": spec.kind, "suite": spec.suite, "variant": spec.variant,
            "packages": sorted(spec.packages), "mirror": spec.mirror, "image": spec.image}  # fmt: skip
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


def root_name(spec: RootSpec, image_id: str | None = None) -> str:
    """The root's folder name in the roots folder (a folder root is used where it is)."""
    if spec.kind == "image":
        return f"image-{(image_id or '')[:16]}"
    return f"build-{spec.suite}-{spec_key(spec)}"


@dataclass(frozen=True)
class RootFacts:
    """What a root is, as recorded once it is made (or read from a site's root): its identity goes
    into the build key, the unit keys and ccache's compiler check (the wrappers' content)."""

    path: Path
    identity: str  # sha256 of what the root holds (its package list, or its compilers and C library)
    glibc: str  # "2.31"
    gcc: str  # "10.2.1"
    describe: str
    cc: str = "/usr/bin/gcc"
    cxx: str = "/usr/bin/g++"

    @property
    def gcc_major(self) -> int:
        return int(self.gcc.split(".")[0])

    def to_json(self) -> dict[str, str]:
        return {"path": str(self.path), "identity": self.identity, "glibc": self.glibc, "gcc": self.gcc,
                "describe": self.describe, "cc": self.cc, "cxx": self.cxx}  # fmt: skip


def identity_of(parts: Iterable[str]) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


# -march levels gcc < 11 does not know by name, spelt out as gcc 11 defines them (x86-64-v2: the
# x86-64 baseline + CX16 SAHF POPCNT SSE3 SSSE3 SSE4.1 SSE4.2; v3 adds AVX AVX2 BMI BMI2 F16C FMA
# LZCNT MOVBE XSAVE; v4 adds AVX-512 F BW CD DQ VL): the same instructions, the same code.
_V2 = ("-mcx16", "-msahf", "-mpopcnt", "-msse3", "-mssse3", "-msse4.1", "-msse4.2")
_V3 = (*_V2, "-mavx", "-mavx2", "-mbmi", "-mbmi2", "-mf16c", "-mfma", "-mlzcnt", "-mmovbe", "-mxsave")
_V4 = (*_V3, "-mavx512f", "-mavx512bw", "-mavx512cd", "-mavx512dq", "-mavx512vl")
MARCH_LEVELS = {"-march=x86-64-v2": _V2, "-march=x86-64-v3": _V3, "-march=x86-64-v4": _V4}


def march_flags(march: str, gcc_major: int) -> str | None:
    """The flags that say `march` to a gcc older than 11 (None: it knows the name)."""
    if gcc_major >= 11 or march not in MARCH_LEVELS:
        return None
    return " ".join(("-march=x86-64", "-mtune=generic", *MARCH_LEVELS[march]))


# System folders that are the root's own: a build folder there is not bound in (the root's would be
# hidden); paths below them that the build needs (a Python's headers, CUDA under /usr/local) are.
_SYSTEM = ("/", "/usr", "/usr/include", "/usr/lib", "/usr/lib64", "/usr/bin", "/usr/local", "/usr/share", "/bin",
           "/sbin", "/lib", "/lib64", "/etc", "/proc", "/sys", "/dev", "/run", "/var", "/opt")  # fmt: skip


def bind_paths(paths: Iterable[str | os.PathLike[str]]) -> tuple[str, ...]:
    """The host folders the compilers must see at the same paths (work and cache folders, the build
    environment, a Python's headers, the CUDA toolkit, the temporary folder): absolute, normalised,
    no system folder itself, and none below another of the list."""
    clean = set()
    for p in paths:
        text = os.path.normpath(str(p))
        if not os.path.isabs(text) or text in _SYSTEM or "\n" in text:
            continue
        clean.add(text)
    return outermost(clean)


def outermost(paths: Iterable[str]) -> tuple[str, ...]:
    """The paths none of the others holds, sorted."""
    clean = set(paths)
    return tuple(sorted(p for p in clean if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in clean)))


def path_list(env: Mapping[str, str], *names: str) -> list[str]:
    """Folders named in PATH-like variables of the build environment (CPATH, LIBRARY_PATH, ...)."""
    return [p for name in names for p in env.get(name, "").split(os.pathsep) if p]


# The scripts the toolchain folder holds (sandbox.write_wrappers writes them). `enter` runs on the
# host: it adds the pins to compiles, then unshares a mount namespace (a user namespace too where not
# root) and runs `inside` there, which overlays the root read-only (its writes land in a tmpfs that
# goes with the namespace), binds the build's folders in, and runs the tool in the root with chroot.
ENTER = r"""#!/bin/sh
# ds-builder: run a tool of the build root named in ./root (see builder/buildroot).
set -eu
here=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd)
tool=$1
shift
pin=
for arg in "$@"; do
  case $arg in
    -c|-E|-S|*.c|*.cc|*.cpp|*.cxx|*.c++|*.C) pin=1 ;;
  esac
done
# A precompiled torch header (builder/units/pch.py): a compile goes through its front once, which
# runs this again with its -include first (gcc takes a header only before any other code: the pins').
if [ -n "$pin" ] && [ "${DS_BUILDER_PCH:-0}" != 0 ] && [ -z "${DS_BUILDER_PCH_FRONT:-}" ]; then
  PYTHONPATH=$DS_BUILDER_PCH_HOME exec "$DS_BUILDER_PCH_PYTHON" -m builder.units.pch "$here" "$tool" "$@"
fi
if [ -n "$pin" ]; then
  case "$1 ${2:-}" in
    "-include "*/ds-torch.h)
      header=$2
      shift 2
      set -- -include "$header" -include /.ds-builder/pins.h "$@" ;;
    *) set -- -include /.ds-builder/pins.h "$@" ;;
  esac
fi
if [ "$(id -u)" = 0 ]; then
  exec unshare --mount --propagation private -- /bin/sh "$here/inside" "$here" "$PWD" "$tool" "$@"
fi
exec unshare --user --map-root-user --mount --propagation private -- /bin/sh "$here/inside" "$here" "$PWD" "$tool" "$@"
"""

INSIDE = r"""#!/bin/sh
# ds-builder: in a private mount namespace, the build root overlaid read-only, the build's folders
# bound in at the same paths, the tool run in it (see builder/buildroot).
set -eu
PATH=$PATH:/usr/sbin:/sbin  # chroot is there, and a plain user's PATH on Debian has no sbin
here=$1 cwd=$2 tool=$3
shift 3
root=$(cat "$here/root")
mnt=$here/mnt
mount -t tmpfs -o mode=0755 ds-build-root "$mnt"
mkdir "$mnt/upper" "$mnt/work" "$mnt/root" "$mnt/skel"
# The mount points the build needs, in a layer of their own above the root: a root another user owns (an
# administrator's) cannot be written in this user's namespace, not even through the overlay.
mkdir -p "$mnt/skel/.ds-builder" "$mnt/skel/dev" "$mnt/skel/proc"
while IFS= read -r path; do
  [ -d "$path" ] || continue
  mkdir -p "$mnt/skel$path"
done < "$here/binds"
mount -t overlay -o "lowerdir=$mnt/skel:$root,upperdir=$mnt/upper,workdir=$mnt/work" ds-build-root "$mnt/root"
while read -r mode path; do
  [ -d "$mnt/root$path" ] || continue
  mount -t tmpfs -o "mode=$mode" ds-build-scratch "$mnt/root$path"
done < "$here/covers"
while IFS= read -r path; do
  [ -d "$path" ] || continue
  mkdir -p "$mnt/root$path"
  mount --rbind "$path" "$mnt/root$path"
done < "$here/binds"
mkdir -p "$mnt/root/.ds-builder" "$mnt/root/dev" "$mnt/root/proc"
mount --bind "$here" "$mnt/root/.ds-builder"
mount --rbind /dev "$mnt/root/dev"
mount --rbind /proc "$mnt/root/proc"
# The caller's folder where the root sees it (a build folder); else / (a tool run from a folder the
# build does not bind, such as the toolkit's checkout, with absolute paths only).
exec chroot "$mnt/root" /usr/bin/env -u LD_LIBRARY_PATH -u LD_PRELOAD PATH=/usr/local/bin:/usr/bin:/bin \
  /bin/sh -c '{ cd "$1" 2>/dev/null || cd /; } && shift && exec "$@"' sh "$cwd" "$tool" "$@"
"""


def tool_wrapper(tool: str, facts: RootFacts, pins: str) -> str:
    """One compiler's wrapper: its content names the root's identity and the pins' hash, so ccache
    (compiler_check = content) never takes an object made by another root or other pins."""
    pins_sha = hashlib.sha256(pins.encode()).hexdigest()[:16]
    return (
        "#!/bin/sh\n"
        f"# ds-builder: {tool} of build root {facts.identity} ({facts.describe}; gcc {facts.gcc}, "
        f"glibc {facts.glibc}); "
        f"pins {pins_sha}\n"
        f'exec "$(dirname -- "$0")/enter" {tool} "$@"\n'
    )


def wrapper_files(facts: RootFacts, binds: Sequence[str], pins: str | None = None,
                  covers: Sequence[str] = ()) -> dict[str, tuple[str, int]]:  # fmt: skip
    """The files of a toolchain folder that enters a root, name -> (content, mode): decided here, written
    by sandbox."""
    pins = pins if pins is not None else pins_header()
    files: dict[str, tuple[str, int]] = {
        "enter": (ENTER, 0o755),
        "inside": (INSIDE, 0o644),
        "root": (f"{facts.path}\n", 0o644),
        "binds": ("".join(f"{b}\n" for b in binds), 0o644),
        "covers": ("".join(f"{c}\n" for c in covers), 0o644),
        "pins.h": (pins, 0o644),
        "root.json": (json.dumps(facts.to_json(), indent=2, sort_keys=True) + "\n", 0o644),
    }
    for name, tool in (("gcc", facts.cc), ("cc", facts.cc), ("g++", facts.cxx), ("c++", facts.cxx)):
        files[name] = (tool_wrapper(tool, facts, pins), 0o755)
    # binutils' strip beside the C compiler (aarch64-linux-gnu-strip for a cross root): the host's knows only
    # the host's objects
    files["strip"] = (tool_wrapper(facts.cc[: facts.cc.rindex("gcc")] + "strip" if "gcc" in facts.cc
                                   else "/usr/bin/strip", facts, pins), 0o755)  # fmt: skip
    return files
