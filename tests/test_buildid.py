"""The build-id rewrite on a real shared object (this machine's libm), not a synthetic ELF."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from builder.wheelbuild.buildid import SECTION, content_id, desc_span, rehash

elffile = pytest.importorskip("elftools.elf.elffile", reason="pyelftools is a builder dependency")
LIBM = Path("/lib/x86_64-linux-gnu/libm.so.6")


def build_id(path: Path) -> tuple[int, bytes]:
    with open(path, "rb") as f:
        section = elffile.ELFFile(f).get_section_by_name(SECTION)
        start, length = desc_span(section["sh_offset"], section.data())
    return start, path.read_bytes()[start : start + length]


def test_desc_span_skips_the_padded_name() -> None:
    note = (4).to_bytes(4, "little") + (20).to_bytes(4, "little") + (3).to_bytes(4, "little") + b"GNU\0" + bytes(20)
    assert desc_span(100, note) == (116, 20)
    odd_name = (5).to_bytes(4, "little") + (8).to_bytes(4, "little") + (3).to_bytes(4, "little") + b"ABCD\0\0\0\0"
    assert desc_span(0, odd_name) == (20, 8)


def test_content_id_ignores_the_old_id() -> None:
    a = b"head" + b"\x11" * 20 + b"tail"
    b = b"head" + b"\x22" * 20 + b"tail"
    assert content_id(a, 4, 20) == content_id(b, 4, 20) == hashlib.sha1(b"head" + bytes(20) + b"tail").digest()
    assert content_id(a, 4, 20) != content_id(b"head" + b"\x11" * 20 + b"tall", 4, 20)
    assert len(content_id(a, 0, 8)) == 8 and len(content_id(bytes(64), 0, 32)) == 32


@pytest.mark.skipif(not LIBM.exists(), reason=f"{LIBM} (a real ELF with a build-id) is not on this machine")
def test_two_copies_differing_only_in_build_id_become_identical(tmp_path: Path) -> None:
    a, b = tmp_path / "a.so", tmp_path / "b.so"
    shutil.copy(LIBM, a)
    shutil.copy(LIBM, b)
    start, old = build_id(b)
    with open(b, "r+b") as f:  # as two clean builds whose debug info differed leave it
        f.seek(start)
        f.write(bytes(x ^ 0xFF for x in old))
    assert a.read_bytes() != b.read_bytes()

    assert rehash(a) and rehash(b)
    assert a.read_bytes() == b.read_bytes()
    _, new = build_id(a)
    assert new != old and len(new) == len(old)
    before = a.read_bytes()
    assert rehash(a) and a.read_bytes() == before  # idempotent


def test_a_file_without_a_build_id_is_left_alone(tmp_path: Path) -> None:
    so = tmp_path / "x.o"
    # The smallest valid ELF header: 64-bit little-endian with no sections.
    header = b"\x7fELF\x02\x01\x01" + bytes(9) + (1).to_bytes(2, "little") + (62).to_bytes(2, "little")
    header += (1).to_bytes(4, "little") + bytes(24) + (0).to_bytes(4, "little") + (64).to_bytes(2, "little")
    header += bytes(12)
    so.write_bytes(header)
    assert rehash(so) is False
    assert so.read_bytes() == header
