"""Hostile safetensors headers: every one a typed, one-line refusal from load, verify,
inspect and the CLI."""

from __future__ import annotations

import re
import struct

import pytest

import snapops
from snapops.cli import main
from snapops.formats.errors import FormatError


@pytest.mark.parametrize("header, why", [
    # the C JSON decoder stops a deep nesting with RecursionError, which escaped
    (b"[" * 100_000 + b"]" * 100_000, r"\[limit\] header JSON nests too deeply"),
    (b'{"a":' * 100_000 + b"1" + b"}" * 100_000, r"\[limit\] header JSON nests too deeply"),
    (b"1" * 5000, r"header is not UTF-8 JSON"),      # beyond int's 4300 digits
    (b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}', r"not UTF-8 JSON"),
])
def test_a_hostile_header_is_one_typed_line(tmp_path, capsys, header, why):
    path = tmp_path / "h.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(4))
    for verb in (snapops.load, snapops.inspect):
        with pytest.raises(FormatError, match=why):
            verb(path)
    report = snapops.verify(path)
    assert not report.ok and re.search(why, str(report.failure)), report.failure
    assert main(["verify", str(path)]) == 1
    said = capsys.readouterr()
    assert len((said.out + said.err).strip().splitlines()) == 1, said
