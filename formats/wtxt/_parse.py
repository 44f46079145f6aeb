"""Streaming WTXT parser: header, arrays and trailer, with every check of docs/formats/wtxt.md.

One code path serves ``verify`` (discard the bytes), ``load`` (keep them) and lazy access.
"""

from __future__ import annotations

import collections
import hmac as _hmac
import os
import threading
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import BinaryIO, Callable

import pybase64

from ..errors import ChecksumError, FormatError, SignatureError, UnsupportedVersionError
from .._alloc import tune_allocator
from ..integrity import FastXor, merkle_link
from .. import sha256lanes
from ..sha256lanes import Running, feed, hmac_from_inner, hmac_inner_prefix
from ..workers import HelperPool
from ._chunks import ChunkReader
from ._grammar import (
    MAGIC, MAX_LINE, ROOT_PENDING, SIGN_RE, ZERO16, ArrLine, Meta, Root, AUDIT_RE,
    grammar_error, parse_arr, parse_cap, parse_idx, parse_meta, parse_root, row_size, check_caps,
)
from ._plan import ChunkPlan, plan_for
from .logical import carries_records, check_audit_binding, unbound_records
from ._reader import LineReader, line_reader


@dataclass
class Header:
    meta: Meta
    caps: list[str]
    root: Root | None              # None for a streaming (root_pending) file
    signature: bytes | None = None  # raw 64-byte Ed25519 signature
    keyid: str | None = None
    signed: bytes = b""            # the bytes the sign line covers
    lines: int = 4                 # number of header lines (incl. sign)

    @property
    def pending(self) -> bool:
        return self.root is None


@dataclass
class ArrayInfo:
    line: ArrLine
    line_no: int
    plan: ChunkPlan
    idx: tuple[int, int] | None
    text_offset: int = 0           # byte offset of the arr line
    body_offset: int = 0           # byte offset of the first ch line (set by lazy scans)
    body_line: int = 0


@dataclass
class Checks:
    """What the caller wants checked, and what it has to check with."""

    hmac_key: bytes | None = None
    trusted: dict = field(default_factory=dict)      # keyid -> Ed25519PublicKey
    wsum_explicit: str | None = None                 # a WSUM the caller named (--wsum)
    wsum_default: str | None = None                  # PATH.wsum, used if it exists
    wsum_root: Root | None = None                    # set once a WSUM is read
    wsum_line: int = 1
    wsum_path: str | None = None
    # False: the file's own digest was verified against a sealed MANIFEST, so the SHA-256s
    # inside it (chunk, array, root) and the HMACs are not computed again; the grammar,
    # base64 and CRC32C checks still run (a changed character fails its chunk's CRC32C, and
    # the line-by-line reread then names the line); a tool's decode, not a verification
    digests: bool = True


def read_header(reader: LineReader) -> Header:
    no, magic = reader.readline()
    if magic != MAGIC:
        if magic.rstrip(b"\r") == MAGIC:
            raise grammar_error(no, "LF line endings only (no CR)", magic)
        if magic.startswith(b"WTXT "):
            raise UnsupportedVersionError(line=no, expected="WTXT 1", got=magic[:20])
        raise grammar_error(no, "WTXT 1", magic)
    raw = [magic]
    no, line = reader.readline()
    meta = parse_meta(line, no)
    raw.append(line)
    no, line = reader.readline()
    caps = parse_cap(line, no)
    raw.append(line)
    no, line = reader.readline()
    root = None if line == ROOT_PENDING else parse_root(line, no) if line.startswith(b"root ") else None
    if root is None and line != ROOT_PENDING:
        raise grammar_error(no, "root sha256_all= ... or root_pending", line)
    raw.append(line)
    header = Header(meta, caps, root, signed=b"\n".join(raw) + b"\n")
    return header


