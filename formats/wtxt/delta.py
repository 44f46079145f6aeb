"""DELTA v2: ship only the chunks that changed between two finalized WTXT snapshots.

``make_delta`` compares chunk SHA-256 values of two verified files and copies the target's
changed chunks verbatim; ``apply_delta`` checks the base's ``sha256_all``, splices, re-derives
the cap line, verifies the result fully and only then renames it into place, so the result is
byte-identical to the target or nothing is written. Grammar: wtxt-canonical.md, "DELTA v2".
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import BinaryIO

import pybase64

from ..atomic import atomic_write
from ..errors import DataError, FormatError
from ..iosafe import open_input
from ._chunks import ChunkReader
from ._grammar import (
    AUDIT_RE, CH_RE, MAX_LINE, ROOT_RE, SIGN_RE, expected_caps, grammar_error, parse_arr,
    parse_meta,
)
from ._reader import MappedLineReader
from .index import IndexedArray, WtxtIndex, open_index
from .logical import audit_caps
from .verify import verify_file

DELTA_MAGIC = re.compile(rb"WTXT-DELTA 2 base_sha256_all=([0-9a-f]{64})")


@dataclass(frozen=True)
class DeltaStats:
    arrays_carried: int
    chunks_changed: int
    chunks_total: int
    delta_bytes: int
    target_bytes: int


class DeltaMismatch(DataError):
    """Base and target differ in names, dtypes, shapes or row blocking: no delta possible."""


def _check_compatible(base: WtxtIndex, target: WtxtIndex) -> None:
    hint = "; write a full snapshot instead"
    if base.header.pending or target.header.pending:
        raise DeltaMismatch("deltas are made between finalized files, not root_pending ones" + hint)
    b, t = base.by_name(), target.by_name()
    if list(b) != list(t):
        gone, new = sorted(set(b) - set(t)), sorted(set(t) - set(b))
        raise DeltaMismatch(f"array names differ (only in base: {gone}, only in target: {new})"
                            + hint)
    for name, tb in t.items():
        ba = b[name].info
        if (ba.line.dtype, ba.line.shape) != (tb.info.line.dtype, tb.info.line.shape):
            raise DeltaMismatch(f"array {name}: {ba.line.dtype}{list(ba.line.shape)} in base, "
                                f"{tb.info.line.dtype}{list(tb.info.line.shape)} in target" + hint)
        if ba.idx != tb.info.idx:
            raise DeltaMismatch(f"array {name}: row blocking differs (idx {ba.idx} vs "
                                f"{tb.info.idx})" + hint)


def _require_valid(path: str, what: str, **keys) -> None:
    report = verify_file(path, **keys)
    if not report.ok:
        raise FormatError(f"{what} does not verify: {report.failure}", path=path,
                          check=report.failure.check) from report.failure


def make_delta(base: str | os.PathLike, target: str | os.PathLike, out: str | os.PathLike,
               **verify_keys) -> DeltaStats:
    """Write the DELTA v2 from ``base`` to ``target`` into ``out`` (atomically)."""
    base, target = os.fspath(base), os.fspath(target)
    _require_valid(base, "base", **verify_keys)
    _require_valid(target, "target", **verify_keys)
    with open_index(base) as bidx, open_index(target) as tidx, atomic_write(out) as sink:
        _check_compatible(bidx, tidx)
        stats = _emit_delta(bidx, tidx, sink)
    return DeltaStats(*stats, os.path.getsize(out), os.path.getsize(target))


def chunk_sha_pairs(a: str | os.PathLike, b: str | os.PathLike) -> list[tuple[bytes, bytes]]:
    """(sha256 hex in ``a``, in ``b``) for every chunk of two WTXT files with the same layout,
    read from their ch lines without decoding; DeltaMismatch when the layouts differ.

    Example::

        pairs = chunk_sha_pairs("gen1.wtxt", "gen2.wtxt")
        sum(x != y for x, y in pairs) / len(pairs)      # share of chunks that changed
        # -> 0.01
    """
    with open_index(a) as aidx, open_index(b) as bidx:
        _check_compatible(aidx, bidx)
        pairs = []
        for barr in bidx.arrays:
            ashas, bshas = aidx.chunk_sha256(barr.name), bidx.chunk_sha256(barr.name)
            pairs.extend(zip((r.tobytes() for r in ashas), (r.tobytes() for r in bshas)))
    return pairs


def _emit_delta(bidx: WtxtIndex, tidx: WtxtIndex, sink: BinaryIO):
    lines = tidx.header.signed.split(b"\n")
    sink.write(b"WTXT-DELTA 2 base_sha256_all=%s\n" % bidx.header.root.sha256_all.encode())
    sink.write(lines[1] + b"\n" + lines[3] + b"\n")
    if tidx.header.signature is not None:
        sink.write(sign_line(tidx.header))
    carried = changed = total = 0
    for tarr in tidx.arrays:
        barr = bidx.array(tarr.name)
        differs = (tidx.chunk_sha256(tarr.name) != bidx.chunk_sha256(tarr.name)).any(axis=1)
        total += len(differs)
        if not differs.any() and tarr.line == barr.line:
            continue
        carried += 1
        changed += int(differs.sum())
        sink.write(tarr.line.line().encode("ascii") + b"\n")
        for (ix, at, size, _) in tarr.chunks():
            if differs[ix]:
                sink.write(tidx.buffer[at:at + size])
        sink.write(b"endarr\n")
    if tidx.audit is not None:
        sink.write(tidx.audit + b"\n")
    sink.write(b"enddelta\n")
    return carried, changed, total


def sign_line(header) -> bytes:
    """The header's sign line, rebuilt exactly (its base64 is canonical by then)."""
    signature = pybase64.b64encode(header.signature).decode("ascii")
    return f"sign ed25519={signature} keyid={header.keyid}\n".encode("ascii")


