"""The WTXT writer: two passes over in-memory arrays, bounded extra memory.

Pass 1 hashes each array (SHA-256 and HMAC, in parallel: hashlib releases the GIL). Pass 2
emits the header with a fixed-width placeholder root line, then the chunks (encoded in
parallel batches, written in order) while another thread computes ``sha256_all``; the root
and sign lines are patched in place at the end. Non-seekable outputs get ``sha256_all`` first.
"""

from __future__ import annotations

import collections
import hashlib
import hmac as _hmac
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
import pybase64

from .._alloc import tune_allocator
from ..integrity import FastXor, crc32c, merkle_link
from ..keys import keyid
from ._grammar import (
    MAGIC, ROOT_PENDING, ZERO16, ZERO64, ArrLine, Meta, Root, ch_line, expected_caps, format_gen,
)
from ._lines import encode_bodies
from ._plan import ENDCH, body_len
from ._prepare import PreparedArray, WriteOptions

BATCH_BYTES = 1 << 20        # raw bytes per encode task
PIECE_BYTES = 57 * 16384     # raw bytes per piece of a chunk larger than BATCH_BYTES
MAX_IN_FLIGHT = 6


@dataclass(frozen=True)
class WriteResult:
    """What a write produced: the root values, for ledgers, WSUM and tags."""

    gen: str
    ts: str
    build: str
    sha256_all: str
    merkle_prev: str
    merkle_this: str
    fastxor: str
    keyid: str | None
    arrays: int
    raw_bytes: int
    wsum: bytes | None = None


def salt_for(key: bytes | None, gen: str, name: str) -> bytes:
    if key is None:
        return bytes(8)
    return _hmac.new(key, b"wtxt-salt" + gen.encode() + name.encode(), "sha256").digest()[:8]


def _array_digests(array: PreparedArray, key: bytes | None, gen: str, pool) -> tuple[Future, Future | None, bytes]:
    salt = salt_for(key, gen, array.name)
    sha = pool.submit(lambda: hashlib.sha256(array.raw).hexdigest())
    mac = None
    if key is not None:
        def run_mac():
            h = _hmac.new(key, salt, "sha256")
            h.update(array.raw)
            return h.hexdigest()
        mac = pool.submit(run_mac)
    return sha, mac, salt


def arr_lines(arrays: list[PreparedArray], key: bytes | None, gen: str, pool) -> list[str]:
    """Pass 1: the exact ``arr`` line of every array."""
    pending = [_array_digests(a, key, gen, pool) for a in arrays]
    lines = []
    for array, (sha, mac, salt) in zip(arrays, pending):
        line = ArrLine(array.name, array.dtype, array.shape, len(array.raw), sha.result(),
                       mac.result() if mac else ZERO64, salt.hex())
        lines.append(line.line())
    return lines


def hash_all(arrays: list[PreparedArray], lines: list[str]) -> str:
    h = hashlib.sha256()
    for array, line in zip(arrays, lines):
        h.update(line.encode("ascii"))
        h.update(array.raw)
    return h.hexdigest()


def fastxor_of(arrays: list[PreparedArray]) -> str:
    fx = FastXor()
    for array in arrays:
        fx.update(array.raw)
    return fx.hexdigest()


def encode_run(raw: memoryview, first_ix: int, count: int, length: int, start: int) -> memoryview:
    """Text of ``count`` chunks of ``length`` bytes starting at chunk ``first_ix``."""
    heads = []
    for k in range(count):
        off = start + k * length
        piece = raw[off:off + length]
        sha = hashlib.sha256(piece).hexdigest()
        heads.append(ch_line(first_ix + k, off, length, sha, crc32c(piece)) + "\n")
    head_len, blen = len(heads[0]), body_len(length)
    out = np.empty((count, head_len + blen + len(ENDCH)), np.uint8)
    out[:, :head_len] = np.frombuffer("".join(heads).encode("ascii"), np.uint8).reshape(count, -1)
    encode_bodies(raw[start:start + count * length], length, count, out[:, head_len:head_len + blen])
    out[:, head_len + blen:] = np.frombuffer(ENDCH, np.uint8)
    return memoryview(out).cast("B")


def encode_piece(piece: memoryview) -> memoryview:
    out = np.empty((1, body_len(len(piece))), np.uint8)
    encode_bodies(piece, len(piece), 1, out)
    return memoryview(out).cast("B")


def chunk_tasks(array: PreparedArray, pool):
    """Futures of the text of ``array``'s chunks, in file order (lazily submitted)."""
    raw, plan = array.raw, array.plan
    for first, count, length in plan.runs(BATCH_BYTES):
        start = first * plan.chunk_len
        if length <= BATCH_BYTES:
            yield pool.submit(encode_run, raw, first, count, length, start)
            continue
        piece = raw[start:start + length]
        head = pool.submit(lambda p=piece, ix=first, off=start: (
            ch_line(ix, off, len(p), hashlib.sha256(p).hexdigest(), crc32c(p)) + "\n").encode())
        yield head
        for at in range(0, length, PIECE_BYTES):
            yield pool.submit(encode_piece, piece[at:at + PIECE_BYTES])
        done: Future = Future()
        done.set_result(ENDCH)
        yield done