def read_sign(reader: LineReader, header: Header) -> tuple[int, bytes]:
    """Consume an optional sign line; return the next line."""
    no, line = reader.readline()
    if not line.startswith(b"sign "):
        return no, line
    m = SIGN_RE.fullmatch(line)
    sig = _canonical_b64(m.group(1)) if m else None
    if sig is None or len(sig) != 64:
        raise SignatureError(line=no, expected="sign ed25519=<base64 of 64 bytes> keyid=<hex16>",
                             got=line.decode("ascii", "replace"))
    header.signature, header.keyid, header.lines = sig, m.group(2).decode(), 5
    return reader.readline()


def _canonical_b64(text: bytes) -> bytes | None:
    try:
        raw = pybase64.b64decode(text, validate=True)
    except ValueError:
        return None
    return raw if pybase64.b64encode(raw) == text else None


def check_signature(header: Header, checks: Checks, require: bool, notes: list[str]) -> None:
    sign_line = 5 if header.signature is not None else 4
    if header.signature is None:
        if checks.trusted or require:
            raise SignatureError(line=sign_line, expected="a sign line (signature required)",
                                 got="no sign line")
        notes.append("unsigned: no sign line")
        return
    if not checks.trusted:
        if require:
            raise SignatureError(line=sign_line, expected="a trusted public key to check keyid "
                                 f"{header.keyid}", got="no trusted keys given")
        notes.append(f"signature by keyid {header.keyid} not checked (no trusted key given)")
        return
    key = checks.trusted.get(header.keyid)
    if key is None:
        raise SignatureError(line=sign_line, expected="keyid of a trusted key: "
                             + ",".join(sorted(checks.trusted)), got=header.keyid)
    from cryptography.exceptions import InvalidSignature

    try:
        key.verify(header.signature, header.signed)
    except InvalidSignature:
        raise SignatureError(line=sign_line, expected=f"a valid Ed25519 signature by {header.keyid}",
                             got="signature does not verify") from None


def read_array_head(reader: LineReader, no: int, line: bytes, prev_name: str | None) -> ArrayInfo:
    offset = reader.offset - len(line) - 1
    arr = parse_arr(line, no)
    if prev_name is not None and arr.name.encode() <= prev_name.encode():
        raise grammar_error(no, f"arrays in strictly increasing name order (after {prev_name})",
                            line[:60], array=arr.name)
    idx = None
    peek_no, peek = reader.readline()
    if peek.startswith(b"idx "):
        idx = parse_idx(peek, peek_no)
        if not arr.shape:
            raise grammar_error(peek_no, "no idx line for a 0-d array", peek, array=arr.name)
        if idx[1] != row_size(arr) or idx[0] < 1:
            raise grammar_error(peek_no, f"rows_per_chunk >= 1 and row_size={row_size(arr)}",
                                peek, array=arr.name)
    else:
        reader.pushback([peek + b"\n"], 1)
    plan = plan_for(arr, idx[0] if idx else None, idx[1] if idx else None)
    return ArrayInfo(arr, no, plan, idx, offset)


def verify_array_mac(info: ArrayInfo, checks: Checks, gen: str, mac_value: str | None,
                     notes: list[str]) -> None:
    arr = info.line
    if checks.hmac_key is not None:
        salt = _hmac.new(checks.hmac_key, b"wtxt-salt" + gen.encode() + arr.name.encode(),
                         "sha256").digest()[:8].hex()
        if arr.unauthenticated:
            raise ChecksumError(line=info.line_no, array=arr.name, check="hmac",
                                expected="an HMAC (a key was given)", got="hmac=0 (unauthenticated)")
        if arr.salt != salt:
            raise ChecksumError(line=info.line_no, array=arr.name, check="hmac",
                                expected=f"salt={salt} (derived from the key)", got=arr.salt)
        if mac_value != arr.hmac:
            raise ChecksumError(line=info.line_no, array=arr.name, check="hmac",
                                expected=f"hmac={arr.hmac}", got=mac_value)
        return
    if arr.unauthenticated and arr.salt != ZERO16:
        raise ChecksumError(line=info.line_no, array=arr.name, check="hmac",
                            expected="salt=0000000000000000 with hmac=0", got=arr.salt)
    if arr.unauthenticated:
        notes.append(f"array {arr.name}: unauthenticated (hmac=0)")
    else:
        notes.append(f"array {arr.name}: hmac not checked (no key given)")


