"""The WTXT writer's scheduling: the root chain fed as digests come in, the file's SHA-256 read
back behind the writers, and what a failure midway leaves behind (formats.wtxt._emit,
formats.wtxt._rootchain, formats.atomic.TrailingDigest)."""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pytest

from snapops.formats import wtxt
from snapops.formats.atomic import TrailingDigest
from snapops.formats.integrity import FastXor
from snapops.formats.model import Snapshot
from snapops.formats.wtxt import _emit
from snapops.formats.wtxt._grammar import ZERO64, ArrLine
from snapops.formats.wtxt._prepare import WriteOptions, prepare_arrays
from snapops.formats.wtxt._rootchain import RootChain
from tests.formats.helper_threads import wait_helpers_idle
from tests.reference import wtxt_ref

TS = "2026-01-01T00:00:00Z"


def state(n: int = 7, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"a{i}": rng.standard_normal(int(rng.integers(0, 5000)), dtype=np.float32)
            for i in range(n)}


def done(value) -> Future:
    future = Future()
    future.set_result(value)
    return future


def expected_root(arrays, digests, salts):
    """``sha256_all`` and ``fastxor`` by their definition (docs/formats/wtxt.md, section 7)."""
    total, fx, lines = hashlib.sha256(), FastXor(), []
    for array, (sha, mac), salt in zip(arrays, digests, salts):
        line = ArrLine(array.name, array.dtype, array.shape, len(array.raw), sha, mac,
                       salt.hex()).line()
        lines.append(line)
        total.update(line.encode() + bytes(array.raw))
        fx.update(array.raw)
    return lines, total.hexdigest(), fx.hexdigest()


def prepared(arrays: dict):
    return prepare_arrays(Snapshot(arrays), WriteOptions(gen=1, ts=TS))


