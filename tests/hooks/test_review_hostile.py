"""Review (textconv, diff) under hostile input: every malformed file is one typed, one-line
error (exit 2, no traceback); sizes a file declares are bounded before anything is
decompressed or allocated (an .npz bomb, a declared 10^6 x 10^6 shape); .npz members and
safetensors tensors are streamed in blocks."""

from __future__ import annotations

import io
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from snapops.formats import wtxt
from snapops.formats.errors import FormatError, LimitError
from snapops.formats.limits import DeclaredLimits, check_member
from snapops.hooks.review import diff_paths, open_snapshot, textconv_lines
from snapops.hooks.review._npz import KEEP_BYTES, npz_members

TS = "2026-01-02T03:04:05Z"


def run_cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snapops", *argv], capture_output=True,
                          text=True)


def assert_one_line_error(done: subprocess.CompletedProcess, *needles: str) -> None:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("snapops: error: "), done.stderr
    assert "Traceback" not in done.stderr
    for needle in needles:
        assert needle in lines[0]


def npy_member(shape, descr: str = "<f4", data: bytes | None = None) -> bytes:
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": descr, "fortran_order": False, "shape": shape})
    count = int(np.prod(shape, dtype=object)) * np.dtype(descr).itemsize
    return header.getvalue() + (bytes(count) if data is None else data)


def write_npz(path: Path, members: dict[str, bytes], method=zipfile.ZIP_STORED) -> Path:
    with zipfile.ZipFile(path, "w", method) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


@pytest.fixture(scope="module")
def bomb(tmp_path_factory) -> Path:
    """256 MiB of zeros deflated to about 1 MiB, written without holding them."""
    path = tmp_path_factory.mktemp("bomb") / "bomb.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        with archive.open("w.npy", "w", force_zip64=True) as member:
            member.write(npy_member((64 << 20,), data=b""))
            block = bytes(4 << 20)
            for _ in range(64):
                member.write(block)
    assert path.stat().st_size < 2 << 20
    return path


# --- WTXT ------------------------------------------------------------------------------------

def _wtxt(tmp_path: Path) -> bytes:
    state = {"R": np.arange(4096, dtype=np.float32).reshape(64, 64)}
    wtxt.save(state, tmp_path / "ok.wtxt", gen=1, ts=TS, rows_per_chunk=8, audit="note=x")
    return (tmp_path / "ok.wtxt").read_bytes()


@pytest.mark.parametrize("where", ["ch sha256", "ch ix", "body", "arr", "meta", "audit"])
def test_non_ascii_anywhere_in_wtxt_is_a_one_line_error(tmp_path, where):
    data = bytearray(_wtxt(tmp_path))
    anchors = {"ch sha256": b"\nch ix=000001 ", "ch ix": b"\nch ix=000002", "body": b"endch\nch",
               "arr": b"\narr name=R", "meta": b"\nmeta schema", "audit": b"\naudit note"}
    at = data.index(anchors[where]) + len(anchors[where]) + (40 if where == "ch sha256" else 2)
    data[at] = 0xE9
    (tmp_path / "bad.wtxt").write_bytes(bytes(data))
    with pytest.raises(FormatError, match=r"bad\.wtxt"):
        list(textconv_lines(tmp_path / "bad.wtxt"))
    assert_one_line_error(run_cli("textconv", str(tmp_path / "bad.wtxt")), "bad.wtxt")
    # diff reads only what it needs (equal arr-line digests: nothing); never a traceback
    done = run_cli("diff", str(tmp_path / "ok.wtxt"), str(tmp_path / "bad.wtxt"))
    if done.returncode:
        assert_one_line_error(done, "bad.wtxt")
    assert "Traceback" not in done.stderr


def test_wtxt_declaring_more_than_the_file_holds_is_refused_before_reading(tmp_path):
    text = _wtxt(tmp_path).replace(b"shape=64,64 order=C bytes=16384",
                                   b"shape=64000,64 order=C bytes=16384000")
    (tmp_path / "big.wtxt").write_bytes(text)
    with pytest.raises(FormatError, match=r"bytes of chunks"):
        open_snapshot(tmp_path / "big.wtxt")


# --- .npz ------------------------------------------------------------------------------------

def test_npz_bomb_is_refused_from_its_declared_sizes(bomb):
    with pytest.raises(LimitError, match=r"expansion"):
        list(textconv_lines(bomb))
    with pytest.raises(LimitError, match=r"expansion"):
        diff_paths(bomb, bomb)
    assert_one_line_error(run_cli("textconv", str(bomb)), "[limit]", "array w")
    assert_one_line_error(run_cli("diff", str(bomb), str(bomb)), "[limit]")