@dataclass
class ParseResult:
    header: Header
    arrays: list[ArrayInfo]
    audit: str | None
    sha256_all: str
    fastxor: str
    notes: list[str]
    root: Root | None = None
    audit_unbound: str | None = None    # why the audit line's records are not authenticated

    @property
    def records_bound(self) -> bool:
        """The audit line carries records and a verified signature binds them."""
        return carries_records(self.audit) and self.audit_unbound is None


class Lane:
    """Runs its calls one after another, in submission order, on a shared executor: a running
    hash gets its updates in order without a thread of its own (two workers, not five
    threads, share the two cores). Calls queued while one runs are drained by the same task."""

    def __init__(self, pool: Executor) -> None:
        self._pool = pool
        self._queue: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._busy = False

    def submit(self, fn, *args) -> Future:
        fut: Future = Future()
        with self._lock:
            self._queue.append((fn, args, fut))
            if self._busy:
                return fut
            self._busy = True
        self._pool.submit(self._drain)
        return fut

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._busy = False
                    return
                fn, args, fut = self._queue.popleft()
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(*args))
                except BaseException as exc:  # handed to whoever waits on the future
                    fut.set_exception(exc)

    def cancel(self) -> None:
        with self._lock:
            while self._queue:
                self._queue.popleft()[2].cancel()


class Lanes:
    """The running hashes of a parse: the array SHA-256 (``ARRAY``), the root hash
    (``ROOT``: ``sha256_all`` with ``fastxor``) and the array HMAC's inner message (``MAC``).
    Where the SHA-256 kernel runs (:mod:`..sha256lanes`) they are fed together in one Lane,
    their rounds interleaved (three messages at 1.68x the speed of one); with hashlib (a CPU
    without the SHA extensions) each has a Lane of its own, so that the three passes share
    both cores. At most ``BACKLOG`` updates wait at once (they hold decoded bytes)."""

    BACKLOG = 24
    ARRAY, ROOT, MAC = 0, 1, 2

    def __init__(self, pool: Executor) -> None:
        self.together = sha256lanes.KERNEL
        self._lanes = [Lane(pool) for _ in range(1 if self.together else 3)]
        self._backlog: collections.deque = collections.deque()

    def submit(self, role: int, fn, *args) -> Future:
        """``fn(*args)`` in order after the updates of the Lane that feeds ``role``."""
        fut = self._lanes[0 if self.together else role].submit(fn, *args)
        self._backlog.append(fut)
        while len(self._backlog) > self.BACKLOG:
            self._backlog.popleft().result()
        return fut

    def feed(self, running: list[Running], fx: FastXor, raw) -> None:
        """``raw`` into the running hashes, in the order ``ARRAY, ROOT[, MAC]``, and
        ``fastxor``."""
        if self.together:
            self.submit(self.ARRAY, _update_all, running, fx, raw)
            return
        for role, one in enumerate(running):
            self.submit(role, _update_all, [one], fx if role == self.ROOT else None, raw)

    def drain(self) -> None:
        """Wait for every update submitted so far."""
        for role in range(len(self._lanes)):
            self.submit(role, lambda: None).result()

    def cancel(self) -> None:
        for lane in self._lanes:
            lane.cancel()


class DeferredChecks:
    """Array checks that wait for the lanes, run in file order; the first failure clears the
    rest (they are later in the file)."""

    def __init__(self) -> None:
        self._checks: collections.deque = collections.deque()

    def add(self, check: Callable[[], None]) -> None:
        self._checks.append(check)

    def run(self, keep: int = 0) -> None:
        while len(self._checks) > keep:
            check = self._checks.popleft()
            try:
                check()
            except BaseException:
                self._checks.clear()
                raise


