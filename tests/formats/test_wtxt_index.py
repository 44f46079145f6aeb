"""The public WTXT chunk-access API (``open_index``): chunk digests read from the ch lines
without decoding, chosen chunks decoded with or without the checks, faults named by line."""

from __future__ import annotations

import re

import numpy as np
import pytest

from snapops.formats import wtxt
from snapops.formats.errors import ChecksumError, FormatError, TruncatedError
from snapops.formats.wtxt.delta import DeltaMismatch, chunk_sha_pairs

TS = "2026-01-02T03:04:05Z"


@pytest.fixture
def state():
    rng = np.random.default_rng(4)
    return {"R": rng.standard_normal((100, 24)).astype(np.float32),   # 96 B rows
            "e": np.array([], dtype=np.int16),
            "v": rng.integers(0, 1000, 5000).astype(np.int64)}


@pytest.fixture
def path(tmp_path, state):
    wtxt.save(state, tmp_path / "s.wtxt", gen=3, ts=TS, rows_per_chunk=7)
    return tmp_path / "s.wtxt"


def ch_shas(text: str, name: str) -> list[str]:
    block = text.split(f"arr name={name} ")[1].split("endarr")[0]
    return re.findall(r"^ch ix=\d+ .* sha256=([0-9a-f]{64}) ", block, re.M)


def test_chunk_sha256_are_the_ch_lines_digests(path):
    text = path.read_text()
    with wtxt.open_index(path) as index:
        assert [a.name for a in index.arrays] == ["R", "e", "v"]
        for name in ("R", "e", "v"):
            shas = index.chunk_sha256(name)
            assert shas.shape == (index.array(name).plan.count, 64)
            assert [bytes(row).decode() for row in shas] == ch_shas(text, name)


@pytest.mark.parametrize("check", [True, False])
def test_decode_any_chunk_range_gives_the_raw_bytes(path, state, check):
    with wtxt.open_index(path) as index:
        for name, array in state.items():
            raw = array.tobytes()
            plan = index.array(name).plan
            assert index.decode(name, check=check).tobytes() == raw
            for first, count in ((0, 1), (1, 2), (plan.count - 1, 1), (2, 0)):
                if first + count > plan.count:
                    continue
                start = first * plan.chunk_len
                stop = min(len(raw), (first + count) * plan.chunk_len)
                out = bytearray(stop - start)
                got = index.decode(name, first, count, out, check=check)
                assert bytes(out) == got.tobytes() == raw[start:stop]


def test_decode_refuses_ranges_and_names_it_does_not_have(path):
    with wtxt.open_index(path) as index:
        count = index.array("R").plan.count
        with pytest.raises(FormatError, match=r"chunks within"):
            index.decode("R", count - 1, 2)
        with pytest.raises(FormatError, match=r"array nope"):
            index.decode("nope")


def _corrupt(path, line_of_chunk: int, mutate) -> int:
    """Apply ``mutate`` to the first body line of chunk ``line_of_chunk`` of R; its number."""
    lines = path.read_text().split("\n")
    ch = next(i for i, l in enumerate(lines) if l.startswith(f"ch ix={line_of_chunk:06d} "))
    lines[ch + 1] = mutate(lines[ch + 1])
    path.write_text("\n".join(lines))
    return ch + 2


def test_checked_decode_names_the_faulty_line_unchecked_does_not_check_parity(path, state):
    digit = "0" if _last(path) != "0" else "1"
    line = _corrupt(path, 1, lambda l: l[:-1] + digit)           # wrong parity digit only
    with wtxt.open_index(path) as index:
        with pytest.raises(ChecksumError, match=rf"s\.wtxt:{line}: \[parity\] array R, chunk 1"):
            index.decode("R", 0, 3)
        assert index.decode("R", check=False).tobytes() == state["R"].tobytes()
        index.decode("R", 2, 3)                                   # other chunks are fine


def _last(path) -> str:
    lines = path.read_text().split("\n")
    ch = next(i for i, l in enumerate(lines) if l.startswith("ch ix=000001 "))
    return lines[ch + 1][-1]


def test_unchecked_decode_refuses_what_cannot_be_decoded(path):
    _corrupt(path, 2, lambda l: "!" + l[1:])
    with wtxt.open_index(path) as index:
        with pytest.raises(FormatError, match=r"array R, chunk 2"):
            index.decode("R", check=False)


def test_chunk_sha256_refuses_a_malformed_ch_line(path):
    text = path.read_bytes()
    at = text.index(b"ch ix=000003 ") + 3
    (path.parent / "bad.wtxt").write_bytes(text[:at] + b"iX" + text[at + 2:])
    with wtxt.open_index(path.parent / "bad.wtxt") as index:
        with pytest.raises(FormatError, match=r"bad\.wtxt:\d+: \[grammar\] array R, chunk 3"):
            index.chunk_sha256("R")


def test_index_refuses_a_file_shorter_than_its_arrays(path):
    text = path.read_bytes()
    path.write_bytes(text[:len(text) // 2])
    with pytest.raises(TruncatedError, match=r"s\.wtxt"):
        wtxt.open_index(path)


def test_chunk_sha_pairs_compare_two_generations(tmp_path, state):
    a = wtxt.save(state, tmp_path / "a.wtxt", gen=1, ts=TS, rows_per_chunk=7)
    changed = {k: v.copy() for k, v in state.items()}
    changed["R"][50] += 1
    wtxt.save(changed, tmp_path / "b.wtxt", gen=2, ts=TS, rows_per_chunk=7,
              merkle_prev=a.merkle_this)
    pairs = chunk_sha_pairs(tmp_path / "a.wtxt", tmp_path / "b.wtxt")
    assert sum(x != y for x, y in pairs) == 1                    # row 50 is in chunk 7 of R
    wtxt.save(state, tmp_path / "c.wtxt", gen=2, ts=TS, rows_per_chunk=5)
    with pytest.raises(DeltaMismatch, match=r"row blocking differs"):
        chunk_sha_pairs(tmp_path / "a.wtxt", tmp_path / "c.wtxt")
