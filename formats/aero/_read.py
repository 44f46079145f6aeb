"""Reading AERO: parse the control region and TIDX from a buffer, serve tensors as mmap views.

:func:`parse_control` and :func:`parse_tidx` are pure functions of bytes (the mmap or any
buffer). :class:`AeroFile` owns the mmap; a tensor is an ``np.frombuffer`` view on it, so opening
touches only the control region and the metadata chunks, and reading one tensor touches only
that tensor's pages. Every problem is a :class:`FormatError` naming the check that failed.
"""

from __future__ import annotations

import json
import mmap
import os
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..model import ArrayMapping, Snapshot, close_map
from ..errors import (ChecksumError, FormatError, LimitError, TruncatedError,
                      UnsupportedVersionError)
from ..iosafe import open_input
from . import _decode, _hash
from . import _spec as S
from ._layout import align


@dataclass(frozen=True)
class Chunk:
    index: int
    fourcc: bytes
    flags: int
    offset: int
    length: int
    ulen: int
    name: str
    blake3: bytes

    @property
    def compressed(self) -> bool:
        return bool(self.flags & S.ChunkFlags.COMPRESSED_ZSTD)

    @property
    def label(self) -> str:
        return f"{self.fourcc.decode('ascii', 'replace')} {self.name!r}"


@dataclass(frozen=True)
class Control:
    uuid: bytes
    toc_offset: int
    toc_length: int
    st_offset: int
    st_length: int
    payloads_start: int
    chunks: tuple[Chunk, ...]

    def find(self, fourcc: bytes, name: str | None = None) -> Chunk | None:
        for chunk in self.chunks:
            if chunk.fourcc == fourcc and (name is None or chunk.name == name):
                return chunk
        return None


def _need(buf_len: int, end: int, what: str, offset: int) -> None:
    if end > buf_len:
        raise TruncatedError(f"{what} runs past the end of the file", offset=offset,
                             expected=f"{end} bytes", got=f"{buf_len} bytes")


def parse_control(buf) -> Control:
    """Header, TOC and string table of an AERO file held in ``buf`` (the whole file)."""
    size = len(buf)
    if size < 4 or bytes(buf[:4]) != S.MAGIC:
        raise FormatError("not an AERO file", offset=0, expected="magic b'AERO'",
                          got=bytes(buf[:4]))
    _need(size, S.HEADER_SIZE, "header", 0)
    (_, major, minor, header_size, toc_off, toc_len, st_off, st_len, file_flags, uuid,
     reserved) = S.HEADER.unpack_from(buf, 0)
    if (major, minor) != S.VERSION:
        raise UnsupportedVersionError("unsupported AERO version", offset=4, expected="0.1",
                                      got=f"{major}.{minor}")
    if header_size != S.HEADER_SIZE:
        raise FormatError("bad header_size", offset=8, expected="96", got=header_size)
    if file_flags != 0:
        raise UnsupportedVersionError("file_flags must be 0 in v0.1", offset=44, expected="0",
                                      got=hex(file_flags))
    if any(reserved):
        raise FormatError("reserved header bytes are not zero", offset=68, expected="zeros",
                          got=reserved.hex())
    if toc_off != S.HEADER_SIZE:
        raise FormatError("TOC must follow the header", offset=12, expected="toc_offset 96",
                          got=toc_off)
    _need(size, toc_off + S.TOC_HEADER_SIZE, "TOC header", toc_off)
    count, res0, res1 = S.TOC_HEADER.unpack_from(buf, toc_off)
    if count > S.MAX_ENTRY_COUNT:
        raise LimitError("too many TOC entries", offset=toc_off,
                         expected=f"<= {S.MAX_ENTRY_COUNT}", got=count)
    if res0 or res1:
        raise FormatError("TOC header reserved fields are not zero", offset=toc_off + 4,
                          expected="0", got=(res0, res1))
    if toc_len != S.TOC_HEADER_SIZE + count * S.TOC_ENTRY_SIZE:
        raise FormatError("toc_length disagrees with entry_count", offset=20,
                          expected=str(S.TOC_HEADER_SIZE + count * S.TOC_ENTRY_SIZE), got=toc_len)
    _need(size, toc_off + toc_len, "TOC", toc_off)
    if st_len > S.MAX_STRING_TABLE:
        raise LimitError("string table too large", offset=36,
                         expected=f"<= {S.MAX_STRING_TABLE} bytes", got=st_len)
    if st_off != align(toc_off + toc_len, S.STRING_TABLE_ALIGN):
        raise FormatError("string table must follow the TOC at an 8-byte boundary", offset=28,
                          expected=str(align(toc_off + toc_len, 8)), got=st_off)
    _need(size, st_off + st_len, "string table", st_off)
    payloads_start = align(st_off + st_len, S.CHUNK_ALIGN)
    with memoryview(buf) as whole, whole[st_off:st_off + st_len] as table:   # no copy
        chunks = tuple(_parse_entry(buf, toc_off + S.TOC_HEADER_SIZE + i * S.TOC_ENTRY_SIZE, i,
                                    table, payloads_start, size) for i in range(count))
    _check_chunk_extents(chunks)
    return Control(uuid, toc_off, toc_len, st_off, st_len, payloads_start, chunks)


