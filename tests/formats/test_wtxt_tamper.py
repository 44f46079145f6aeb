"""Changing any single byte of a sealed WTXT file makes verification fail, naming the right
check (and line, for line-local checks)."""

from __future__ import annotations

import random
import re

import pytest

from snapops.formats import wtxt
from tests.conftest import sample_state

B64 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
HEXD = b"0123456789abcdef"
DIGITS = b"0123456789"
STRUCTURAL = {"grammar", "limit", "truncated", "version"}

# (line regex, [(group, kind, checks when replaced within its class)])
LINE_FIELDS = [
    (rb"WTXT 1", []),
    (rb"meta schema=(\S+) gen=(\d+) ts=(\S+) build=(\S+) endian=LE host=(\S+) cuda=(\S+)",
     [(1, "token", {"signature"}), (2, "digit", {"signature"}), (3, "digit", {"signature", "grammar"}),
      (4, "token", {"signature"}), (5, "token", {"signature"}), (6, "token", {"signature"})]),
    (rb"cap ext=(\S+)", [(1, "lower", {"signature"})]),
    (rb"root sha256_all=(\w+) merkle_prev=(\w+) merkle_this=(\w+) fastxor=(\w+)",
     [(i, "hex", {"signature"}) for i in range(1, 5)]),
    (rb"sign ed25519=(\S+) keyid=(\w+)", [(1, "b64", {"signature"}), (2, "hex", {"signature"})]),
    (rb"arr name=(\w+) dtype=(\w+) shape=(\S*) order=C bytes=(\d+) sha256=(\w+) hmac=(\w+) salt=(\w+)",
     [(1, "lower", {"hmac", "grammar"}), (2, "lower", {"grammar", "sha256_all"}),
      (3, "digit", {"grammar"}), (4, "digit", {"grammar"}), (5, "hex", {"array_sha256"}),
      (6, "hex", {"hmac"}), (7, "hex", {"hmac"})]),
    (rb"ch ix=(\d+) off=(\d+) len=(\d+) sha256=(\w+) crc32c=(\w+) b64=on width=76 lines=(\d+)",
     [(1, "digit", {"grammar"}), (2, "digit", {"grammar"}), (3, "digit", {"grammar"}),
      (4, "hex", {"chunk_sha256"}), (5, "hex", {"crc32c"}), (6, "digit", {"grammar"})]),
    (rb"([A-Za-z0-9+/=]{1,76}) ([0-9a-f])", [(1, "body", None), (2, "hex", {"parity"})]),
    (rb"endch|endarr|endwtxt", []),
]
ALPHABETS = {"token": b"abcdefghijklmnopqrstuvwxyz0123456789", "lower": b"abcdefghijklmnopqrstuvwxyz",
             "digit": DIGITS, "hex": HEXD, "b64": B64}


@pytest.fixture(scope="module")
def sealed(tmp_path_factory, keydir):
    path = tmp_path_factory.mktemp("t") / "sealed.wtxt"
    wtxt.save(sample_state(), path, gen=12, ts="2026-01-02T03:04:05Z", row_blocking=True,
              hmac_key=keydir / "hmac.key", sign_key=keydir / "signing.key",
              audit='note="tamper"')
    return path.read_bytes()


def classify(data: bytes, pos: int):
    """(line number, field kind, checks for an in-class change, old byte) of position ``pos``."""
    start = data.rfind(b"\n", 0, pos) + 1
    end = data.find(b"\n", pos)
    if pos == end:
        return data.count(b"\n", 0, pos) + 1, "lf", set(), None
    line = data[start:end]
    col = pos - start
    for pattern, fields in LINE_FIELDS:
        m = re.fullmatch(pattern, line)
        if not m:
            continue
        for group, kind, checks in fields:
            if m.start(group) <= col < m.end(group):
                return data.count(b"\n", 0, pos) + 1, kind, checks, line[col]
        return data.count(b"\n", 0, pos) + 1, "keyword", set(), line[col]
    return data.count(b"\n", 0, pos) + 1, "other", None, line[col]


def verify_bytes(tmp_path, data: bytes, keydir):
    path = tmp_path / "x.wtxt"
    path.write_bytes(data)
    return wtxt.verify(path, hmac_key=keydir / "hmac.key", trusted_keys=[keydir / "signing.pub"],
                       require_signature=True, require_hmac=True)


def positions(data: bytes, count: int, seed: int):
    audit = data.index(b"\naudit ") + 1
    audit_end = data.index(b"\n", audit)
    rng = random.Random(seed)
    picked = []
    while len(picked) < count:
        pos = rng.randrange(len(data))
        line_start = data.rfind(b"\n", 0, pos) + 1
        if audit <= pos <= audit_end or data.startswith(b"idx ", line_start):
            continue  # nothing binds the audit line (spec); idx lines are tested below
        picked.append(pos)
    return picked


