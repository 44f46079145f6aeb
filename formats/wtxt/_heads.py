"""The ch lines of a run of equal chunks as one numpy block: built by the writer, compared
by the reader, with a fixed number of numpy calls per run.

Within a run every ch line has the same width (``ChunkPlan.runs`` cuts runs where the ix
field grows a digit), so the lines form a (count, width) array whose ix and off columns are
digits of an arithmetic sequence and whose sha256 and crc32c columns are the hex of values
computed per chunk (one hashlib and one crc32c call each: all the per-chunk Python left).
"""

from __future__ import annotations

import hashlib

import numpy as np

from ..integrity import crc32c_holding_gil
from ._grammar import ZERO64, ch_line
from ._lines import HEX_DIGITS

_CRC_SHIFTS = np.arange(28, -4, -4, dtype=np.uint32)
_IS_HEX = np.zeros(256, bool)
_IS_HEX[HEX_DIGITS] = True


def digits(values: np.ndarray, width: int) -> np.ndarray:
    """(n,) non-negative integers -> (n, width) ASCII decimal digits, zero-padded."""
    powers = 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
    return ((values[:, None] // powers) % 10 + 48).astype(np.uint8)


def hex_digits(data: np.ndarray) -> np.ndarray:
    """(n, k) bytes -> (n, 2k) lowercase hex digits."""
    out = np.empty((data.shape[0], 2 * data.shape[1]), np.uint8)
    out[:, 0::2] = HEX_DIGITS[data >> 4]
    out[:, 1::2] = HEX_DIGITS[data & 0xF]
    return out


def chunk_crcs(raw, count: int, length: int) -> np.ndarray:
    """CRC32C (count, 8 hex digits) of ``count`` chunks of ``length`` bytes in ``raw``."""
    view = memoryview(raw).cast("B")
    crcs = [crc32c_holding_gil(view[k * length:(k + 1) * length]) for k in range(count)]
    return HEX_DIGITS[(np.array(crcs, np.uint32)[:, None] >> _CRC_SHIFTS) & 0xF]


def chunk_digests(raw, count: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """SHA-256 (count, 64 hex digits) and CRC32C (count, 8 hex digits) of ``count`` chunks
    of ``length`` bytes held back to back in ``raw``."""
    view = memoryview(raw).cast("B")
    shas, crcs = [], []
    for k in range(count):
        piece = view[k * length:(k + 1) * length]
        shas.append(hashlib.sha256(piece).digest())
        crcs.append(crc32c_holding_gil(piece))
    sha = hex_digits(np.frombuffer(b"".join(shas), np.uint8).reshape(count, 32))
    crc = HEX_DIGITS[(np.array(crcs, np.uint32)[:, None] >> _CRC_SHIFTS) & 0xF]
    return sha, crc


class RunHeads:
    """The ch lines (each with its LF) of chunks ``first`` .. ``first + count - 1`` of
    ``length`` bytes, the first at raw offset ``start``, with zeros for the hash fields."""

    def __init__(self, first: int, count: int, length: int, start: int) -> None:
        line = (ch_line(first, start, length, ZERO64, 0) + "\n").encode("ascii")
        self.width = len(line)
        self.sha_at = line.index(b" sha256=") + len(" sha256=")
        self.crc_at = line.index(b" crc32c=") + len(" crc32c=")
        self.lines = np.tile(np.frombuffer(line, np.uint8), (count, 1))
        ix_width = line.index(b" off=") - len("ch ix=")
        off_at = line.index(b" off=") + len(" off=")
        self.lines[:, 6:6 + ix_width] = digits(first + np.arange(count, dtype=np.int64),
                                               ix_width)
        self.lines[:, off_at:off_at + 12] = digits(
            start + length * np.arange(count, dtype=np.int64), 12)

    def fill(self, sha: np.ndarray, crc: np.ndarray) -> np.ndarray:
        """The finished lines, given the hex columns from ``chunk_digests``."""
        self.lines[:, self.sha_at:self.sha_at + 64] = sha
        self.lines[:, self.crc_at:self.crc_at + 8] = crc
        return self.lines

    def match(self, text: np.ndarray, sha: np.ndarray, crc: np.ndarray) -> bool:
        """Whether (count, width) ``text`` holds exactly these lines with these hashes."""
        return bool(np.array_equal(text, self.fill(sha, crc)))

    def match_unhashed(self, text: np.ndarray, crc: np.ndarray) -> bool:
        """``match`` with the sha256 fields taken as written (64 lowercase hex digits each)
        instead of computed."""
        sha = text[:, self.sha_at:self.sha_at + 64]
        return bool(_IS_HEX[sha].all()) and self.match(text, sha, crc)
