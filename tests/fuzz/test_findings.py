"""Regression tests for what the fuzzer found (each once an untyped exception or a silent
loss, now a typed error or a refusal at write time)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import snapops
from snapops.formats.errors import DataError, FormatError
from snapops.formats.generation.load import load_from_source
from snapops.formats.generation.source import FolderSource
from snapops.formats.registry import handler
from snapops.formats.generation.write import GenerationSpec, seal_in_ledger, write_generation
from tests.fuzz.seeds import RUN, TS, state


def test_wtxt_audit_line_with_non_ascii_is_a_grammar_error(tmp_path):
    snapops.save(state(), tmp_path / "s.wtxt", audit="note=seed")
    data = (tmp_path / "s.wtxt").read_bytes().replace(b"audit note=seed",
                                                      b"audit note=s\xc3\xa9ed")
    (tmp_path / "a.wtxt").write_bytes(data)
    for read in (handler("wtxt").inspect, handler("wtxt").open_lazy):
        with pytest.raises(FormatError, match=r"a\.wtxt:\d+: \[grammar\].*audit line"):
            read(tmp_path / "a.wtxt")


def test_unverified_generation_load_refuses_a_shape_its_shards_do_not_hold(tmp_path):
    repo = tmp_path / "gen"
    spec = GenerationSpec(run=RUN, format="wtxt", shard_max=1024)
    seal_in_ledger(repo, RUN, write_generation(repo, spec, 1, TS, state()))
    manifest = repo / "snapshots" / RUN / "MANIFEST"
    manifest.write_bytes(manifest.read_bytes().replace(b"shape=6,4 ", b"shape=6,5 ")
                         .replace(b"box=0:6,0:4", b"box=0:6,0:5"))
    with pytest.raises(FormatError, match=r"array emb: the shard does not hold this part"):
        load_from_source(FolderSource(repo), RUN, verify=False)
    # verified: named by the verifier, whose ledger check (before the shards) sees the change
    with pytest.raises(FormatError, match=r"\[ledger\] the ledger's last line does not seal"):
        load_from_source(FolderSource(repo), RUN)


@pytest.mark.parametrize("fmt", ["wtxt", "finf"])   # bool kept as u8 + record
def test_an_empty_name_the_dtype_record_cannot_list_is_refused(fmt, tmp_path):
    path = tmp_path / f"x{handler(fmt).suffixes[0]}"
    with pytest.raises(DataError, match="empty name"):
        handler(fmt).save({"": np.ones(2, np.bool_), "n": np.arange(2, dtype=np.uint8)}, path)
    assert list(tmp_path.iterdir()) == []
    handler(fmt).save({"": np.ones(2, np.bool_)}, path)        # alone: the record says "*"
    assert handler(fmt).load(path)[""].dtype == np.bool_


def test_names_a_format_cannot_hold_are_refused_not_lost(tmp_path):
    with pytest.raises(DataError, match="NUL"):
        snapops.save({"a\x00b": np.ones(2)}, tmp_path / "x.npz")
    with pytest.raises(DataError, match="__metadata__"):
        snapops.save({"__metadata__": np.ones(2)}, tmp_path / "x.safetensors")
    assert list(tmp_path.iterdir()) == []
    snapops.save({"a\x00b": np.ones(2)}, tmp_path / "x.safetensors")   # it holds any name
    assert list(snapops.load(tmp_path / "x.safetensors").arrays) == ["a\x00b"]


def test_a_ledger_path_too_long_for_the_file_system_is_a_problem_not_an_oserror(tmp_path):
    from snapops.formats.ledger import Ledger

    repo = tmp_path / "gen"
    spec = GenerationSpec(run=RUN, format="wtxt", shard_max=1024)
    seal_in_ledger(repo, RUN, write_generation(repo, spec, 1, TS, state()))
    path = repo / "ledger" / f"{RUN}.ledger"
    path.write_bytes(path.read_bytes().replace(f"snapshots/{RUN}/".encode(),
                                               b"snapshots/run" + b"9" * 300 + b"/"))
    report = Ledger(path, root=repo).verify()
    assert not report.ok
    assert any("cannot be looked up" in str(p) for p in report.problems), report.problems


def test_textconv_reads_npz_written_by_snapops_with_meta_and_logical_dtypes(tmp_path):
    from snapops.hooks.review import textconv_lines

    for suffix in (".npz", ".safetensors"):
        snapops.save(state(), tmp_path / f"s{suffix}", gen=1, ts=TS)
    npz = [line for line in textconv_lines(tmp_path / "s.npz") if "format=" not in line]
    other = [line for line in textconv_lines(tmp_path / "s.safetensors")
             if "format=" not in line]
    assert "meta gen=1" in npz and any(line.startswith("arr emb dtype=bf16") for line in npz)
    assert [x for x in npz if not x.startswith("meta")] == \
        [x for x in other if not x.startswith("meta")]


def _flag_encrypted(path, member: bytes) -> None:
    """Set the 'encrypted' bit (general purpose flag bit 0) of ``member`` in its local header
    and in the central directory, as a hostile archive would."""
    data = bytearray(path.read_bytes())
    for signature, flags_at, name_at in ((b"PK\x03\x04", 6, 30), (b"PK\x01\x02", 8, 46)):
        at = 0
        while (at := data.find(signature, at)) >= 0:
            if data[at + name_at:at + name_at + len(member)] == member:
                data[at + flags_at] |= 0x1
            at += 4
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("member", [b"snapops.json", b"w.npy"])
def test_npz_with_an_encrypted_member_is_refused_by_every_reader(tmp_path, member, capsys):
    """Fuzz seed 11, npz case 1414: zipfile's bare RuntimeError ('password required')
    escaped verify."""
    from snapops.cli import main

    path = tmp_path / "s.npz"
    snapops.save({"w": np.arange(6, dtype=np.float32)}, path, gen=1)
    _flag_encrypted(path, member)
    expected = r"s\.npz.*encrypted zip member.*" + member.decode().replace(".", r"\.")
    assert not snapops.verify(path).ok
    assert "encrypted zip member" in str(snapops.verify(path).failure)
    for read in (snapops.load, snapops.inspect):
        with pytest.raises(FormatError, match=expected):
            read(path)
    capsys.readouterr()
    assert main(["textconv", str(path)]) == 2       # the review's own archive reader
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "encrypted zip member" in err, err


def test_pt_with_an_encrypted_member_is_refused(tmp_path):
    torch = pytest.importorskip("torch")
    path = tmp_path / "s.pt"
    torch.save({"w": torch.arange(4.0)}, path)
    _flag_encrypted(path, b"s/data.pkl")
    report = snapops.verify(path)     # torch's own reader refuses it first: still typed
    assert not report.ok and isinstance(report.failure, FormatError), report.failure
    assert "s.pt" in str(report.failure)


def test_pt_whose_zip_needs_an_unknown_version_is_a_typed_error(tmp_path):
    """Fuzz seed 11, pt case 3380: zipfile's NotImplementedError ('zip file version 12.7')
    escaped the CRC check of a .pt that torch itself had loaded."""
    torch = pytest.importorskip("torch")
    path = tmp_path / "s.pt"
    torch.save({"w": torch.arange(4.0)}, path)
    data = bytearray(path.read_bytes())
    central = data.index(b"PK\x01\x02")
    data[central + 6] = 127                      # "version needed to extract": 12.7
    path.write_bytes(bytes(data))
    report = snapops.verify(path)
    assert not report.ok and isinstance(report.failure, FormatError)
    assert "zip file version 12.7" in str(report.failure), report.failure


def test_compressed_npz_with_a_damaged_deflate_stream_is_a_typed_error(tmp_path, capsys):
    """numpy.savez_compressed writes deflated members: zlib.error escaped verify, load and
    inspect when one was damaged (found by a hand-made case after the fuzz findings above).
    Damage near the start breaks the deflate stream; near the end it may still inflate, to
    bytes that fail the CRC-32."""
    import zipfile

    from snapops.cli import main

    clean = tmp_path / "clean.npz"
    np.savez_compressed(clean, w=np.random.default_rng(0).random(10000).astype(np.float32))
    info = zipfile.ZipFile(clean).getinfo("w.npy")
    body = info.header_offset + 30 + len(info.filename) + len(info.extra)
    failures = []
    for where in (body + 10, body + info.compress_size - 200):
        data = bytearray(clean.read_bytes())
        for at in range(where, where + 30):
            data[at] ^= 0x55
        path = tmp_path / "c.npz"
        path.write_bytes(bytes(data))
        report = snapops.verify(path)
        assert not report.ok and isinstance(report.failure, FormatError), report.failure
        with pytest.raises(FormatError, match=r"c\.npz.*array w") as raised:
            snapops.load(path)
        assert str(raised.value).count("c.npz") == 1, raised.value
        failures.append(str(report.failure))
        capsys.readouterr()
        assert main(["textconv", str(path)]) == 2          # the review's own reader
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.count("c.npz") == 1, err
    assert "decompressing" in failures[0], failures
    assert re.search(r"decompressing|Bad CRC-32", failures[1]), failures


def test_a_residual_declaring_a_huge_target_is_refused_before_any_allocation():
    """Fuzz seed 18, residual case 340: a header declaring a 4 GiB target made the decoder
    allocate it before looking at the payload (MemoryError under the fuzzer's memory cap)."""
    import struct
    import tracemalloc

    from snapops.formats.generation.residual import HEADER, decode_residual, encode_residual

    base = np.arange(1000, dtype=np.float32)
    blob = bytearray(encode_residual(base.tobytes(), (base * 2).tobytes(), itemsize=4))
    struct.pack_into("<Q", blob, 8, (4 << 30) + 4000)         # the target length field
    assert HEADER.unpack_from(blob)[4] == (4 << 30) + 4000
    tracemalloc.start()
    try:
        # its frames are held against the declared planes before anything is allocated (the
        # first plane, all zeros, is sparse: its bitmap frame is far short of 1 Gi items)
        with pytest.raises(FormatError, match=r"\[residual\] residual frame does not fit its "
                                              r"plane; expected exactly 134217853 bytes"):
            decode_residual(base.tobytes(), bytes(blob))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