def test_sealed_file_verifies(tmp_path, sealed, keydir):
    assert verify_bytes(tmp_path, sealed, keydir).ok


@pytest.mark.parametrize("seed", range(4))
def test_in_class_changes_name_the_check(tmp_path, sealed, keydir, seed):
    rng = random.Random(1000 + seed)
    for pos in positions(sealed, 80, seed):
        line_no, kind, checks, old = classify(sealed, pos)
        if kind == "body":
            new = rng.choice([c for c in B64 if c != old]) if old != ord("=") else rng.choice(B64)
            checks = ({"parity"} if (old ^ new) & 0xF else {"crc32c", "base64"})
        elif kind in ALPHABETS:
            new = rng.choice([c for c in ALPHABETS[kind] if c != old])
        else:
            new = rng.choice([c for c in range(0x21, 0x7F) if c != old])
            checks = set()
        report = verify_bytes(tmp_path, sealed[:pos] + bytes([new]) + sealed[pos + 1:], keydir)
        assert not report.ok, (pos, kind)
        allowed = checks | (STRUCTURAL if kind in ("keyword", "lf", "other", "digit", "lower")
                            or "grammar" in checks else set())
        assert report.failure.check in allowed, (pos, kind, chr(old), chr(new), str(report.failure))
        if report.failure.check == "parity":
            assert report.failure.line == line_no


@pytest.mark.parametrize("seed", range(3))
def test_arbitrary_byte_changes_fail(tmp_path, sealed, keydir, seed):
    rng = random.Random(seed)
    for pos in positions(sealed, 70, 50 + seed):
        new = rng.choice([c for c in range(256) if c != sealed[pos]])
        report = verify_bytes(tmp_path, sealed[:pos] + bytes([new]) + sealed[pos + 1:], keydir)
        assert not report.ok, pos
        if new > 0x7E or new in (0x09, 0x0D):
            assert report.failure.check in STRUCTURAL | {"signature"}, str(report.failure)


def test_every_line_kind_is_covered(sealed):
    kinds = {classify(sealed, p)[1] for p in positions(sealed, 320, 0)}
    assert {"body", "hex", "digit", "keyword", "lf", "lower"} <= kinds


def test_every_header_byte_is_bound(tmp_path, sealed, keydir):
    """The header (magic, meta, cap, root, sign) is covered byte by byte."""
    rng = random.Random(7)
    header_end = sealed.index(b"\narr ")
    for pos in range(0, header_end + 1, 2):
        _, kind, checks, old = classify(sealed, pos)
        alphabet = ALPHABETS.get(kind, bytes(range(0x21, 0x7F)))
        new = rng.choice([c for c in alphabet if c != old])
        report = verify_bytes(tmp_path, sealed[:pos] + bytes([new]) + sealed[pos + 1:], keydir)
        assert not report.ok, pos
        assert report.failure.check in (checks or set()) | STRUCTURAL | {"signature"}, pos


def test_base64_change_names_line_array_and_chunk(tmp_path, sealed, keydir):
    at = sealed.index(b"arr name=ids")
    line_start = sealed.index(b"\n", sealed.index(b"\nch ", at) + 1) + 1
    old = sealed[line_start + 10]
    new = next(c for c in B64 if (c ^ old) & 0xF)
    report = verify_bytes(tmp_path, sealed[:line_start + 10] + bytes([new]) +
                          sealed[line_start + 11:], keydir)
    failure = report.failure
    assert failure.check == "parity" and failure.array == "ids" and failure.chunk == 0
    assert failure.line == sealed.count(b"\n", 0, line_start) + 1
    assert f":{failure.line}:" in str(failure) and "ids" in str(failure)


def test_idx_change_that_alters_layout_fails(tmp_path, sealed, keydir):
    data = sealed.replace(b"idx rows_per_chunk=256 row_size=96", b"idx rows_per_chunk=8 row_size=96", 1)
    report = verify_bytes(tmp_path, data, keydir)
    assert not report.ok and report.failure.check == "grammar"
    data = sealed.replace(b"row_size=96", b"row_size=95", 1)
    assert verify_bytes(tmp_path, data, keydir).failure.check == "grammar"


def test_endwtxt_and_trailing_bytes(tmp_path, sealed, keydir):
    assert verify_bytes(tmp_path, sealed[:-1], keydir).failure.check in {"truncated", "grammar"}
    assert verify_bytes(tmp_path, sealed + b"x", keydir).failure.check == "grammar"
    assert verify_bytes(tmp_path, sealed + b"\n", keydir).failure.check == "grammar"
