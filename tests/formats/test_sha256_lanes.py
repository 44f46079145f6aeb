"""The interleaved SHA-256 kernel (formats/_sha256.c) and its wrapper (formats.sha256lanes),
checked against hashlib and hmac, and the WTXT writer and reader with and without it."""

from __future__ import annotations

import hashlib
import hmac
import random

import numpy as np
import pytest

from snapops.formats import _sha256, sha256lanes, wtxt
from snapops.formats.errors import FormatError
from snapops.formats.sha256lanes import Running, feed, hmac_from_inner, hmac_inner_prefix
from snapops.formats.wtxt import _arrayhash, _chunks, _emit
from tests.formats.helper_threads import wait_helpers_idle
from tests.reference import wtxt_ref

TS = "2026-01-01T00:00:00Z"
KINDS = [pytest.param(True, marks=pytest.mark.skipif(not sha256lanes.KERNEL,
                                                     reason="this CPU has no SHA extensions")),
         False]


def chunk_digests(data: bytes, chunk_len: int) -> bytes:
    if chunk_len == 0:
        return b""
    return b"".join(hashlib.sha256(data[at:at + chunk_len]).digest()
                    for at in range(0, max(len(data), 1), chunk_len))


@pytest.mark.parametrize("kernel", KINDS)
def test_chunks_and_running_messages_match_hashlib_for_any_lengths_and_cuts(kernel):
    rng = random.Random(7)
    for _ in range(600):
        n = rng.choice([0, 1, 55, 56, 63, 64, 65, 127, 128, 129, rng.randrange(5000)])
        chunk_len = rng.choice([0, 1, 63, 64, 65, 119, 128, rng.randrange(1, 3000)])
        data = rng.randbytes(n)
        prefixes = [rng.randbytes(rng.randrange(150)) for _ in range(rng.randrange(4))]
        running = [Running(p, kernel=kernel) for p in prefixes]
        # fed in pieces cut at chunk boundaries, as the writer feeds runs of chunks
        step = chunk_len * rng.randrange(1, 4) if chunk_len else rng.randrange(1, 200)
        cuts = list(range(0, n, step))[1:] + [n]
        at = 0
        for end in cuts:
            assert feed(data[at:end], chunk_len, running) == chunk_digests(data[at:end],
                                                                           chunk_len)
            at = end
        assert [r.digest() for r in running] == [hashlib.sha256(p + data).digest()
                                                 for p in prefixes]


@pytest.mark.parametrize("kernel", KINDS)
def test_a_digest_leaves_the_message_running(kernel):
    running = Running(b"a" * 70, kernel=kernel)
    running.update(b"b" * 10)
    assert running.hexdigest() == hashlib.sha256(b"a" * 70 + b"b" * 10).hexdigest()
    running.update(b"c" * 200)
    assert running.digest() == hashlib.sha256(b"a" * 70 + b"b" * 10 + b"c" * 200).digest()


@pytest.mark.parametrize("kernel", KINDS)
@pytest.mark.parametrize("key", [b"", b"k", bytes(range(64)), bytes(range(65)) * 3])
def test_hmac_from_its_inner_message_matches_hmac(key, kernel):
    salt, message = b"saltsalt", bytes(range(256)) * 9
    inner = Running(hmac_inner_prefix(key, salt), kernel=kernel)
    feed(message, 0, [inner])
    assert hmac_from_inner(key, inner.digest()) == hmac.new(key, salt + message,
                                                            "sha256").digest()


def test_wrong_uses_are_refused():
    with pytest.raises(ValueError, match="chunk_len=-1"):
        feed(b"x", -1, [])
    with pytest.raises(ValueError, match="at most 3"):
        feed(b"x", 1, [Running(kernel=False) for _ in range(4)])
    if not sha256lanes.KERNEL:
        return
    with pytest.raises(ValueError, match="both kinds"):
        feed(b"x", 1, [Running(kernel=True), Running(kernel=False)])
    one = Running(kernel=True)
    with pytest.raises(ValueError, match="the same context twice"):
        feed(b"x", 1, [one, one])
    with pytest.raises(ValueError, match="not a sha256_context"):
        _sha256.sha256_feed(b"x", 1, [bytearray(112)], bytearray(32))
    with pytest.raises(ValueError, match="expected 32 bytes"):
        _sha256.sha256_feed(b"x", 1, [], bytearray(64))
    with pytest.raises(ValueError, match="not a sha256_context"):
        _sha256.sha256_finish(b"not a context")
    with pytest.raises(BufferError, match="not writable"):
        _sha256.sha256_feed(b"x", 1, [bytes(one.state)], bytearray(32))


def state(n: int = 9, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"a{i}": rng.standard_normal(int(rng.integers(0, 40000)), dtype=np.float32)
            for i in range(n)}