@dataclass
class DeltaArray:
    arr_line: bytes
    chunks: dict[int, tuple[int, int]] = field(default_factory=dict)  # ix -> (offset, size)


@dataclass
class ParsedDelta:
    base_sha256_all: str
    meta: bytes
    root: bytes
    sign: bytes | None
    arrays: dict[str, DeltaArray]
    audit: bytes | None


def parse_delta(reader: MappedLineReader, base: WtxtIndex) -> ParsedDelta:
    """Parse and check a delta against the base's layout (chunk text fully validated)."""
    no, line = reader.readline()
    m = DELTA_MAGIC.fullmatch(line)
    if not m:
        raise grammar_error(no, "WTXT-DELTA 2 base_sha256_all=<64 hex>", line)
    no, meta = reader.readline()
    parse_meta(meta, no)
    no, root = reader.readline()
    if not ROOT_RE.fullmatch(root):
        raise grammar_error(no, "root sha256_all= merkle_prev= merkle_this= fastxor=", root)
    no, line = reader.readline()
    sign = None
    if line.startswith(b"sign "):
        if not SIGN_RE.fullmatch(line):
            raise grammar_error(no, "sign ed25519=<base64> keyid=<hex16>", line)
        sign = line
        no, line = reader.readline()
    arrays: dict[str, DeltaArray] = {}
    base_arrays = base.by_name()
    while line.startswith(b"arr "):
        arr = parse_arr(line, no)
        if arrays and arr.name <= list(arrays)[-1]:
            raise grammar_error(no, "arrays in increasing name order, each once", line[:60])
        barr = base_arrays.get(arr.name)
        if barr is None:
            raise FormatError(line=no, array=arr.name, check="delta",
                              expected="an array the base has", got=arr.name)
        if (arr.dtype, arr.shape) != (barr.info.line.dtype, barr.info.line.shape):
            raise FormatError(line=no, array=arr.name, check="delta",
                              expected=f"dtype {barr.info.line.dtype} shape {barr.info.line.shape}",
                              got=f"{arr.dtype} {arr.shape}")
        entry = arrays[arr.name] = DeltaArray(line)
        no, line = _read_chunks(reader, barr, entry)
        if line != b"endarr":
            raise grammar_error(no, "ch or endarr", line, array=arr.name)
        no, line = reader.readline()
    audit = None
    if line.startswith(b"audit"):
        if not AUDIT_RE.fullmatch(line):
            raise grammar_error(no, "audit key=value ...", line)
        audit, (no, line) = line, reader.readline()
    if line != b"enddelta" or not reader.at_eof():
        raise grammar_error(no, "enddelta and end of file", line)
    return ParsedDelta(m.group(1).decode(), meta, root, sign, arrays, audit)