def _parse_entry(buf, at: int, index: int, table: memoryview, payloads_start: int,
                 size: int) -> Chunk:
    (fourcc, flags, offset, length, ulen, name_off, name_len, reserved,
     digest) = S.TOC_ENTRY.unpack_from(buf, at)

    def bad(message: str, expected: str, got: object, cls=FormatError) -> FormatError:
        return cls(message, offset=at, chunk=index, expected=expected, got=got)

    if any(b < 0x20 or b > 0x7E for b in fourcc):
        raise bad("fourcc is not printable ASCII", "4 ASCII characters", fourcc)
    if reserved:
        raise bad("TOC entry reserved field is not zero", "0", reserved)
    if flags & ~S.KNOWN_FLAGS:
        raise bad("unknown chunk flags", f"bits within {S.KNOWN_FLAGS:#x}", hex(flags))
    if name_off + name_len > len(table):
        raise bad("chunk name runs past the string table", f"<= {len(table)}",
                  name_off + name_len)
    try:
        name = str(table[name_off:name_off + name_len], "utf-8")
    except UnicodeDecodeError as exc:
        raise bad("chunk name is not UTF-8", "UTF-8", str(exc)) from exc
    compressed = bool(flags & S.ChunkFlags.COMPRESSED_ZSTD)
    if compressed and fourcc in S.NEVER_COMPRESSED:
        raise bad(f"{fourcc.decode()} chunks are never compressed", "no COMPRESSED_ZSTD flag",
                  hex(flags))
    if not compressed and length != ulen:
        raise bad("uncompressed chunk with chunk_length != chunk_ulen", str(length), ulen)
    if (compressed or fourcc in S.METADATA) and ulen > S.MAX_METADATA_ULEN:
        raise bad("metadata chunk too large", f"ulen <= {S.MAX_METADATA_ULEN}", ulen, LimitError)
    if offset % S.CHUNK_ALIGN or offset < payloads_start:
        raise bad("chunk offset outside the payload area or not 16-byte aligned",
                  f"a multiple of 16 >= {payloads_start}", offset)
    if offset + length > size:
        raise bad("chunk runs past the end of the file", f"end <= {size}", offset + length,
                  TruncatedError)
    return Chunk(index, fourcc, flags, offset, length, ulen, name, digest)


_NAMED = {S.NAME_IHSH: S.IHSH, S.NAME_MJSN: S.MJSN, S.NAME_MMSG: S.MMSG, S.NAME_TIDX: S.TIDX}


_SHARD_NAME = re.compile(r"weights\.shard([0-9]+)(\.phsh)?")


