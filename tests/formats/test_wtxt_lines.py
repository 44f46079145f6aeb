"""The vectorised parity nibble of WTXT base64 lines against the per-line definition (XOR of
the line's characters, low 4 bits), for every line width and line count the codec meets."""

from __future__ import annotations

import numpy as np
import pytest

from snapops.formats.wtxt._lines import ALPHABET, line_parity, parity


@pytest.mark.parametrize("lines", [1, 2, 3, 7, 64])
def test_parity_of_each_line_is_the_xor_of_its_characters(lines):
    rng = np.random.default_rng(lines)
    for width in range(4, 84, 4):                   # a chunk's last line: any multiple of 4
        chars = ALPHABET[rng.integers(0, 64, (lines, width))]
        got = parity(chars)
        assert got.shape == (lines,) and got.dtype == np.uint8
        assert got.tolist() == [line_parity(row.tobytes()) for row in chars], width


def test_parity_keeps_the_leading_axes_and_reads_strided_input():
    rng = np.random.default_rng(7)
    block = ALPHABET[rng.integers(0, 64, (5, 3, 79))]
    chars = block[:, :, :76]                       # the characters of lines still in the text
    assert not chars.flags.c_contiguous
    got = parity(chars)
    assert got.shape == (5, 3)
    assert got.tolist() == [[line_parity(chars[i, j].tobytes()) for j in range(3)]
                            for i in range(5)]


def test_one_changed_character_changes_only_its_own_line():
    rng = np.random.default_rng(8)
    chars = ALPHABET[rng.integers(0, 64, (10, 76))]
    before = parity(chars)
    chars[6, 40] ^= 0x01                           # 'A' <-> '@'-like flip of the lowest bit
    after = parity(chars)
    assert (before != after).tolist() == [k == 6 for k in range(10)]


def test_no_lines_and_empty_lines():
    assert parity(np.zeros((0, 76), np.uint8)).shape == (0,)
    assert parity(np.zeros((3, 0), np.uint8)).tolist() == [0, 0, 0]