# Given an array's info, return a writable byte buffer of its size to decode into (or None).
ArraySink = Callable[[ArrayInfo], memoryview | None]


def parse_stream(stream: BinaryIO, checks: Checks, *, sink: ArraySink | None = None,
                 require_signature: bool = False, threads: int = 2) -> ParseResult:
    """Parse and check a whole WTXT stream; raise the first FormatError found."""
    tune_allocator()
    notes: list[str] = []
    reader = line_reader(stream, max_line=MAX_LINE)
    try:
        return _parse(reader, checks, sink, require_signature, threads, notes)
    finally:
        reader.close()


def _parse(reader, checks: Checks, sink, require_signature: bool, threads: int,
           notes: list[str]) -> ParseResult:
    header = read_header(reader)
    no, line = read_sign(reader, header)
    check_signature(header, checks, require_signature, notes)
    attach_wsum(header, checks, require_signature, notes)
    gen = header.meta.gen
    total, fx = Running(), FastXor()
    arrays: list[ArrayInfo] = []
    pool = HelperPool(max(1, threads))
    lanes = Lanes(pool)
    deferred = DeferredChecks()
    read_body = _read_array_body if checks.digests else _decode_array_body
    try:
        while line.startswith(b"arr "):
            info = read_array_head(reader, no, line, arrays[-1].line.name if arrays else None)
            deferred.add(read_body(reader, info, checks, gen, sink, pool, lanes, total, fx,
                                   notes))
            arrays.append(info)
            deferred.run(keep=2)      # checked a little later: no stall per array
            no, line = reader.readline()
        deferred.run()
        lanes.drain()
    except FormatError:
        deferred.run()                # a failure earlier in the file is the one to report
        raise
    finally:
        lanes.cancel()
        pool.shutdown(wait=True, cancel_futures=True)
    audit = None
    if line.startswith(b"audit"):
        if not AUDIT_RE.fullmatch(line):
            raise grammar_error(no, 'audit key=value ... (values "quoted" or without spaces)', line)
        audit = line[6:].decode("ascii")
        no, line = reader.readline()
    if line != b"endwtxt":
        raise grammar_error(no, "arr, audit or endwtxt", line)
    if not reader.at_eof():
        raise grammar_error(reader.line_no, "end of file after endwtxt", reader.read_exact(40))
    result = ParseResult(header, arrays, audit, total.hexdigest(), fx.hexdigest(), notes)
    check_caps(header.caps, any(not a.line.unauthenticated for a in arrays) if arrays else None,
               any(a.idx is not None for a in arrays), 3)
    result.audit_unbound = check_audit_binding(
        header.caps, audit, line=no - 1 if audit is not None else None,
        signature_verified=header.signature is not None and bool(checks.trusted))
    if result.audit_unbound is not None:
        if require_signature:
            raise unbound_records(result.audit_unbound, "signature")
        notes.append("array names and dtypes from the audit line are not authenticated: "
                     + result.audit_unbound)
    if checks.digests:
        check_root(result, checks)
    else:
        result.root = header.root if not header.pending else checks.wsum_root
        notes.append("digests not computed (the file's own digest was verified)")
    return result


