"""Rewrite a stripped shared object's GNU build-id from its own bytes.

The linker's build-id hashes the whole output, debug sections included, and GCC's debug info is
not byte-stable between two clean builds of the same inputs (measured here: a few dozen bytes
apart while the code was identical). After `strip --strip-debug` that hash names sections that
are gone, and is the one thing that keeps two builds from being bit-identical. Recomputing it
over the stripped file (as debugedit --build-id does for distributions) keeps it unique per
content and makes it reproducible.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

SECTION = ".note.gnu.build-id"


def desc_span(note_offset: int, note: bytes) -> tuple[int, int]:
    """(file offset, length) of the id inside an ELF note: namesz, descsz, type, name, desc."""
    namesz = int.from_bytes(note[0:4], "little")
    descsz = int.from_bytes(note[4:8], "little")
    return note_offset + 12 + (namesz + 3) // 4 * 4, descsz


def content_id(data: bytes, start: int, length: int) -> bytes:
    """A hash of the file with the id itself zeroed, cut or padded to the id's length."""
    blanked = data[:start] + bytes(length) + data[start + length :]
    digest = hashlib.sha1(blanked).digest() if length <= 20 else hashlib.sha256(blanked).digest()
    return digest[:length].ljust(length, b"\0")


def rehash(path: Path) -> bool:
    """Replace the build-id of `path` in place; False when it has none."""
    from elftools.elf.elffile import ELFFile

    with open(path, "rb") as f:
        section = ELFFile(f).get_section_by_name(SECTION)
        if section is None:
            return False
        start, length = desc_span(section["sh_offset"], section.data())
    data = path.read_bytes()
    new = content_id(data, start, length)
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(new)
    return True
