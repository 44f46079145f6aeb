"""FINF's exploded form: a tree file whose arrays point at one block file each (relative URIs
that may not leave the tree's folder), explode and implode byte for byte, and the CLI."""

from __future__ import annotations

import numpy as np
import pytest

from snapops.cli import main
from snapops.formats import finf
from snapops.formats.errors import FormatError
from tests.formats.test_finf import (BLOCK, assert_same, blocks_of, every_dtype_state,
                                     make_file, tree_with, write)


def test_explode_implode_round_trip_is_byte_identical(tmp_path):
    state = every_dtype_state()
    path = write(tmp_path, state, compression="zstd")
    out = finf.explode(path, tmp_path / "parts")
    parts = tmp_path / "parts"
    assert sorted(p.name for p in parts.iterdir()) == sorted(["m.finf", *out["blocks"]])
    tree_file = (parts / "m.finf").read_bytes()
    assert b"\x89BLK" not in tree_file and tree_file.endswith(b"\n...\n")
    assert b"source: m0000.finf" in tree_file
    original = blocks_of(path.read_bytes())
    for i, name in enumerate(out["blocks"]):
        raw = (parts / name).read_bytes()
        assert raw.startswith(b"%FINF 0.1.0\n\x89BLK")            # no tree, no padding
        magic, hsize, allocated, used, checksum, enc = BLOCK.unpack_from(raw, 12)
        assert allocated == used == len(raw) - 58
        assert (raw[58:], checksum, enc) == (original[i]["data"], original[i]["checksum"],
                                             original[i]["encoding"])
    assert_same(finf.load(parts / "m.finf"), state)                # loads through its URIs
    assert finf.verify(parts / "m.finf").ok
    finf.implode(parts / "m.finf", tmp_path / "back.finf")
    assert (tmp_path / "back.finf").read_bytes() == path.read_bytes()



def test_implode_of_a_tree_pointing_at_the_wrong_block_writes_nothing(tmp_path):
    """A hand-edited tree naming another (smaller) block file: implode refuses before the
    output exists, as verify of the tree does."""
    state = {"small": np.arange(3, dtype=np.int8), "big": np.arange(4000, dtype=np.int32)}
    out = finf.explode(write(tmp_path, state), tmp_path / "parts")
    tree = tmp_path / "parts" / "m.finf"
    small, big = sorted(out["blocks"], key=lambda name: (tmp_path / "parts" / name).stat().st_size)
    tree.write_bytes(tree.read_bytes().replace(f"source: {big}".encode(),
                                               f"source: {small}".encode()))
    assert not finf.verify(tree).ok
    with pytest.raises(FormatError, match=r"\[extents\] array big"):
        finf.implode(tree, tmp_path / "back.finf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.finf", "parts"]

@pytest.mark.parametrize("uri", ["../outside.finf", "/etc/passwd", "file:///etc/passwd",
                                 "sub/../../outside.finf", "a\\..\\b.finf", "%2e%2e/x.finf",
                                 "http://example.org/x.finf", "./x.finf", "a//b.finf",
                                 "link/outside.finf"])
def test_uri_leaving_the_folder_is_refused(tmp_path, uri):
    (tmp_path / "outside.finf").write_bytes(make_file(None, [b"\x01"]))
    folder = tmp_path / "parts"
    folder.mkdir()
    (folder / "link").symlink_to(tmp_path)                          # symlink escape
    tree = tree_with(f"  w: !ndarray {{source: '{uri}', dtype: uint8, shape: [1]}}\n")
    (folder / "t.finf").write_bytes(make_file(tree, []))
    for action in (lambda: finf.load(folder / "t.finf"),
                   lambda: finf.implode(folder / "t.finf", tmp_path / "out.finf")):
        with pytest.raises(FormatError, match=r"\[uri\]") as info:
            action()
        assert info.value.check == "uri"
    report = finf.verify(folder / "t.finf")
    assert not report.ok and report.failure.check == "uri"
    assert not (tmp_path / "out.finf").exists()


def test_missing_block_file_is_a_typed_error(tmp_path):
    path = write(tmp_path, {"w": np.arange(3, dtype=np.int8)})
    finf.explode(path, tmp_path / "parts")
    (tmp_path / "parts" / "m0000.finf").unlink()
    with pytest.raises(FormatError, match=r"\[uri\] array w: exploded block file"):
        finf.load(tmp_path / "parts" / "m.finf")


def test_a_block_file_name_too_long_for_the_file_system_is_a_typed_error(tmp_path):
    """A URI of plain segments may still name a file no file system holds (a 300-character
    segment): stat's ENAMETOOLONG is a typed refusal, not an OSError."""
    folder = tmp_path / "parts"
    folder.mkdir()
    tree = tree_with(f"  w: !ndarray {{source: '{'b' * 300}.finf', dtype: uint8, shape: [1]}}\n")
    (folder / "t.finf").write_bytes(make_file(tree, []))
    with pytest.raises(FormatError, match=r"\[uri\] array w: exploded block file unreadable: "
                                          r"File name too long"):
        finf.load(folder / "t.finf")
    report = finf.verify(folder / "t.finf")
    assert not report.ok and report.failure.check == "uri"


def test_cli_explode_implode(tmp_path, capsys):
    path = write(tmp_path)
    assert main(["finf", "explode", str(path), str(tmp_path / "parts")]) == 0
    assert main(["finf", "implode", str(tmp_path / "parts" / "m.finf"),
                 str(tmp_path / "back.finf")]) == 0
    assert (tmp_path / "back.finf").read_bytes() == path.read_bytes()
    capsys.readouterr()
    assert main(["finf", "implode", str(tmp_path / "parts"), str(tmp_path / "x.finf")]) == 2
    assert capsys.readouterr().err == (f"snapops: error: {tmp_path / 'parts'} is a folder: give "
                                       f"the tree file inside it (DIR/FILE, e.g. "
                                       f"{tmp_path / 'parts' / 'm.finf'}) and OUT\n")
    bad = tmp_path / "parts" / "bad.finf"
    bad.write_bytes(make_file(tree_with(
        "  w: !ndarray {source: ../m.finf, dtype: uint8, shape: [1]}\n"), []))
    capsys.readouterr()
    assert main(["finf", "implode", str(bad), str(tmp_path / "x.finf")]) == 2
    assert "uri" in capsys.readouterr().err
    with pytest.raises(SystemExit, match=r"^0$"):
        main(["finf", "explode", "--help"])
    assert capsys.readouterr().out.rstrip().splitlines()[-1].strip().startswith("snapops finf")
