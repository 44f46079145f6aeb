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
    with pytest.raises(FormatError) as raised:
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
    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    assert "--no-verify" in capsys.readouterr().out
