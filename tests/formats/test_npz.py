"""Reading ``.npz`` input: what numpy writes, read without pickle, in C order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import snapops
from snapops.formats.errors import FormatError


def test_fortran_ordered_members_load_as_their_values_in_c_order(tmp_path):
    """np.savez of a transposed array stores it Fortran-ordered: the values come back (as
    numpy's own reader gives them), C-contiguous, and convert carries them over exactly."""
    matrix = np.arange(12, dtype=np.float64).reshape(3, 4)
    cube = np.asfortranarray(np.arange(24, dtype=np.int16).reshape(2, 3, 4))
    path = tmp_path / "f.npz"
    np.savez(path, t=matrix.T, cube=cube, c=matrix)
    with np.load(path, allow_pickle=False) as expected:
        assert expected["t"].flags.f_contiguous           # the file really holds F order
        snap = snapops.load(path)
        for name in ("t", "cube", "c"):
            assert snap[name].flags.c_contiguous
            assert snap[name].dtype == expected[name].dtype
            assert np.array_equal(snap[name], expected[name])
        snapops.save(snap, tmp_path / "f.fold", gen=1)
        back = snapops.load(tmp_path / "f.fold")
        assert all(np.array_equal(back[n], expected[n]) for n in ("t", "cube", "c"))


def test_a_member_that_needs_pickle_is_refused(tmp_path):
    path = tmp_path / "o.npz"
    np.savez(path, ok=np.ones(2), o=np.array([{}, 1], dtype=object))
    with pytest.raises(FormatError, match=r"o.npz: \[grammar\] array o: npz member needs pickle"):
        snapops.load(path)


def test_zip_archives_are_told_apart_by_their_first_member_not_their_name(tmp_path):
    """npz and torch's .pt are both zip archives; a misnamed one is read as what it is."""
    import torch

    np.savez(tmp_path / "n.npz", x=np.arange(3, dtype=np.int16))   # np.savez adds .npz
    (tmp_path / "n.npz").rename(tmp_path / "n.wtxt")
    torch.save({"a": torch.arange(4, dtype=torch.float32)}, tmp_path / "t.npz")
    assert snapops.verify(tmp_path / "n.wtxt").format == "npz"
    assert np.array_equal(snapops.load(tmp_path / "n.wtxt")["x"], np.arange(3, dtype=np.int16))
    assert snapops.verify(tmp_path / "t.npz").format == "pt"
    assert np.array_equal(snapops.load(tmp_path / "t.npz")["a"], np.arange(4, dtype=np.float32))


def test_a_member_that_is_not_an_array_is_refused(tmp_path):
    """A torch archive whose first name is too long to sniff falls back to the .npz suffix:
    it is refused by name, not read as an empty npz that verifies."""
    import torch

    path = tmp_path / ("m" * 60 + ".npz")
    torch.save({"a": torch.ones(2)}, path)
    report = snapops.verify(path)
    assert not report.ok and report.failure.check == "structure"
    assert "neither an array (.npy) nor snapops.json" in str(report.failure)
    with pytest.raises(FormatError, match=r"\[structure\] npz member that is neither"):
        snapops.load(path)


def _flipped_directory(tmp_path, edit) -> Path:
    """An npz (three arrays and snapops.json) whose central directory ``edit`` changed."""
    import ml_dtypes

    path = tmp_path / "d.npz"
    snapops.save({"a": np.ones(3, np.float32), "b": np.zeros(2, ml_dtypes.bfloat16),
                  "c": np.arange(4)}, path)
    data = bytearray(path.read_bytes())
    edit(data, data.find(b"PK\x01\x02"))
    path.write_bytes(data)
    return path


def _comment_length_bit(data: bytearray, directory: int) -> None:
    data[directory + 33] ^= 0x40        # the first entry's comment swallows the others


def _second_name_made_first(data: bytearray, directory: int) -> None:
    at = data.find(b"b.npy", directory)   # the directory's name, not the local header's
    data[at] = ord("a")


@pytest.mark.parametrize("edit, says", [
    (_comment_length_bit, r"does not hold the entries its end record declares; expected 4"),
    (_second_name_made_first, r"zip member name appears twice; expected each name once, "
                              r"got a.npy"),
])
def test_a_damaged_central_directory_is_refused_not_read_short(tmp_path, edit, says):
    """zipfile lists fewer members (or two of one name) and would hand back a snapshot
    missing arrays and their dtypes; every reader refuses instead."""
    path = _flipped_directory(tmp_path, edit)
    report = snapops.verify(path)
    assert not report.ok and report.failure.check == "structure"
    for read in (snapops.load, snapops.inspect):
        with pytest.raises(FormatError, match=rf"d.npz: \[structure\] .*{says}"):
            read(path)
