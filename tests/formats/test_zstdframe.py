"""zstd frames decoded into a caller's buffer (libzstd one-shot through python-zstandard's
cffi backend), checked against python-zstandard's own decoder; the residual decoder with and
without it; and frames written through libzstd with our sequence producer (the zero-run parse
of ``formats/_kernels.c``), checked by libzstd's sequence validation and python-zstandard's
decoder."""

from __future__ import annotations

import numpy as np
import pytest
import zstandard

import snapops.formats.generation.residual as residual
from snapops.formats.errors import FormatError
from snapops.formats.generation.residual import decode_residual, encode_residual
import snapops.formats.zstdframe as zstdframe
from snapops.formats._kernels import zero_run_producer
from snapops.formats.zstdframe import (FrameError, FrameWriter, decode_frames_into, frame_sizes,
                                       lib)

pytestmark = pytest.mark.skipif(lib is None, reason="python-zstandard's cffi backend")


def frame(data: bytes, **kw) -> bytes:
    return zstandard.ZstdCompressor(level=1, **kw).compress(data)


@pytest.mark.parametrize("size", [0, 1, 4095, 1 << 20, (3 << 20) + 7])
def test_a_frame_decodes_as_python_zstandard_decodes_it(size):
    data = np.random.default_rng(size).integers(0, 4, size, dtype=np.uint8).tobytes()
    out = bytearray(size)
    assert decode_frames_into(frame(data), out) == size
    assert bytes(out) == zstandard.ZstdDecompressor().decompress(frame(data)) == data


def test_a_multithreaded_encoders_frame_is_one_frame():
    data = np.random.default_rng(1).integers(0, 3, 9 << 20, dtype=np.uint8).tobytes()
    blob = frame(data, threads=2)
    out = bytearray(len(data))
    assert len(frame_sizes(blob)) == 1
    assert decode_frames_into(blob, out) == len(data) and bytes(out) == data


def test_frames_back_to_back_decode_each_into_its_place():
    parts = [b"", b"abc" * 1000, bytes(70_000), np.random.default_rng(4).bytes(5000)]
    blob = b"".join(frame(p) for p in parts)
    assert frame_sizes(blob) == [(len(frame(p)), len(p)) for p in parts]
    out = bytearray(sum(map(len, parts)) + 3)
    assert decode_frames_into(blob, out) == len(out) - 3
    assert bytes(out) == b"".join(parts) + bytes(3)


def test_nothing_is_written_past_the_output_and_larger_frames_fail():
    data = bytes(range(256)) * 64
    guard = np.full(len(data) + 100, 0xA5, np.uint8)
    with pytest.raises(FrameError, match="decode to more than the 16383 bytes of the output"):
        decode_frames_into(frame(data), memoryview(guard)[:len(data) - 1])
    with pytest.raises(FrameError, match="decode to more than the 16384 bytes"):
        decode_frames_into(frame(b"x") + frame(data), memoryview(guard)[:len(data)])
    assert (guard[len(data) - 1:] == 0xA5).all()
    # frames walked wrongly (16 bytes, not 16384) are stopped by libzstd at the room given
    blob = frame(data)
    with pytest.raises(FrameError, match="Destination buffer is too small"):
        decode_frames_into(blob, memoryview(guard)[:16], [(len(blob), 16)])
    with pytest.raises(FrameError, match=f"run past the {len(blob)} bytes of the input"):
        decode_frames_into(blob, guard, [(len(blob) + 1, len(data))])
    assert (guard[16:] == 0xA5).all()


@pytest.mark.parametrize("blob,reason", [
    (frame(b"abc") + b"x", "Src size is incorrect|Unknown frame descriptor"),
    (frame(b"abc")[:-2], "Src size is incorrect"),
    (b"\x00" * 32, "Unknown frame descriptor"),
    (b"", "Src size is incorrect"),
    (zstandard.ZstdCompressor(write_content_size=False).compress(b"abc"),
     "the frame at byte 0 declares no content size"),
    (frame(b"abc") + zstandard.ZstdCompressor(write_content_size=False).compress(b"d"),
     "the frame at byte 12 declares no content size"),
    (frame(b"") * 17, "more than 16 frames"),
])
def test_anything_but_valid_frames_with_their_sizes_is_refused(blob, reason):
    out = bytearray(64)
    with pytest.raises(FrameError, match=reason):
        decode_frames_into(blob, out)


def test_a_read_only_output_is_refused():
    with pytest.raises(BufferError, match="not writable"):
        decode_frames_into(frame(b"abc"), b"xyz")


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
            monkeypatch.setattr(residual, "ONE_SHOT", False)
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
    planes = decompress_planes(stream, head, None).layout()
    with open_payload_file(blob) as f:         # a real file: mapped, decoded in one call
        assert bytes(decompress_planes(f, head, None).layout()) == bytes(planes)
    assert len(planes) == len(target)


def open_payload_file(blob: bytes):
    import tempfile

    from snapops.formats.generation.residual import HEADER

    f = tempfile.TemporaryFile()
    f.write(blob)
    f.seek(HEADER.size)
    return f


BLOCK = 128 << 10      # zstd's largest block: the producer parses one at a time


def _runs_of_zeros(size: int, runs: list[tuple[int, int]], seed: int = 0) -> bytes:
    """Random bytes without zeros, then zero runs (start, length) put in."""
    data = np.random.default_rng(seed).integers(1, 256, size, dtype=np.uint8)
    for start, length in runs:
        data[start:start + length] = 0
    return data.tobytes()


