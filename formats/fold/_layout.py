"""FOLD byte layout: the 28-byte header, 32-byte chunk headers, the JSON index and its hashes.

Everything here is a pure function of bytes (no files): the writer packs with it, the reader
parses and validates with it. Every length is checked against its limit before it is used.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from dataclasses import dataclass
from typing import Any

from ..errors import (
    ChecksumError, FormatError, LimitError, TruncatedError, UnsupportedVersionError,
)
from ._ecc import ecc_length, parse_algo

MAGIC = b"FOLDv1\0\0"
HEADER = struct.Struct(">8sIQQ")            # magic, header_len, index_off, index_len
CHUNK_HEADER = struct.Struct(">4sIQQII")    # ctype, flags, uncomp_len, comp_len, crc32c, ecc_len
HEADER_LEN = HEADER.size                    # 28
CHUNK_HEADER_LEN = CHUNK_HEADER.size        # 32

FLAG_NONE = 0
FLAG_ZSTD = 1
MAX_INDEX_SIZE = 100 * 1024 * 1024
MAX_CHUNK_SIZE = 2 * 1024 * 1024 * 1024
# A zstd block yields at most 128 KiB and takes at least 4 bytes (an RLE block), so no valid
# frame expands more than 32768-fold: a larger declared size is a bomb, refused before any work.
ZSTD_MAX_RATIO = 32768

FORMAT_NAME = "fold"
FORMAT_VERSION = "1.2.0"
READ_VERSIONS = ("1.0.0", "1.1.0", "1.2.0")
INDEX_KEYS = ("format", "version", "created_at_unix", "metadata", "chunks")
ENTRY_KEYS = ("name", "ctype", "flags", "offset", "header_len", "comp_len", "uncomp_len",
              "crc32c", "sha256", "ecc_algo", "ecc_len")
MIND_CHUNKS = ("ai_graph", "ai_vectors")
_SHA_HEX = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Limits:
    """Read/write bounds. ``max_ecc_repairs`` caps the Reed–Solomon blocks decoded per file
    (pure-Python reedsolo takes ~2 ms a block)."""

    max_index: int = MAX_INDEX_SIZE
    max_chunk: int = MAX_CHUNK_SIZE
    max_ecc_repairs: int = 4096


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class Header:
    index_off: int
    index_len: int


@dataclass(frozen=True)
class ChunkEntry:
    """One ``chunks[]`` entry of the index (``header_len`` is always 32)."""

    name: str
    ctype: str
    flags: int
    offset: int
    comp_len: int
    uncomp_len: int
    crc32c: int
    sha256: str
    ecc_algo: str
    ecc_len: int

    @property
    def payload_off(self) -> int:
        return self.offset + CHUNK_HEADER_LEN

    @property
    def end(self) -> int:
        return self.payload_off + self.comp_len + self.ecc_len

    def to_json(self) -> dict:
        return {"name": self.name, "ctype": self.ctype, "flags": self.flags,
                "offset": self.offset, "header_len": CHUNK_HEADER_LEN,
                "comp_len": self.comp_len, "uncomp_len": self.uncomp_len,
                "crc32c": self.crc32c, "sha256": self.sha256, "ecc_algo": self.ecc_algo,
                "ecc_len": self.ecc_len}

    def header_bytes(self) -> bytes:
        return CHUNK_HEADER.pack(self.ctype.encode("ascii"), self.flags, self.uncomp_len,
                                 self.comp_len, self.crc32c, self.ecc_len)


@dataclass(frozen=True)
class Index:
    version: str
    created_at: float
    metadata: dict
    chunks: tuple[ChunkEntry, ...]


# -- header -------------------------------------------------------------------------------------

def pack_header(index_off: int = 0, index_len: int = 0) -> bytes:
    return HEADER.pack(MAGIC, HEADER_LEN, index_off, index_len)


def parse_header(buf, file_size: int, limits: Limits = DEFAULT_LIMITS) -> Header:
    if file_size < HEADER_LEN:
        raise TruncatedError("file shorter than the FOLD header", offset=file_size,
                             expected=f"{HEADER_LEN} bytes", got=file_size)
    magic, header_len, index_off, index_len = HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise FormatError("not a FOLD file", offset=0, expected=repr(MAGIC), got=bytes(magic))
    if header_len != HEADER_LEN:
        raise FormatError("bad header_len", offset=8, expected=str(HEADER_LEN), got=header_len)
    if index_off < HEADER_LEN:
        raise FormatError("index_off points into the header", offset=12,
                          expected=f">= {HEADER_LEN}", got=index_off)
    if index_len > limits.max_index:
        raise LimitError("index too large", offset=20, expected=f"<= {limits.max_index}",
                         got=index_len)
    end = index_off + index_len
    if end > file_size:
        raise TruncatedError("index extends past the end of the file", offset=index_off,
                             expected=f"{end} bytes", got=file_size)
    if end != file_size:
        raise FormatError("bytes after the index", offset=end,
                          expected=f"file size {end}", got=file_size)
    return Header(index_off, index_len)


# -- hashes -------------------------------------------------------------------------------------

def manifest_hash(metadata: dict) -> str:
    """SHA-256 of the canonical JSON of ``metadata`` without ``manifest_hash`` (peer's rule)."""
    body = {k: v for k, v in metadata.items() if k != "manifest_hash"}
    try:
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError) as exc:   # non-string keys cannot come from JSON text
        raise FormatError("metadata cannot be canonicalised", got=str(exc)) from exc
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def index_bytes(entries: list[ChunkEntry], metadata: dict, created_at: float) -> bytes:
    """The index JSON: compact, keys in the peer's order, chunk_hashes and manifest_hash last."""
    meta = dict(metadata)
    meta["chunk_hashes"] = {e.name: e.sha256 for e in entries}
    meta["manifest_hash"] = manifest_hash(meta)
    index = {"format": FORMAT_NAME, "version": FORMAT_VERSION,
             "created_at_unix": float(created_at), "metadata": meta,
             "chunks": [e.to_json() for e in entries]}
    return json.dumps(index, ensure_ascii=False, separators=(",", ":"),
                      allow_nan=False).encode("utf-8")


