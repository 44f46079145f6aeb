"""The C line kernels of WTXT (``formats/_kernels.c``) against the per-line definition: each
line is its characters, a space, the hex digit of their XOR's low four bits, and LF. Checked
for every line width and count the codec meets, for strided views, and for buffers that do
not fit; the kernel's decoding against pybase64 line by line and against the gathering path."""

from __future__ import annotations

import numpy as np
import pybase64
import pytest
from numpy.lib.stride_tricks import as_strided

from snapops.formats._kernels import decode_lines, gather_lines, put_lines, set_base64_decoder
from snapops.formats.wtxt import _lines
from snapops.formats.wtxt._lines import (
    ALPHABET, body_len, decode_bodies, decode_bodies_unchecked, encode_bodies, line_parity,
)


def reference_lines(chars: np.ndarray) -> np.ndarray:
    """(count, n, width) characters -> (count, n, width + 3) lines, one line at a time."""
    count, n, width = chars.shape
    lines = np.empty((count, n, width + 3), np.uint8)
    for i in range(count):
        for j in range(n):
            row = chars[i, j].tobytes()
            lines[i, j] = np.frombuffer(row + b" %x\n" % line_parity(row), np.uint8)
    return lines


def random_chars(seed: int, shape: tuple[int, int, int]) -> np.ndarray:
    return ALPHABET[np.random.default_rng(seed).integers(0, 64, shape)]


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64])
def test_put_lines_writes_each_line_as_the_definition_says(n):
    for width in range(0, 84, 4):                 # 76 for full lines, a chunk's last: any x4
        chars = random_chars(n * 100 + width, (3, n, width))
        lines = np.full((3, n, width + 3), 0xAA, np.uint8)
        put_lines(lines, chars)
        assert np.array_equal(lines, reference_lines(chars)), width


@pytest.mark.parametrize("n", [1, 2, 64])
def test_gather_lines_takes_the_characters_back_and_accepts_correct_lines(n):
    for width in range(0, 84, 4):
        chars = random_chars(n * 100 + width, (3, n, width))
        lines = reference_lines(chars)
        out = np.zeros_like(chars)
        assert gather_lines(lines, out, True) is True
        assert np.array_equal(out, chars), width


def test_strided_views_inside_a_larger_text_are_read_and_written_in_place():
    chars = random_chars(5, (4, 6, 76))
    text = np.full((4, 6 * 79 + 11), 0x55, np.uint8)        # chunk rows with a head and a tail
    lines = text[:, 5:5 + 6 * 79].reshape(4, 6, 79)
    put_lines(lines, chars)
    assert np.array_equal(lines, reference_lines(chars))
    assert (text[:, :5] == 0x55).all() and (text[:, 5 + 6 * 79:] == 0x55).all()
    back = np.empty((4, 6, 76), np.uint8)
    assert gather_lines(lines, back, True) and np.array_equal(back, chars)
    every_other = np.empty((4, 3, 76), np.uint8)
    assert gather_lines(lines[:, ::2], every_other, True)
    assert np.array_equal(every_other, chars[:, ::2])


@pytest.mark.parametrize("where", ["char", "space", "digit", "lf", "last line"])
def test_one_wrong_byte_anywhere_fails_the_check_but_not_the_copy(where):
    chars = random_chars(9, (2, 5, 76))
    lines = reference_lines(chars)
    i, j, k = {"char": (1, 2, 40), "space": (0, 3, 76), "digit": (1, 0, 77),
               "lf": (0, 1, 78), "last line": (1, 4, 0)}[where]
    lines[i, j, k] ^= 0x01 if where != "digit" else 0x02
    assert gather_lines(lines, np.empty_like(chars), True) is False
    out = np.empty_like(chars)
    assert gather_lines(lines, out, False) is True
    assert np.array_equal(out, lines[:, :, :76])


def test_a_changed_character_changes_only_its_own_lines_digit():
    chars = random_chars(8, (1, 10, 76))
    before = reference_lines(chars)
    chars[0, 6, 40] ^= 0x01
    after = np.empty_like(before)
    put_lines(after, chars)
    assert (before[0, :, 77] != after[0, :, 77]).tolist() == [k == 6 for k in range(10)]


def test_empty_batches_do_nothing():
    put_lines(np.empty((0, 4, 79), np.uint8), np.empty((0, 4, 76), np.uint8))
    assert gather_lines(np.empty((3, 0, 79), np.uint8), np.empty((3, 0, 76), np.uint8), True)


@pytest.mark.parametrize("lines, chars, message", [
    (np.empty((2, 3, 79), np.uint8), np.empty((2, 3, 75), np.uint8), "width \\+ 3"),
    (np.empty((2, 3, 79), np.uint8), np.empty((2, 4, 76), np.uint8), "width \\+ 3"),
    (np.empty((3, 79), np.uint8), np.empty((3, 76), np.uint8), "3-d uint8"),
    (np.empty((2, 3, 79), np.uint16), np.empty((2, 3, 76), np.uint8), "3-d uint8"),
    (np.empty((2, 3, 158), np.uint8)[:, :, ::2], np.empty((2, 3, 76), np.uint8), "contiguous"),
])
def test_buffers_that_do_not_fit_are_refused_before_any_byte_is_touched(lines, chars, message):
    with pytest.raises(ValueError, match=message):
        put_lines(lines, chars)
    with pytest.raises(ValueError, match=message):
        gather_lines(lines, chars, True)


