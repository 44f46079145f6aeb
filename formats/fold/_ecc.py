"""Reed–Solomon ECC for FOLD chunks: ``rs(N)`` over GF(2^8), reedsolo's ``RSCodec(N)`` code.

Layout (docs/formats/fold.md, section 4): the compressed payload is cut into blocks of ``255-N`` bytes; the
ECC region is each block's N parity bytes, concatenated. The code is reedsolo's default one
(nsize 255, fcr 0, primitive polynomial 0x11d, generator 2), so a block of <= 255-N bytes is
exactly ``RSCodec(N).encode(block)[-N:]``.

Parity is computed here with numpy instead of reedsolo: encoding is linear, so the parity of a
block is the XOR over its positions of a per-position table lookup, done for thousands of blocks
at once (several times faster than the compiled ``creedsolo``). The same routine checks parity
on read; only blocks whose parity disagrees are handed to reedsolo (``creedsolo`` when
importable) for error correction.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

import numpy as np

from ..errors import FormatError, UnsupportedVersionError

PRESETS = {"none": 0, "off": 0, "low": 16, "med": 32, "high": 64}
_ALGO = re.compile(r"rs\(([1-9][0-9]{0,2})\)")
_PRIM = 0x11D
_BATCH = 32768          # blocks per numpy pass: big enough to amortise the per-position loop


def parse_algo(text: object, where: dict | None = None) -> int:
    """``"none"`` -> 0, ``"rs(N)"`` -> N (1..254); anything else is unsupported."""
    if text == "none":
        return 0
    m = _ALGO.fullmatch(text) if isinstance(text, str) else None
    if not m or not 1 <= int(m.group(1)) <= 254:
        raise UnsupportedVersionError("ECC algorithm", **(where or {}),
                                      expected='"none" or "rs(N)", 1 <= N <= 254', got=text)
    return int(m.group(1))


def algo_name(nsym: int) -> str:
    return f"rs({nsym})" if nsym else "none"


def parse_option(ecc: str | int | None) -> int:
    """Writer option: a preset name (none/off/low/med/high), ``"rs(N)"`` or N itself."""
    from ..errors import DataError

    if ecc is None:
        return 0
    if isinstance(ecc, int) and not isinstance(ecc, bool) and 0 <= ecc <= 254:
        return ecc
    if isinstance(ecc, str) and ecc.lower() in PRESETS:
        return PRESETS[ecc.lower()]
    try:
        return parse_algo(ecc)
    except FormatError:
        raise DataError(f"ecc must be none, low, med, high or rs(N) with 1 <= N <= 254, "
                        f"got {ecc!r}") from None


def ecc_length(comp_len: int, nsym: int) -> int:
    if not nsym:
        return 0
    k = 255 - nsym
    return -(-comp_len // k) * nsym


# -- parity -------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _gf() -> tuple[np.ndarray, np.ndarray]:
    exp = np.zeros(512, np.int64)
    log = np.zeros(256, np.int64)
    x = 1
    for i in range(255):
        exp[i] = x
        log[x] = i
        x <<= 1
        if x & 0x100:
            x ^= _PRIM
    exp[255:510] = exp[:255]
    return exp, log


def _gf_mul_table() -> np.ndarray:
    exp, log = _gf()
    table = exp[(log[:, None] + log[None, :])].astype(np.uint8)
    table[0, :] = 0
    table[:, 0] = 0
    return table


@functools.lru_cache(maxsize=4)
def _tables(nsym: int) -> np.ndarray:
    """``T[i, b]`` = parity contributed by byte ``b`` at message position ``i`` (uint64 lanes)."""
    exp, _ = _gf()
    mul = _gf_mul_table()
    gen = [1]                                   # prod (x - 2^i), highest degree first
    for i in range(nsym):
        root = int(exp[i])
        gen = [a ^ int(mul[root, b]) for a, b in zip(gen + [0], [0] + gen, strict=True)]
    k = 255 - nsym
    rows = np.zeros((k, nsym), np.uint8)
    rem = np.array(gen[1:], np.uint8)           # x^nsym mod g
    for t in range(k):                          # rows[k-1-t] = x^(nsym+t) mod g
        rows[k - 1 - t] = rem
        carry = rem[0]
        rem = np.concatenate([rem[1:], [0]]).astype(np.uint8) ^ mul[carry, gen[1:]]
    width = -(-nsym // 8) * 8
    table = np.zeros((k, 256, width), np.uint8)
    table[:, :, :nsym] = mul[:, rows].transpose(1, 0, 2)
    return np.ascontiguousarray(table).view(np.uint64)


def _parity_rows(blocks: np.ndarray, nsym: int) -> np.ndarray:
    """Parity of each row of ``blocks`` (n, 255-N) uint8 -> (n, N) uint8."""
    table = _tables(nsym)
    n = blocks.shape[0]
    out = np.empty((n, table.shape[2]), np.uint64)
    tmp = np.empty((min(n, _BATCH), table.shape[2]), np.uint64)
    for lo in range(0, n, _BATCH):
        cols = np.ascontiguousarray(blocks[lo:lo + _BATCH].T)
        acc = out[lo:lo + cols.shape[1]]
        part = tmp[:cols.shape[1]]
        np.take(table[0], cols[0], axis=0, out=acc)
        for i in range(1, cols.shape[0]):
            np.take(table[i], cols[i], axis=0, out=part)
            acc ^= part
    return out.view(np.uint8)[:, :nsym]


def _blocks(data, nsym: int) -> np.ndarray:
    """The payload as (nblocks, 255-N) rows; a short last block is zero-padded at the front,
    which leaves its parity unchanged (leading zero coefficients)."""
    k = 255 - nsym
    buf = np.frombuffer(data, np.uint8)
    full, tail = divmod(buf.size, k)
    if not tail:
        return buf.reshape(full, k)
    rows = np.zeros((full + 1, k), np.uint8)
    rows[:full] = buf[:full * k].reshape(full, k)
    rows[full, k - tail:] = buf[full * k:]
    return rows


def parity(data, nsym: int) -> bytes:
    """The ECC region for ``data`` (bytes-like) under ``rs(nsym)``."""
    if not nsym or not len(data):
        return b""
    return _parity_rows(_blocks(data, nsym), nsym).tobytes()


def bad_blocks(data, ecc, nsym: int) -> np.ndarray:
    """Indices of the blocks whose stored parity disagrees with their data (syndrome != 0)."""
    if not nsym or not len(data):
        return np.zeros(0, np.int64)
    computed = _parity_rows(_blocks(data, nsym), nsym)
    stored = np.frombuffer(ecc, np.uint8).reshape(-1, nsym)
    return np.flatnonzero((computed != stored).any(axis=1))


# -- correction ---------------------------------------------------------------------------------

@dataclass
class Repair:
    """What correction did to one chunk."""

    blocks: int = 0
    bad_blocks: int = 0
    data_bytes: int = 0
    parity_bytes: int = 0
    failed_block: int | None = None
    positions: list[int] = field(default_factory=list)   # payload offsets fixed (first 100)


class Uncorrectable(Exception):
    """Internal: a block has more errors than rs(N) can fix (callers turn it into a FormatError)."""


@functools.lru_cache(maxsize=4)
def _codec(nsym: int):
    try:
        import creedsolo as rs
    except ImportError:
        try:
            import reedsolo as rs
        except ImportError:
            return None
    return rs.RSCodec(nsym)


def correct(data, ecc, nsym: int, bad: np.ndarray) -> tuple[bytearray, Repair]:
    """Fix the ``bad`` blocks of ``data`` with reedsolo; raises Uncorrectable on the first
    block it cannot decode."""
    k = 255 - nsym
    repair = Repair(blocks=-(-len(data) // k), bad_blocks=int(bad.size))
    codec = _codec(nsym)
    if codec is None:
        raise Uncorrectable("ECC correction needs the reedsolo package (pip install reedsolo)")
    fixed = bytearray(data)
    ecc = memoryview(ecc)
    for b in bad.tolist():
        lo, hi = b * k, min(len(fixed), (b + 1) * k)
        block, par = bytes(fixed[lo:hi]), bytes(ecc[b * nsym:(b + 1) * nsym])
        try:
            msg, full, _ = codec.decode(bytearray(block + par))
        except Exception as exc:   # reedsolo raises ReedSolomonError and others on bad input
            repair.failed_block = b
            raise Uncorrectable(f"block {b}: {exc}") from None
        msg, full = bytes(msg), bytes(full)
        if len(msg) != len(block) or len(full) != len(block) + nsym:
            repair.failed_block = b
            raise Uncorrectable(f"block {b}: decoder returned a block of the wrong size")
        for j, (x, y) in enumerate(zip(block, msg, strict=True)):
            if x != y:
                repair.data_bytes += 1
                if len(repair.positions) < 100:
                    repair.positions.append(lo + j)
        repair.parity_bytes += sum(x != y for x, y in zip(par, full[len(block):], strict=True))
        fixed[lo:hi] = msg
    return fixed, repair
