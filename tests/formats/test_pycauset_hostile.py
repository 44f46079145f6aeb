"""PyCauset under hostile input: truncation at every offset, bit flips, fuzzed bytes."""

from __future__ import annotations

import functools
import struct
import tempfile
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snapops.formats import pycauset as pc
from snapops.formats.errors import (DataError, FormatError, TruncatedError)

from .test_pycauset import (  # noqa: F401  (shared helpers, not tests)
    PREAMBLE, SLOT, _fields, values, arrays_of, frame, matrix_file, parse, put_slot, slots, with_metadata, write,
)


# ---- truncation, bit flips, hostile input --------------------------------------------------------

def test_truncation_at_every_offset(tmp_path):
    data = matrix_file(tmp_path).read_bytes()
    for cut in range(len(data)):
        with pytest.raises(FormatError, match=r"\[(preamble|slots|truncated)\]"):
            parse(data[:cut])
    (tmp_path / "t.pycauset").write_bytes(data[:5000 % len(data)])
    with pytest.raises(FormatError, match=r"\[truncated\] file shorter than the 4096\-byte"):
        pc.load(tmp_path / "t.pycauset")
    (tmp_path / "e.pycauset").write_bytes(b"")
    with pytest.raises(TruncatedError, match=r"\[truncated\] empty file"):
        pc.load(tmp_path / "e.pycauset")


def test_bit_flips_in_header_and_metadata(tmp_path):
    data = matrix_file(tmp_path).read_bytes()
    good = arrays_of(data)["w"]
    m_off = _fields(data, "A")[3]
    for i in [*range(0, 272), *range(m_off, len(data))]:
        flipped = bytearray(data)
        flipped[i] ^= 0x01
        try:
            c = parse(bytes(flipped))
        except FormatError:
            continue
        # the only harmless flips are in a slot: CRC32 catches every 1-bit error, the slot is
        # dropped, and the other slot (same pointers in a fresh file) takes over
        assert 16 <= i < 272, i
        assert c.active.name == ("A" if i >= 144 else "B")
        assert (c.entries[0].materialize(bytes(flipped), 4096) == good).all()


HEADER_START = struct.pack(PREAMBLE, b"PYCAUSET", 1, 1, 4096, 0)


@settings(max_examples=300)
@given(st.binary(max_size=6000) | st.binary(max_size=6000).map(lambda b: HEADER_START + b))
def test_any_bytes_give_a_snapshot_or_a_typed_error(data):
    try:
        c = parse(data)
    except FormatError:
        return
    for e in c.entries:
        e.materialize(data, c.payload_offset)


@functools.cache
def _seed_file() -> bytes:
    """Two arrays (snapops.arrays/v1) after one metadata update: two blocks, slot B active."""
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "s.pycauset"
        pc.save({"a": np.arange(6, dtype=np.int16).reshape(2, 3), "b": np.ones(3, bool)}, p)
        pc.update_metadata(p, {"provenance": {"k": [1, "x"]}})
        return p.read_bytes()


@settings(max_examples=300)
@given(st.lists(st.tuples(st.integers(0, 272) | st.integers(4096, 6000),
                          st.binary(min_size=1, max_size=8)), min_size=1, max_size=4),
       st.booleans())
def test_mutated_files_give_typed_errors(edits, fix_crcs):
    data = bytearray(_seed_file())
    for at, blob in edits:                            # the slots, the payload, the blocks
        at %= len(data)
        data[at:at + len(blob)] = blob[:len(data) - at]
    if fix_crcs:                                      # get past the CRCs to the deeper checks
        for name, at in (("A", 16), ("B", 144)):
            fields = struct.unpack_from("<7Q", data, at)
            struct.pack_into("<I", data, at + 56, zlib.crc32(struct.pack("<7Q", *fields)))
            m_off, m_len = fields[3], fields[4]
            if m_off + 32 <= len(data) and m_len >= 32 and m_off + m_len <= len(data):
                body = bytes(data[m_off + 32:m_off + m_len])
                struct.pack_into("<I", data, m_off + 24, zlib.crc32(body))
    test_any_bytes_give_a_snapshot_or_a_typed_error.hypothesis.inner_test(bytes(data))


@settings(max_examples=200)
@given(st.dictionaries(st.sampled_from(["rows", "cols", "matrix_type", "data_type", "view",
                                        "payload_layout", "x"]), values, max_size=4))
def test_hostile_metadata_gives_typed_errors(changes):
    data = _seed_file()
    meta = dict(parse(data).meta)
    meta.update(changes)
    try:
        test_any_bytes_give_a_snapshot_or_a_typed_error.hypothesis.inner_test(
            with_metadata(data, meta))
    except DataError:
        pass


def test_absurd_lengths_bounded_memory(tmp_path):
    data = matrix_file(tmp_path).read_bytes()
    cases = []
    # a metadata map declaring 2**32-1 entries, inside a block whose CRC is right
    body = b"\x08\xff\xff\xff\xff" + bytes(64)
    a = _fields(data, "A")
    out = bytearray(data[:a[3]]) + frame(body)
    put_slot(out, "A", (1, a[1], a[2], a[3], 32 + len(body), 0, 0))
    cases.append(bytes(out))
    # a string claiming 4 GiB
    body = b"\x08\x01\x00\x00\x00\x01\x00a\x05\xff\xff\xff\xff" + bytes(8)
    out = bytearray(data[:a[3]]) + frame(body)
    put_slot(out, "A", (1, a[1], a[2], a[3], 32 + len(body), 0, 0))
    cases.append(bytes(out))
    # slots claiming exabyte payloads and metadata
    out = bytearray(data)
    put_slot(out, "A", (1, 4096, 1 << 62, a[3], a[4], 0, 0))
    put_slot(out, "B", (2, 4096, a[2], 1 << 60, 1 << 62, 0, 0))
    cases.append(bytes(out))
    for case in cases:
        tracemalloc.start()
        try:
            with pytest.raises(FormatError, match=r"\[(limit|metadata|slots)\] .*(declares|runs "
                                                  r"past|no valid header slot)"):
                parse(case)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 64 << 10
