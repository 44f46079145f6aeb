"""Bounded decoders for metadata payloads: zstd, MessagePack, JSON.

Each takes bytes from an untrusted file and returns a value or raises a FormatError; memory is
bounded by the declared uncompressed length, itself capped by MAX_METADATA_ULEN.
"""

from __future__ import annotations

import json
from typing import Any

import msgpack
import zstandard

from ..errors import FormatError, LimitError
from ..limits import zstd_decompressor
from . import _spec as S

_READ_STEP = 1 << 20


def unzstd(stored, ulen: int, *, chunk: str) -> bytes:
    """Decompress one zstd payload that must inflate to exactly ``ulen`` bytes.

    Output is produced a MiB at a time and stops one byte past ``ulen``, so a bomb costs at most
    ``ulen`` bytes of memory, however much it would expand.
    """
    if ulen > S.MAX_METADATA_ULEN:
        raise LimitError("metadata chunk too large to decompress", chunk=None,
                         expected=f"ulen <= {S.MAX_METADATA_ULEN}", got=f"{ulen} ({chunk})")
    try:
        declared = zstandard.frame_content_size(stored)
    except zstandard.ZstdError as exc:
        raise FormatError(f"{chunk}: not a zstd frame", got=str(exc)) from exc
    if declared >= 0 and declared != ulen:
        raise FormatError(f"{chunk}: zstd frame size disagrees with the TOC",
                          expected=f"{ulen} bytes", got=declared)
    out = bytearray()
    try:
        reader = zstd_decompressor().stream_reader(stored, read_across_frames=True)
        with reader:
            while len(out) <= ulen:
                piece = reader.read(min(_READ_STEP, ulen + 1 - len(out)))
                if not piece:
                    break
                out += piece
    except zstandard.ZstdError as exc:
        raise FormatError(f"{chunk}: corrupt zstd data", got=str(exc)) from exc
    if len(out) != ulen:
        got = f"{len(out)} bytes" if len(out) <= ulen else "more"
        raise FormatError(f"{chunk}: decompressed size disagrees with the TOC",
                          expected=f"{ulen} bytes", got=got)
    return bytes(out)


def unpack_msgpack(data, *, chunk: str, allow_trailing_zeros: bool = False) -> Any:
    """One MessagePack object with every length bounded by the payload size; no ext types."""
    size = len(data)
    unpacker = msgpack.Unpacker(
        raw=False, strict_map_key=True, use_list=True, max_buffer_size=max(size, 1),
        max_str_len=size, max_bin_len=size, max_array_len=size, max_map_len=size // 2,
        max_ext_len=0, ext_hook=_no_ext, timestamp=0)
    try:
        unpacker.feed(data)
        value = unpacker.unpack()
        used = unpacker.tell()
    except msgpack.OutOfData as exc:
        raise FormatError(f"{chunk}: truncated MessagePack", got=str(exc)) from exc
    except (msgpack.UnpackException, ValueError, TypeError, UnicodeDecodeError, RecursionError,
            MemoryError) as exc:
        raise FormatError(f"{chunk}: malformed MessagePack",
                          got=f"{type(exc).__name__}: {exc}") from exc
    rest = bytes(memoryview(data)[used:])
    if rest and not (allow_trailing_zeros and not rest.strip(b"\0")):
        raise FormatError(f"{chunk}: bytes after the MessagePack object",
                          expected="nothing" + (" or zero padding" if allow_trailing_zeros else ""),
                          got=f"{len(rest)} bytes")
    return value


def _no_ext(code, data):
    raise ValueError(f"MessagePack extension type {code} is not allowed")


def load_json(data, *, chunk: str) -> Any:
    """Strict JSON (no NaN/Infinity) from UTF-8 bytes; deep nesting fails as RecursionError."""
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(f"{chunk}: JSON is not UTF-8", got=str(exc)) from exc
    try:
        return json.loads(text, parse_constant=_bad_constant)
    except (ValueError, RecursionError) as exc:
        raise FormatError(f"{chunk}: malformed JSON", got=str(exc)) from exc


def _bad_constant(name: str):
    raise ValueError(f"non-standard JSON constant {name}")
