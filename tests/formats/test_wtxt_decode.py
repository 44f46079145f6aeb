"""``load(verify=False)`` of WTXT: the same arrays as a verifying load, without computing the
SHA-256s inside the file (a sealed MANIFEST vouches for the file's own digest, so restore
checks that instead); grammar, base64 and CRC32C are still checked (a changed character fails
its chunk's CRC32C, and the reread line by line names the line and its parity)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from snapops.formats import wtxt
from snapops.formats.errors import FormatError
from snapops.formats.keys import generate_keys
from tests.conftest import sample_state

TS = "2026-01-02T03:04:05Z"


def same(a, b) -> bool:
    return list(a.arrays) == list(b.arrays) and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and a[k].tobytes() == b[k].tobytes()
        for k in a.arrays)


@pytest.mark.parametrize("layout", [{}, {"row_blocking": True}, {"rows_per_chunk": 3},
                                    {"streaming": True}])
def test_decoding_gives_what_a_verifying_load_gives(tmp_path, layout):
    keys = tmp_path / "keys"
    generate_keys(keys)
    state = sample_state(np.random.default_rng(3)) | {
        "big": np.random.default_rng(4).standard_normal((300, 1500)).astype(np.float32)}
    path = tmp_path / "s.wtxt"
    wtxt.save(state, path, gen=7, ts=TS, hmac_key=keys / "hmac.key",
              sign_key=keys / "signing.key", **layout)
    checked, decoded = wtxt.load(path), wtxt.load(path, verify=False)
    assert same(checked, decoded)
    assert {k: decoded.meta[k] for k in ("gen", "ts", "sha256_all", "merkle_this")} == \
        {k: checked.meta[k] for k in ("gen", "ts", "sha256_all", "merkle_this")}
    for name, array in state.items():
        assert decoded[name].tobytes() == np.ascontiguousarray(array).tobytes()


def two_files(tmp_path):
    """Two files of the same layout and different numbers."""
    paths = []
    for seed in (1, 2):
        w = np.random.default_rng(seed).standard_normal((64, 1024)).astype(np.float32)
        paths.append(tmp_path / f"{seed}.wtxt")
        wtxt.save({"w": w}, paths[-1], gen=1, ts=TS, rows_per_chunk=8)
    return [p.read_bytes() for p in paths]


def chunk_text(data: bytes, ix: int) -> tuple[int, int]:
    start = data.index(b"ch ix=%06d " % ix)
    return start, data.index(b"endch\n", start)


def test_a_stale_chunk_digest_is_what_decoding_does_not_see(tmp_path):
    """Chunk 3's text (body and CRC32C) from another file under this file's SHA-256: a
    verifying load refuses it, decoding returns the other file's bytes. That is why only a
    file whose own digest was checked is decoded this way."""
    mine, other = two_files(tmp_path)
    a0, a1 = chunk_text(mine, 3)
    b0, b1 = chunk_text(other, 3)
    sha = re.search(rb"sha256=[0-9a-f]{64}", mine[a0:a1]).group()
    spliced = other[b0:b1].replace(re.search(rb"sha256=[0-9a-f]{64}", other[b0:b1]).group(), sha)
    forged = tmp_path / "forged.wtxt"
    forged.write_bytes(mine[:a0] + spliced + mine[a1:])
    with pytest.raises(FormatError) as raised:
        wtxt.load(forged)
    assert raised.value.check == "chunk_sha256"
    decoded = wtxt.load(forged, verify=False)["w"]
    theirs = wtxt.load(tmp_path / "2.wtxt")["w"]
    assert np.array_equal(decoded[24:32], theirs[24:32])


@pytest.mark.parametrize("damage, check", [("body", "parity"), ("crc", "crc32c"),
                                           ("sha_field", "grammar"), ("endch", "grammar")])
def test_decoding_still_refuses_damaged_text(tmp_path, damage, check):
    mine, _ = two_files(tmp_path)
    start, end = chunk_text(mine, 2)
    data = bytearray(mine)
    if damage == "body":
        at = mine.index(b"\n", start) + 5           # a character of the first body line
        data[at] = ord("A") if data[at] != ord("A") else ord("B")
    elif damage == "crc":
        at = mine.index(b"crc32c=", start) + 7
        data[at] = ord("0") if data[at] != ord("0") else ord("1")
    elif damage == "sha_field":
        data[mine.index(b"sha256=", start) + 7] = ord("g")
    else:
        data[end] = ord("E")
    path = tmp_path / "damaged.wtxt"
    path.write_bytes(bytes(data))
    with pytest.raises(FormatError) as raised:
        wtxt.load(path, verify=False)
    assert raised.value.check == check, raised.value
    assert raised.value.chunk == 2 or damage == "endch"
