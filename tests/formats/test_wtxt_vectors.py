"""Our WTXT writer reproduces the test vectors (tests/vectors/wtxt) byte for byte; our verifier accepts them."""

from __future__ import annotations

import numpy as np
import pytest

from snapops.formats import wtxt
from snapops.formats.npz import FORMAT as NPZ
from tests.conftest import VECTOR_OPTS


def _g1_merkle(vectors) -> str:
    return wtxt.read_header(vectors / "g1-sealed.wtxt").merkle_this


def _sealed_opts(vectors, gen: int) -> dict:
    return dict(gen=gen, row_blocking=True, hmac_key=vectors / "test-hmac.key",
                sign_key=vectors / "test-signing.key", audit=f'note="vector g{gen}"', **VECTOR_OPTS)


def test_plain_vector_reproduced(vectors, tmp_path):
    wtxt.save(NPZ.load(vectors / "g1.npz"), tmp_path / "out.wtxt", gen=1, **VECTOR_OPTS)
    assert (tmp_path / "out.wtxt").read_bytes() == (vectors / "g1-plain.wtxt").read_bytes()


@pytest.mark.parametrize("gen", [1, 2])
def test_sealed_vectors_reproduced(vectors, tmp_path, gen):
    opts = _sealed_opts(vectors, gen)
    if gen == 2:
        opts["merkle_prev"] = _g1_merkle(vectors)
    result = wtxt.save(NPZ.load(vectors / f"g{gen}.npz"), tmp_path / "out.wtxt", **opts)
    expected = (vectors / f"g{gen}-sealed.wtxt").read_bytes()
    assert (tmp_path / "out.wtxt").read_bytes() == expected
    assert result.merkle_this == wtxt.read_header(vectors / f"g{gen}-sealed.wtxt").merkle_this


def test_streaming_vector_reproduced(vectors, tmp_path):
    out = tmp_path / "g2-stream.wtxt"
    wtxt.save(NPZ.load(vectors / "g2.npz"), out, gen=2, streaming=True, rows_per_chunk=4,
              sign_key=vectors / "test-signing.key", merkle_prev=_g1_merkle(vectors),
              **VECTOR_OPTS)
    assert out.read_bytes() == (vectors / "g2-stream.wtxt").read_bytes()
    assert (tmp_path / "g2-stream.wtxt.wsum").read_bytes() == \
        (vectors / "g2-stream.wtxt.wsum").read_bytes()


@pytest.mark.parametrize("name,keys", [
    ("g1-plain.wtxt", False), ("g1-sealed.wtxt", True), ("g2-sealed.wtxt", True),
    ("g2-stream.wtxt", True)])
def test_vectors_verify(vectors, name, keys):
    opts = {}
    if keys:
        opts = dict(trusted_keys=[vectors / "test-signing.pub"], require_signature=True)
        if "sealed" in name:
            opts.update(hmac_key=vectors / "test-hmac.key", require_hmac=True)
    report = wtxt.verify(vectors / name, **opts)
    assert report.ok, report.failure
    assert report.arrays == 6


def test_vectors_load_equal_inputs(vectors):
    source = NPZ.load(vectors / "g1.npz")
    for name in ("g1-plain.wtxt", "g1-sealed.wtxt"):
        loaded = wtxt.load(vectors / name)
        assert loaded.equal(source)
        assert loaded["emb"].dtype == np.float32 and loaded["step"].shape == ()


def test_plain_vector_is_unauthenticated_and_unsigned(vectors):
    report = wtxt.verify(vectors / "g1-plain.wtxt")
    assert report.ok
    assert any("unauthenticated" in n for n in report.notes)
    assert any("unsigned" in n for n in report.notes)
    demanded = wtxt.verify(vectors / "g1-plain.wtxt", require_signature=True)
    assert not demanded.ok and demanded.failure.check == "signature"


def test_wrong_hmac_key_fails(vectors, tmp_path):
    (tmp_path / "other.key").write_text("ab" * 32 + "\n")
    report = wtxt.verify(vectors / "g1-sealed.wtxt", hmac_key=tmp_path / "other.key")
    assert not report.ok and report.failure.check == "hmac"
    assert report.failure.array == "bias"


def test_untrusted_signer_fails(vectors, keydir):
    report = wtxt.verify(vectors / "g1-sealed.wtxt", trusted_keys=[keydir / "signing.pub"])
    assert not report.ok and report.failure.check == "signature"
    assert "56475aa75463474c" in str(report.failure)


def test_stream_without_wsum_fails_clearly(vectors, tmp_path):
    lone = tmp_path / "lone.wtxt"
    lone.write_bytes((vectors / "g2-stream.wtxt").read_bytes())
    report = wtxt.verify(lone)
    assert not report.ok and report.failure.check == "wsum"
    assert "WSUM" in str(report.failure)
