"""The independent WTXT reference regenerates, reproduces and accepts the WTXT test vectors
(tests/vectors/wtxt)."""
from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from .make_vectors import COMMON, INPUTS, VECTORS as VEC, load_inputs
from .wtxt_ref import RefError, apply_delta, crc32c, parse_wtxt, verify_wsum, write_wtxt

REPO = Path(__file__).resolve().parents[2]


def _read(name: str) -> bytes:
    return (VEC / name).read_bytes()


@pytest.fixture(scope="module")
def keys():
    return load_inputs(VEC)


def _flip(data: bytes, pos: int, new: bytes) -> bytes:
    return data[:pos] + new + data[pos + 1:]


def test_crc32c_check_value():
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"") == 0


def test_make_vectors_regenerates_every_committed_vector(tmp_path):
    """``python -m tests.reference.make_vectors OUTDIR`` as the vectors' README says."""
    done = subprocess.run([sys.executable, "-m", "tests.reference.make_vectors", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    committed = sorted(p.name for p in VEC.iterdir() if p.name != "README.md")
    assert sorted(p.name for p in tmp_path.iterdir()) == committed
    for name in committed:
        assert (tmp_path / name).read_bytes() == _read(name), name
    assert set(INPUTS) < set(committed)


def test_make_vectors_refuses_a_folder_without_inputs(tmp_path):
    done = subprocess.run([sys.executable, "-m", "tests.reference.make_vectors",
                           str(tmp_path / "out"), "--inputs", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith("make_vectors: error:") and "g1.npz" in done.stderr
    assert not (tmp_path / "out").exists()


def test_delta_vector_applies_to_g2():
    assert apply_delta(_read("g1-sealed.wtxt"), _read("g1-to-g2.wtxtdelta")) == \
        _read("g2-sealed.wtxt")


def test_parse_accepts_vectors(keys):
    plain = parse_wtxt(_read("g1-plain.wtxt"))
    assert plain["signature"] == "absent" and len(plain["unauthenticated"]) == 6
    g1 = keys["g1"]
    for name in ("g1-sealed.wtxt", "g2-sealed.wtxt"):
        got = parse_wtxt(_read(name), hmac_key=keys["hmac"], public_key_pem=keys["pub"])
        assert got["signature"] == "verified" and got["unauthenticated"] == []
    for k, v in plain["arrays"].items():
        assert v.dtype == g1[k].dtype and v.shape == g1[k].shape and np.array_equal(v, g1[k])
    stream = parse_wtxt(_read("g2-stream.wtxt"), wsum=_read("g2-stream.wtxt.wsum"),
                        public_key_pem=keys["pub"])
    assert stream["root_pending"] and stream["signature"] == "verified"


def test_verify_wsum_accepts_stream_pair(keys):
    verify_wsum(_read("g2-stream.wtxt"), _read("g2-stream.wtxt.wsum"), keys["pub"])
    verify_wsum(_read("g2-stream.wtxt"), _read("g2-stream.wtxt.wsum"), None)


def test_stream_needs_wsum_and_wsum_needs_stream():
    with pytest.raises(RefError, match=r"wsum \(line 4\): root_pending file needs") as e:
        parse_wtxt(_read("g2-stream.wtxt"))
    assert e.value.check == "wsum"
    with pytest.raises(RefError, match=r"wsum \(line 4\): a WSUM was") as e:
        verify_wsum(_read("g1-plain.wtxt"), _read("g2-stream.wtxt.wsum"), None)
    assert e.value.check == "wsum"


def test_flipped_base64_char_is_parity_or_crc():
    data = _read("g1-plain.wtxt")
    line_no = 7  # a full 76-char base64 line of `bias`
    start = sum(len(x) + 1 for x in data.split(b"\n")[:line_no - 1])
    pos = next(i for i in range(start, start + 76) if chr(data[i]).isalpha())
    old = data[pos]
    # different low nibble -> the line's parity nibble no longer matches
    new = b"0" if (old ^ ord("0")) & 0xF else b"1"
    with pytest.raises(RefError, match=r"parity \(line 7\): bias chunk 0") as e:
        parse_wtxt(_flip(data, pos, new))
    assert (e.value.check, e.value.line_no) == ("parity", line_no)
    # swapping case keeps the low nibble: parity passes, crc32c on the ch line catches it
    with pytest.raises(RefError, match=r"crc32c \(line 6\): bias chunk 0") as e:
        parse_wtxt(_flip(data, pos, bytes([old ^ 0x20])))
    assert (e.value.check, e.value.line_no) == ("crc32c", 6)


def test_changed_merkle_prev_is_merkle_failure():
    data = _read("g1-plain.wtxt")
    bad = data.replace(b"merkle_prev=" + b"0" * 64, b"merkle_prev=" + b"1" * 64, 1)
    with pytest.raises(RefError, match=r"merkle \(line 4\): merkle_this does not") as e:
        parse_wtxt(bad)
    assert (e.value.check, e.value.line_no) == ("merkle", 4)


def test_noncanonical_padding_rejected():
    # a 1-byte chunk b"A" encodes as QQ==; QR== decodes to the same byte leniently
    good = write_wtxt({"x": np.array([0x41], dtype=np.uint8)}, gen=3, **COMMON)
    assert b"\nQQ== 0\n" in good  # Q^Q^=^= = 0
    bad = good.replace(b"\nQQ== 0\n", b"\nQR== 3\n")  # Q^R = 0x51^0x52 = 3
    assert base64.b64decode(b"QR==") == b"A"
    with pytest.raises(RefError, match=r"base64 \(line 6\): x chunk 0") as e:
        parse_wtxt(bad)
    assert e.value.check == "base64"


def test_noncanonical_signature_base64_rejected():
    alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    data = _read("g1-sealed.wtxt")
    sig = data.split(b"sign ed25519=")[1].split(b" ")[0]
    assert sig.endswith(b"==")  # 64 bytes: last char carries 4 zero padding bits
    last = alphabet[alphabet.index(sig[-3]) + 1:][:1]
    bad_sig = sig[:-3] + last + b"=="
    assert base64.b64decode(bad_sig) == base64.b64decode(sig)
    with pytest.raises(RefError, match=r"signature \(line 5\): ed25519= is not") as e:
        parse_wtxt(data.replace(sig, bad_sig))
    assert e.value.check == "signature"


def test_wrong_hmac_key_and_wrong_public_key(keys):
    data = _read("g1-sealed.wtxt")
    with pytest.raises(RefError, match=r"hmac \(line 6\): bias: salt is") as e:
        parse_wtxt(data, hmac_key=b"\x01" * 32)
    assert e.value.check == "hmac"
    with pytest.raises(RefError, match=r"hmac \(line 5\): bias: unauthenticated \(hmac") as e:
        parse_wtxt(_read("g1-plain.wtxt"), hmac_key=keys["hmac"])
    assert e.value.check == "hmac"
    with pytest.raises(RefError, match=r"signature \(line 4\): no sign line") as e:
        parse_wtxt(_read("g1-plain.wtxt"), public_key_pem=keys["pub"])
    assert e.value.check == "signature"


def test_delta_for_wrong_base_rejected():
    with pytest.raises(RefError, match=r"sha256_all \(line 1\): delta base_sha256_all does") as e:
        apply_delta(_read("g1-plain.wtxt"), _read("g1-to-g2.wtxtdelta"))
    assert e.value.check == "sha256_all"


@pytest.mark.parametrize("bad", [
    {"b": np.zeros(2, dtype=np.bool_)}, {"h": np.zeros(2, dtype=np.float16)},
    {"c": np.zeros(2, dtype=np.complex64)}, {"layer.0.weight": np.zeros(2)},
])
def test_writer_refuses_unsupported(bad):
    with pytest.raises(ValueError, match=r"unsupported dtype|is not \[A-Za-z0-9_\]\+"):
        write_wtxt(bad, gen=1, **COMMON)


def test_roundtrip_edge_shapes():
    arrays = {"big": np.arange(20000, dtype=">f4").reshape(100, 200)[:, ::2],
              "s": np.float64(2.5), "z": np.zeros((5, 0), dtype=np.int16)}
    for opts in ({}, {"row_blocking": True}, {"rows_per_chunk": 3}):
        data = write_wtxt(arrays, gen=7, **COMMON, **opts)
        got = parse_wtxt(data)["arrays"]
        for k, v in arrays.items():
            assert np.array_equal(got[k], v) and got[k].shape == np.shape(v)
