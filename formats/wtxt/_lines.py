"""Base64 chunk bodies: 76-column lines, each followed by a space, a parity nibble and LF.

Vectorised over a batch of equal-length chunks: numpy and pybase64 do the per-byte work (and
release the GIL), Python only loops per chunk. Decoding returns None whenever the text is not
exactly canonical; the caller then re-reads those lines one by one to name the first fault.
"""

from __future__ import annotations

import numpy as np
import pybase64

from ._grammar import WIDTH

LINE = WIDTH + 3  # 76 chars, space, parity digit, LF
HEX_DIGITS = np.frombuffer(b"0123456789abcdef", np.uint8)
HEX_VALUE = np.full(256, 0xFF, np.uint8)
HEX_VALUE[HEX_DIGITS] = np.arange(16, dtype=np.uint8)
B64_VALUE = np.full(256, 0xFF, np.uint8)
B64_VALUE[np.frombuffer(
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", np.uint8)] = np.arange(64)


def b64_len(length: int) -> int:
    return 4 * -(-length // 3)


def parity(chars: np.ndarray) -> np.ndarray:
    """XOR of each line's characters masked to 4 bits; ``chars`` is (..., n) with n % 4 == 0."""
    words = np.bitwise_xor.reduce(chars.view("<u4"), axis=-1)
    words ^= words >> 16
    words ^= words >> 8
    return (words & 0xF).astype(np.uint8)


def line_parity(line: bytes) -> int:
    acc = 0
    for c in line:
        acc ^= c
    return acc & 0xF


def encode_bodies(raw, length: int, count: int, out: np.ndarray) -> None:
    """Write the bodies of ``count`` chunks of ``length`` bytes (``raw`` holds them back to back)
    into ``out`` of shape (count, body_len(length))."""
    if length == 0:
        return
    if length % 3 == 0:
        text = pybase64.b64encode(raw)
    else:
        view = memoryview(raw)
        text = b"".join(pybase64.b64encode(view[i * length:(i + 1) * length]) for i in range(count))
    chars = np.frombuffer(text, np.uint8).reshape(count, b64_len(length))
    full, tail = divmod(chars.shape[1], WIDTH)
    if full:
        src = chars[:, :full * WIDTH].reshape(count, full, WIDTH)
        dst = out[:, :full * LINE].reshape(count, full, LINE)
        dst[:, :, :WIDTH] = src
        dst[:, :, WIDTH] = 0x20
        dst[:, :, WIDTH + 1] = HEX_DIGITS[parity(src)]
        dst[:, :, WIDTH + 2] = 0x0A
    if tail:
        src = chars[:, full * WIDTH:]
        dst = out[:, full * LINE:]
        dst[:, :tail] = src
        dst[:, tail] = 0x20
        dst[:, tail + 1] = HEX_DIGITS[parity(src)]
        dst[:, tail + 2] = 0x0A


def decode_bodies(text: np.ndarray, length: int, out: memoryview | None = None):
    """Inverse of encode_bodies for ``text`` of shape (count, body_len(length)).

    Returns the raw bytes of all chunks back to back (written into ``out`` when given, and then
    ``out`` is returned), or None if anything is not canonical (separators, parity, alphabet,
    padding, padding bits).
    """
    count = text.shape[0]
    if length == 0:
        return out if out is not None else b""
    full, tail = divmod(b64_len(length), WIDTH)
    chars = np.empty((count, b64_len(length)), np.uint8)
    if full:
        lines = text[:, :full * LINE].reshape(count, full, LINE)
        body = chars[:, :full * WIDTH].reshape(count, full, WIDTH)
        body[...] = lines[:, :, :WIDTH]
        if not (_separators_ok(lines[:, :, WIDTH:], WIDTH) and
                np.array_equal(HEX_VALUE[lines[:, :, WIDTH + 1]], parity(body))):
            return None
    if tail:
        last = text[:, full * LINE:]
        chars[:, full * WIDTH:] = last[:, :tail]
        if not (_separators_ok(last[:, tail:], tail) and
                np.array_equal(HEX_VALUE[last[:, tail + 1]], parity(chars[:, full * WIDTH:]))):
            return None
    if not _padding_ok(chars, length):
        return None
    try:
        if length % 3 == 0:
            raw = pybase64.b64decode(chars, validate=True)
        elif out is None:
            raw = b"".join(pybase64.b64decode(row, validate=True) for row in chars)
        else:
            for i, row in enumerate(chars):
                piece = pybase64.b64decode(row, validate=True)
                if len(piece) != length:
                    return None
                out[i * length:(i + 1) * length] = piece
            return out
    except ValueError:
        return None
    if len(raw) != count * length:
        return None
    if out is not None:
        out[:] = raw
        return out
    return raw


def _separators_ok(seps: np.ndarray, _width: int) -> bool:
    return bool((seps[..., 0] == 0x20).all() and (seps[..., 2] == 0x0A).all())


def _padding_ok(chars: np.ndarray, length: int) -> bool:
    """'=' exactly as the final padding and zero padding bits (canonical base64); pybase64's
    validate=True rejects any other character or a misplaced '='."""
    pad = (3 - length % 3) % 3
    if not pad:
        return True
    if not (chars[:, -pad:] == ord("=")).all():
        return False
    values = B64_VALUE[chars[:, -pad - 1]]
    return not (values & {1: 0x3, 2: 0xF}[pad]).any()
