"""Decode targets: huge-page mappings faulted in by the decoding threads where transparent
huge pages are on, else populated first (the madvise path, the MAP_POPULATE fallback); small
buffers from the heap; all writable, of the size asked, owning their memory."""

from __future__ import annotations

import numpy as np
import pytest

import snapops.formats._alloc as alloc


@pytest.mark.parametrize("nbytes", [0, 1000, alloc.POPULATE_FROM, 5 * alloc.POPULATE_FROM + 3])
@pytest.mark.parametrize("madvise_works", [True, False])
def test_a_populated_buffer_is_a_writable_array_of_its_size(nbytes, madvise_works,
                                                            monkeypatch):
    if not madvise_works:
        monkeypatch.setattr(alloc, "_populate", lambda address, size: False)
    buf = alloc.populated_buffer(nbytes)
    assert buf.dtype == np.uint8 and buf.shape == (nbytes,) and buf.flags.writeable
    pattern = np.arange(nbytes, dtype=np.uint64).astype(np.uint8)
    buf[:] = pattern
    assert np.array_equal(buf, pattern)
    if nbytes >= alloc.POPULATE_FROM:
        assert not buf.flags.owndata          # a mapping of its own, freed with the array
        assert buf.base is not None


@pytest.mark.parametrize("nbytes", [1000, alloc.POPULATE_FROM, 5 * alloc.POPULATE_FROM + 3])
@pytest.mark.parametrize("huge", [True, False])
def test_a_decode_buffer_is_a_writable_mapping_of_its_size_with_or_without_huge_pages(
        nbytes, huge, monkeypatch):
    populated = []
    real = alloc.populated_buffer
    monkeypatch.setattr(alloc, "huge_pages_enabled", lambda: huge)
    monkeypatch.setattr(alloc, "populated_buffer", lambda n: populated.append(n) or real(n))
    buf = alloc.decode_buffer(nbytes)
    assert buf.dtype == np.uint8 and buf.shape == (nbytes,) and buf.flags.writeable
    pattern = np.arange(nbytes, dtype=np.uint64).astype(np.uint8)
    buf[:] = pattern
    assert np.array_equal(buf, pattern)
    large = nbytes >= alloc.POPULATE_FROM
    assert buf.flags.owndata is not large
    assert populated == ([nbytes] if large and not huge else [])


@pytest.mark.parametrize("text, enabled", [
    ("always [madvise] never\n", True), ("[always] madvise never\n", True),
    ("always madvise [never]\n", False), (None, False), (b"\xff[always]", False)])
def test_huge_pages_count_as_on_only_where_the_kernel_says_always_or_madvise(
        tmp_path, text, enabled):
    setting = tmp_path / "enabled"
    if isinstance(text, str):
        setting.write_text(text)
    elif text is not None:
        setting.write_bytes(text)
    assert alloc.huge_pages_enabled(str(setting)) is enabled


def test_libc_functions_are_looked_up_once_and_missing_ones_are_none():
    import ctypes
    import os

    from snapops.formats.libc import libc_function

    getpid = libc_function("getpid", ())
    assert getpid is not None and getpid() == os.getpid()
    assert libc_function("getpid", ()) is getpid
    assert libc_function("snapops_no_such_function", ()) is None
    assert libc_function("madvise", (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)).restype \
        is ctypes.c_int
