"""Reading ``.npz`` input: what numpy writes, read without pickle, in C order."""

from __future__ import annotations

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
