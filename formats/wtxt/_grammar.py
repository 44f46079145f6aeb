"""WTXT 1.1 line grammar: constants, formatting and strict parsing of the non-base64 lines.

Binding rules: docs/formats/wtxt.md. Every ``parse_*`` takes one line *without*
its LF and the 1-based line number, and raises FormatError naming both on any deviation.
"""

from __future__ import annotations

import datetime as _dt
import math
import re
from dataclasses import dataclass

import numpy as np

from ..errors import FormatError, LimitError

MAGIC = b"WTXT 1"
CHUNK_BYTES = 32768
WIDTH = 76
RAW_PER_LINE = 57
MAX_LINE = 4096          # longest header/arr/idx/ch/audit line a reader accepts
MAX_NAME = 255
MAX_NDIM = 64
MAX_ARRAY_BYTES = 10**12 - 1  # keeps off= at 12 digits; larger declarations are refused
ZERO64 = "0" * 64
ZERO16 = "0" * 16
KNOWN_CAPS = ("crc32c", "line_parity", "arr_hmac", "delta_v2", "row_blocking")

DTYPES = {
    "f64": np.dtype("<f8"), "f32": np.dtype("<f4"),
    "i64": np.dtype("<i8"), "u64": np.dtype("<u8"),
    "i32": np.dtype("<i4"), "u32": np.dtype("<u4"),
    "i16": np.dtype("<i2"), "u16": np.dtype("<u2"),
    "i8": np.dtype("i1"), "u8": np.dtype("u1"),
}
_DTYPE_NAMES = {(d.kind, d.itemsize): n for n, d in DTYPES.items()}

TOKEN = rb"[A-Za-z0-9._/+-]+"
NAME = re.compile(rb"[A-Za-z0-9_]+")
DIGS = rb"(?:0|[1-9][0-9]*)"
HEX = lambda n: rb"[0-9a-f]{%d}" % n  # noqa: E731
B64 = rb"[A-Za-z0-9+/]*={0,2}"

META_RE = re.compile(
    rb"meta schema=(" + TOKEN + rb") gen=([0-9]{6,}) ts=([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:"
    rb"[0-9]{2}:[0-9]{2}Z) build=(" + TOKEN + rb") endian=LE host=(" + TOKEN + rb") cuda=("
    + TOKEN + rb")")
CAP_RE = re.compile(rb"cap ext=([A-Za-z0-9_]+(?:,[A-Za-z0-9_]+)*)")
ROOT_RE = re.compile(
    rb"root sha256_all=(" + HEX(64) + rb") merkle_prev=(" + HEX(64) + rb") merkle_this=("
    + HEX(64) + rb") fastxor=(" + HEX(16) + rb")")
ROOT_PENDING = b'root_pending sha256_all=' + b"0" * 64 + b' note="finalize with WSUM"'
SIGN_RE = re.compile(rb"sign ed25519=(" + B64 + rb") keyid=(" + HEX(16) + rb")")
ARR_RE = re.compile(
    rb"arr name=([A-Za-z0-9_]+) dtype=([a-z0-9]+) shape=((?:" + DIGS + rb"(?:," + DIGS
    + rb")*)?) order=C bytes=(" + DIGS + rb") sha256=(" + HEX(64) + rb") hmac=(" + HEX(64)
    + rb") salt=(" + HEX(16) + rb")")
IDX_RE = re.compile(
    rb"idx rows_per_chunk=(" + DIGS + rb") row_size=(" + DIGS + rb") row_blocking=on")
CH_RE = re.compile(
    rb"ch ix=([0-9]{6,}) off=([0-9]{12,}) len=(" + DIGS + rb") sha256=(" + HEX(64)
    + rb") crc32c=(" + HEX(8) + rb") b64=on width=76 lines=(" + DIGS + rb")")
AUDIT_RE = re.compile(rb'audit [A-Za-z0-9_]+=(?:"[ !#-~]*"|[!#-~]+)(?: [A-Za-z0-9_]+=(?:"[ !#-~]*"|[!#-~]+))*')


def grammar_error(line_no: int, expected: str, got: bytes, **where) -> FormatError:
    shown = bytes(got).decode("ascii", "backslashreplace")
    return FormatError(line=line_no, expected=expected, got=shown, check="grammar", **where)


def format_gen(gen: int) -> str:
    return f"{gen:06d}"


def canonical_gen(text: str) -> bool:
    return len(text) == 6 or text[0] != "0"