# -- index --------------------------------------------------------------------------------------

def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def decode_json(raw, offset: int, what: str) -> Any:
    """Strict JSON: UTF-8, no duplicate keys; every failure is a FormatError at ``offset``."""
    try:
        text = bytes(raw).decode("utf-8")
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except UnicodeDecodeError as exc:
        raise FormatError(f"{what} is not UTF-8", offset=offset + exc.start,
                          expected="UTF-8 JSON", got=str(exc)) from exc
    except json.JSONDecodeError as exc:
        raise FormatError(f"{what} is not valid JSON", offset=offset,
                          expected="JSON", got=f"{exc.msg} at char {exc.pos}") from exc
    except (ValueError, RecursionError) as exc:   # duplicates, huge ints, deep nesting
        raise FormatError(f"{what} is not acceptable JSON", offset=offset,
                          expected="JSON", got=str(exc)) from exc


def parse_index(raw, header: Header, limits: Limits = DEFAULT_LIMITS) -> Index:
    off = header.index_off
    obj = decode_json(raw, off, "index")
    if not isinstance(obj, dict):
        raise FormatError("index is not a JSON object", offset=off, expected="object",
                          got=type(obj).__name__)
    for key in INDEX_KEYS:
        if key not in obj and key != "created_at_unix":
            raise FormatError(f"index lacks {key!r}", offset=off, expected=key, got="absent")
    if obj["format"] != FORMAT_NAME:
        raise FormatError("index format", offset=off, expected=repr(FORMAT_NAME),
                          got=obj["format"])
    version = obj["version"]
    if version not in READ_VERSIONS:
        raise UnsupportedVersionError("FOLD version", offset=off,
                                      expected=" or ".join(READ_VERSIONS), got=version)
    created = obj.get("created_at_unix", 0.0)
    if isinstance(created, bool) or not isinstance(created, (int, float)):
        raise FormatError("created_at_unix", offset=off, expected="a number", got=created)
    metadata = obj["metadata"]
    if not isinstance(metadata, dict):
        raise FormatError("index metadata", offset=off, expected="object",
                          got=type(metadata).__name__)
    raw_chunks = obj["chunks"]
    if not isinstance(raw_chunks, list):
        raise FormatError("index chunks", offset=off, expected="array",
                          got=type(raw_chunks).__name__)
    chunks = tuple(_parse_entry(item, i, off, limits) for i, item in enumerate(raw_chunks))
    names = set()
    for i, c in enumerate(chunks):
        if c.name in names:
            raise FormatError("duplicate chunk name", offset=off, chunk=i,
                              expected="unique names", got=c.name)
        names.add(c.name)
    check_extents(chunks, header)
    index = Index(version, float(created), metadata, chunks)
    check_hashes(index, off)
    return index