def test_expansion_limit_spares_small_members_and_can_be_raised(tmp_path, bomb):
    zeros = write_npz(tmp_path / "z.npz", {"z.npy": npy_member((1 << 20,))},
                      zipfile.ZIP_DEFLATED)                      # 4 MiB, ~1000:1
    assert list(textconv_lines(zeros))[-2].startswith("endarr z sha256=")
    tight = DeclaredLimits(expansion_floor=1 << 20)
    with pytest.raises(LimitError, match=r"expansion"):
        list(textconv_lines(zeros, limits=tight))
    done = run_cli("textconv", str(bomb), "--max-expansion", "1000")
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "end"


def test_declared_huge_shape_is_refused_before_allocating(tmp_path):
    path = write_npz(tmp_path / "huge.npz",
                     {"w.npy": npy_member((10**6, 10**6), data=bytes(16))})
    with pytest.raises(LimitError, match=r"4000000000000 bytes"):
        list(textconv_lines(path))
    assert_one_line_error(run_cli("textconv", str(path)), "[limit]", "4000000000000")
    with pytest.raises(LimitError, match=r"at most 1000 bytes"):
        open_snapshot(write_npz(tmp_path / "k.npz", {"k.npy": npy_member((1000,))}),
                      limits=DeclaredLimits(max_bytes=1000))


@pytest.mark.parametrize("case", ["short data", "object dtype", "not npy", "bad header",
                                  "fortran", "truncated zip", "unsupported method"])
def test_malformed_npz_is_a_one_line_error(tmp_path, case):
    path = tmp_path / "bad.npz"
    if case == "short data":
        write_npz(path, {"w.npy": npy_member((100,), data=bytes(16))})
    elif case == "object dtype":
        write_npz(path, {"w.npy": npy_member((2,), descr="|O", data=bytes(16))})
    elif case == "not npy":
        write_npz(path, {"w.txt": b"hello"})
    elif case == "bad header":
        write_npz(path, {"w.npy": b"\x93NUMPY\x01\x00\xff\xff{'descr'"})
    elif case == "fortran":
        np.savez(path, w=np.asfortranarray(np.ones((3, 4), np.float32)))
    elif case == "truncated zip":
        np.savez(path, w=np.ones(10))
        path.write_bytes(path.read_bytes()[:-30])
    else:                                   # deflate64: a method zipfile cannot decode
        np.savez_compressed(path, w=np.ones(10))
        data = bytearray(path.read_bytes())
        for magic, at in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):
            pos = data.index(magic) + at
            data[pos:pos + 2] = struct.pack("<H", 9)
        path.write_bytes(bytes(data))
    with pytest.raises(FormatError, match=r"bad\.npz"):
        list(textconv_lines(path))
    assert_one_line_error(run_cli("textconv", str(path)), "bad.npz")


def test_npz_members_stream_in_any_order_within_the_window(tmp_path):
    values = np.arange(3 << 20, dtype=">f8")           # 24 MiB, big-endian, > KEEP_BYTES
    assert values.nbytes > KEEP_BYTES
    np.savez(tmp_path / "s.npz", v=values)
    archive, members = npz_members(str(tmp_path / "s.npz"))
    try:
        member = members["v"]
        assert member.dtype == np.dtype("=f8") and member.shape == values.shape
        step = 1 << 18
        order = [1, 0, 3, 2, 2, 5, 4, 11, 10, 0, 6]     # neighbours swapped, back to the start
        for block in order:
            got = member.read(block * step, (block + 1) * step)
            assert np.array_equal(got, values[block * step:(block + 1) * step])
    finally:
        member.release()
        archive.close()


def test_check_member_limits():
    check_member("a", declared=200 << 20, compressed=100 << 20)          # 2x: fine
    check_member("a", declared=1 << 20, compressed=1)                    # under the floor
    with pytest.raises(LimitError, match=r"100x expansion"):
        check_member("a", declared=200 << 20, compressed=1 << 20)
    with pytest.raises(LimitError, match=r"at most 10 bytes declared"):
        check_member("a", declared=11, compressed=11, limits=DeclaredLimits(max_bytes=10))


# --- safetensors -------------------------------------------------------------------------------

def test_safetensors_tensors_are_read_by_row_ranges(tmp_path):
    from safetensors.numpy import save_file

    rng = np.random.default_rng(3)
    arrays = {"m": rng.standard_normal((300, 7)).astype(np.float32),
              "v": rng.standard_normal(50).astype(np.float64),
              "s": np.array(5, np.int64)}
    save_file(arrays, str(tmp_path / "t.safetensors"))
    with open_snapshot(tmp_path / "t.safetensors") as snap:
        for name, expected in arrays.items():
            flat = expected.reshape(-1)
            source = snap.arrays[name]
            for start, stop in ((0, flat.size), (3, min(11, flat.size)), (flat.size - 1,
                                                                            flat.size)):
                assert np.array_equal(source.read(start, stop), flat[start:stop])