def shard_index(name: str) -> int | None:
    """N of a ``weights.shard{N}`` chunk name (ASCII digits only: ``str.isdigit`` also takes
    ``²``, which ``int`` refuses)."""
    found = _SHARD_NAME.fullmatch(name)
    return int(found[1]) if found and not found[2] and len(found[1]) <= 18 else None


def _expected_fourcc(name: str) -> bytes | None:
    """The fourcc a well-known chunk name implies (so a damaged tag cannot hide a chunk)."""
    if name in _NAMED:
        return _NAMED[name]
    found = _SHARD_NAME.fullmatch(name)
    if found:
        return S.PHSH if found[2] else S.WTSH
    return None


def _check_chunk_extents(chunks: tuple[Chunk, ...]) -> None:
    seen: set[tuple[bytes, str]] = set()
    for chunk in chunks:
        implied = _expected_fourcc(chunk.name)
        if (implied is not None and implied != chunk.fourcc) or (
                chunk.fourcc in (S.IHSH, S.WTSH, S.PHSH) and implied != chunk.fourcc):
            raise FormatError("chunk name and fourcc disagree", chunk=chunk.index,
                              expected=f"{implied.decode() if implied else 'another fourcc'} "
                                       f"for {chunk.name!r}", got=chunk.fourcc)
        key = (chunk.fourcc, chunk.name)
        if key in seen:
            raise FormatError("duplicate chunk", chunk=chunk.index, expected="unique fourcc+name",
                              got=chunk.label)
        seen.add(key)
    extents = sorted((c.offset, c.offset + c.length, c.index) for c in chunks if c.length)
    for (_, end, first), (start, _, second) in zip(extents, extents[1:]):
        if start < end:
            raise FormatError("chunk payloads overlap", chunk=second, offset=start,
                              expected=f"start >= {end} (end of chunk {first})", got=start,
                              check="extents")


# ---- TIDX ------------------------------------------------------------------------------------

@dataclass(slots=True, eq=True)
class Tensor:
    name: str
    dtype: int
    shape: tuple[int, ...]
    shard_id: int
    data_off: int
    data_len: int
    flags: int = 0
    hash_b3: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype("u1") if self.dtype == S.DTYPE_PACKED else S.DTYPES[self.dtype][1]

    @property
    def np_shape(self) -> tuple[int, ...]:
        return (self.data_len,) if self.dtype == S.DTYPE_PACKED else self.shape

    def entry(self) -> dict:
        """The TIDX map for this tensor (key order as the reference writer)."""
        out = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape),
               "shard_id": self.shard_id, "data_off": self.data_off, "data_len": self.data_len,
               "flags": self.flags}
        out.update(self.extra)
        if self.hash_b3 is not None:
            out["hash_b3"] = self.hash_b3
        return out


_REQUIRED = ("name", "dtype", "shape", "shard_id", "data_off", "data_len")
_REQUIRED_SET = frozenset(_REQUIRED)


def _uint(value: Any, what: str, where: str) -> int:
    if type(value) is not int or value < 0:
        raise FormatError(f"TIDX {where}: {what} must be a non-negative integer",
                          expected="uint", got=value, check="tidx")
    return value