@pytest.mark.parametrize("seed", range(5))
def test_root_chain_gives_the_definition_whatever_order_digests_arrive_in(seed):
    arrays = prepared(state(9, seed))
    salts = [bytes([i]) * 8 for i in range(len(arrays))]
    digests = [(hashlib.sha256(a.raw).hexdigest(), hmac.new(b"k", a.raw, "sha256").hexdigest())
               for a in arrays]
    futures = [(Future(), Future()) for _ in arrays]
    chain = RootChain(arrays, salts)
    for i, pair in enumerate(futures):
        chain.add(i, pair)
    order = np.random.default_rng(seed).permutation(2 * len(arrays))
    with ThreadPoolExecutor(3) as pool:     # completions race on three threads
        for k in order:
            pool.submit(futures[k // 2][k % 2].set_result, digests[k // 2][k % 2])
    assert chain.done.result(timeout=10) == expected_root(arrays, digests, salts)


def test_root_chain_fed_by_arrays_added_after_their_digests_are_in():
    arrays = prepared(state(4))
    salts = [bytes(8)] * len(arrays)
    digests = [(hashlib.sha256(a.raw).hexdigest(), ZERO64) for a in arrays]
    chain = RootChain(arrays, salts)
    for i, (sha, _) in enumerate(digests):
        assert not chain.done.done()
        chain.add(i, (done(sha), None))              # no HMAC: an unkeyed file
    assert chain.done.result(timeout=0) == expected_root(arrays, digests, salts)


def test_root_chain_of_no_arrays_is_the_empty_hash():
    assert RootChain([], []).done.result(timeout=0)[1] == hashlib.sha256().hexdigest()


def test_a_failed_digest_fails_the_root_instead_of_hanging():
    arrays = prepared(state(3))
    chain = RootChain(arrays, [bytes(8)] * 3)
    failing = Future()
    chain.add(0, (done(hashlib.sha256(arrays[0].raw).hexdigest()), None))
    chain.add(1, (failing, None))
    failing.set_exception(OSError("read error in array 1"))
    with pytest.raises(OSError, match="read error in array 1"):
        chain.done.result(timeout=5)


def test_trailing_digest_follows_the_frontier_and_waits_for_the_header(tmp_path):
    data = np.random.default_rng(3).integers(0, 256, 3 << 20, np.uint8).tobytes()
    fd = os.open(tmp_path / "f.bin", os.O_RDWR | os.O_CREAT)
    try:
        os.ftruncate(fd, len(data))
        digest = TrailingDigest(fd, len(data))
        digest.STEP = 64 << 10
        third = len(data) // 3
        os.pwrite(fd, data[third:2 * third], third)      # out of order, header last
        digest.advance(2 * third)
        time.sleep(0.05)
        assert not digest.future.done()                  # no start yet: the header may change
        os.pwrite(fd, data[2 * third:], 2 * third)
        os.pwrite(fd, data[:third], 0)
        digest.start()
        digest.advance(len(data))
        assert digest.future.result(timeout=10) == hashlib.sha256(data).hexdigest()
    finally:
        os.close(fd)


def test_an_abandoned_trailing_digest_frees_its_helper(tmp_path):
    fd = os.open(tmp_path / "f.bin", os.O_RDWR | os.O_CREAT)
    try:
        os.ftruncate(fd, 1 << 20)
        digest = TrailingDigest(fd, 1 << 20)
        digest.start()
        digest.advance(4096)
        digest.abort()
        with pytest.raises(RuntimeError, match="abandoned"):
            digest.future.result(timeout=10)
    finally:
        os.close(fd)
    wait_helpers_idle(but_for="wtxt-write")


@pytest.mark.parametrize("threads", [1, 2, 5])
@pytest.mark.parametrize("in_flight", [1, 8])
def test_same_bytes_and_digest_for_every_pool_size_and_window(tmp_path, keydir, monkeypatch,
                                                              threads, in_flight):
    monkeypatch.setattr(_emit, "MAX_IN_FLIGHT", in_flight)
    monkeypatch.setattr(_emit, "BATCH_BYTES", 4096)      # many chunk tasks per array
    arrays = state(12)
    ours = wtxt.save(arrays, tmp_path / "x.wtxt", gen=3, ts=TS, row_blocking=True,
                     threads=threads, hmac_key=keydir / "hmac.key",
                     sign_key=keydir / "signing.key")
    data = (tmp_path / "x.wtxt").read_bytes()
    assert ours.sha256 == hashlib.sha256(data).hexdigest() and ours.size == len(data)
    reference = wtxt_ref.write_wtxt(
        arrays, gen=3, ts=TS, row_blocking=True, build="unknown",
        hmac_key=bytes.fromhex((keydir / "hmac.key").read_text().strip()),
        sign_key_pem=(keydir / "signing.key").read_bytes())
    assert data == reference


def test_a_failure_midway_leaves_nothing_and_no_thread(tmp_path, monkeypatch):
    calls = []
    real = _emit.FileSink.write_at

    def failing(sink, offset, data):
        calls.append(1)
        if len(calls) == 40:                 # a chunk's text, after the endarr lines
            raise OSError(28, "No space left on device")
        return real(sink, offset, data)

    monkeypatch.setattr(_emit.FileSink, "write_at", failing)
    monkeypatch.setattr(_emit, "BATCH_BYTES", 4096)
    with pytest.raises(OSError, match="No space left"):
        wtxt.save(state(12), tmp_path / "x.wtxt", gen=1, ts=TS, row_blocking=True)
    assert list(tmp_path.iterdir()) == []
    wait_helpers_idle(but_for="wtxt-write")


def test_without_fallocate_the_file_is_extended_and_still_exact(tmp_path, keydir, monkeypatch):
    monkeypatch.setattr(_emit, "_FALLOCATE", None)       # a file system without fallocate(2)
    arrays = state(5)
    ours = wtxt.save(arrays, tmp_path / "x.wtxt", gen=2, ts=TS,
                     hmac_key=keydir / "hmac.key", sign_key=keydir / "signing.key")
    data = (tmp_path / "x.wtxt").read_bytes()
    assert ours.sha256 == hashlib.sha256(data).hexdigest()
    assert data == wtxt_ref.write_wtxt(
        arrays, gen=2, ts=TS, hmac_key=bytes.fromhex((keydir / "hmac.key").read_text().strip()),
        sign_key_pem=(keydir / "signing.key").read_bytes())
