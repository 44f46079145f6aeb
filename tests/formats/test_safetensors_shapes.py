"""Shapes numpy cannot hold (refused as too large, typed, by every verb and by the writers'
torch conversion) and names a safetensors file does not have."""

from __future__ import annotations

import json
import re
import struct

import numpy as np
import pytest

import snapops
from snapops.formats.errors import DataError, FormatError, LimitError
from snapops.formats.registry import handler


def write_header(path, entries: dict, data: bytes = b"") -> str:
    header = json.dumps(entries).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return str(path)


@pytest.mark.parametrize("shape", [[0, 2**62], [2**40, 0, 2**40], [0, 2**63 - 1, 1]])
def test_an_empty_shape_numpy_cannot_hold_is_a_limit_error(tmp_path, shape):
    """numpy refuses (0, 2**62) though it holds no bytes: load and open_lazy raised a bare
    ValueError and verify said ok."""
    path = write_header(tmp_path / "e.safetensors",
                        {"w": {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]}})
    why = (r"e\.safetensors: \[limit\] array w: expected dimensions spanning at most \d+ "
           r"bytes, got shape " + "x".join(map(str, shape)) + " of 4-byte items")
    report = snapops.verify(path)
    assert not report.ok and isinstance(report.failure, LimitError), report
    assert re.fullmatch(".*/" + why, str(report.failure)), report.failure
    for verb in (snapops.load, snapops.inspect, handler("safetensors").open_lazy):
        with pytest.raises(LimitError, match=why):
            verb(path)


def test_empty_arrays_of_ordinary_shapes_still_read(tmp_path):
    path = write_header(tmp_path / "ok.safetensors", {
        "w": {"dtype": "BF16", "shape": [0, 1 << 20], "data_offsets": [0, 0]},
        "v": {"dtype": "I16", "shape": [2], "data_offsets": [0, 4]}}, b"\x01\x00\x02\x00")
    snap = snapops.load(path)
    assert snap["w"].shape == (0, 1 << 20) and snap["w"].dtype.name == "bfloat16"
    assert snap["v"].tolist() == [1, 2]
    assert snapops.verify(path).ok


def test_the_lazy_reader_names_a_missing_array(tmp_path):
    path = tmp_path / "m.safetensors"
    snapops.save({"w": np.ones(2, np.float32)}, path)
    with handler("safetensors").open_lazy(path) as lazy:
        for get in (lazy.__getitem__, lazy.spec):     # spec raised a bare KeyError
            with pytest.raises(FormatError, match=r"m\.safetensors: \[grammar\] array nope: "
                                                  r"no such array; expected one of w, got nope"):
                get("nope")


@pytest.mark.parametrize("suffix", [".fold", ".safetensors", ".pt"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_writing_an_empty_tensor_numpy_cannot_hold_is_a_data_error(tmp_path, suffix, dtype):
    """The torch -> numpy conversion raised numpy's bare ValueError."""
    import torch

    path = tmp_path / f"x{suffix}"
    tensor = torch.empty(0, 2**62, dtype=getattr(torch, dtype))
    with pytest.raises(DataError, match=r"array 'w': shape 0x4611686018427387904 is one "
                                        r"numpy cannot hold"):
        snapops.save({"w": tensor, "v": torch.ones(2)}, path)
    assert not path.exists() and list(tmp_path.iterdir()) == []
