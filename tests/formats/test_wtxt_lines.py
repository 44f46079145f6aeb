"""The C line kernel of WTXT (``formats/_kernels.c``) against the per-line definition: each
line is its characters, a space, the hex digit of their XOR's low four bits, and LF. Checked
for every line width and count the codec meets, for strided views, and for buffers that do
not fit."""

from __future__ import annotations

import numpy as np
import pytest

from snapops.formats._kernels import gather_lines, put_lines
from snapops.formats.wtxt._lines import ALPHABET, line_parity


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
