"""The typed metadata encoding v1: one tag byte before each little-endian value.

Tags: 0x01 bool (u8), 0x02 i64 (negative ints), 0x03 u64 (ints >= 0), 0x04 f64, 0x05 str
(u32 length + UTF-8), 0x06 bytes (u32 length), 0x07 array (u32 count + values), 0x08 map (u32
count, then per entry u16 key length + UTF-8 key + value; keys sorted). The top level is a map;
trailing bytes are an error; there is no null.

:func:`decode_metadata` is a pure function of a buffer that raises only :class:`FormatError`
subclasses. Every declared count and length is checked against the bytes that remain (and the
total number of values against ``MAX_VALUES``) before anything is built, so a hostile block
cannot make the decoder allocate more than a small multiple of its own size.

>>> encode_metadata({"b": True, "a": -1}).hex()
'080200000001006102ffffffffffffffff0100620101'
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from ..errors import DataError, FormatError, LimitError, TruncatedError
from . import _spec as S

_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")
_F64 = struct.Struct("<d")
_MIN_SIZE = {S.T_ARRAY: 1, S.T_MAP: 3}   # smallest encoding of one array item / map entry

# ---- encoding ----------------------------------------------------------------------------------


def encode_metadata(meta: dict) -> bytes:
    """The canonical encoding of the top-level map ``meta`` (keys sorted at every level).

    Raises :class:`DataError` for values the encoding cannot hold (None, ints outside
    i64/u64, non-str keys, nesting deeper than ``MAX_DEPTH``).
    """
    if not isinstance(meta, dict):
        raise DataError(f"PyCauset metadata must be a dict, got {type(meta).__name__}")
    out = bytearray()
    _encode(meta, out, 0, "metadata")
    return bytes(out)


def _encode(value: Any, out: bytearray, depth: int, where: str) -> None:
    if depth > S.MAX_DEPTH:
        raise DataError(f"{where}: metadata nested deeper than {S.MAX_DEPTH} levels")
    if isinstance(value, (bool, np.bool_)):
        out += bytes((S.T_BOOL, 1 if value else 0))
    elif isinstance(value, (int, np.integer)):
        value = int(value)
        if value < 0:
            if value < -(1 << 63):
                raise DataError(f"{where}: {value} does not fit in i64")
            out += bytes((S.T_I64,)) + _I64.pack(value)
        else:
            if value >= 1 << 64:
                raise DataError(f"{where}: {value} does not fit in u64")
            out += bytes((S.T_U64,)) + _U64.pack(value)
    elif isinstance(value, (float, np.floating)):
        out += bytes((S.T_F64,)) + _F64.pack(float(value))
    elif isinstance(value, str):
        _encode_sized(S.T_STR, _utf8(value, where), out, where)
    elif isinstance(value, (bytes, bytearray, memoryview)):
        _encode_sized(S.T_BYTES, bytes(value), out, where)
    elif isinstance(value, (list, tuple)):
        out += bytes((S.T_ARRAY,)) + _U32.pack(len(value))
        for i, item in enumerate(value):
            _encode(item, out, depth + 1, f"{where}[{i}]")
    elif isinstance(value, dict):
        _encode_map(value, out, depth, where)
    else:
        raise DataError(f"{where}: {type(value).__name__} has no PyCauset metadata encoding "
                        "(bool, int, float, str, bytes, list, dict; no None)")


def _utf8(text: str, where: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:       # lone surrogates: no reader could decode them
        raise DataError(f"{where}: string is not valid Unicode ({exc.reason})") from exc


def _encode_sized(tag: int, raw: bytes, out: bytearray, where: str) -> None:
    if len(raw) > 0xFFFFFFFF:
        raise DataError(f"{where}: value longer than 4 GiB")
    out += bytes((tag,)) + _U32.pack(len(raw)) + raw


def _encode_map(value: dict, out: bytearray, depth: int, where: str) -> None:
    for key in value:
        if not isinstance(key, str):
            raise DataError(f"{where}: map keys must be str, got {key!r}")
    out += bytes((S.T_MAP,)) + _U32.pack(len(value))
    for key in sorted(value):                   # code-point order == UTF-8 byte order
        raw = _utf8(key, where)
        if len(raw) > 0xFFFF:
            raise DataError(f"{where}: key longer than 65535 bytes")
        out += _U16.pack(len(raw)) + raw
        _encode(value[key], out, depth + 1, f"{where}.{key}")


# ---- decoding ----------------------------------------------------------------------------------


class _Reader:
    """A cursor over the metadata buffer; ``base`` turns positions into file offsets."""

    __slots__ = ("buf", "pos", "end", "base", "values")

    def __init__(self, buf, base: int) -> None:
        self.buf = memoryview(buf).cast("B") if not isinstance(buf, bytes) else buf
        self.pos = 0
        self.end = len(buf)
        self.base = base
        self.values = 0

    def need(self, n: int, what: str) -> int:
        at = self.pos
        if n > self.end - at:
            raise TruncatedError(f"metadata {what} runs past the end of the block",
                                 offset=self.base + at, expected=f"{n} more bytes",
                                 got=f"{self.end - at} bytes", check="metadata")
        self.pos = at + n
        return at

    def unpack(self, st: struct.Struct, what: str):
        return st.unpack_from(self.buf, self.need(st.size, what))[0]

    def text(self, n: int, what: str) -> str:
        at = self.need(n, what)
        try:
            return str(self.buf[at:at + n], "utf-8")
        except UnicodeDecodeError as exc:
            raise FormatError(f"metadata {what} is not UTF-8", offset=self.base + at,
                              expected="UTF-8", got=str(exc), check="metadata") from exc

    def count(self, per_item: int, what: str) -> int:
        """A u32 count, checked against the bytes left and the value budget."""
        at = self.pos
        n = self.unpack(_U32, f"{what} count")
        if n * per_item > self.end - self.pos:
            raise LimitError(f"metadata {what} declares more entries than the block holds",
                             offset=self.base + at,
                             expected=f"<= {(self.end - self.pos) // per_item}", got=n)
        self.budget(n, at)
        return n

    def budget(self, n: int, at: int) -> None:
        self.values += n
        if self.values > S.MAX_VALUES:
            raise LimitError("metadata holds too many values", offset=self.base + at,
                             expected=f"<= {S.MAX_VALUES}", got=self.values)


def decode_metadata(buf, *, base: int = 0) -> dict:
    """Decode one encoded metadata payload (bytes, memoryview or a slice of an mmap).

    ``base`` is the file offset of ``buf[0]``, used in error messages.

    >>> decode_metadata(bytes.fromhex("080100000001006103" + "0100000000000000"))
    {'a': 1}
    """
    if len(buf) > S.MAX_METADATA_PAYLOAD:
        raise LimitError("metadata payload too large", offset=base,
                         expected=f"<= {S.MAX_METADATA_PAYLOAD} bytes", got=len(buf))
    r = _Reader(buf, base)
    if r.end == 0 or r.buf[0] != S.T_MAP:
        raise FormatError("top-level metadata must be a map", offset=base, expected="tag 0x08",
                          got=f"tag 0x{r.buf[0]:02x}" if r.end else "nothing", check="metadata")
    r.budget(1, 0)
    value = _decode(r, 0)
    if r.pos != r.end:
        raise FormatError("trailing bytes after the metadata map", offset=base + r.pos,
                          expected=f"{r.pos} bytes", got=f"{r.end} bytes", check="metadata")
    return value


def _decode(r: _Reader, depth: int) -> Any:
    at = r.pos
    tag = r.unpack(_U8, "tag")
    if tag == S.T_BOOL:
        raw = r.unpack(_U8, "bool")
        if raw > 1:
            raise FormatError("bool must be 0 or 1", offset=r.base + at + 1, expected="0 or 1",
                              got=raw, check="metadata")
        return raw == 1
    if tag == S.T_I64:
        return r.unpack(_I64, "i64")
    if tag == S.T_U64:
        return r.unpack(_U64, "u64")
    if tag == S.T_F64:
        return r.unpack(_F64, "f64")
    if tag == S.T_STR:
        return r.text(r.unpack(_U32, "string length"), "string")
    if tag == S.T_BYTES:
        n = r.unpack(_U32, "bytes length")
        start = r.need(n, "bytes")
        return bytes(r.buf[start:start + n])
    if tag in (S.T_ARRAY, S.T_MAP):
        if depth >= S.MAX_DEPTH:
            raise LimitError("metadata nested too deeply", offset=r.base + at,
                             expected=f"<= {S.MAX_DEPTH} levels", got=depth + 1)
        if tag == S.T_ARRAY:
            n = r.count(_MIN_SIZE[S.T_ARRAY], "array")
            return [_decode(r, depth + 1) for _ in range(n)]
        return _decode_map(r, depth)
    raise FormatError("unknown metadata tag", offset=r.base + at, expected="0x01..0x08",
                      got=f"0x{tag:02x}", check="metadata")


def _decode_map(r: _Reader, depth: int) -> dict:
    n = r.count(_MIN_SIZE[S.T_MAP], "map")
    out: dict[str, Any] = {}
    for _ in range(n):
        at = r.pos
        key = r.text(r.unpack(_U16, "key length"), "key")
        if key in out:
            raise FormatError("duplicate metadata key", offset=r.base + at,
                              expected="unique keys", got=key, check="metadata")
        out[key] = _decode(r, depth + 1)
    return out


def is_canonical(buf, value: dict) -> bool:
    """True when ``buf`` is exactly the canonical encoding of ``value`` (sorted keys, int tags
    by sign). Readers accept other orders; ``verify`` reports them as a note."""
    try:
        return encode_metadata(value) == bytes(buf)
    except DataError:
        return False