def check_ts(ts: str) -> bool:
    try:
        _dt.datetime.strptime(ts, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return False
    return True


def wtxt_dtype(dtype: np.dtype) -> str | None:
    """The WTXT dtype name for a numpy dtype, or None when WTXT cannot hold it."""
    if dtype.kind not in "fiu":
        return None
    return _DTYPE_NAMES.get((dtype.kind, dtype.itemsize))


@dataclass(frozen=True)
class Meta:
    schema: str
    gen: str
    ts: str
    build: str
    host: str
    cuda: str

    def line(self) -> str:
        return (f"meta schema={self.schema} gen={self.gen} ts={self.ts} build={self.build}"
                f" endian=LE host={self.host} cuda={self.cuda}")


@dataclass(frozen=True)
class Root:
    sha256_all: str
    merkle_prev: str
    merkle_this: str
    fastxor: str

    def line(self) -> str:
        return (f"root sha256_all={self.sha256_all} merkle_prev={self.merkle_prev}"
                f" merkle_this={self.merkle_this} fastxor={self.fastxor}")


@dataclass(frozen=True)
class ArrLine:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    sha256: str
    hmac: str
    salt: str

    def line(self) -> str:
        shape = ",".join(str(d) for d in self.shape)
        return (f"arr name={self.name} dtype={self.dtype} shape={shape} order=C"
                f" bytes={self.nbytes} sha256={self.sha256} hmac={self.hmac} salt={self.salt}")

    @property
    def np_dtype(self) -> np.dtype:
        return DTYPES[self.dtype]

    @property
    def unauthenticated(self) -> bool:
        return self.hmac == ZERO64


def parse_meta(line: bytes, no: int) -> Meta:
    m = META_RE.fullmatch(line)
    if not m:
        raise grammar_error(no, "meta schema= gen= ts= build= endian=LE host= cuda=", line)
    meta = Meta(*(g.decode("ascii") for g in m.groups()))
    if not canonical_gen(meta.gen):
        raise grammar_error(no, "gen as 6 digits or more without leading zeros", line)
    if not check_ts(meta.ts):
        raise grammar_error(no, "ts as a real UTC time YYYY-MM-DDTHH:MM:SSZ", line)
    return meta


def parse_cap(line: bytes, no: int) -> list[str]:
    m = CAP_RE.fullmatch(line)
    if not m:
        raise grammar_error(no, "cap ext=<comma-separated names>", line)
    return m.group(1).decode("ascii").split(",")


def expected_caps(hmac_used: bool, row_blocking: bool) -> list[str]:
    caps = ["crc32c", "line_parity"]
    if hmac_used:
        caps.append("arr_hmac")
    caps.append("delta_v2")
    if row_blocking:
        caps.append("row_blocking")
    return caps


def check_caps(caps: list[str], hmac_used: bool | None, row_blocking: bool, no: int) -> None:
    """Known entries must be exactly what the content implies; unknown ones sorted after.

    ``hmac_used=None`` (no arrays: nothing shows whether a key was used) accepts both."""
    if hmac_used is None:
        hmac_used = "arr_hmac" in caps[:3]
    want = expected_caps(hmac_used, row_blocking)
    known, unknown = caps[:len(want)], caps[len(want):]
    bad_unknown = any(u in KNOWN_CAPS for u in unknown) or unknown != sorted(set(unknown))
    if known != want or bad_unknown:
        raise FormatError(line=no, expected="cap ext=" + ",".join(want) + "[,unknown...]",
                          got=",".join(caps), check="cap")


def parse_root(line: bytes, no: int) -> Root:
    m = ROOT_RE.fullmatch(line)
    if not m:
        raise grammar_error(no, "root sha256_all= merkle_prev= merkle_this= fastxor=", line)
    return Root(*(g.decode("ascii") for g in m.groups()))


def parse_shape(text: bytes) -> tuple[int, ...]:
    return tuple(int(d) for d in text.split(b",")) if text else ()


def parse_arr(line: bytes, no: int) -> ArrLine:
    m = ARR_RE.fullmatch(line)
    if not m:
        raise grammar_error(no, "arr name= dtype= shape= order=C bytes= sha256= hmac= salt=", line)
    name, dtype, shape_text, nbytes, sha, mac, salt = m.groups()
    name_s = name.decode("ascii")
    if len(name) > MAX_NAME:
        raise LimitError(line=no, expected=f"name of at most {MAX_NAME} chars", got=len(name))
    dtype_s = dtype.decode("ascii")
    if dtype_s not in DTYPES:
        raise FormatError(line=no, array=name_s, expected="|".join(DTYPES), got=dtype_s,
                          check="grammar")
    if shape_text.count(b",") >= MAX_NDIM:
        raise LimitError(line=no, array=name_s, expected=f"at most {MAX_NDIM} dims",
                         got=shape_text.count(b",") + 1)
    shape = parse_shape(shape_text)
    span = math.prod(d for d in shape if d) * DTYPES[dtype_s].itemsize
    if span > MAX_ARRAY_BYTES:        # numpy refuses such a shape even with a 0 in it
        raise LimitError(line=no, array=name_s, check="limit",
                         expected=f"dimensions spanning at most {MAX_ARRAY_BYTES} bytes",
                         got=f"shape {shape_text.decode()}")
    size = int(np.prod(shape, dtype=object)) if shape else 1
    declared = int(nbytes)
    if declared > MAX_ARRAY_BYTES:
        raise LimitError(line=no, array=name_s, expected=f"bytes <= {MAX_ARRAY_BYTES}",
                         got=declared)
    if size * DTYPES[dtype_s].itemsize != declared:
        raise FormatError(line=no, array=name_s, check="grammar",
                          expected=f"bytes = {size} elements x {DTYPES[dtype_s].itemsize}",
                          got=declared)
    return ArrLine(name_s, dtype_s, shape, declared, sha.decode(), mac.decode(), salt.decode())


def parse_idx(line: bytes, no: int) -> tuple[int, int]:
    m = IDX_RE.fullmatch(line)
    if not m:
        raise grammar_error(no, "idx rows_per_chunk= row_size= row_blocking=on", line)
    return int(m.group(1)), int(m.group(2))


def row_size(arr: ArrLine) -> int:
    inner = int(np.prod(arr.shape[1:], dtype=object)) if len(arr.shape) > 1 else 1
    return arr.np_dtype.itemsize * inner


def default_rows_per_chunk(row_bytes: int) -> int:
    """``max(1, 32768 // S)`` rounded down to a power of two (S = 0 counts as 1)."""
    rows = max(1, CHUNK_BYTES // max(row_bytes, 1))
    return 1 << (rows.bit_length() - 1)


def ch_line(ix: int, off: int, length: int, sha: str, crc: int) -> str:
    return (f"ch ix={ix:06d} off={off:012d} len={length} sha256={sha} crc32c={crc:08x}"
            f" b64=on width=76 lines={lines_for(length)}")


def lines_for(length: int) -> int:
    return -(-length // RAW_PER_LINE)
