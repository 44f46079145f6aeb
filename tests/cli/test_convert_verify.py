"""snapops convert and snapops.load never launder: an input whose integrity data (or, for
safetensors, whose header) does not hold is refused with verify's message, exit 1, and
nothing is written at the output path; --no-verify is the explicit way around."""

from __future__ import annotations

import numpy as np
import pytest

import snapops
from snapops.cli import main
from snapops.formats.errors import FormatError

TS = "2026-01-02T03:04:05Z"
MARK = np.float32(1234.5)
STATE = {"w": np.full((32, 32), MARK, np.float32), "b": np.arange(7, dtype=np.int64)}
# format -> (suffix, writer options); FOLD uncompressed so the payload bytes can be found
CASES = {
    "wtxt": (".wtxt", {}),
    "aero": (".aero", {}),
    "fold": (".fold", {"compression": "none"}),
    "pycauset": (".pycauset", {}),
    "finf": (".finf", {"checksum": True}),
    "npz": (".npz", {}),
    "pt": (".pt", {}),
    "safetensors": (".safetensors", {}),
}


def corrupt(path, fmt: str) -> None:
    """Flip one bit: in the array data, or (safetensors, which has no integrity data) in a
    header data offset."""
    data = bytearray(path.read_bytes())
    if fmt == "wtxt":
        at = data.index(b"\nch ix=000000", data.index(b"arr name=w")) + 1
        at = data.index(b"\n", at) + 10                 # inside the first base64 body line
    elif fmt == "safetensors":
        at = data.index(b'"data_offsets":[') + len(b'"data_offsets":[')
    else:
        at = data.index(MARK.tobytes() * 4) + 8
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def corrupted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corrupt")
    out = {}
    for fmt, (suffix, opts) in CASES.items():
        path = folder / f"bad{suffix}"
        snapops.save(STATE, path, gen=1, ts=TS, **opts)
        assert snapops.verify(path).ok
        corrupt(path, fmt)
        out[fmt] = path
    return out


@pytest.mark.parametrize("fmt", sorted(CASES))
def test_convert_of_a_corrupt_input_is_refused_and_writes_nothing(fmt, corrupted, tmp_path,
                                                                  capsys):
    src = corrupted[fmt]
    report = snapops.verify(src)
    assert not report.ok
    dst = tmp_path / "out.wtxt"
    assert main(["convert", str(src), str(dst), "--ts", TS]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"snapops: error: {report.failure}"       # verify's message, one line
    assert not dst.exists() and list(tmp_path.iterdir()) == []
    with pytest.raises(FormatError, match=r"\[") as raised:
        snapops.load(src)
    assert str(raised.value) == str(report.failure)


@pytest.mark.parametrize("fmt", ["aero", "pycauset", "finf"])
def test_no_verify_converts_what_the_reader_accepts(fmt, corrupted, tmp_path, capsys):
    dst = tmp_path / "out.npz"
    assert main(["convert", str(corrupted[fmt]), str(dst), "--no-verify"]) == 0
    changed = snapops.load(dst)["w"]
    assert changed.dtype == np.float32 and (changed != MARK).sum() == 1
    assert snapops.load(corrupted[fmt], verify=False)["w"].tobytes() == changed.tobytes()


def test_no_verify_is_documented(capsys):
    with pytest.raises(SystemExit, match="0"):
        main(["convert", "--help"])
    assert "--no-verify" in capsys.readouterr().out


def test_unsupported_zip_feature_is_a_one_line_refusal(tmp_path, capsys):
    import io
    import zipfile

    buffer = io.BytesIO()
    np.save(buffer, np.ones(3))
    path = tmp_path / "odd.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_BZIP2) as archive:
        archive.writestr("w.npy", buffer.getvalue())
    data = bytearray(path.read_bytes())
    for signature, at in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):   # method 99 (AES)
        start = data.index(signature) + at
        data[start:start + 2] = (99).to_bytes(2, "little")
    path.write_bytes(bytes(data))
    for argv in (["convert", str(path), str(tmp_path / "o.wtxt")], ["textconv", str(path)]):
        assert main(argv) in (1, 2)
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "odd.npz" in err and "array w" in err, err
    assert not (tmp_path / "o.wtxt").exists()


def test_bf16_safetensors_npz_safetensors_round_trip_is_bit_exact(tmp_path, capsys):
    import ml_dtypes

    bits = np.arange(0, 65536, 257, dtype=np.uint16)          # NaN payloads included
    snapops.save({"w": bits.view(ml_dtypes.bfloat16)}, tmp_path / "a.safetensors")
    assert main(["convert", str(tmp_path / "a.safetensors"), str(tmp_path / "b.npz")]) == 0
    assert main(["convert", str(tmp_path / "b.npz"), str(tmp_path / "c.safetensors")]) == 0
    back = snapops.load(tmp_path / "c.safetensors")["w"]
    assert back.dtype == ml_dtypes.bfloat16 and back.view(np.uint16).tobytes() == bits.tobytes()


def test_compression_none_is_the_string_fold_accepts(tmp_path, capsys):
    snapops.save(STATE, tmp_path / "s.npz")
    assert main(["convert", str(tmp_path / "s.npz"), str(tmp_path / "s.fold"),
                 "--option", "compression=none"]) == 0
    assert snapops.load(tmp_path / "s.fold")["w"].tobytes() == STATE["w"].tobytes()
    assert MARK.tobytes() * 4 in (tmp_path / "s.fold").read_bytes()      # stored raw
