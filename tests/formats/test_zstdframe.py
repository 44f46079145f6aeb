"""One zstd frame decoded into a caller's buffer (libzstd one-shot through python-zstandard's
cffi backend), checked against python-zstandard's own decoder; and the residual decoder with
and without it."""

from __future__ import annotations

import numpy as np
import pytest
import zstandard

import snapops.formats.generation.residual as residual
from snapops.formats.errors import FormatError
from snapops.formats.generation.residual import decode_residual, encode_residual
from snapops.formats.zstdframe import FrameError, decode_frame_into, lib

pytestmark = pytest.mark.skipif(lib is None, reason="python-zstandard's cffi backend")


def frame(data: bytes, **kw) -> bytes:
    return zstandard.ZstdCompressor(level=1, **kw).compress(data)


@pytest.mark.parametrize("size", [0, 1, 4095, 1 << 20, (3 << 20) + 7])
def test_a_frame_decodes_as_python_zstandard_decodes_it(size):
    data = np.random.default_rng(size).integers(0, 4, size, dtype=np.uint8).tobytes()
    out = bytearray(size)
    assert decode_frame_into(frame(data), out) == size
    assert bytes(out) == zstandard.ZstdDecompressor().decompress(frame(data)) == data


def test_a_multithreaded_encoders_frame_is_one_frame():
    data = np.random.default_rng(1).integers(0, 3, 9 << 20, dtype=np.uint8).tobytes()
    blob = frame(data, threads=2)
    out = bytearray(len(data))
    assert decode_frame_into(blob, out) == len(data) and bytes(out) == data


def test_nothing_is_written_past_the_output_and_a_larger_frame_fails():
    data = bytes(range(256)) * 64
    guard = np.full(len(data) + 100, 0xA5, np.uint8)
    with pytest.raises(FrameError, match="Destination buffer is too small"):
        decode_frame_into(frame(data), memoryview(guard)[:len(data) - 1])
    assert (guard[len(data) - 1:] == 0xA5).all()


@pytest.mark.parametrize("blob,reason", [
    (frame(b"abc") + b"x", "1 bytes of data after the frame"),
    (frame(b"abc") + frame(b"def"), "after the frame"),
    (frame(b"abc")[:-2], "Src size is incorrect"),
    (b"\x00" * 32, "Unknown frame descriptor"),
    (b"", "Src size is incorrect"),
])
def test_anything_but_exactly_one_valid_frame_is_refused(blob, reason):
    out = bytearray(64)
    with pytest.raises(FrameError, match=reason):
        decode_frame_into(blob, out)


def test_a_read_only_output_is_refused():
    with pytest.raises(BufferError, match="not writable"):
        decode_frame_into(frame(b"abc"), b"xyz")


def test_residuals_decode_alike_with_and_without_the_one_shot_decoder(monkeypatch, tmp_path):
    rng = np.random.default_rng(3)
    base = rng.standard_normal(50_000).astype(np.float32)
    target = (base * np.float32(1.001)).tobytes()
    blob = encode_residual(base.tobytes(), target, itemsize=4)
    bad = bytearray(blob)
    bad[len(bad) - 40] ^= 0x55                 # inside the last block of the frame
    results = []
    for one_shot in (True, False):
        if not one_shot:
            monkeypatch.setattr(residual, "decode_frame_into", lambda src, out: None)
        assert decode_residual(base.tobytes(), blob) == target
        with pytest.raises(FormatError) as failed:
            decode_residual(base.tobytes(), bytes(bad))
        results.append(failed.value.check)
        with pytest.raises(FormatError, match=r"\[residual\]"):
            decode_residual(base.tobytes(), blob[:-5])
    assert results[0] == results[1]


def test_a_residual_read_from_a_stream_that_cannot_be_mapped_is_streamed():
    import io

    from snapops.formats.generation.residual import HEADER, decompress_planes, read_header

    base = np.arange(10_000, dtype=np.float32)
    target = (base * np.float32(1.5)).tobytes()
    blob = encode_residual(base.tobytes(), target, itemsize=4)
    head = read_header(blob[:HEADER.size], "r", total=len(blob))
    stream = io.BytesIO(blob)
    stream.seek(HEADER.size)                   # no file descriptor to map
    planes = decompress_planes(stream, head, None)
    with open_payload_file(blob) as f:         # a real file: mapped, decoded in one call
        assert bytes(decompress_planes(f, head, None)) == bytes(planes)
    assert len(planes) == len(target)


def open_payload_file(blob: bytes):
    import tempfile

    from snapops.formats.generation.residual import HEADER

    f = tempfile.TemporaryFile()
    f.write(blob)
    f.seek(HEADER.size)
    return f