def _read_chunks(reader: MappedLineReader, barr: IndexedArray, entry: DeltaArray):
    chunks = ChunkReader(reader, barr.name, barr.info.plan, None)
    last = -1
    while True:
        start = reader.offset
        no, line = reader.readline()
        m = CH_RE.fullmatch(line)
        if not m:
            return no, line
        ix = int(m.group(1))
        if ix <= last or ix >= barr.info.plan.count:
            raise grammar_error(no, f"chunk index in ({last}, {barr.info.plan.count})", line,
                                array=barr.name, chunk=ix)
        reader.offset, reader.line_no = start, no
        chunks.read_chunk(ix)
        entry.chunks[ix] = (start, reader.offset - start)
        last = ix


def apply_delta(base: str | os.PathLike, delta: str | os.PathLike, out: str | os.PathLike,
                **verify_keys) -> None:
    """Apply ``delta`` to ``base`` and write the (fully verified) target to ``out``."""
    base, delta = os.fspath(base), os.fspath(delta)
    _require_valid(base, "base", **verify_keys)

    def check_result(tmp) -> None:
        report = verify_file(tmp, **verify_keys)
        if not report.ok:
            raise FormatError(f"delta result does not verify: {report.failure}",
                              path=os.fspath(out), check=report.failure.check)

    with open_index(base) as bidx, open_input(delta) as df:
        reader = MappedLineReader(df, max_line=MAX_LINE)
        try:
            try:
                parsed = parse_delta(reader, bidx)
            except FormatError as exc:
                raise exc.located(delta)
            if parsed.base_sha256_all != bidx.header.root.sha256_all:
                raise FormatError(path=delta, line=1, check="sha256_all",
                                  expected=f"a base with sha256_all={parsed.base_sha256_all}",
                                  got=f"{base} has sha256_all={bidx.header.root.sha256_all}")
            with atomic_write(out, before_replace=check_result) as sink:
                _splice(bidx, parsed, reader.buffer, sink)
        finally:
            reader.close()


def _splice(bidx: WtxtIndex, parsed: ParsedDelta, dmap, sink: BinaryIO) -> None:
    bmap = bidx.buffer
    hmac_used = any(not a.line.unauthenticated for a in bidx.arrays)
    if parsed.arrays:
        carried = {n: parse_arr(d.arr_line, 0) for n, d in parsed.arrays.items()}
        hmac_used = any(not (carried.get(a.name) or a.line).unauthenticated
                        for a in bidx.arrays)
    blocked = any(a.info.idx is not None for a in bidx.arrays)
    if not bidx.arrays:
        hmac_used = "arr_hmac" in bidx.header.caps
    audit = parsed.audit[len(b"audit "):].decode("ascii") if parsed.audit is not None else None
    caps = ",".join(expected_caps(hmac_used, blocked) + audit_caps(audit))
    sink.write(b"WTXT 1\n" + parsed.meta + b"\ncap ext=" + caps.encode() + b"\n" + parsed.root
               + b"\n")
    if parsed.sign is not None:
        sink.write(parsed.sign + b"\n")
    for barr in bidx.arrays:
        entry = parsed.arrays.get(barr.name)
        if entry is None:
            sink.write(bmap[barr.head_start:barr.end_start + len(b"endarr\n")])
            continue
        sink.write(entry.arr_line + b"\n")
        sink.write(bmap[_idx_start(barr, bmap):barr.body_start])
        for ix, at, size, _ in barr.chunks():
            piece = entry.chunks.get(ix)
            sink.write(dmap[piece[0]:piece[0] + piece[1]] if piece else bmap[at:at + size])
        sink.write(b"endarr\n")
    if parsed.audit is not None:
        sink.write(parsed.audit + b"\n")
    sink.write(b"endwtxt\n")


def _idx_start(barr: IndexedArray, data) -> int:
    """Offset of the line after the arr line (the idx line, or the first chunk)."""
    return bytes(data[barr.head_start:barr.body_start]).index(b"\n") + 1 + barr.head_start
