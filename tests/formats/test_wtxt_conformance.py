"""Byte-for-byte agreement with an independent implementation of the WTXT format description
(tests/reference/wtxt_ref.py), on generated states and every writer option."""

from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from snapops.formats import wtxt
from tests.reference import wtxt_ref

DTYPES = ["<f8", "<f4", "<i8", "<u8", "<i4", "<u4", "<i2", "<u2", "i1", "u1"]
NAMES = st.text(alphabet="abcXYZ019_", min_size=1, max_size=6)


@st.composite
def states(draw):
    names = draw(st.lists(NAMES, min_size=0, max_size=4, unique=True))
    state = {}
    for name in names:
        dtype = np.dtype(draw(st.sampled_from(DTYPES)))
        shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=40))
        state[name] = draw(hnp.arrays(dtype, shape, elements=hnp.from_dtype(dtype).filter(
            lambda x: True)))
    return state


@st.composite
def options(draw):
    opts = dict(
        gen=draw(st.integers(0, 10**8)),
        ts=draw(st.sampled_from(["2026-01-02T03:04:05Z", "1999-12-31T23:59:59Z"])),
        build=draw(st.sampled_from(["b1", "abc.123", "x/y+z-1"])),
        merkle_prev=draw(st.one_of(st.none(), st.just("ab" * 32))),
    )
    blocking = draw(st.sampled_from(["none", "default", "rows"]))
    if blocking == "default":
        opts["row_blocking"] = True
    elif blocking == "rows":
        opts["rows_per_chunk"] = draw(st.integers(1, 50))
    if draw(st.booleans()):
        opts["audit"] = 'note="conformance" n=1'
    return opts


def _ours(state, **opts) -> bytes:
    buf = io.BytesIO()
    wtxt.write(state, buf, **opts)
    return buf.getvalue()


def _ref_opts(opts: dict, hmac_key=None, sign_pem=None) -> dict:
    out = dict(opts)
    out.update(hmac_key=hmac_key, sign_key_pem=sign_pem)
    return out


@settings(max_examples=60)
@given(state=states(), opts=options())
@pytest.mark.slow
def test_matches_reference_writer(state, opts):
    ours = _ours(state, **opts)
    assert ours == wtxt_ref.write_wtxt(state, **_ref_opts(opts))


@settings(max_examples=25)
@given(state=states(), opts=options(), streaming=st.booleans())
def test_matches_reference_with_keys(state, opts, streaming, tmp_path_factory):
    folder = tmp_path_factory.mktemp("k")
    from snapops.formats.keys import generate_keys

    generate_keys(folder)
    hmac_key = bytes.fromhex((folder / "hmac.key").read_text().strip())
    pem = (folder / "signing.key").read_bytes()
    path = folder / "out.wtxt"
    wtxt.save(state, path, hmac_key=hmac_key, sign_key=folder / "signing.key",
              streaming=streaming, **opts)
    expected = wtxt_ref.write_wtxt(state, streaming=streaming, **_ref_opts(opts, hmac_key, pem))
    if streaming:
        assert path.read_bytes() == expected[0]
        assert (folder / "out.wtxt.wsum").read_bytes() == expected[1]
    else:
        assert path.read_bytes() == expected
    report = wtxt.verify(path, hmac_key=hmac_key, trusted_keys=[folder / "signing.pub"],
                         require_hmac=bool(state), require_signature=True)
    assert report.ok, report.failure


@settings(max_examples=40)
@given(state=states(), opts=options())
@pytest.mark.slow
def test_reference_accepts_ours_and_we_accept_reference(state, opts, tmp_path_factory):
    data = wtxt_ref.write_wtxt(state, **_ref_opts(opts))
    parsed = wtxt_ref.parse_wtxt(_ours(state, **opts))
    assert sorted(parsed["arrays"]) == sorted(state)
    path = tmp_path_factory.mktemp("r") / "ref.wtxt"
    path.write_bytes(data)
    loaded = wtxt.load(path)
    for name, array in state.items():
        assert loaded[name].dtype == array.dtype.newbyteorder("<") or array.dtype.itemsize == 1
        assert loaded[name].shape == array.shape
        assert loaded[name].tobytes() == np.ascontiguousarray(array).astype(
            array.dtype.newbyteorder("<")).tobytes()


def test_big_endian_and_strided_inputs_match_reference():
    base = np.arange(120, dtype=">i4").reshape(10, 12)
    state = {"be": base, "strided": np.arange(200, dtype=np.float64)[::3],
             "fortran": np.asfortranarray(np.arange(30, dtype=np.int16).reshape(5, 6))}
    opts = dict(gen=3, ts="2026-01-02T03:04:05Z", row_blocking=True)
    assert _ours(state, **opts) == wtxt_ref.write_wtxt(state, **_ref_opts(opts))


@pytest.mark.parametrize("rows", [None, 1, 3, 4096])
def test_zero_row_size_matches_reference(rows):
    state = {"z": np.zeros((5, 0), np.float32), "y": np.zeros((0,), np.uint8)}
    opts = dict(gen=1, ts="2026-01-02T03:04:05Z", row_blocking=True, rows_per_chunk=rows)
    assert _ours(state, **opts) == wtxt_ref.write_wtxt(state, **_ref_opts(opts))
