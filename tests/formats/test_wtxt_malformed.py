"""Bad WTXT input gets a typed FormatError naming the line — never a crash, hang or a huge
allocation; and any byte string yields a snapshot or a FormatError (property test)."""

from __future__ import annotations

import io
import resource

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snapops.formats import wtxt
from snapops.formats.errors import DataError, FormatError, LimitError, TruncatedError
from snapops.formats.wtxt._parse import Checks, parse_stream
from tests.conftest import sample_state

TS = "2026-01-02T03:04:05Z"


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("m") / "good.wtxt"
    wtxt.save(sample_state(), path, gen=3, ts=TS, row_blocking=True, audit="n=1")
    return path.read_bytes()


def parse(data: bytes):
    return parse_stream(io.BytesIO(data), Checks(), threads=2)


def fails(data: bytes, tmp_path) -> FormatError:
    with pytest.raises(FormatError,
                       match=r"\[(base64|cap|grammar|limit|truncated|version)\]") as err:
        parse(data)
    path = tmp_path / "bad.wtxt"
    path.write_bytes(data)
    report = wtxt.verify(path)
    assert not report.ok and report.failure.check == err.value.check
    with pytest.raises(FormatError, match=r"\[(base64|cap|grammar|limit|truncated|version)\]"):
        wtxt.load(path)
    return err.value


def test_truncation_at_every_line(tmp_path):
    """Every line boundary (and inside the last line) of a sealed file with every line kind."""
    state = {"a": np.arange(70, dtype=np.float32).reshape(10, 7), "s": np.array(3, np.int64),
             "e": np.zeros((0, 2), np.uint8)}
    from snapops.formats.keys import generate_keys

    generate_keys(tmp_path / "k")
    path = tmp_path / "small.wtxt"
    wtxt.save(state, path, gen=3, ts=TS, rows_per_chunk=3, audit="n=1",
              hmac_key=tmp_path / "k" / "hmac.key", sign_key=tmp_path / "k" / "signing.key")
    data = path.read_bytes()
    cuts = [i + 1 for i, c in enumerate(data) if c == 0x0A][:-1] + [0, 3, len(data) - 1]
    assert len(cuts) > 25
    for cut in cuts:
        error = fails(data[:cut], tmp_path)
        assert error.check in {"truncated", "grammar"}, (cut, str(error))
        assert error.line is not None


def test_truncation_inside_a_line_names_the_line(good, tmp_path):
    cut = good.index(b"\nendarr") - 30
    error = fails(good[:cut], tmp_path)
    assert isinstance(error, TruncatedError) or error.check == "grammar"
    assert error.line is not None


@pytest.mark.parametrize("transform", [
    lambda d: d.replace(b"\n", b"\r\n"),
    lambda d: d.replace(b"\n", b"\r\n", 3),
    lambda d: d.replace(b"meta schema", b"meta\tschema"),
    lambda d: d.replace(b"host=cpu", b"host=c\xc3\xa9u"),
    lambda d: d.replace(b" cuda=off", b" cuda=off "),
    lambda d: d.replace(b"\nendch\n", b"\n\nendch\n", 1),
    lambda d: d.replace(b"gen=000003 ts=" + TS.encode(), b"ts=" + TS.encode() + b" gen=000003"),
    lambda d: d.replace(b"dtype=f32 shape=40,24", b"shape=40,24 dtype=f32"),
    lambda d: d.replace(b"shape=40,24 order=C bytes=3840", b"shape=40,25 order=C bytes=3840"),
    lambda d: d.replace(b"shape=40,24", b"shape=040,24"),
    lambda d: d.replace(b"gen=000003", b"gen=0000003"),
    lambda d: d.replace(b"ts=" + TS.encode(), b"ts=2026-02-30T03:04:05Z"),
    lambda d: d.replace(b"dtype=f32", b"dtype=f16", 1),
    lambda d: d.replace(b"dtype=f32", b"dtype=bf16", 1),
    lambda d: d.replace(b"name=emb", b"name=em.b"),
    lambda d: d.replace(b"name=emb", b"name=zzz"),
    lambda d: d.replace(b"WTXT 1\n", b"WTXT 2\n"),
    lambda d: d.replace(b"order=C", b"order=F", 1),
    lambda d: d.replace(b"len=3840", b"len=3841"),
    lambda d: d.replace(b"lines=68", b"lines=67"),
    lambda d: d.replace(b"\nendwtxt\n", b"\n"),
    lambda d: d.replace(b"audit n=1", b"audit n=\"1"),
    lambda d: d.replace(b"cap ext=crc32c,line_parity,delta_v2,row_blocking",
                        b"cap ext=crc32c,line_parity,delta_v2"),
    lambda d: d.replace(b"cap ext=crc32c,line_parity,delta_v2,row_blocking",
                        b"cap ext=crc32c,line_parity,delta_v2,row_blocking,zz,aa"),
], ids=lambda f: "")
def test_typed_errors_for_malformed_lines(good, tmp_path, transform):
    data = transform(good)
    assert data != good
    error = fails(data, tmp_path)
    assert error.line is not None and error.check in {
        "grammar", "truncated", "version", "cap", "sha256_all", "limit"}, str(error)