def _read_array_body(reader, info: ArrayInfo, checks: Checks, gen: str, sink, pool,
                     lanes: Lanes, total, fx, notes) -> Callable[[], None]:
    """Decode one array's chunks and feed the running hashes; returns the check of the
    array's SHA-256 and HMAC (to call once the lanes got there)."""
    arr = info.line
    running = [Running(), total]
    key = checks.hmac_key if not arr.unauthenticated else None
    if key is not None:
        running.append(Running(hmac_inner_prefix(key, bytes.fromhex(arr.salt))))
    lanes.submit(lanes.ROOT, total.update, arr.line().encode("ascii"))
    dest = sink(info) if sink else None
    for raw in ChunkReader(reader, arr.name, info.plan, pool, dest):
        lanes.feed(running, fx, raw)
    no, end = reader.readline()
    if end != b"endarr":
        raise grammar_error(no, "endarr", end, array=arr.name)
    digest = lanes.submit(lanes.ARRAY, running[0].hexdigest)
    mac_value = lanes.submit(lanes.MAC, lambda: hmac_from_inner(key, running[2].digest()).hex()) \
        if key is not None else None

    def check() -> None:
        if digest.result() != arr.sha256:
            raise ChecksumError(line=info.line_no, array=arr.name, check="array_sha256",
                                expected=f"sha256={arr.sha256}", got=digest.result())
        verify_array_mac(info, checks, gen, mac_value.result() if mac_value else None, notes)
    return check


def _decode_array_body(reader, info: ArrayInfo, checks: Checks, gen: str, sink, pool,
                       lanes: Lanes, total, fx, notes) -> Callable[[], None]:
    """``_read_array_body`` without the digests (``Checks.digests`` False), decoded on this
    thread: without the hashing, a batch is decoded faster than worker threads hand the GIL
    back and forth (measured: 0.31 s against 0.46 s for 256 MiB, a third of the CPU)."""
    dest = sink(info) if sink else None
    for _ in ChunkReader(reader, info.line.name, info.plan, None, dest, hashed=False):
        pass
    no, end = reader.readline()
    if end != b"endarr":
        raise grammar_error(no, "endarr", end, array=info.line.name)
    return lambda: None


def _update_all(running: list[Running], fx: FastXor | None, raw) -> None:
    feed(raw, 0, running)
    if fx is not None:
        fx.update(raw)


def attach_wsum(header: Header, checks: Checks, require_signature: bool,
                notes: list[str]) -> None:
    """Read the WSUM that finalizes a root_pending file (the named one, else PATH.wsum)."""
    from .wsum import check_wsum_signature, read_wsum

    if not header.pending:
        if checks.wsum_explicit is not None:
            raise FormatError(line=4, check="wsum", expected="no WSUM for a file with a root line",
                              got=f"--wsum {checks.wsum_explicit}")
        return
    path = checks.wsum_explicit
    if path is None and checks.wsum_default is not None and os.path.exists(checks.wsum_default):
        path = checks.wsum_default
    if path is None:
        return  # check_root reports the missing WSUM
    wsum = read_wsum(path)
    check_wsum_signature(wsum, checks.trusted, require_signature, notes, path)
    checks.wsum_root, checks.wsum_path = wsum.root(), path


def check_root(result: ParseResult, checks: Checks) -> None:
    header, meta = result.header, result.header.meta
    if header.pending:
        if checks.wsum_root is None:
            raise FormatError(line=4, check="wsum", expected="the WSUM file that finalizes this "
                              "root_pending snapshot (PATH.wsum or --wsum FILE)", got="no WSUM")
        root, where = checks.wsum_root, dict(path=checks.wsum_path, line=checks.wsum_line)
    else:
        root, where = header.root, dict(line=4)
    result.root = root
    if root.sha256_all != result.sha256_all:
        raise ChecksumError(check="sha256_all", expected=f"sha256_all={root.sha256_all}",
                            got=result.sha256_all, **where)
    link = merkle_link(root.merkle_prev, root.sha256_all, meta.ts, meta.gen, meta.build)
    if link != root.merkle_this:
        raise ChecksumError(check="merkle", expected=f"merkle_this={link}", got=root.merkle_this,
                            **where)
    if not header.pending and root.fastxor != result.fastxor:
        raise ChecksumError(check="fastxor", expected=f"fastxor={root.fastxor}",
                            got=result.fastxor, **where)