def write_ordered(out: BinaryIO, futures) -> None:
    """Write results of ``futures`` in order, keeping at most MAX_IN_FLIGHT outstanding."""
    window = collections.deque()
    for fut in futures:
        window.append(fut)
        if len(window) >= MAX_IN_FLIGHT:
            out.write(window.popleft().result())
    while window:
        out.write(window.popleft().result())


def write_wtxt(out: BinaryIO, arrays: list[PreparedArray], opts: WriteOptions, ts: str) -> WriteResult:
    tune_allocator()
    gen = format_gen(opts.gen)
    key = opts.hmac_key
    meta = Meta(opts.schema, gen, ts, opts.build, opts.host, opts.cuda)
    merkle_prev = opts.merkle_prev or ZERO64
    blocked = any(a.plan.rows_per_chunk is not None for a in arrays)
    caps = expected_caps(key is not None, blocked)
    seekable = _seekable(out)
    base = out.tell() if seekable else 0
    with ThreadPoolExecutor(max_workers=max(2, opts.threads + 1),
                            thread_name_prefix="wtxt-write") as pool:
        fx = pool.submit(fastxor_of, arrays)
        lines = arr_lines(arrays, key, gen, pool)
        total = pool.submit(hash_all, arrays, lines)
        if not seekable and not opts.streaming:     # the root line cannot be patched later
            total.result(), fx.result()
        head = [MAGIC.decode(), meta.line(), "cap ext=" + ",".join(caps)]
        root_at = len("\n".join(head)) + 1
        if opts.streaming:
            head.append(ROOT_PENDING.decode())
        else:
            head.append(_root(total, fx, merkle_prev, ts, gen, opts.build) if total.done() and fx.done()
                        else Root(ZERO64, ZERO64, ZERO64, ZERO16).line())
        header = ("\n".join(head) + "\n").encode("ascii")
        out.write(header)
        sign_at = len(header)
        if opts.sign_key is not None:
            out.write(_sign_line(opts.sign_key, header))
        for array, line in zip(arrays, lines):
            out.write(line.encode("ascii") + b"\n")
            if array.plan.rows_per_chunk is not None:
                out.write(f"idx rows_per_chunk={array.plan.rows_per_chunk} "
                          f"row_size={array.plan.row_size} row_blocking=on\n".encode("ascii"))
            write_ordered(out, chunk_tasks(array, pool))
            out.write(b"endarr\n")
        if opts.audit is not None:
            out.write(f"audit {opts.audit}\n".encode("ascii"))
        out.write(b"endwtxt\n")
        sha_all, fastxor = total.result(), fx.result()
    merkle_this = merkle_link(merkle_prev, sha_all, ts, gen, opts.build)
    if not opts.streaming and seekable:
        root = Root(sha_all, merkle_prev, merkle_this, fastxor).line().encode("ascii")
        header = header[:root_at] + root + b"\n"
        end = out.tell()
        out.seek(base + root_at)
        out.write(root + b"\n")
        if opts.sign_key is not None:
            out.seek(base + sign_at)
            out.write(_sign_line(opts.sign_key, header))
        out.seek(end)
    wsum = _wsum_line(sha_all, merkle_prev, merkle_this, opts.sign_key) if opts.streaming else None
    return WriteResult(gen, ts, opts.build, sha_all, merkle_prev, merkle_this, fastxor,
                       keyid(opts.sign_key) if opts.sign_key is not None else None,
                       len(arrays), sum(len(a.raw) for a in arrays), wsum)


def _root(total: Future, fx: Future, merkle_prev: str, ts: str, gen: str, build: str) -> str:
    sha_all = total.result()
    return Root(sha_all, merkle_prev, merkle_link(merkle_prev, sha_all, ts, gen, build),
                fx.result()).line()


def _sign_line(sign_key, signed: bytes) -> bytes:
    signature = pybase64.b64encode(sign_key.sign(signed)).decode("ascii")
    return f"sign ed25519={signature} keyid={keyid(sign_key)}\n".encode("ascii")


def _wsum_line(sha_all: str, merkle_prev: str, merkle_this: str, sign_key) -> bytes:
    body = f"WSUM 1 sha256_all={sha_all} merkle_prev={merkle_prev} merkle_this={merkle_this}"
    signature = ""
    if sign_key is not None:
        signature = pybase64.b64encode(sign_key.sign(body.encode("ascii"))).decode("ascii")
    return f"{body} sign={signature}\n".encode("ascii")


def _seekable(out: BinaryIO) -> bool:
    try:
        return bool(out.seekable()) and out.tell() >= 0
    except (AttributeError, OSError, ValueError):
        return False
