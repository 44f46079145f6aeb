"""Independent reference implementation of WTXT 1.1 with its canonical decisions.

Test-only.  Written from the WTXT 1.1 format description and its canonical decisions
(restated in docs/formats/wtxt.md, wtxt-delta.md and wsum.md) without looking at the main
implementation.  Plain and slow on purpose.  ``python -m tests.reference.make_vectors OUTDIR``
regenerates the test vectors with it.

Public API: write_wtxt, parse_wtxt, make_delta, apply_delta, verify_wsum,
crc32c, RefError.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac as _hmac
import math
import re
from datetime import datetime

import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

CHUNK = 32768
WIDTH = 76
ZERO64 = "0" * 64
ZERO16 = "0" * 16
DTYPES = {  # WTXT name -> little-endian numpy dtype
    "f64": "<f8", "f32": "<f4", "i64": "<i8", "u64": "<u8", "i32": "<i4",
    "u32": "<u4", "i16": "<i2", "u16": "<u2", "i8": "|i1", "u8": "|u1",
}
_KIND_SIZE = {(np.dtype(v).kind, np.dtype(v).itemsize): k for k, v in DTYPES.items()}
TOKEN = r"[A-Za-z0-9._/+-]+"
NUM = r"(?:0|[1-9][0-9]*)"
HEX64 = r"[0-9a-f]{64}"
AUDIT_RE = re.compile(r'[A-Za-z0-9_]+=(?:"[ !#-~]*"|[!#-~]+)(?: [A-Za-z0-9_]+=(?:"[ !#-~]*"|[!#-~]+))*')
META_RE = re.compile(rf"meta schema=({TOKEN}) gen=([0-9]+) ts=(\S+) build=({TOKEN}) "
                     rf"endian=LE host=({TOKEN}) cuda=({TOKEN})")
ROOT_RE = re.compile(rf"root sha256_all=({HEX64}) merkle_prev=({HEX64}) "
                     rf"merkle_this=({HEX64}) fastxor=([0-9a-f]{{16}})")
PENDING_LINE = f'root_pending sha256_all={ZERO64} note="finalize with WSUM"'
SIGN_RE = re.compile(r"sign ed25519=([A-Za-z0-9+/=]+) keyid=([0-9a-f]{16})")
ARR_RE = re.compile(rf"arr name=([A-Za-z0-9_]+) dtype=({'|'.join(DTYPES)}) "
                    rf"shape=((?:{NUM}(?:,{NUM})*)?) order=C bytes=({NUM}) "
                    rf"sha256=({HEX64}) hmac=({HEX64}) salt=([0-9a-f]{{16}})")
IDX_RE = re.compile(rf"idx rows_per_chunk=([1-9][0-9]*) row_size=({NUM}) row_blocking=on")
CH_RE = re.compile(rf"ch ix=([0-9]{{6,}}) off=([0-9]{{12,}}) len=({NUM}) sha256=({HEX64}) "
                   rf"crc32c=([0-9a-f]{{8}}) b64=on width=76 lines=({NUM})")
B64LN_RE = re.compile(r"([A-Za-z0-9+/=]{1,76}) ([0-9a-f])")
WSUM_RE = re.compile(rf"WSUM 1 sha256_all=({HEX64}) merkle_prev=({HEX64}) "
                     rf"merkle_this=({HEX64}) sign=([A-Za-z0-9+/=]*)\n")
DELTA_RE = re.compile(rf"WTXT-DELTA 2 base_sha256_all=({HEX64})")


class RefError(Exception):
    """A failed check: `check` is e.g. 'parity', 'crc32c', 'merkle'; line_no is 1-based."""

    def __init__(self, check: str, line_no: int, message: str):
        super().__init__(f"{check} (line {line_no}): {message}")
        self.check, self.line_no, self.message = check, line_no, message


# ---------------------------------------------------------------- primitives
def _crc_table() -> tuple[int, ...]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return tuple(table)


_CRC_TABLE = _crc_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc = _CRC_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _parity(line: str) -> int:
    x = 0
    for ch in line.encode("ascii"):
        x ^= ch
    return x & 0xF


def _fastxor(raws: list[bytes]) -> str:
    data = b"".join(raws)
    data += b"\0" * (-len(data) % 8)
    x = 0
    for i in range(0, len(data), 8):
        x ^= int.from_bytes(data[i:i + 8], "little")
    return f"{x:016x}"


def _merkle(prev_hex: str, hash_all_hex: str, ts: str, gen: str, build: str) -> str:
    msg = bytes.fromhex(prev_hex) + bytes.fromhex(hash_all_hex) + (ts + gen + build).encode("ascii")
    return _sha(msg)


def _b64_canonical(text: str) -> bytes | None:
    """Strict standard base64; None unless `text` is the canonical encoding of its bytes."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw if base64.b64encode(raw).decode("ascii") == text else None