def test_read_only_outputs_are_refused():
    chars = random_chars(3, (1, 2, 76))
    lines = reference_lines(chars)
    lines.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        put_lines(lines, chars)
    frozen = np.empty_like(chars)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        gather_lines(lines, frozen, True)
    with pytest.raises(BufferError, match="not writable"):
        gather_lines(lines, b"x" * chars.size, True)
    with pytest.raises(TypeError, match="bytes-like object is required"):
        put_lines(lines.copy(), "not a buffer")


# decode_lines: the full lines decoded by libbase64 (from pybase64's extension) in the kernel.

def reference_decode(lines: np.ndarray) -> np.ndarray:
    """(count, n, 79) lines -> (count, n, 57) bytes, each line's characters by pybase64."""
    count, n, _ = lines.shape
    raw = [pybase64.b64decode(lines[i, j, :76].tobytes(), validate=True)
           for i in range(count) for j in range(n)]
    return np.frombuffer(b"".join(raw), np.uint8).reshape(count, n, 57)


def test_this_install_decodes_in_the_kernel():
    assert _lines.KERNEL_DECODES is True     # pybase64's extension exports base64_decode


@pytest.mark.parametrize("n", [1, 2, 255, 256, 257, 600])
def test_decode_lines_equals_pybase64_line_by_line_across_block_boundaries(n):
    lines = reference_lines(random_chars(n, (3, n, 76)))
    text = np.full((3, n * 79 + 5), 0x55, np.uint8)     # chunk rows with other text after
    text[:, :n * 79] = lines.reshape(3, -1)
    dest = np.full((3, n * 57 + 7), 0xAA, np.uint8)     # a chunk's raw bytes, tail after
    into = as_strided(dest, (3, n, 57), (dest.strides[0], 57, 1))
    assert decode_lines(text[:, :n * 79].reshape(3, n, 79), into, True) is True
    assert np.array_equal(into, reference_decode(lines))
    assert (dest[:, n * 57:] == 0xAA).all()


@pytest.mark.parametrize("where, byte, checked, unchecked", [
    ("char", ord("*"), False, False),       # not base64: refused either way
    ("char", ord("="), False, False),       # padding inside a full line
    ("char", ord("\n"), False, False),
    ("space", ord("x"), False, True),       # separators only with check
    ("digit", ord("g"), False, True),
    ("lf", ord("\r"), False, True),
])
def test_decode_lines_refuses_what_the_gathered_path_refuses(where, byte, checked, unchecked):
    lines = reference_lines(random_chars(4, (2, 300, 76)))
    k = {"char": 33, "space": 76, "digit": 77, "lf": 78}[where]
    lines[1, 280, k] = byte
    dest = np.zeros((2, 300, 57), np.uint8)
    assert decode_lines(lines, dest, True) is checked
    assert decode_lines(lines, np.zeros_like(dest), False) is unchecked


def test_decode_lines_refuses_buffers_that_do_not_fit_and_a_null_decoder():
    lines = np.zeros((2, 3, 79), np.uint8)
    for dest, message in [(np.zeros((2, 3, 56), np.uint8), "\\(count, n, 57\\)"),
                          (np.zeros((2, 4, 57), np.uint8), "\\(count, n, 57\\)"),
                          (np.zeros((2, 3, 114), np.uint8)[:, :, ::2], "contiguous"),
                          (np.zeros((2, 6, 57), np.uint8)[:, ::2], "contiguous")]:
        with pytest.raises(ValueError, match=message):
            decode_lines(lines, dest, True)
    with pytest.raises(ValueError, match="\\(count, n, 79\\)"):
        decode_lines(np.zeros((2, 3, 78), np.uint8), np.zeros((2, 3, 57), np.uint8), True)
    frozen = np.zeros((2, 3, 57), np.uint8)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        decode_lines(lines, frozen, True)
    with pytest.raises(ValueError, match="NULL"):
        set_base64_decoder(0)


@pytest.mark.parametrize("length", [57, 570, 32768, 57 * 300 + 2])
def test_both_decoders_of_a_chunk_agree_on_good_and_bad_text(monkeypatch, length):
    raw = np.random.default_rng(length).integers(0, 256, 3 * length, dtype=np.uint8)
    text = np.zeros((3, body_len(length)), np.uint8)
    encode_bodies(raw, length, 3, text)
    bad = text.copy()
    bad[2, 40] = ord("=")
    results = {}
    for kernel in (True, False):
        monkeypatch.setattr(_lines, "KERNEL_DECODES", kernel)
        out = np.zeros(3 * length, np.uint8)
        results[kernel] = (decode_bodies(text, length, out), out.copy(),
                           decode_bodies(bad, length), decode_bodies_unchecked(text, length))
        with pytest.raises(ValueError, match="base64|quantum"):
            decode_bodies_unchecked(bad, length)
    for decoded, out, refused, unchecked in results.values():
        assert np.array_equal(decoded, raw) and np.array_equal(out, raw)
        assert refused is None and np.array_equal(unchecked, raw)