def _int_field(item: dict, key: str, i: int, off: int, top: int = 2**64 - 1) -> int:
    value = item[key]
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
        raise FormatError(f"chunk field {key!r}", offset=off, chunk=i,
                          expected=f"an integer in [0, {top}]", got=value)
    return value


def _parse_entry(item: Any, i: int, off: int, limits: Limits) -> ChunkEntry:
    if not isinstance(item, dict):
        raise FormatError("chunk entry", offset=off, chunk=i, expected="object",
                          got=type(item).__name__)
    missing = [k for k in ENTRY_KEYS if k not in item]
    if missing:
        raise FormatError("chunk entry lacks fields", offset=off, chunk=i,
                          expected=", ".join(ENTRY_KEYS), got=", ".join(missing) + " missing")
    name, ctype, sha, algo = item["name"], item["ctype"], item["sha256"], item["ecc_algo"]
    if not isinstance(name, str):
        raise FormatError("chunk name", offset=off, chunk=i, expected="a string", got=name)
    if not (isinstance(ctype, str) and len(ctype) == 4 and ctype.isascii()):
        raise FormatError("chunk ctype", offset=off, chunk=i, expected="4 ASCII characters",
                          got=ctype)
    if not (isinstance(sha, str) and _SHA_HEX.fullmatch(sha)):
        raise FormatError("chunk sha256", offset=off, chunk=i, expected="64 lowercase hex",
                          got=sha)
    if not isinstance(algo, str):
        raise FormatError("chunk ecc_algo", offset=off, chunk=i, expected="a string", got=algo)
    if _int_field(item, "header_len", i, off) != CHUNK_HEADER_LEN:
        raise FormatError("chunk header_len", offset=off, chunk=i,
                          expected=str(CHUNK_HEADER_LEN), got=item["header_len"])
    entry = ChunkEntry(
        name=name, ctype=ctype, flags=_int_field(item, "flags", i, off, 2**32 - 1),
        offset=_int_field(item, "offset", i, off), comp_len=_int_field(item, "comp_len", i, off),
        uncomp_len=_int_field(item, "uncomp_len", i, off),
        crc32c=_int_field(item, "crc32c", i, off, 2**32 - 1), sha256=sha, ecc_algo=algo,
        ecc_len=_int_field(item, "ecc_len", i, off, 2**32 - 1))
    check_entry_limits(entry, limits, i)
    return entry


def check_entry_limits(e: ChunkEntry, limits: Limits, i: int | None = None) -> None:
    """The peer's limits plus ours: known flags, sizes <= max_chunk, no zstd bomb, ECC length."""
    where = dict(offset=e.offset, chunk=i, array=None)
    if e.flags not in (FLAG_NONE, FLAG_ZSTD):
        raise UnsupportedVersionError("chunk compression flags", **where,
                                      expected="0 (none) or 1 (zstd)", got=e.flags)
    for key in ("uncomp_len", "comp_len", "ecc_len"):
        if getattr(e, key) > limits.max_chunk:
            raise LimitError(f"chunk {key} too large", **where,
                             expected=f"<= {limits.max_chunk}", got=getattr(e, key))
    if e.flags == FLAG_NONE and e.uncomp_len != e.comp_len:
        raise FormatError("uncompressed chunk sizes differ", **where,
                          expected=f"uncomp_len == comp_len ({e.comp_len})", got=e.uncomp_len)
    if e.flags == FLAG_ZSTD and e.uncomp_len > e.comp_len * ZSTD_MAX_RATIO:
        raise LimitError("declared size exceeds what zstd can expand to (bomb)", **where,
                         expected=f"<= {e.comp_len * ZSTD_MAX_RATIO}", got=e.uncomp_len)
    nsym = parse_algo(e.ecc_algo, where)
    want = ecc_length(e.comp_len, nsym)
    if e.ecc_len != want:
        raise FormatError(f"ecc_len for {e.ecc_algo}", **where, expected=str(want), got=e.ecc_len)


