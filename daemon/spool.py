"""Spool files: a pinned generation on disk in a zero-encoding binary form.

Layout: ``SNAPSPOOL 1\\n`` + one line of JSON (gen, ts, meta, and per array name, dtype,
shape, offset, nbytes, crc32c) + LF, zero padding to 64 bytes, then each array's raw C-order
bytes at a 64-aligned offset. Written through the atomic helper (temp, fsync, rename) so a
spool file is complete or absent; read by mmap without copying. The CRC32C per array catches
later corruption; bad content raises FormatError (the daemon logs it and drops the gen).
"""

from __future__ import annotations

import json
import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from snapops.formats.atomic import atomic_write
from snapops.formats.errors import FormatError, LimitError, TruncatedError
from snapops.formats.integrity import crc32c
from snapops.formats.model import close_map

MAGIC = b"SNAPSPOOL 1\n"
ALIGN = 64
MAX_HEADER = 16 << 20
MAX_ARRAYS = 1 << 20
# dtypes a spool may hold (bf16 travels as u2 with "bf16": true in its entry)
DTYPES = {"<f8", "<f4", "<f2", "<i8", "<u8", "<i4", "<u4", "<i2", "<u2", "|i1", "|u1", "|b1"}


def spool_name(gen: int) -> str:
    return f"gen-{gen:012d}.spool"


def _bytes(array: np.ndarray) -> memoryview:
    flat = np.ascontiguousarray(array).reshape(-1)
    return memoryview(flat.view(np.uint8)) if flat.size else memoryview(b"")


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass(frozen=True)
class SpoolEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    crc: int
    bf16: bool = False


def plan(arrays: dict[str, np.ndarray]) -> tuple[list[dict], int]:
    """Entries (without CRCs) and the data size, arrays in the given order."""
    entries, at = [], 0
    for name, array in arrays.items():
        entries.append({"name": name, "dtype": array.dtype.str, "shape": list(array.shape),
                        "offset": at, "nbytes": int(array.nbytes)})
        at = _align(at + array.nbytes)
    return entries, at


def write_spool(path: str | os.PathLike, gen: int, arrays: dict[str, np.ndarray],
                meta: dict | None = None, bf16: frozenset[str] = frozenset()) -> int:
    """Write one generation atomically; returns the file size."""
    entries, _ = plan(arrays)
    for entry, array in zip(entries, arrays.values()):
        entry["crc32c"] = crc32c(_bytes(array))
        if entry["name"] in bf16:
            entry["bf16"] = True
    header = json.dumps({"gen": gen, "meta": meta or {}, "arrays": entries},
                        separators=(",", ":"), sort_keys=True).encode("utf-8")
    head = MAGIC + header + b"\n"
    start = _align(len(head))
    with atomic_write(path) as out:
        out.write(head + bytes(start - len(head)))
        at = 0
        for entry, array in zip(entries, arrays.values()):
            if entry["offset"] > at:
                out.write(bytes(entry["offset"] - at))
            out.write(_bytes(array))
            at = entry["offset"] + entry["nbytes"]
    return start + at


class Spool:
    """A spool file opened by mmap: ``arrays()`` gives zero-copy views, CRC-checked."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < len(MAGIC):
                    raise TruncatedError(path=self.path, offset=0, expected="a spool header",
                                         got=f"{size} bytes")
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as exc:
            raise FormatError(path=self.path, expected="a readable spool file",
                              got=exc.strerror) from exc
        try:
            self.gen, self.meta, self.entries, self.data_start = self._parse(size)
        except BaseException:
            self._map.close()
            raise

    def _parse(self, size: int):
        if self._map[:len(MAGIC)] != MAGIC:
            raise FormatError(path=self.path, offset=0, expected="SNAPSPOOL 1",
                              got=bytes(self._map[:12]))
        end = self._map.find(b"\n", len(MAGIC), min(size, len(MAGIC) + MAX_HEADER))
        if end < 0:
            raise LimitError(path=self.path, offset=len(MAGIC),
                             expected=f"a header line under {MAX_HEADER} bytes", got="none")
        try:
            header = json.loads(self._map[len(MAGIC):end])
            gen, meta, raw_entries = int(header["gen"]), dict(header["meta"]), header["arrays"]
            if not isinstance(raw_entries, list) or len(raw_entries) > MAX_ARRAYS:
                raise ValueError("arrays")
            entries = [self._entry(e) for e in raw_entries]
        except (ValueError, KeyError, TypeError) as exc:
            raise FormatError(path=self.path, offset=len(MAGIC), expected="a valid spool header",
                              got=str(exc)[:80]) from None
        start = _align(end + 1)
        for e in entries:
            if start + e.offset + e.nbytes > size:
                raise TruncatedError(path=self.path, offset=start + e.offset,
                                     expected=f"{e.nbytes} bytes for {e.name}", got="end of file")
        return gen, meta, entries, start

    @staticmethod
    def _entry(e: dict) -> SpoolEntry:
        dtype, shape = str(e["dtype"]), tuple(int(d) for d in e["shape"])
        if dtype not in DTYPES or any(d < 0 for d in shape) or len(shape) > 64:
            raise ValueError(f"unsupported dtype/shape {dtype} {shape}")
        nbytes = int(e["nbytes"])
        if int(np.prod(shape, dtype=object)) * np.dtype(dtype).itemsize != nbytes:
            raise ValueError(f"{e['name']}: nbytes does not match shape")
        if int(e["offset"]) < 0 or int(e["offset"]) % ALIGN:
            raise ValueError("misaligned offset")
        return SpoolEntry(str(e["name"]), dtype, shape, int(e["offset"]), nbytes,
                          int(e["crc32c"]), bool(e.get("bf16", False)))

    def arrays(self, check: bool = True) -> dict[str, np.ndarray]:
        out = {}
        for e in self.entries:
            view = memoryview(self._map)[self.data_start + e.offset:
                                         self.data_start + e.offset + e.nbytes]
            if check and crc32c(view) != e.crc:
                raise FormatError(path=self.path, offset=self.data_start + e.offset,
                                  check="crc32c", expected=f"crc32c {e.crc:08x} for {e.name}",
                                  got=f"{crc32c(view):08x}")
            out[e.name] = np.frombuffer(view, np.dtype(e.dtype)).reshape(e.shape)
        return out

    def close(self) -> None:
        close_map(self._map)

    def __enter__(self) -> "Spool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def spool_files(folder: str | os.PathLike) -> list[tuple[int, Path]]:
    found = []
    for path in Path(folder).glob("gen-*.spool"):
        try:
            found.append((int(path.name[4:-6]), path))
        except ValueError:
            continue
    return sorted(found)