def parse_tidx(obj: Any) -> list[Tensor]:
    """Validate a decoded TIDX map and return its tensors (shard bounds are checked later)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("tensors"), list):
        raise FormatError("TIDX must be a map with a 'tensors' list", expected="{'tensors': [...]}",
                          got=type(obj).__name__, check="tidx")
    tensors: list[Tensor] = []
    names: set[str] = set()
    for i, item in enumerate(obj["tensors"]):
        if type(item) is dict and item.keys() >= _REQUIRED_SET:
            name = item["name"]
            if type(name) is str and name not in names:
                fast = _fast_tensor(item, name)
                if fast is not None:
                    names.add(name)
                    tensors.append(fast)
                    continue
        where = f"entry {i}"
        if not isinstance(item, dict):
            raise FormatError(f"TIDX {where} is not a map", got=type(item).__name__, check="tidx")
        if not item.keys() >= _REQUIRED_SET:
            missing = [k for k in _REQUIRED if k not in item]
            raise FormatError(f"TIDX {where} lacks fields", expected=", ".join(_REQUIRED),
                              got=", ".join(missing) + " missing", check="tidx")
        name = item["name"]
        if not isinstance(name, str) or name in names:
            raise FormatError(f"TIDX {where}: name must be a unique string", got=name,
                              check="tidx")
        names.add(name)
        tensors.append(_parse_tensor(item, name, f"{where} ({name!r})"))
    return tensors


_ITEMSIZE = {code: dtype.itemsize for code, (_, dtype) in S.DTYPES.items()}
_HASH_RE = re.compile(r"[0-9a-f]{64}")
_EXTRA = ("quant_id", "quant_params")


def _fast_tensor(item: dict, name: str) -> Tensor | None:
    """The common, well-formed entry, checked without building messages; None sends the entry
    to :func:`_parse_tensor`, which names what is wrong."""
    dtype, shape, data_len = item["dtype"], item["shape"], item["data_len"]
    shard_id, data_off, flags = item["shard_id"], item["data_off"], item.get("flags", 0)
    hash_b3 = item.get("hash_b3")
    if hash_b3 == "":
        hash_b3 = None
    if (type(dtype) is not int or dtype not in _ITEMSIZE or type(shape) is not list
            or len(shape) > S.MAX_NDIM or type(data_len) is not int or type(shard_id) is not int
            or type(data_off) is not int or type(flags) is not int
            or min(shard_id, data_off, flags) < 0
            or (hash_b3 is not None and not (type(hash_b3) is str and _HASH_RE.fullmatch(hash_b3)))
            or "quant_id" in item or "quant_params" in item):
        return None
    count = _ITEMSIZE[dtype]
    for d in shape:
        if type(d) is not int or d < 0:
            return None
        count *= d
    if count != data_len:
        return None
    return Tensor(name, dtype, tuple(shape), shard_id, data_off, data_len, flags, hash_b3, {})


def _parse_tensor(item: dict, name: str, where: str) -> Tensor:
    dtype = _uint(item["dtype"], "dtype", where)
    if dtype not in S.DTYPES and dtype != S.DTYPE_PACKED:
        raise FormatError(f"TIDX {where}: unknown dtype", expected="0..12 or 0x8000", got=dtype,
                          check="tidx", array=name)
    shape = item["shape"]
    if not isinstance(shape, list):
        raise FormatError(f"TIDX {where}: shape must be a list", got=shape, check="tidx")
    if len(shape) > S.MAX_NDIM:
        raise LimitError(f"TIDX {where}: too many dimensions", expected=f"<= {S.MAX_NDIM}",
                         got=len(shape), array=name)
    dims = tuple(_uint(d, "a dimension", where) for d in shape)
    data_len = _uint(item["data_len"], "data_len", where)
    if dtype != S.DTYPE_PACKED:
        count = 1
        for d in dims:
            count *= d
        if count * S.DTYPES[dtype][1].itemsize != data_len:
            raise FormatError(f"TIDX {where}: data_len disagrees with shape and dtype",
                              expected=str(count * S.DTYPES[dtype][1].itemsize), got=data_len,
                              check="tidx", array=name)
    hash_b3 = item.get("hash_b3")
    if hash_b3 == "":
        hash_b3 = None     # the reference writer's placeholder when hashing is off
    if hash_b3 is not None and not (isinstance(hash_b3, str) and _HASH_RE.fullmatch(hash_b3)):
        raise FormatError(f"TIDX {where}: hash_b3 must be 64 lowercase hex digits", got=hash_b3,
                          check="tidx", array=name)
    extra = {k: item[k] for k in _EXTRA if k in item}
    return Tensor(name, dtype, dims, _uint(item["shard_id"], "shard_id", where),
                  _uint(item["data_off"], "data_off", where), data_len,
                  _uint(item.get("flags", 0), "flags", where), hash_b3, extra)


def check_tensor_extents(tensors: list[Tensor], shard_sizes: dict[int, int]) -> None:
    """Every tensor inside its shard, and no two tensors of a shard sharing a byte."""
    by_shard: dict[int, list[tuple[int, int, str]]] = {}
    for t in tensors:
        size = shard_sizes.get(t.shard_id)
        if size is None:
            raise FormatError(f"tensor refers to a missing shard {S.shard_name(t.shard_id)!r}",
                              array=t.name, expected="an existing WTSH chunk", got=t.shard_id,
                              check="tidx_bounds")
        if t.data_off + t.data_len > size:
            raise FormatError("tensor runs past the end of its shard", array=t.name,
                              expected=f"data_off + data_len <= {size}",
                              got=t.data_off + t.data_len, check="tidx_bounds")
        if t.data_len:
            by_shard.setdefault(t.shard_id, []).append((t.data_off, t.data_off + t.data_len,
                                                        t.name))
    for spans in by_shard.values():
        spans.sort()
        for (_, end, first), (start, _, second) in zip(spans, spans[1:]):
            if start < end:
                raise FormatError(f"tensors overlap ({first!r} and {second!r})", array=second,
                                  expected=f"data_off >= {end}", got=start, check="tidx_overlap")


# ---- the file ----------------------------------------------------------------------------------

class AeroFile(ArrayMapping):
    """An open AERO file: control region parsed, TIDX decoded and checked, weights mapped.

    Example::

        with AeroFile("model.aero") as f:
            w = f.array("layer.0.weight")     # a read-only view on the mmap
    """

    def __init__(self, path: str | os.PathLike, *, follow: bool = True) -> None:
        """``follow=False``: a symlink is refused (the members an AEROSET's JSON names)."""
        self.path = os.fspath(path)
        try:
            with open_input(self.path, follow=follow) as handle:
                size = os.fstat(handle.fileno()).st_size
                if size == 0:
                    raise TruncatedError("empty file", path=self.path, offset=0,
                                         expected="an AERO header", got="0 bytes")
                self._mm: mmap.mmap | None = mmap.mmap(handle.fileno(), 0,
                                                       access=mmap.ACCESS_READ)
        except OSError as exc:
            raise FormatError(f"cannot read: {exc.strerror}", path=self.path) from exc
        self.size = size
        try:
            self.control = parse_control(self._mm)
            self.meta_chunks: dict[bytes, Chunk | None] = {
                fourcc: self.control.find(fourcc) for fourcc in (S.MJSN, S.MMSG, S.TIDX)}
            self.shards = {c.name: c for c in self.control.chunks if c.fourcc == S.WTSH}
            self.tensors = self._load_tidx()
            self.by_name = {t.name: t for t in self.tensors}
            self.index_only = bool(self.tensors) and not self.shards
            if not self.index_only:
                check_tensor_extents(self.tensors, self.shard_sizes())
        except FormatError as exc:
            self.close()
            raise exc.located(self.path)

    # -- chunks --
    def stored_range(self, lo: int, hi: int) -> memoryview:
        if self._mm is None:
            raise FormatError("file is closed", path=self.path)
        return memoryview(self._mm)[lo:hi]

    def stored(self, chunk: Chunk) -> memoryview:
        return self.stored_range(chunk.offset, chunk.offset + chunk.length)

    def advise(self, flag: int | None) -> None:
        """Pass an ``madvise`` hint for the whole map (ignored where unsupported)."""
        if flag is not None and self._mm is not None and hasattr(self._mm, "madvise"):
            try:
                self._mm.madvise(flag)
            except OSError:
                pass

    def content(self, chunk: Chunk) -> bytes | memoryview:
        """The uncompressed bytes of ``chunk`` (a view when it is stored raw)."""
        if chunk.compressed:
            with self.stored(chunk) as raw:
                return _decode.unzstd(raw, chunk.ulen, chunk=chunk.label)
        return self.stored(chunk)

    def checked_content(self, chunk: Chunk) -> bytes | memoryview:
        data = self.content(chunk)
        if _hash.digest(data) != chunk.blake3:
            raise ChecksumError("chunk content does not match its TOC BLAKE3", chunk=chunk.index,
                                offset=chunk.offset, expected=chunk.blake3.hex(),
                                got=_hash.digest(data).hex(), check="chunk_blake3")
        return data

    def metadata(self, fourcc: bytes) -> Any:
        """Decoded MJSN (JSON), MMSG or TIDX (MessagePack), hash-checked; None if absent."""
        chunk = self.meta_chunks.get(fourcc) or self.control.find(fourcc)
        if chunk is None:
            return None
        data = self.checked_content(chunk)
        if fourcc == S.MJSN:
            return _decode.load_json(data, chunk=chunk.label)
        return _decode.unpack_msgpack(data, chunk=chunk.label)

    def _load_tidx(self) -> list[Tensor]:
        if self.meta_chunks[S.TIDX] is None:
            if self.shards:
                raise FormatError("weights without a tensor index", expected="a TIDX chunk",
                                  got="none", check="tidx")
            return []
        return parse_tidx(self.metadata(S.TIDX))

    def shard_sizes(self) -> dict[int, int]:
        sizes = {}
        for name, chunk in self.shards.items():
            index = shard_index(name)
            if index is not None:
                sizes[index] = chunk.length
        return sizes

    def meta(self) -> dict:
        value = self.metadata(S.MJSN)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise FormatError("meta.json must hold a JSON object", got=type(value).__name__,
                              path=self.path)
        return value

    # -- tensors --
    @property
    def names(self) -> list[str]:
        """Tensor names in TIDX order."""
        return [t.name for t in self.tensors]

    def spec(self, name: str) -> tuple[np.dtype, tuple[int, ...]]:
        t = self.by_name.get(name)
        return (t.np_dtype, tuple(t.np_shape)) if t is not None else super().spec(name)

    def array(self, name: str) -> np.ndarray:
        """A read-only view of tensor ``name`` on the mmap (no copy, no other tensor touched)."""
        try:
            t = self.by_name[name]
        except KeyError:
            raise FormatError("no such tensor", path=self.path, array=name,
                              expected="a name from the TIDX", got=name) from None
        if self.index_only:
            raise FormatError("index-only AERO file: its weights live in the AEROSET parts",
                              path=self.path, array=name, check="tidx_bounds")
        if self._mm is None:
            raise FormatError("file is closed", path=self.path, array=name)
        start = self.shards[S.shard_name(t.shard_id)].offset + t.data_off
        dtype = t.np_dtype
        if t.data_len == 0:
            out = np.empty(t.np_shape, dtype)
        else:
            out = np.frombuffer(self._mm, dtype, t.data_len // dtype.itemsize, start)
            out = out.reshape(t.np_shape)
        out.flags.writeable = False
        return out

    def close(self) -> None:
        mm, self._mm = self._mm, None
        close_map(mm)


def packed_snapshot(arrays: dict, meta: dict, tensors: list[Tensor]) -> Snapshot:
    """A Snapshot of AERO tensors: packed (0x8000) tensors load as their raw bytes, with
    their logical shape and codec fields in ``meta["aero.packed"]`` (JSON), which ``save``
    reads back."""
    packed = {t.name: {"shape": list(t.shape), **t.extra} for t in tensors
              if t.dtype == S.DTYPE_PACKED}
    if packed:
        meta[S.PACKED_META_KEY] = json.dumps(packed, sort_keys=True, separators=(",", ":"))
    return Snapshot(arrays, meta)
