"""CUDA architectures: the names people write, the one form torch wants, and what a .so really holds.

`normalize` accepts "9.0", "sm_90", "90", "compute_90", "9.0+PTX", "9.0a", "sm_90a" and torch's
names ("Hopper") and returns torch's TORCH_CUDA_ARCH_LIST spelling. `fatbin_archs` reads the
.nv_fatbin section of a shared object (the fallback for machines without cuobjdump, such as this
toolkit with only nvcc) and lists the SASS and PTX code it carries.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from builder.errors import RecipeError

# torch.utils.cpp_extension's named architectures (the ones still buildable by CUDA 11.8+).
NAMED = {
    "maxwell": ("5.0", "5.2+PTX"),
    "pascal": ("6.0", "6.1+PTX"),
    "volta": ("7.0+PTX",),
    "turing": ("7.5+PTX",),
    "ampere": ("8.0", "8.6+PTX"),
    "ada": ("8.9+PTX",),
    "hopper": ("9.0+PTX",),
    "blackwell": ("10.0", "12.0+PTX"),
}
_FORMS = re.compile(r"^(?:sm_|compute_)?(\d{1,2})\.?(\d)([af]?)(\+ptx)?$", re.IGNORECASE)
KNOWN_MAJORS = range(3, 13)
# Every compute capability NVIDIA has shipped a GPU with (nvcc --list-gpu-arch of CUDA 11.8 to 13.0,
# plus Jetson parts); a recipe naming anything else (sm_99) is refused when it is loaded, before
# any download. Whether the chosen nvcc still targets it is checked again once it is known.
COMPUTE_CAPABILITIES = (
    "3.0", "3.2", "3.5", "3.7", "5.0", "5.2", "5.3", "6.0", "6.1", "6.2", "7.0", "7.2", "7.5",
    "8.0", "8.6", "8.7", "8.8", "8.9", "9.0", "10.0", "10.1", "10.3", "11.0", "12.0", "12.1",
)  # fmt: skip
ARCH_SPECIFIC = ("9.0", "10.0", "10.1", "10.3", "11.0", "12.0", "12.1")  # sm_90a ...
FAMILY_SPECIFIC = ("10.0", "10.1", "10.3", "11.0", "12.0", "12.1")  # sm_100f ... (CUDA 12.9+)
FATBIN_MAGIC = 0xBA55ED50


def normalize(text: str) -> tuple[str, ...]:
    """One user-written arch as torch's TORCH_CUDA_ARCH_LIST entries; RecipeError for nonsense."""
    word = text.strip()
    if word.lower() in NAMED:
        return NAMED[word.lower()]
    m = _FORMS.match(word.replace(" ", ""))
    if not m or int(m.group(1)) not in KNOWN_MAJORS:
        raise RecipeError(
            f'"{text}" is not a CUDA architecture',
            'write a compute capability such as "9.0", "sm_90", "90", "9.0+PTX", "9.0a" or a name such as "Hopper"',
        )
    major, minor, suffix, ptx = m.groups()
    base = f"{int(major)}.{minor}"
    if base not in COMPUTE_CAPABILITIES:
        raise RecipeError(
            f'"{text}" is not a CUDA architecture: no GPU has compute capability {base}',
            f"use one of {', '.join(COMPUTE_CAPABILITIES)} (e.g. 8.0 for A100, 9.0 for H100)",
        )
    if suffix and base not in (ARCH_SPECIFIC if suffix.lower() == "a" else FAMILY_SPECIFIC):
        raise RecipeError(
            f'"{text}": nvcc has no {suffix.lower()}-variant for compute capability {base}',
            f"drop the '{suffix}', or use one of {', '.join(a + suffix.lower() for a in ARCH_SPECIFIC)}"
            if suffix.lower() == "a"
            else f"drop the 'f', or use one of {', '.join(a + 'f' for a in FAMILY_SPECIFIC)}",
        )
    return (f"{base}{suffix.lower()}{'+PTX' if ptx else ''}",)


def normalize_all(items: Iterable[str]) -> tuple[str, ...]:
    """Normalised, deduplicated, sorted by capability."""
    out = {a for item in items for a in normalize(item)}
    return tuple(sorted(out, key=_key))