def _written(data: bytes, *, chunk: int = 1 << 20, **options) -> bytes:
    import io

    out = io.BytesIO()
    with FrameWriter(out, len(data), **options) as frame:
        for at in range(0, len(data), chunk):
            frame.write(data[at:at + chunk])
    return out.getvalue()


PARSED = {
    "empty": b"",
    "one zero": bytes(1),
    "15 zeros": bytes(15),
    "16 zeros": bytes(16),
    "a block of zeros and a bit": bytes(BLOCK + 5),
    "random": np.random.default_rng(1).integers(0, 256, 300_000, np.uint8).tobytes(),
    "runs of 15, 16, 17 and 64 at odd places": _runs_of_zeros(
        70_000, [(0, 17), (100, 15), (203, 16), (1001, 64), (69_983, 17)]),
    "runs across and at the ends of blocks": _runs_of_zeros(
        3 * BLOCK + 77, [(BLOCK - 40, 100), (2 * BLOCK - 16, 16), (2 * BLOCK, 16),
                         (3 * BLOCK + 60, 17)]),
    "long runs after shorter, equal and longer ones": _runs_of_zeros(
        9_000, [(10, 32), (100, 33), (200, 34), (300, 31), (400, 40), (500, 35), (600, 90),
                (2000, 60), (3000, 16), (4000, 200), (8000, 1000)]),
    "carries of small steps": np.random.default_rng(2).choice(
        np.array([0, 1, 3, 7, 15, 31], np.uint8), 1 << 20,
        p=[0.8, 0.1, 0.05, 0.03, 0.015, 0.005]).tobytes(),
}


@pytest.mark.parametrize("name", PARSED)
def test_the_zero_run_parse_passes_libzstds_validation_and_decodes_exactly(name):
    """libzstd validates every sequence of the parse (FrameWriter turns validation on and
    the fallback to zstd's own parse off): a wrong parse fails the frame here."""
    data = PARSED[name]
    blob = _written(data, producer=zero_run_producer(), chunk=50_000)
    out = bytearray(len(data))
    assert decode_frames_into(blob, out) == len(data) and bytes(out) == data
    assert zstandard.ZstdDecompressor().decompress(blob) == data
    assert zstandard.frame_content_size(blob) == len(data)


@pytest.mark.parametrize("seed", range(40))
def test_the_zero_run_parse_is_exact_on_random_runs_of_zeros(seed):
    """Random sizes up to three blocks, zero runs of geometric lengths (1 to thousands) at
    random places, sometimes touching each other or a block's end."""
    rng = np.random.default_rng(seed)
    size = int(rng.integers(0, 3 * BLOCK + 100))
    data = rng.integers(1, 256, size, dtype=np.uint8)
    for _ in range(int(rng.integers(0, 200))):
        if size:
            start = int(rng.integers(0, size))
            data[start:start + int(rng.geometric(1 / rng.choice([4, 40, 400])))] = 0
    data = data.tobytes()
    blob = _written(data, producer=zero_run_producer(), chunk=int(rng.integers(1, 1 << 18)))
    assert zstandard.ZstdDecompressor().decompress(blob) == data


def test_the_zero_run_parse_is_deterministic_and_beats_zstds_own_on_carries():
    data = PARSED["carries of small steps"]
    ours = _written(data, producer=zero_run_producer())
    assert _written(data, producer=zero_run_producer(), chunk=12_345) == ours
    zstds = _written(data, level=1, threads=2)
    assert zstandard.ZstdDecompressor().decompress(zstds) == data
    # literals Huffman-coded beat level 1's many short matches on such a plane
    assert len(ours) < 0.9 * len(zstds)


def test_two_frames_written_at_once_on_one_thread_stay_apart():
    import io

    one, two = PARSED["carries of small steps"], PARSED["random"]
    outs = io.BytesIO(), io.BytesIO()
    first = FrameWriter(outs[0], len(one), producer=zero_run_producer())
    second = FrameWriter(outs[1], len(two), level=1, threads=2)
    for at in range(0, max(len(one), len(two)), 100_000):
        first.write(one[at:at + 100_000])
        second.write(two[at:at + 100_000])
    first.close()
    second.close()
    assert zstandard.ZstdDecompressor().decompress(outs[0].getvalue()) == one
    assert zstandard.ZstdDecompressor().decompress(outs[1].getvalue()) == two


def test_a_frame_of_another_length_than_declared_fails():
    import io

    with pytest.raises(FrameError, match="(?i)size"):
        with FrameWriter(io.BytesIO(), 10, producer=zero_run_producer()) as frame:
            frame.write(bytes(9))
    with pytest.raises(FrameError, match="(?i)size"):
        with FrameWriter(io.BytesIO(), 10, producer=zero_run_producer()) as frame:
            frame.write(bytes(11))


def test_without_libzstds_producer_api_zstds_own_parse_writes_the_frame(monkeypatch):
    data = PARSED["carries of small steps"]
    monkeypatch.setattr(zstdframe, "_PRODUCER_API", ("ZSTD_no_such_function",))
    blob = _written(data, producer=zero_run_producer(), threads=2)
    assert zstandard.ZstdDecompressor().decompress(blob) == data
    assert blob == _written(data, level=1, threads=2)       # level 1, not our parse


def test_without_the_cffi_backend_python_zstandard_writes_the_frame(monkeypatch):
    data = PARSED["runs of 15, 16, 17 and 64 at odd places"]
    monkeypatch.setattr(zstdframe, "lib", None)
    blob = _written(data, producer=zero_run_producer(), threads=2)
    assert zstandard.ZstdDecompressor().decompress(blob) == data
    assert zstandard.frame_content_size(blob) == len(data)