@pytest.mark.parametrize("kernel", KINDS)
def test_wtxt_written_and_verified_the_same_with_and_without_the_kernel(
        tmp_path, keydir, monkeypatch, kernel):
    monkeypatch.setattr(sha256lanes, "KERNEL", kernel)
    monkeypatch.setattr(_emit, "BATCH_BYTES", 8192)     # many runs per array
    arrays = state()
    ours = wtxt.save(arrays, tmp_path / "x.wtxt", gen=4, ts=TS, hmac_key=keydir / "hmac.key",
                     sign_key=keydir / "signing.key")
    data = (tmp_path / "x.wtxt").read_bytes()
    assert ours.sha256 == hashlib.sha256(data).hexdigest()
    assert data == wtxt_ref.write_wtxt(
        arrays, gen=4, ts=TS, hmac_key=bytes.fromhex((keydir / "hmac.key").read_text().strip()),
        sign_key_pem=(keydir / "signing.key").read_bytes())
    report = wtxt.verify(tmp_path / "x.wtxt", hmac_key=keydir / "hmac.key",
                         trusted_keys=[keydir / "signing.pub"], require_hmac=True,
                         require_signature=True)
    assert report.ok, report.failure
    loaded = wtxt.load(tmp_path / "x.wtxt", hmac_key=keydir / "hmac.key")
    assert all(np.array_equal(loaded[k].view(np.uint32), v.view(np.uint32))
               for k, v in arrays.items())


def test_a_hash_pass_that_fails_fails_the_save_and_leaves_nothing(tmp_path, monkeypatch):
    calls = []
    real = _arrayhash.feed

    def failing(*args):
        calls.append(1)
        if len(calls) == 5:
            raise MemoryError("hash pass failed")
        return real(*args)

    monkeypatch.setattr(_arrayhash, "feed", failing)
    monkeypatch.setattr(_emit, "BATCH_BYTES", 8192)
    with pytest.raises(MemoryError, match="hash pass failed"):
        wtxt.save(state(), tmp_path / "x.wtxt", gen=1, ts=TS)
    assert list(tmp_path.iterdir()) == []
    wait_helpers_idle(but_for="wtxt-write")


@pytest.mark.parametrize("kernel", KINDS)
def test_a_changed_byte_still_fails_the_array_digest_and_hmac(tmp_path, keydir, monkeypatch,
                                                               kernel):
    monkeypatch.setattr(sha256lanes, "KERNEL", kernel)
    wtxt.save(state(3), tmp_path / "x.wtxt", gen=4, ts=TS, hmac_key=keydir / "hmac.key")
    text = bytearray((tmp_path / "x.wtxt").read_bytes())
    at = text.index(b" hmac=", text.index(b"arr name=a1")) + len(" hmac=")
    text[at] = ord("0") if text[at] != ord("0") else ord("1")      # the HMAC field of a1
    (tmp_path / "y.wtxt").write_bytes(bytes(text))
    report = wtxt.verify(tmp_path / "y.wtxt", hmac_key=keydir / "hmac.key")
    assert not report.ok and "hmac" in str(report.failure)


def flip_chunk_sha(data: bytes, ix: int, array_at: int = 0) -> tuple[bytes, int]:
    """``data`` with one hex digit of chunk ``ix``'s sha256 field (of the array whose arr line
    is at or after ``array_at``) changed, and that ch line's number."""
    at = data.index(b"ch ix=%06d " % ix, array_at)
    digit = data.index(b" sha256=", at) + len(" sha256=")
    new = b"0" if data[digit:digit + 1] != b"0" else b"1"
    return data[:digit] + new + data[digit + 1:], data.count(b"\n", 0, at) + 1


@pytest.mark.parametrize("kernel", KINDS)
def test_a_wrong_chunk_digest_is_named_at_its_ch_line(tmp_path, monkeypatch, kernel):
    monkeypatch.setattr(sha256lanes, "KERNEL", kernel)
    monkeypatch.setattr(_chunks, "BATCH_BYTES", 65536)      # runs of two 32 KiB chunks
    arrays = {"a": np.arange(300_000, dtype=np.float32), "b": np.ones(70_000, np.float32)}
    wtxt.save(arrays, tmp_path / "x.wtxt", gen=1, ts=TS)
    data = (tmp_path / "x.wtxt").read_bytes()
    for ix in (0, 5, 36):                   # first, inside a run, the short last chunk
        forged, line = flip_chunk_sha(data, ix)
        (tmp_path / "y.wtxt").write_bytes(forged)
        with pytest.raises(FormatError, match=r"chunk_sha256") as raised:
            wtxt.load(tmp_path / "y.wtxt")
        assert (raised.value.check, raised.value.line, raised.value.chunk) == \
            ("chunk_sha256", line, ix)
        report = wtxt.verify(tmp_path / "y.wtxt")
        assert (report.failure.check, report.failure.line) == ("chunk_sha256", line)


def test_a_wrong_chunk_digest_comes_before_a_fault_later_in_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(_chunks, "BATCH_BYTES", 65536)
    arrays = {"a": np.arange(300_000, dtype=np.float32), "b": np.ones(70_000, np.float32)}
    wtxt.save(arrays, tmp_path / "x.wtxt", gen=1, ts=TS)
    forged, line = flip_chunk_sha((tmp_path / "x.wtxt").read_bytes(), 3)
    later = forged.index(b"endarr\n", forged.index(b"arr name=b"))
    forged = forged[:later] + b"endarX\n" + forged[later + 7:]     # a grammar fault after it
    (tmp_path / "y.wtxt").write_bytes(forged)
    report = wtxt.verify(tmp_path / "y.wtxt")
    assert (report.failure.check, report.failure.line) == ("chunk_sha256", line)
    same_array = forged.index(b"endarr\n")                           # in the same array
    forged = forged[:same_array] + b"endarX\n" + forged[same_array + 7:]
    (tmp_path / "z.wtxt").write_bytes(forged)
    report = wtxt.verify(tmp_path / "z.wtxt")
    assert (report.failure.check, report.failure.line) == ("chunk_sha256", line)