def gpu_of(arch: str) -> str:
    """The GPU an arch runs on, as a compute capability: '9.0a' and '9.0+PTX' -> '9.0'."""
    return arch.split("+")[0].rstrip("af")


def _key(arch: str) -> tuple[int, int, str]:
    base = sm(arch)
    return (base // 10, base % 10, arch)


def sm(arch: str) -> int:
    """'9.0+PTX' -> 90."""
    major, minor = arch.split("+")[0].rstrip("af").split(".")
    return int(major) * 10 + int(minor)


def label(archs: Iterable[str]) -> str:
    """The version-label part: sm80.sm90, sm90a, sm90ptx."""
    parts = []
    for a in archs:
        base = a.split("+")[0].replace(".", "")
        parts.append(f"sm{base}{'ptx' if a.endswith('+PTX') else ''}")
    return ".".join(parts)


@dataclass(frozen=True)
class FatbinCode:
    kind: str  # "sass" | "ptx"
    sm: int


FATBIN_COMPRESSED = 0x8000  # entry flag (u64 at +40) nvcc 13.0 sets for -Xfatbin -compress-all


def fatbin_entries(data: bytes) -> Iterator[tuple[int, int, int]]:
    """(kind, arch, flags) of every code entry of a .nv_fatbin section (one or more concatenated
    fat binaries); kind 1 is PTX, 2 ELF (SASS).

    Layout (as produced by nvcc, checked against this machine's CUDA 13.0): a 16-byte header
    <magic u32, version u16, header size u16, payload size u64>, then entries whose header holds
    <kind u16, version u16, header size u32, payload size u64, ..., arch u32 at +28, flags u64 at +40>.
    """
    off = 0
    while off + 16 <= len(data):
        magic, _, header, size = struct.unpack_from("<IHHQ", data, off)
        if magic != FATBIN_MAGIC:
            off += 8  # fat binaries are 8-byte aligned; skip padding
            continue
        pos, end = off + header, off + header + size
        while pos + 32 <= end:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, pos)
            (arch,) = struct.unpack_from("<I", data, pos + 28)
            flags = struct.unpack_from("<Q", data, pos + 40)[0] if pos + 48 <= end else 0
            if kind in (1, 2):
                yield kind, arch, flags
            if entry_header == 0:
                break
            pos += entry_header + payload
        off = end


def parse_fatbin(data: bytes) -> set[FatbinCode]:
    """The code entries of a .nv_fatbin section."""
    return {FatbinCode("ptx" if kind == 1 else "sass", arch) for kind, arch, _ in fatbin_entries(data)}


def fatbin_compressed(data: bytes) -> bool:
    """Whether every code entry of a .nv_fatbin section is compressed (False if it has none)."""
    flags = [bool(f & FATBIN_COMPRESSED) for _, _, f in fatbin_entries(data)]
    return bool(flags) and all(flags)


def so_compressed(path: Path) -> bool:
    """Whether a shared object's device code is compressed (False where it has none)."""
    from elftools.elf.elffile import ELFFile

    with open(path, "rb") as f:
        section = ELFFile(f).get_section_by_name(".nv_fatbin")
        return fatbin_compressed(section.data()) if section is not None else False


def so_archs(path: Path) -> set[FatbinCode]:
    """Device code in a shared object, read from its ELF .nv_fatbin section (empty if none)."""
    from elftools.elf.elffile import ELFFile

    with open(path, "rb") as f:
        section = ELFFile(f).get_section_by_name(".nv_fatbin")
        return parse_fatbin(section.data()) if section is not None else set()


def missing_archs(found: set[FatbinCode], wanted: Iterable[str]) -> list[str]:
    """Requested archs with no SASS in `found` (and, for +PTX, no PTX)."""
    missing = []
    for arch in wanted:
        if FatbinCode("sass", sm(arch)) not in found:
            missing.append(arch)
        elif arch.endswith("+PTX") and FatbinCode("ptx", sm(arch)) not in found:
            missing.append(arch)
    return missing