def check_extents(chunks: tuple[ChunkEntry, ...], header: Header) -> None:
    """Chunks tile [28, index_off) exactly: no hole, no overlap, nothing outside."""
    at = HEADER_LEN
    for c in sorted(chunks, key=lambda c: c.offset):
        if c.offset != at:
            what = "overlaps the previous chunk" if c.offset < at else "leaves a hole before it"
            raise FormatError(f"chunk {c.name!r} {what}", offset=c.offset,
                              expected=f"offset {at}", got=c.offset)
        at = c.end
        if at > header.index_off:
            raise FormatError(f"chunk {c.name!r} runs into the index", offset=c.offset,
                              expected=f"end <= {header.index_off}", got=at)
    if at != header.index_off:
        raise FormatError("hole between the last chunk and the index", offset=at,
                          expected=f"index at {at}", got=header.index_off)


def check_hashes(index: Index, off: int) -> None:
    """``chunk_hashes`` matches every entry and ``manifest_hash`` matches ``metadata``.

    Version 1.2.0 files must carry both; older ones are checked where present.
    """
    meta = index.metadata
    required = index.version == FORMAT_VERSION
    hashes = meta.get("chunk_hashes")
    if hashes is None and required:
        raise FormatError("metadata lacks chunk_hashes", offset=off, check="chunk_hashes",
                          expected="chunk_hashes", got="absent")
    if hashes is not None:
        if not isinstance(hashes, dict):
            raise FormatError("chunk_hashes", offset=off, expected="object",
                              got=type(hashes).__name__, check="chunk_hashes")
        names = {c.name for c in index.chunks}
        if set(hashes) != names:
            extra = sorted(set(hashes) ^ names)[:5]
            raise FormatError("chunk_hashes does not name exactly the chunks", offset=off,
                              check="chunk_hashes", expected="one hash per chunk", got=extra)
        for i, c in enumerate(index.chunks):
            if hashes[c.name] != c.sha256:
                raise FormatError(f"chunk_hashes[{c.name!r}] differs from the chunk entry",
                                  offset=off, chunk=i, check="chunk_hashes",
                                  expected=c.sha256, got=hashes[c.name])
    stored = meta.get("manifest_hash")
    if stored is None and not required:
        return
    actual = manifest_hash(meta)
    if stored != actual:
        raise ChecksumError("manifest_hash does not match the metadata", offset=off,
                            check="manifest_hash", expected=actual, got=stored)


def parse_chunk_header(buf, entry: ChunkEntry, where: dict) -> None:
    """The 32-byte binary header (``buf``) must repeat the index entry exactly."""
    got = CHUNK_HEADER.unpack_from(buf, 0)
    want = (entry.ctype.encode("ascii"), entry.flags, entry.uncomp_len, entry.comp_len,
            entry.crc32c, entry.ecc_len)
    if got != want:
        fields = ("ctype", "flags", "uncomp_len", "comp_len", "crc32c", "ecc_len")
        diff = [f"{f}={g!r}" for f, g, w in zip(fields, got, want, strict=True) if g != w]
        raise FormatError(f"chunk header of {entry.name!r} disagrees with the index", **where,
                          check="chunk_header", expected="the index's values",
                          got=", ".join(diff))


def is_mind(chunks) -> bool:
    """A FOLD file is a ``.mind`` when it has an ``ai_graph`` or ``ai_vectors`` chunk."""
    return any(c.name in MIND_CHUNKS for c in chunks)