def test_unknown_caps_in_order_are_ignored(good, tmp_path):
    data = good.replace(b"delta_v2,row_blocking\n", b"delta_v2,row_blocking,aa_new,zz_new\n")
    result = parse(data)
    assert len(result.arrays) == len(sample_state())


def test_bad_base64_is_named(good, tmp_path):
    at = good.index(b"arr name=step ")
    line = good.index(b"\n", good.index(b"\nch ", at) + 1) + 1
    end = good.index(b"\n", line)
    body = good[line:end - 2]
    assert body.endswith(b"=")
    non_canonical = body[:-2] + b"R" + body[-1:] if body.endswith(b"==") else body[:-2] + b"B="
    parity = 0
    for c in non_canonical:
        parity ^= c
    data = good[:line] + non_canonical + b" %x" % (parity & 0xF) + good[end:]
    error = fails(data, tmp_path)
    assert error.check == "base64" and error.array == "step"


def _petabyte(good: bytes) -> bytes:
    return good.replace(b"shape=9000 order=C bytes=36000",
                        b"shape=281474976710656 order=C bytes=1125899906842624")


def test_petabyte_declaration_is_refused_without_allocating(good, tmp_path):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    error = fails(_petabyte(good), tmp_path)
    assert isinstance(error, LimitError)
    terabyte = good.replace(b"shape=9000 order=C bytes=36000",
                            b"shape=250000000000 order=C bytes=1000000000000")
    error = fails(terabyte, tmp_path)
    assert error.check in {"limit", "grammar", "truncated", "crc32c", "chunk_sha256"}
    big_rows = good.replace(b"idx rows_per_chunk=8192 row_size=4",
                            b"idx rows_per_chunk=999999999999999 row_size=4")
    fails(big_rows, tmp_path)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert after - before < 200_000  # KiB: nothing near the declared sizes was allocated



def test_an_empty_array_with_a_dimension_numpy_cannot_hold_is_a_limit_error(tmp_path):
    """shape=0,<23 digits>: no bytes, but numpy refuses the shape; every reader says so."""
    path = tmp_path / "e.wtxt"
    wtxt.save({"e": np.zeros((0, 3), np.float32)}, path, gen=1, ts=TS)
    huge = path.read_bytes().replace(b"shape=0,3 ", b"shape=0,99999999999999999999999 ")
    error = fails(huge, tmp_path)
    assert isinstance(error, LimitError) and error.line == 5 and error.array == "e"
    import snapops

    path.write_bytes(huge)
    with pytest.raises(LimitError, match=r"e.wtxt:5: \[limit\] array e: expected dimensions"):
        snapops.inspect(path)
    two = path.read_bytes().replace(b"shape=0,3 ", b"shape=0,68719476736,68719476736 ")
    assert fails(two, tmp_path).check == "limit"
    with pytest.raises(DataError, match=r"shape \(0, 1099511627776\) spans 4398046511104 bytes"):
        wtxt.save({"e": np.zeros((0, 2**40), np.float32)}, tmp_path / "w.wtxt", gen=1, ts=TS)
    assert not (tmp_path / "w.wtxt").exists()

def test_huge_line_is_a_limit_error(tmp_path):
    error = fails(b"WTXT 1\nmeta " + b"x" * 100_000, tmp_path)
    assert isinstance(error, LimitError) and error.line == 2


def test_load_refuses_declared_size_beyond_file_before_allocating(good, tmp_path):
    data = good.replace(b"shape=9000 order=C bytes=36000",
                        b"shape=90000000000 order=C bytes=360000000000")
    path = tmp_path / "big.wtxt"
    path.write_bytes(data)
    with pytest.raises(FormatError, match=r"\[truncated\] array ids") as err:
        wtxt.load(path)
    assert err.value.array == "ids"


@settings(max_examples=300)
@given(st.binary(max_size=600))
def test_any_bytes_give_result_or_format_error(data):
    try:
        parse(b"WTXT 1\n" + data if data[:1] == b"m" else data)
    except FormatError:
        pass


@settings(max_examples=300)
@given(st.data())
def test_mutated_files_give_result_or_format_error(good, data):
    blob = bytearray(good)
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "cut", "insert", "delete"]))
        pos = data.draw(st.integers(0, max(0, len(blob) - 1)))
        if op == "flip" and blob:
            blob[pos] = data.draw(st.integers(0, 255))
        elif op == "cut":
            del blob[pos:]
        elif op == "insert":
            blob[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
        elif blob:
            del blob[pos:pos + data.draw(st.integers(1, 80))]
    try:
        result = parse(bytes(blob))
    except FormatError:
        return
    assert bytes(blob) == good or len(result.arrays) <= len(sample_state())


def test_same_result_whole_and_in_tiny_reads(good):
    class Trickle(io.RawIOBase):
        def __init__(self, data):
            self.data, self.pos = data, 0

        def readable(self):
            return True

        def readinto(self, b):
            n = min(len(b), 7, len(self.data) - self.pos)
            b[:n] = self.data[self.pos:self.pos + n]
            self.pos += n
            return n

    whole = parse(good)
    trickled = parse_stream(Trickle(good), Checks(), threads=1)
    assert whole.sha256_all == trickled.sha256_all
    assert [a.line for a in whole.arrays] == [a.line for a in trickled.arrays]
    data = np.frombuffer(b"", np.uint8)
    assert data.size == 0
