"""Base64 chunk bodies: 76-column lines, each followed by a space, a parity nibble and LF.

Vectorised over a batch of equal-length chunks, with a fixed number of library calls per
batch whatever the number of chunks: the full 76-character lines of every chunk (57 raw bytes
each) are gathered and encoded or decoded with one pybase64 call, each chunk's last line with
one more, and its final partial quantum (the '=' padding) through a lookup table. Each line's
characters, space, parity digit and LF are put in place (or checked and taken out) in one pass
by the C kernel (``formats/_kernels.c``). Where pybase64's extension exports libbase64's
decoder, the kernel decodes the full lines too, a few hundred at a time while their characters
are in the cache, straight into the array. It, numpy and pybase64 do the per-byte work and
release the GIL, so two threads run on two cores.

Decoding comes in two strengths: ``decode_bodies`` returns None whenever the text is not
exactly canonical (separators, parity, alphabet, padding, padding bits), and the caller then
re-reads the lines one by one to name the first fault; ``decode_bodies_unchecked`` (for
review, which does not verify) only refuses what cannot be decoded.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pybase64
from numpy.lib.stride_tricks import as_strided

from ._grammar import RAW_PER_LINE, WIDTH
from .._kernels import decode_lines, gather_lines, put_lines, set_base64_decoder

LINE = WIDTH + 3  # 76 chars, space, parity digit, LF
ALPHABET = np.frombuffer(
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", np.uint8)
HEX_DIGITS = np.frombuffer(b"0123456789abcdef", np.uint8)
HEX_VALUE = np.full(256, 0xFF, np.uint8)
HEX_VALUE[HEX_DIGITS] = np.arange(16, dtype=np.uint8)
B64_VALUE = np.full(256, 0xFF, np.uint8)
B64_VALUE[ALPHABET] = np.arange(64, dtype=np.uint8)
_PAD = ord("=")


def _bind_libbase64() -> bool:
    """Hand the C kernel libbase64's ``base64_decode`` from pybase64's extension; False where
    the extension is missing or does not export it (then pybase64 decodes gathered lines)."""
    try:
        from pybase64 import _pybase64
        symbol = ctypes.CDLL(_pybase64.__file__).base64_decode
    except (ImportError, OSError, AttributeError):
        return False
    set_base64_decoder(ctypes.cast(symbol, ctypes.c_void_p).value)
    return True


KERNEL_DECODES = _bind_libbase64()


def b64_len(length: int) -> int:
    return 4 * -(-length // 3)


def body_len(length: int) -> int:
    """Bytes of base64 text (with parity and LFs) for a chunk of ``length`` raw bytes."""
    full, tail = divmod(b64_len(length), WIDTH)
    return full * LINE + (tail + 3 if tail else 0)


def line_parity(line: bytes) -> int:
    """The parity nibble of one line's characters: their XOR, low four bits (the definition;
    the C kernel computes the same for whole batches)."""
    acc = 0
    for c in line:
        acc ^= c
    return acc & 0xF


class _Shape:
    """How a chunk of ``length`` bytes splits into lines: ``full`` lines of 57 bytes that
    decode without padding, then a last line of ``tail_chars`` characters (0: none) holding
    ``tail_whole`` whole quanta and, when ``rest`` (1 or 2) is set, a padded final quantum."""

    def __init__(self, length: int) -> None:
        self.length = length
        full, tail = divmod(length, RAW_PER_LINE)
        self.full, self.tail_bytes = full, tail
        self.tail_whole, self.rest = divmod(tail, 3)
        self.tail_chars = b64_len(tail)


def encode_bodies(raw, length: int, count: int, out: np.ndarray) -> None:
    """Write the bodies of ``count`` chunks of ``length`` bytes (``raw`` holds them back to back)
    into ``out`` of shape (count, body_len(length))."""
    if length == 0:
        return
    s = _Shape(length)
    data = np.frombuffer(raw, np.uint8, count * length).reshape(count, length)
    if s.full:
        chars = _encode_whole(data[:, :s.full * RAW_PER_LINE]).reshape(count, s.full, WIDTH)
        put_lines(out[:, :s.full * LINE].reshape(count, s.full, LINE), chars)
    if s.tail_chars:
        tail_data = data[:, s.full * RAW_PER_LINE:]
        chars = np.empty((count, s.tail_chars), np.uint8)
        if s.tail_whole:
            chars[:, :4 * s.tail_whole] = _encode_whole(tail_data[:, :3 * s.tail_whole])
        if s.rest:
            chars[:, 4 * s.tail_whole:] = _encode_final(tail_data[:, 3 * s.tail_whole:])
        tail = out[:, s.full * LINE:s.full * LINE + s.tail_chars + 3]
        put_lines(tail[:, None, :], chars[:, None, :])


def _encode_whole(data: np.ndarray) -> np.ndarray:
    """(count, 3k) bytes -> (count, 4k) base64 characters, with one pybase64 call."""
    text = pybase64.b64encode(np.ascontiguousarray(data))
    return np.frombuffer(text, np.uint8).reshape(data.shape[0], -1)


def _encode_final(data: np.ndarray) -> np.ndarray:
    """(count, 1 or 2) bytes -> (count, 4) characters of a padded final quantum."""
    out = np.full((data.shape[0], 4), _PAD, np.uint8)
    b0 = data[:, 0]
    b1 = data[:, 1] if data.shape[1] == 2 else np.zeros_like(b0)
    out[:, 0] = ALPHABET[b0 >> 2]
    out[:, 1] = ALPHABET[((b0 & 0x3) << 4) | (b1 >> 4)]
    if data.shape[1] == 2:
        out[:, 2] = ALPHABET[(b1 & 0xF) << 2]
    return out


def decode_bodies(text: np.ndarray, length: int, out=None):
    """Inverse of encode_bodies for ``text`` of shape (count, body_len(length)).

    Returns the raw bytes of all chunks back to back as a uint8 array (written into ``out``,
    a writable buffer of count * length bytes, when given), or None if anything is not
    canonical (separators, parity, alphabet, padding, padding bits).
    """
    try:
        return _decode(text, length, out, check=True)
    except ValueError:
        return None


def decode_bodies_unchecked(text: np.ndarray, length: int, out=None) -> np.ndarray:
    """Decode (count, body_len(length)) chunk bodies without the parity and separator checks.
    Raises ValueError where the characters are not base64 or the padding is not canonical."""
    return _decode(text, length, out, check=False)


def _decode(text: np.ndarray, length: int, out, check: bool) -> np.ndarray:
    count = text.shape[0]
    dest = (np.empty(count * length, np.uint8) if out is None
            else np.frombuffer(out, np.uint8, count * length))
    if length == 0:
        return dest
    s = _Shape(length)
    rows = dest.reshape(count, length)
    if s.full:
        lines = text[:, :s.full * LINE].reshape(count, s.full, LINE)
        if KERNEL_DECODES:
            into = as_strided(rows, (count, s.full, RAW_PER_LINE),
                              (rows.strides[0], RAW_PER_LINE, 1))
            if not decode_lines(lines, into, check):
                raise ValueError("separators, parity or base64")
        else:
            _decode_whole(_gather(lines, check), rows[:, :s.full * RAW_PER_LINE])
    if s.tail_chars:
        tail = text[:, s.full * LINE:s.full * LINE + s.tail_chars + 3][:, None, :]
        chars = _gather(tail, check)[:, 0, :]
        at = s.full * RAW_PER_LINE
        if s.tail_whole:
            _decode_whole(chars[:, :4 * s.tail_whole], rows[:, at:at + 3 * s.tail_whole])
        if s.rest:
            rows[:, at + 3 * s.tail_whole:] = _decode_final(chars[:, 4 * s.tail_whole:], s.rest)
    return dest


def _gather(lines: np.ndarray, check: bool) -> np.ndarray:
    """The characters of (count, n, width + 3) lines as a contiguous (count, n, width) array.
    With ``check``, raise ValueError unless every line ends in a space, its parity digit and
    LF."""
    count, n, width = lines.shape[0], lines.shape[1], lines.shape[2] - 3
    chars = np.empty((count, n, width), np.uint8)
    if not gather_lines(lines, chars, check):
        raise ValueError("separators or parity")
    return chars


def _decode_whole(chars: np.ndarray, dest: np.ndarray) -> None:
    """(..., 4k) contiguous characters without padding -> 3k bytes each into ``dest``, with
    one pybase64 call."""
    raw = pybase64.b64decode(np.ascontiguousarray(chars), validate=True)
    if len(raw) != dest.size:
        raise ValueError("base64 padding inside a chunk body")
    dest[...] = np.frombuffer(raw, np.uint8).reshape(dest.shape)


def _decode_final(quantum: np.ndarray, rest: int) -> np.ndarray:
    """(count, 4) characters of a padded final quantum -> (count, rest) bytes; refuses
    anything but canonical padding (the unused bits zero)."""
    values = B64_VALUE[quantum[:, :rest + 1]]
    if (values == 0xFF).any() or not (quantum[:, rest + 1:] == _PAD).all():
        raise ValueError("bad final base64 quantum")
    if (values[:, rest] & (0x3 if rest == 2 else 0xF)).any():
        raise ValueError("non-zero padding bits")
    v = values.astype(np.uint16)
    out = np.empty((quantum.shape[0], rest), np.uint8)
    out[:, 0] = ((v[:, 0] << 2) | (v[:, 1] >> 4)) & 0xFF
    if rest == 2:
        out[:, 1] = ((v[:, 1] << 4) | (v[:, 2] >> 2)) & 0xFF
    return out
