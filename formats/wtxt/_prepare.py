"""Turn a Snapshot plus writer options into validated, canonical write inputs (no IO)."""

from __future__ import annotations

import datetime as _dt
import math
import os
import re
from dataclasses import dataclass, field

import numpy as np

from ..contract import GEN, META_TOKEN, UTC_TIME, valid_token, valid_ts
from ..errors import DataError
from ..model import Snapshot, le_contiguous
from ._grammar import (
    AUDIT_RE, ArrLine, MAX_ARRAY_BYTES, MAX_NAME, NAME, ZERO64, default_rows_per_chunk, wtxt_dtype,
)
from ._plan import ChunkPlan, plan_for

_HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class WriteOptions:
    """WTXT writer options (the CLI flags of ``snapops convert``)."""

    gen: int = 0
    ts: str | None = None
    schema: str = "weights/v1"
    build: str = "unknown"
    host: str = "cpu"
    cuda: str = "off"
    merkle_prev: str | None = None
    row_blocking: bool = False
    rows_per_chunk: int | None = None
    hmac_key: bytes | None = None
    sign_key: object | None = None  # Ed25519PrivateKey
    streaming: bool = False
    audit: str | None = None
    threads: int = 2

    def resolved_ts(self) -> str:
        """``ts`` or, when unset, $SOURCE_DATE_EPOCH, else the current UTC second."""
        if self.ts is not None:
            return self.ts
        epoch = os.environ.get("SOURCE_DATE_EPOCH")
        moment = (_dt.datetime.fromtimestamp(int(epoch), _dt.timezone.utc) if epoch
                  else _dt.datetime.now(_dt.timezone.utc))
        return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class PreparedArray:
    name: str
    dtype: str
    shape: tuple[int, ...]
    raw: memoryview
    plan: ChunkPlan
    keep: np.ndarray = field(repr=False, default=None)  # owns the bytes ``raw`` points into


def unmap_name(name: str) -> str:
    return name.replace("__", ".")


def check_options(opts: WriteOptions) -> str:
    """Validate options (by the rules every format's options share); return the resolved ts."""
    for key in ("schema", "build", "host", "cuda"):
        value = getattr(opts, key)
        if not isinstance(value, str) or not valid_token(value):
            raise DataError(f"{key}={value!r}: expected {META_TOKEN.expected}")
    if not isinstance(opts.gen, int) or isinstance(opts.gen, bool) or not GEN.test(opts.gen):
        raise DataError(f"gen={opts.gen!r}: expected {GEN.expected}")
    ts = opts.resolved_ts()
    if not valid_ts(ts):
        raise DataError(f"ts={ts!r}: expected {UTC_TIME.expected}")
    if opts.merkle_prev is not None and not _HEX64.fullmatch(opts.merkle_prev):
        raise DataError("merkle_prev: expected 64 lowercase hex digits")
    if opts.rows_per_chunk is not None and (not isinstance(opts.rows_per_chunk, int)
                                            or opts.rows_per_chunk < 1):
        raise DataError(f"rows_per_chunk={opts.rows_per_chunk!r}: expected an integer >= 1")
    if opts.hmac_key is not None and (not isinstance(opts.hmac_key, bytes) or not opts.hmac_key):
        raise DataError("hmac_key: expected non-empty bytes")
    if opts.audit is not None and not AUDIT_RE.fullmatch(b"audit " + opts.audit.encode("ascii", "replace")):
        raise DataError(f"audit={opts.audit!r}: expected key=value pairs "
                        "(value quoted with \"...\" or without spaces)")
    return ts


def prepare_arrays(snapshot: Snapshot, opts: WriteOptions) -> list[PreparedArray]:
    """Validate names and dtypes and compute each array's chunk plan, in byte-wise name order."""
    blocked = opts.row_blocking or opts.rows_per_chunk is not None
    prepared = {}
    for name, array in snapshot.arrays.items():
        if not NAME.fullmatch(name.encode("ascii", "replace")) or len(name) > MAX_NAME:
            raise DataError(f"array {name!r}: WTXT names must match [A-Za-z0-9_]+ "
                            f"(<= {MAX_NAME} chars); snapops.save maps other names itself")
        array = np.asarray(array)
        wdtype = wtxt_dtype(array.dtype)
        if wdtype is None:
            raise DataError(f"array {name!r}: dtype {array.dtype} is not supported by WTXT "
                            "(f64 f32 i64 u64 i32 u32 i16 u16 i8 u8); nothing is cast silently")
        if array.nbytes > MAX_ARRAY_BYTES:
            raise DataError(f"array {name!r}: {array.nbytes} bytes exceeds the WTXT limit")
        span = math.prod(d for d in array.shape if d) * array.itemsize
        if span > MAX_ARRAY_BYTES:
            raise DataError(f"array {name!r}: shape {array.shape} spans {span} bytes, over "
                            f"the WTXT limit ({MAX_ARRAY_BYTES})")
        contiguous = le_contiguous(array)
        raw = memoryview(contiguous.reshape(-1).view(np.uint8)) if contiguous.size else memoryview(b"")
        line = ArrLine(name, wdtype, tuple(array.shape), int(array.nbytes), ZERO64, ZERO64, "")
        if blocked and array.ndim >= 1:
            size = line_row_size(array)
            rows = opts.rows_per_chunk or default_rows_per_chunk(size)
            plan = plan_for(line, rows, size)
        else:
            plan = plan_for(line, None, None)
        prepared[name] = PreparedArray(name, wdtype, tuple(array.shape), raw, plan, contiguous)
    return [prepared[n] for n in sorted(prepared, key=lambda n: n.encode("ascii"))]


def line_row_size(array: np.ndarray) -> int:
    return int(array.dtype.itemsize * int(np.prod(array.shape[1:], dtype=np.int64)))
