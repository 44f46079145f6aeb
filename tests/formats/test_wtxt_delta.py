"""DELTA v2: byte-identical round trips, agreement with the reference, clear refusals."""

from __future__ import annotations

import numpy as np
import pytest

from snapops.cli import main
from snapops.formats import wtxt
from snapops.formats.errors import DataError, FormatError
from snapops.formats.wtxt.delta import apply_delta, make_delta
from tests.reference import wtxt_ref

TS = "2026-01-02T03:04:05Z"


def _state(seed=0, rows=512, cols=64):
    rng = np.random.default_rng(seed)
    return {"R": rng.standard_normal((rows, cols)).astype(np.float32),
            "b": rng.standard_normal(cols), "n": np.array(3, np.int64)}


def _pair(tmp_path, fraction: float, keydir=None, rows_per_chunk=4):
    base = _state()
    target = {k: v.copy() for k, v in base.items()}
    rows = base["R"].shape[0]
    changed = np.random.default_rng(1).choice(rows, int(round(rows * fraction)), replace=False)
    target["R"][changed] += 1.0
    keys = {}
    if keydir is not None:
        keys = dict(hmac_key=keydir / "hmac.key", sign_key=keydir / "signing.key")
    r1 = wtxt.save(base, tmp_path / "g1.wtxt", gen=1, ts=TS, rows_per_chunk=rows_per_chunk, **keys)
    wtxt.save(target, tmp_path / "g2.wtxt", gen=2, ts=TS, rows_per_chunk=rows_per_chunk,
              merkle_prev=r1.merkle_this, audit='note="g2"', **keys)
    return tmp_path / "g1.wtxt", tmp_path / "g2.wtxt", len(changed)


@pytest.mark.parametrize("fraction", [0.0, 1 / 512, 0.01, 0.5, 1.0])
def test_roundtrip_is_byte_identical(tmp_path, fraction):
    base, target, rows_changed = _pair(tmp_path, fraction)
    stats = make_delta(base, target, tmp_path / "d.wtxtdelta")
    assert stats.chunks_changed <= rows_changed  # 4 rows per chunk: changed chunks <= rows
    if fraction == 0.0:
        assert stats.chunks_changed == 0
    if fraction == 1.0:
        assert stats.chunks_changed == 128
    apply_delta(base, tmp_path / "d.wtxtdelta", tmp_path / "out.wtxt")
    assert (tmp_path / "out.wtxt").read_bytes() == target.read_bytes()
    assert (tmp_path / "d.wtxtdelta").read_bytes() == wtxt_ref.make_delta(
        base.read_bytes(), target.read_bytes())


def test_one_chunk_delta_is_small_and_signed(tmp_path, keydir):
    base, target, _ = _pair(tmp_path, 1 / 512, keydir)
    stats = make_delta(base, target, tmp_path / "d.wtxtdelta", hmac_key=keydir / "hmac.key")
    assert stats.chunks_changed == 1 and stats.delta_bytes < stats.target_bytes / 20
    assert b"\nsign ed25519=" in (tmp_path / "d.wtxtdelta").read_bytes()
    apply_delta(base, tmp_path / "d.wtxtdelta", tmp_path / "out.wtxt",
                hmac_key=keydir / "hmac.key", trusted_keys=[keydir / "signing.pub"])
    assert (tmp_path / "out.wtxt").read_bytes() == target.read_bytes()


def test_reference_applies_our_delta_and_we_apply_its(tmp_path):
    base, target, _ = _pair(tmp_path, 0.05)
    make_delta(base, target, tmp_path / "ours.wtxtdelta")
    assert wtxt_ref.apply_delta(base.read_bytes(),
                                (tmp_path / "ours.wtxtdelta").read_bytes()) == target.read_bytes()


def test_wrong_base_is_refused_and_nothing_written(tmp_path):
    base, target, _ = _pair(tmp_path, 0.01)
    make_delta(base, target, tmp_path / "d.wtxtdelta")
    with pytest.raises(FormatError, match="sha256_all") as err:
        apply_delta(target, tmp_path / "d.wtxtdelta", tmp_path / "out.wtxt")
    assert err.value.check == "sha256_all"
    assert not (tmp_path / "out.wtxt").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_corrupt_delta_chunk_is_named_and_nothing_written(tmp_path):
    base, target, _ = _pair(tmp_path, 0.01)
    make_delta(base, target, tmp_path / "d.wtxtdelta")
    data = bytearray((tmp_path / "d.wtxtdelta").read_bytes())
    at = data.index(b"\nch ") + 1
    at = data.index(b"\n", at) + 3
    data[at] = ord("A") if data[at] != ord("A") else ord("C")
    (tmp_path / "bad.wtxtdelta").write_bytes(bytes(data))
    with pytest.raises(FormatError, match=r"\[parity\] array R, chunk 4") as err:
        apply_delta(base, tmp_path / "bad.wtxtdelta", tmp_path / "out.wtxt")
    assert err.value.check in {"parity", "crc32c"} and err.value.array == "R"
    assert "bad.wtxtdelta" in str(err.value)
    assert not (tmp_path / "out.wtxt").exists()


@pytest.mark.parametrize("change,match", [
    (lambda s: s.pop("b"), "names differ"),
    (lambda s: s.update(b=s["b"].astype(np.float32)), "f64"),
    (lambda s: s.update(R=s["R"][:-1]), "512"),
    (None, "row blocking"),
])
def test_incompatible_pairs_say_write_a_full_snapshot(tmp_path, change, match):
    base = _state()
    target = _state()
    rows = 4
    if change is None:
        rows = 8
    else:
        change(target)
    wtxt.save(base, tmp_path / "a.wtxt", gen=1, ts=TS, rows_per_chunk=4)
    wtxt.save(target, tmp_path / "b.wtxt", gen=2, ts=TS, rows_per_chunk=rows)
    with pytest.raises(DataError, match=match) as err:
        make_delta(tmp_path / "a.wtxt", tmp_path / "b.wtxt", tmp_path / "d.wtxtdelta")
    assert "full snapshot" in str(err.value)
    assert not (tmp_path / "d.wtxtdelta").exists()


def test_streaming_files_are_refused(tmp_path):
    wtxt.save(_state(), tmp_path / "a.wtxt", gen=1, ts=TS, rows_per_chunk=4, streaming=True)
    wtxt.save(_state(), tmp_path / "b.wtxt", gen=2, ts=TS, rows_per_chunk=4)
    with pytest.raises(DataError, match="root_pending"):
        make_delta(tmp_path / "a.wtxt", tmp_path / "b.wtxt", tmp_path / "d.wtxtdelta")


def test_cli_make_and_apply(tmp_path, capsys):
    base, target, _ = _pair(tmp_path, 0.01)
    assert main(["delta", "make", str(base), str(target), str(tmp_path / "d.wtxtdelta")]) == 0
    assert "chunks changed" in capsys.readouterr().out
    assert main(["delta", "apply", str(base), str(tmp_path / "d.wtxtdelta"),
                 str(tmp_path / "o.wtxt")]) == 0
    assert (tmp_path / "o.wtxt").read_bytes() == target.read_bytes()
    assert main(["delta", "apply", str(target), str(tmp_path / "d.wtxtdelta"),
                 str(tmp_path / "o2.wtxt")]) == 1          # read, and it fails a check
    assert "sha256_all" in capsys.readouterr().err