def _salt(key: bytes, gen: str, name: str) -> bytes:
    return _hmac.new(key, b"wtxt-salt" + gen.encode("ascii") + name.encode("ascii"),
                     hashlib.sha256).digest()[:8]


def _layout(total: int, size: int) -> list[tuple[int, int]]:
    """(off, len) of each chunk; a 0-byte array has one empty chunk."""
    if total == 0:
        return [(0, 0)]
    return [(off, min(size, total - off)) for off in range(0, total, size)]


def _row_size(dtype: str, shape: tuple[int, ...]) -> int:
    return np.dtype(DTYPES[dtype]).itemsize * math.prod(shape[1:])


def _default_rows(row_size: int) -> int:
    rows = max(1, CHUNK // max(row_size, 1))  # row_size 0 (e.g. shape 5,0) treated as 1
    return 1 << (rows.bit_length() - 1)  # round down to a power of two


def _keyid(pub: Ed25519PublicKey) -> str:
    raw = pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def _load_pubkeys(pem) -> list[Ed25519PublicKey]:
    pems = [pem] if isinstance(pem, (bytes, str)) else list(pem)
    keys = []
    for p in pems:
        key = serialization.load_pem_public_key(p.encode() if isinstance(p, str) else p)
        if not isinstance(key, Ed25519PublicKey):
            raise ValueError("public key is not Ed25519")
        keys.append(key)
    return keys


def _sign(sign_key_pem: bytes, msg: bytes) -> tuple[str, str]:
    key = serialization.load_pem_private_key(sign_key_pem, password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError("signing key is not Ed25519")
    return base64.b64encode(key.sign(msg)).decode("ascii"), _keyid(key.public_key())


# ---------------------------------------------------------------- writer
def _to_raw(name: str, arr) -> tuple[str, tuple[int, ...], bytes]:
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_]+", name):
        raise ValueError(f"array name {name!r} is not [A-Za-z0-9_]+")
    if not isinstance(arr, (np.ndarray, np.generic)):
        raise ValueError(f"array {name!r}: not a numpy array ({type(arr).__name__})")
    arr = np.asarray(arr)
    dt = None if arr.dtype.fields else _KIND_SIZE.get((arr.dtype.kind, arr.dtype.itemsize))
    if dt is None:
        raise ValueError(f"array {name!r}: unsupported dtype {arr.dtype}")
    raw = arr.astype(np.dtype(DTYPES[dt]), order="C", copy=True).tobytes(order="C")
    return dt, tuple(int(d) for d in arr.shape), raw


def _chunk_lines(ix: int, off: int, raw: bytes) -> list[str]:
    text = base64.b64encode(raw).decode("ascii")
    b64 = [text[i:i + WIDTH] for i in range(0, len(text), WIDTH)]
    head = (f"ch ix={ix:06d} off={off:012d} len={len(raw)} sha256={_sha(raw)} "
            f"crc32c={crc32c(raw):08x} b64=on width=76 lines={len(b64)}")
    return [head] + [f"{line} {_parity(line):x}" for line in b64] + ["endch"]


def _arr_line(name, dt, shape, raw, key: bytes | None, gen: str) -> str:
    if key is None:
        salt, mac = b"\0" * 8, ZERO64
    else:
        salt = _salt(key, gen, name)
        mac = _hmac.new(key, salt + raw, hashlib.sha256).hexdigest()
    return (f"arr name={name} dtype={dt} shape={','.join(map(str, shape))} order=C "
            f"bytes={len(raw)} sha256={_sha(raw)} hmac={mac} salt={salt.hex()}")


def _array_block(arr_line: str, idx: tuple[int, int] | None, raw: bytes) -> list[str]:
    out = [arr_line]
    size = CHUNK
    if idx is not None:
        out.append(f"idx rows_per_chunk={idx[0]} row_size={idx[1]} row_blocking=on")
        size = idx[0] * idx[1]
    for ix, (off, n) in enumerate(_layout(len(raw), size)):
        out += _chunk_lines(ix, off, raw[off:off + n])
    return out + ["endarr"]


def _cap_line(hmac_used: bool, row_blocked: bool) -> str:
    ext = ["crc32c", "line_parity"] + (["arr_hmac"] if hmac_used else [])
    ext += ["delta_v2"] + (["row_blocking"] if row_blocked else [])
    return "cap ext=" + ",".join(ext)


def _check_ts(ts) -> bool:
    if not isinstance(ts, str) or not re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", ts):
        return False
    try:
        datetime(int(ts[0:4]), int(ts[5:7]), int(ts[8:10]), int(ts[11:13]),
                 int(ts[14:16]), int(ts[17:19]))
    except ValueError:
        return False
    return True


def _check_write_args(gen, ts, tokens, merkle_prev, audit, rows_per_chunk):
    if not isinstance(gen, int) or isinstance(gen, bool) or gen < 0:
        raise ValueError(f"gen must be a non-negative int, got {gen!r}")
    if not _check_ts(ts):
        raise ValueError(f"ts {ts!r} is not a valid YYYY-MM-DDTHH:MM:SSZ")
    for label, tok in tokens.items():
        if not isinstance(tok, str) or not re.fullmatch(TOKEN, tok):
            raise ValueError(f"{label} {tok!r} is not a TOKEN")
    if merkle_prev is not None and not re.fullmatch(HEX64, str(merkle_prev)):
        raise ValueError("merkle_prev must be 64 lowercase hex digits")
    if audit is not None and not AUDIT_RE.fullmatch(audit):
        raise ValueError(f"audit {audit!r} does not match the audit grammar")
    if rows_per_chunk is not None and (not isinstance(rows_per_chunk, int) or rows_per_chunk < 1):
        raise ValueError("rows_per_chunk must be a positive int")


def write_wtxt(arrays, *, gen, ts, schema="weights/v1", build="unknown", host="cpu",
               cuda="off", merkle_prev=None, row_blocking=False, rows_per_chunk=None,
               hmac_key=None, sign_key_pem=None, audit=None, streaming=False):
    _check_write_args(gen, ts, {"schema": schema, "build": build, "host": host, "cuda": cuda},
                      merkle_prev, audit, rows_per_chunk)
    gen_s = f"{gen:06d}"
    blocking = row_blocking or rows_per_chunk is not None
    items = sorted((_to_raw(n, a) + (n,) for n, a in arrays.items()), key=lambda t: t[3])
    body, hash_in, raws, any_idx = [], [], [], False
    for dt, shape, raw, name in items:
        idx = None
        if blocking and len(shape) >= 1:
            size = _row_size(dt, shape)
            idx = (rows_per_chunk or _default_rows(size), size)
            any_idx = True
        line = _arr_line(name, dt, shape, raw, hmac_key, gen_s)
        body += _array_block(line, idx, raw)
        hash_in.append(line.encode("ascii") + raw)
        raws.append(raw)
    hash_all = _sha(b"".join(hash_in))
    prev = merkle_prev or ZERO64
    this = _merkle(prev, hash_all, ts, gen_s, build)
    head = ["WTXT 1", f"meta schema={schema} gen={gen_s} ts={ts} build={build} endian=LE "
            f"host={host} cuda={cuda}", _cap_line(hmac_key is not None, any_idx)]
    head.append(PENDING_LINE if streaming else
                f"root sha256_all={hash_all} merkle_prev={prev} merkle_this={this} "
                f"fastxor={_fastxor(raws)}")
    if sign_key_pem is not None:
        sig, keyid = _sign(sign_key_pem, ("\n".join(head) + "\n").encode("ascii"))
        head.append(f"sign ed25519={sig} keyid={keyid}")
    tail = ([f"audit {audit}"] if audit is not None else []) + ["endwtxt"]
    data = ("\n".join(head + body + tail) + "\n").encode("ascii")
    if not streaming:
        return data
    wsum = f"WSUM 1 sha256_all={hash_all} merkle_prev={prev} merkle_this={this}"
    sig = _sign(sign_key_pem, wsum.encode("ascii"))[0] if sign_key_pem is not None else ""
    return data, f"{wsum} sign={sig}\n".encode("ascii")


# ---------------------------------------------------------------- parser
class _Lines:
    """Cursor over the lines of an ASCII/LF file, checking the text armor rules."""

    def __init__(self, data: bytes):
        bad = re.search(rb"[^\x20-\x7e\n]", data)
        if bad:
            raise RefError("grammar", data.count(b"\n", 0, bad.start()) + 1,
                           f"byte 0x{data[bad.start()]:02x} is not printable ASCII or LF")
        if not data.endswith(b"\n"):
            raise RefError("grammar", data.count(b"\n") + 1, "file does not end with LF")
        self.lines = data.decode("ascii").split("\n")[:-1]
        for i, line in enumerate(self.lines, 1):
            if line == "" or line.endswith(" "):
                raise RefError("grammar", i, "blank line or trailing space")
        self.pos = 0

    def peek(self) -> str | None:
        return self.lines[self.pos] if self.pos < len(self.lines) else None

    def take(self, what: str) -> tuple[int, str]:
        if self.pos >= len(self.lines):
            raise RefError("grammar", self.pos + 1, f"unexpected end of file, expected {what}")
        self.pos += 1
        return self.pos, self.lines[self.pos - 1]

    def match(self, regex: re.Pattern, what: str) -> tuple[int, re.Match]:
        no, line = self.take(what)
        m = regex.fullmatch(line)
        if not m:
            raise RefError("grammar", no, f"expected {what}: {line[:80]!r}")
        return no, m

    def expect(self, literal: str) -> int:
        no, line = self.take(literal)
        if line != literal:
            raise RefError("grammar", no, f"expected {literal!r}, got {line[:80]!r}")
        return no


def _parse_chunk(cur: _Lines, ix: int, off: int, n: int, name: str) -> bytes:
    no, m = cur.match(CH_RE, f"ch line {ix} of {name}")
    if (m[1], m[2], int(m[3])) != (f"{ix:06d}", f"{off:012d}", n):
        raise RefError("grammar", no, f"{name} chunk {ix}: ix/off/len must be {ix}/{off}/{n}")
    if int(m[6]) != math.ceil(n / 57):
        raise RefError("grammar", no, f"{name} chunk {ix}: lines must be {math.ceil(n / 57)}")
    text = []
    for k in range(int(m[6])):
        lno, lm = cur.match(B64LN_RE, f"base64 line of {name} chunk {ix}")
        if _parity(lm[1]) != int(lm[2], 16):
            raise RefError("parity", lno, f"{name} chunk {ix}: parity nibble mismatch")
        if len(lm[1]) != WIDTH and k != int(m[6]) - 1:
            raise RefError("grammar", lno, f"{name} chunk {ix}: line is not 76 chars")
        text.append(lm[1])
    raw = _b64_canonical("".join(text))
    if raw is None:
        raise RefError("base64", no, f"{name} chunk {ix}: base64 is not canonical")
    if len(raw) != n:
        raise RefError("base64", no, f"{name} chunk {ix}: decodes to {len(raw)} bytes, not {n}")
    if f"{crc32c(raw):08x}" != m[5]:
        raise RefError("crc32c", no, f"{name} chunk {ix}: crc32c mismatch")
    if _sha(raw) != m[4]:
        raise RefError("chunk sha256", no, f"{name} chunk {ix}: sha256 mismatch")
    cur.expect("endch")
    return raw


def _parse_arr_line(no: int, m: re.Match) -> dict:
    shape = tuple(int(d) for d in m[3].split(",")) if m[3] else ()
    rec = {"line_no": no, "arr_line": m[0], "name": m[1], "dtype": m[2], "shape": shape,
           "bytes": int(m[4]), "sha256": m[5], "hmac": m[6], "salt": m[7], "idx": None}
    if rec["bytes"] != np.dtype(DTYPES[m[2]]).itemsize * math.prod(shape):
        raise RefError("grammar", no, f"{m[1]}: bytes= does not match dtype and shape")
    return rec


def _parse_idx(cur: _Lines, rec: dict) -> None:
    if cur.peek() is None or not cur.peek().startswith("idx"):
        return
    no, m = cur.match(IDX_RE, "idx line")
    if not rec["shape"]:
        raise RefError("grammar", no, f"{rec['name']}: a 0-d array has no idx line")
    if int(m[2]) != _row_size(rec["dtype"], rec["shape"]):
        raise RefError("grammar", no, f"{rec['name']}: row_size does not match the shape")
    rec["idx"] = (int(m[1]), int(m[2]))
    rec["idx_line"] = m[0]


def _check_hmac(rec: dict, key: bytes | None, gen: str, raw: bytes) -> None:
    no, name = rec["line_no"], rec["name"]
    if rec["hmac"] == ZERO64:
        if rec["salt"] != ZERO16:
            raise RefError("hmac", no, f"{name}: all-zero hmac needs an all-zero salt")
        if key is not None:
            raise RefError("hmac", no, f"{name}: unauthenticated (hmac is zero) but a key was given")
        return
    if key is None:
        return
    if rec["salt"] != _salt(key, gen, name).hex():
        raise RefError("hmac", no, f"{name}: salt is not the one derived from key/gen/name")
    mac = _hmac.new(key, bytes.fromhex(rec["salt"]) + raw, hashlib.sha256).hexdigest()
    if not _hmac.compare_digest(mac, rec["hmac"]):
        raise RefError("hmac", no, f"{name}: HMAC mismatch")


def _parse_array(cur: _Lines, key: bytes | None, gen: str) -> dict:
    rec = _parse_arr_line(*cur.match(ARR_RE, "arr line"))
    _parse_idx(cur, rec)
    size = rec["idx"][0] * rec["idx"][1] if rec["idx"] else CHUNK
    rec["chunks"] = [_parse_chunk(cur, ix, off, n, rec["name"])
                     for ix, (off, n) in enumerate(_layout(rec["bytes"], size))]
    cur.expect("endarr")
    raw = b"".join(rec["chunks"])
    if _sha(raw) != rec["sha256"]:
        raise RefError("array sha256", rec["line_no"], f"{rec['name']}: sha256 mismatch")
    _check_hmac(rec, key, gen, raw)
    rec["raw"] = raw
    return rec


def _parse_header(cur: _Lines) -> dict:
    cur.expect("WTXT 1")
    no, m = cur.match(META_RE, "meta line")
    if m[2] != f"{int(m[2]):06d}":
        raise RefError("grammar", no, f"gen={m[2]} is not canonical")
    if not _check_ts(m[3]):
        raise RefError("grammar", no, f"ts={m[3]} is not a valid UTC timestamp")
    hdr = {"meta": dict(zip(("schema", "gen", "ts", "build", "host", "cuda"), m.groups())),
           "meta_line": m[0]}
    hdr["cap_line_no"], cap = cur.match(re.compile(r"cap ext=(\S+)"), "cap line")
    hdr["cap"], hdr["cap_line"] = cap[1].split(","), cap[0]
    no, line = cur.take("root line")
    hdr["root_pending"] = line == PENDING_LINE
    root = ROOT_RE.fullmatch(line)
    if not (root or hdr["root_pending"]):
        raise RefError("grammar", no, "expected root or root_pending line")
    hdr["root_line"] = line
    hdr["root"] = dict(zip(("sha256_all", "merkle_prev", "merkle_this", "fastxor"),
                           root.groups())) if root else None
    hdr["signed_bytes"] = ("\n".join(cur.lines[:cur.pos]) + "\n").encode("ascii")
    hdr["sign"] = hdr["sign_line"] = None
    if (cur.peek() or "").startswith("sign"):
        hdr["sign_line_no"], sm = cur.match(SIGN_RE, "sign line")
        sig = _b64_canonical(sm[1])
        if sig is None or len(sig) != 64:
            raise RefError("signature", hdr["sign_line_no"], "ed25519= is not canonical 64-byte base64")
        hdr["sign"], hdr["sign_line"] = {"sig": sig, "keyid": sm[2]}, sm[0]
    return hdr


def _check_cap(hdr: dict, recs: list[dict]) -> None:
    cap, no = hdr["cap"], hdr["cap_line_no"]
    hmac_used = any(r["hmac"] != ZERO64 for r in recs)
    if not recs and "arr_hmac" in cap:  # no content to imply it: accept the writer's choice
        hmac_used = True
    known = _cap_line(hmac_used, any(r["idx"] for r in recs))[len("cap ext="):].split(",")
    unknown = cap[len(known):]
    if cap[:len(known)] != known:
        raise RefError("cap", no, f"known cap entries must be exactly {','.join(known)}")
    names = {"crc32c", "line_parity", "arr_hmac", "delta_v2", "row_blocking"}
    for i, ent in enumerate(unknown):
        if not re.fullmatch(TOKEN, ent) or ent in names or (i and ent <= unknown[i - 1]):
            raise RefError("cap", no, f"bad or misordered extra cap entry {ent!r}")


def _check_signature(hdr: dict, keys: list[Ed25519PublicKey] | None) -> str:
    if hdr["sign"] is None:
        if keys:
            raise RefError("signature", 4, "no sign line but a public key was given")
        return "absent"
    if not keys:
        return "unverified"
    no = hdr["sign_line_no"]
    match = [k for k in keys if _keyid(k) == hdr["sign"]["keyid"]]
    if not match:
        raise RefError("signature", no, "keyid matches none of the given public keys")
    try:
        match[0].verify(hdr["sign"]["sig"], hdr["signed_bytes"])
    except InvalidSignature:
        raise RefError("signature", no, "Ed25519 signature does not verify") from None
    return "verified"


def _check_root(hdr: dict, recs: list[dict]) -> None:
    hash_all = _sha(b"".join(r["arr_line"].encode("ascii") + r["raw"] for r in recs))
    root, meta = hdr["root"], hdr["meta"]
    if root["sha256_all"] != hash_all:
        raise RefError("sha256_all", 4, "sha256_all does not match the content")
    if root["merkle_this"] != _merkle(root["merkle_prev"], hash_all, meta["ts"], meta["gen"],
                                      meta["build"]):
        raise RefError("merkle", 4, "merkle_this does not match")
    if root["fastxor"] != _fastxor([r["raw"] for r in recs]):
        raise RefError("fastxor", 4, "fastxor does not match")


def _check_wsum(hdr: dict, recs: list[dict], wsum: bytes, keys) -> dict:
    if not hdr["root_pending"]:
        raise RefError("wsum", 1, "a WSUM was given for a file with a normal root line")
    m = WSUM_RE.fullmatch(wsum.decode("ascii", "replace"))
    if not m:
        raise RefError("grammar", 1, "WSUM is not one well-formed line")
    hash_all, meta = _sha(b"".join(r["arr_line"].encode("ascii") + r["raw"] for r in recs)), hdr["meta"]
    if m[1] != hash_all:
        raise RefError("sha256_all", 1, "WSUM sha256_all does not match the content")
    if m[3] != _merkle(m[2], hash_all, meta["ts"], meta["gen"], meta["build"]):
        raise RefError("merkle", 1, "WSUM merkle_this does not match")
    sig = _b64_canonical(m[4]) if m[4] else b""
    if sig is None or len(sig) not in (0, 64):
        raise RefError("signature", 1, "WSUM sign= is not canonical 64-byte base64")
    if keys:
        signed = wsum[:wsum.index(b" sign=")]
        if not sig or not any(_verifies(k, sig, signed) for k in keys):
            raise RefError("signature", 1, "WSUM signature missing or not valid for any key")
    return {"sha256_all": m[1], "merkle_prev": m[2], "merkle_this": m[3]}


def _verifies(key: Ed25519PublicKey, sig: bytes, msg: bytes) -> bool:
    try:
        key.verify(sig, msg)
    except InvalidSignature:
        return False
    return True


def parse_wtxt(data: bytes, *, hmac_key: bytes | None = None, public_key_pem=None,
               wsum: bytes | None = None) -> dict:
    """Strictly parse and verify a WTXT file; raise RefError on the first failure.

    public_key_pem: one PEM (bytes) or a list of trusted PEMs.  wsum: the WSUM
    bytes, required iff the file has a root_pending line.
    """
    cur = _Lines(data)
    hdr = _parse_header(cur)
    recs: list[dict] = []
    while (cur.peek() or "").startswith("arr"):
        rec = _parse_array(cur, hmac_key, hdr["meta"]["gen"])
        if recs and rec["name"] <= recs[-1]["name"]:
            raise RefError("grammar", rec["line_no"], "arrays are not in strict name order")
        recs.append(rec)
    hdr["audit"] = hdr["audit_line"] = None
    if (cur.peek() or "").startswith("audit"):
        no, m = cur.match(re.compile(r"audit (" + AUDIT_RE.pattern + ")"), "audit line")
        hdr["audit"], hdr["audit_line"] = m[1], m[0]
    cur.expect("endwtxt")
    if cur.peek() is not None:
        raise RefError("grammar", cur.pos + 1, "content after endwtxt")
    _check_cap(hdr, recs)
    keys = _load_pubkeys(public_key_pem) if public_key_pem is not None else None
    if hdr["root_pending"]:
        if wsum is None:
            raise RefError("wsum", 4, "root_pending file needs its WSUM")
        hdr["wsum"] = _check_wsum(hdr, recs, wsum, keys)
    elif wsum is not None:
        raise RefError("wsum", 4, "a WSUM was given for a file with a normal root line")
    else:
        _check_root(hdr, recs)
    hdr["signature"] = _check_signature(hdr, keys)
    hdr["unauthenticated"] = [r["name"] for r in recs if r["hmac"] == ZERO64]
    hdr["records"] = {r["name"]: r for r in recs}
    hdr["arrays"] = {r["name"]: np.frombuffer(r["raw"], dtype=DTYPES[r["dtype"]])
                     .reshape(r["shape"]).copy() for r in recs}
    return hdr


def verify_wsum(wtxt: bytes, wsum: bytes, public_key_pem=None) -> None:
    parse_wtxt(wtxt, wsum=wsum, public_key_pem=public_key_pem)


# ---------------------------------------------------------------- DELTA v2
def make_delta(base: bytes, target: bytes) -> bytes:
    b, t = parse_wtxt(base), parse_wtxt(target)
    if b["root_pending"] or t["root_pending"]:
        raise ValueError("deltas are only made between finalized files (not root_pending)")
    br, tr = b["records"], t["records"]
    derived = _cap_line(any(r["hmac"] != ZERO64 for r in tr.values()) or
                        (not tr and "arr_hmac" in b["cap"]), any(r["idx"] for r in tr.values()))
    if t["cap_line"] != derived:
        raise ValueError("target cap line is not the one an applier re-derives (extra entries?)")
    if list(br) != list(tr):
        raise ValueError("base and target have different array names; write a full snapshot")
    out = [f"WTXT-DELTA 2 base_sha256_all={b['root']['sha256_all']}", t["meta_line"],
           t["root_line"]] + ([t["sign_line"]] if t["sign_line"] else [])
    for name in br:
        x, y = br[name], tr[name]
        if (x["dtype"], x["shape"], x["idx"]) != (y["dtype"], y["shape"], y["idx"]):
            raise ValueError(f"array {name}: dtype/shape/row blocking differ; write a full snapshot")
        size = x["idx"][0] * x["idx"][1] if x["idx"] else CHUNK
        changed = [ix for ix, (cx, cy) in enumerate(zip(x["chunks"], y["chunks"])) if cx != cy]
        if not changed and x["arr_line"] == y["arr_line"]:
            continue
        out.append(y["arr_line"])
        layout = _layout(y["bytes"], size)
        for ix in changed:
            out += _chunk_lines(ix, layout[ix][0], y["chunks"][ix])
        out.append("endarr")
    out += ([t["audit_line"]] if t["audit_line"] else []) + ["enddelta"]
    return ("\n".join(out) + "\n").encode("ascii")


def _parse_delta_array(cur: _Lines, brecs: dict, prev: str | None) -> tuple[str, str, list]:
    no, m = cur.match(ARR_RE, "arr line")
    rec = _parse_arr_line(no, m)
    name, base = rec["name"], brecs.get(rec["name"])
    if base is None or (prev is not None and name <= prev):
        raise RefError("grammar", no, f"array {name} unknown to the base or out of order")
    if (rec["dtype"], rec["shape"]) != (base["dtype"], base["shape"]):
        raise RefError("grammar", no, f"array {name}: dtype/shape differ from the base")
    size = base["idx"][0] * base["idx"][1] if base["idx"] else CHUNK
    layout, chunks = _layout(base["bytes"], size), list(base["chunks"])
    last = -1
    while (cur.peek() or "").startswith("ch "):
        cm = CH_RE.fullmatch(cur.lines[cur.pos])
        ix = int(cm[1]) if cm else -1
        if ix <= last or ix >= len(layout):
            raise RefError("grammar", cur.pos + 1, f"{name}: chunk ix invalid or out of order")
        chunks[ix] = _parse_chunk(cur, ix, *layout[ix], name)
        last = ix
    cur.expect("endarr")
    return name, rec["arr_line"], chunks


def apply_delta(base: bytes, delta: bytes, *, hmac_key: bytes | None = None,
                public_key_pem=None) -> bytes:
    b = parse_wtxt(base)
    if b["root_pending"]:
        raise RefError("grammar", 4, "base is root_pending; deltas apply to finalized files")
    cur = _Lines(delta)
    no, m = cur.match(DELTA_RE, "WTXT-DELTA 2 header")
    if m[1] != b["root"]["sha256_all"]:
        raise RefError("sha256_all", no, "delta base_sha256_all does not match the base")
    meta = cur.match(re.compile(r"meta .*"), "meta line")[1][0]
    root = cur.match(re.compile(r"root .*"), "root line")[1][0]
    sign = cur.match(SIGN_RE, "sign line")[1][0] if (cur.peek() or "").startswith("sign") else None
    new, prev = {}, None
    while (cur.peek() or "").startswith("arr"):
        name, arr_line, chunks = _parse_delta_array(cur, b["records"], prev)
        new[name], prev = (arr_line, chunks), name
    audit = cur.match(re.compile(r"audit .*"), "audit")[1][0] if (cur.peek() or "").startswith("audit") else None
    cur.expect("enddelta")
    if cur.peek() is not None:
        raise RefError("grammar", cur.pos + 1, "content after enddelta")
    result = _assemble(b, meta, root, sign, new, audit)
    parse_wtxt(result, hmac_key=hmac_key, public_key_pem=public_key_pem)
    return result


def _assemble(b: dict, meta: str, root: str, sign, new: dict, audit) -> bytes:
    body, hmac_used = [], False
    for name, rec in b["records"].items():
        arr_line, chunks = new.get(name, (rec["arr_line"], rec["chunks"]))
        hmac_used |= ARR_RE.fullmatch(arr_line)[6] != ZERO64
        body += _array_block(arr_line, rec["idx"], b"".join(chunks))
    if not b["records"]:
        hmac_used = "arr_hmac" in b["cap"]
    any_idx = any(r["idx"] for r in b["records"].values())
    head = ["WTXT 1", meta, _cap_line(hmac_used, any_idx), root] + ([sign] if sign else [])
    tail = ([audit] if audit else []) + ["endwtxt"]
    return ("\n".join(head + body + tail) + "\n").encode("ascii")
