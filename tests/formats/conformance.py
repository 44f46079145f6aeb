"""The conformance suite every registered snapshot format passes (as zarr tests its stores).

A format's test class subclasses :class:`FormatConformance` and names the format; every
expectation below is derived from what the format declares (its Capabilities), so a format
that claims a capability is held to it:

* round trip of every dtype the format stores natively or through the ``snapops_dtypes``
  record (bit-exact, dtype kept), and a clear refusal of the others;
* torch state_dicts (f32, bf16, f16, int64, bool, dotted names): ``torch.equal`` after load;
* names, ``gen``/``ts``/``build``, unknown options (an error naming the allowed ones);
* determinism (same bytes twice, and from another process) and the WriteResult's digest;
* truncation at every offset and a flipped bit at every offset: typed errors only, and
  where the format has integrity data for array bytes, every flip there is detected;
* limits: a huge hostile file is refused without allocating its claims;
* capabilities: signatures and HMACs verify (or the demand fails closed), mmap views,
  verify levels, the uniform inspect table.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import re
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import ClassVar

import ml_dtypes
import numpy as np
import pytest

from snapops.formats.contract import SnapshotFormat, render_inspect
from snapops.formats.dtypes import DTYPES, dtype_name, unsigned_for
from snapops.formats.errors import DataError, FormatError, SignatureError, SnapopsError
from snapops.formats.registry import detect, handler
from snapops.formats.report import Report

TS = "2026-01-02T03:04:05Z"
REPO = Path(__file__).resolve().parents[2]
# a pattern that cannot occur by accident in headers: where a format stores array bytes raw,
# the test finds them in the file by this signature
PROBE = (np.arange(32, dtype="<u4") * np.uint32(2654435761) + np.uint32(0x9E3779B9))


def sample(dtype: np.dtype, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Random bits of ``dtype`` (NaN payloads included); bools are 0 or 1."""
    rng = np.random.default_rng(seed)
    count = int(np.prod(shape, dtype=np.int64))
    if dtype == np.bool_:
        return rng.integers(0, 2, count).astype(bool).reshape(shape)
    raw = rng.integers(0, 256, count * dtype.itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


def determinism_state() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    return {"w": rng.standard_normal((8, 4)).astype(np.float32),
            "h": rng.standard_normal(6).astype(ml_dtypes.bfloat16),
            "n": np.arange(5, dtype=np.int64)}


def owner(array: np.ndarray):
    """The object at the bottom of an array's ``base`` chain (through memoryviews)."""
    base = array
    while True:
        nxt = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
        if nxt is None:
            return base
        base = nxt


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and \
        np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


def representative_offsets(data: bytes, run: int = 8) -> list[int]:
    """Every offset of ``data``, except inside a run of ``run`` or more equal bytes (padding,
    zeros), where only the run's first and last byte stand for the rest."""
    offsets, start = [], 0
    for at in range(1, len(data) + 1):
        if at == len(data) or data[at] != data[start]:
            length = at - start
            offsets.extend([start, at - 1] if length >= run else range(start, at))
            start = at
    return offsets


def outcome(fmt: SnapshotFormat, path: Path) -> str:
    """'ok' or the typed failure of load and verify; anything else escapes (a test failure)."""
    report = fmt.verify(path)
    assert isinstance(report, Report)
    try:
        fmt.load(path)
    except SnapopsError:
        return "refused"
    return "ok" if report.ok else "verify-failed"


class FormatConformance:
    """Subclass with ``name = "<format>"``; override the hooks below where a format needs."""

    name: ClassVar[str]
    probe_options: ClassVar[dict] = {}            # writer options that keep the probe small
    refused_dtype: ClassVar[np.dtype | None] = np.dtype("datetime64[s]")
    truncation_limit: ClassVar[int] = 6000      # bytes: every offset below is tried

    @property
    def fmt(self) -> SnapshotFormat:
        return handler(self.name)

    def target(self, folder: Path, stem: str = "s") -> Path:
        return folder / f"{stem}{self.fmt.suffixes[0]}"

    def data_file(self, path: Path) -> Path:
        """The file that holds the array bytes (AEROSET: a part)."""
        return path

    def save_probe(self, folder: Path, **options) -> Path:
        """A small file holding PROBE where its bytes can be found (where stored raw)."""
        state = {"probe": PROBE, "w": np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)}
        return Path(self.fmt.save(state, self.target(folder), **(self.probe_options | options))
                    .path)

    def probe_span(self, path: Path) -> tuple[int, int] | None:
        """Where PROBE's bytes are in ``data_file(path)``; None when not stored raw."""
        data = self.data_file(path).read_bytes()
        at = data.find(PROBE.tobytes())
        return None if at < 0 else (at, at + PROBE.nbytes)

    # -- dtypes and names ---------------------------------------------------------------------

    @pytest.mark.parametrize("dtype", sorted(DTYPES))
    def test_every_dtype_round_trips_or_is_refused_clearly(self, tmp_path, dtype):
        dt = DTYPES[dtype]
        state = {f"a{i}": sample(dt, shape, i) for i, shape in enumerate([(), (3, 5), (0, 2)])}
        caps = self.fmt.capabilities
        carrier = unsigned_for(dt)
        if not (caps.stores(dtype) or (carrier and caps.stores(carrier))):
            with pytest.raises(DataError, match=f"cannot hold dtype {dtype}"):
                self.fmt.save(state, self.target(tmp_path))
            return
        path = Path(self.fmt.save(state, self.target(tmp_path)).path)
        back = self.fmt.load(path)
        assert sorted(back.arrays) == sorted(state)
        for key, array in state.items():
            assert same_bits(array, back[key]), key
        report = self.fmt.verify(path)
        assert report.ok, report.failure
        rows = {r["name"]: r for r in self.fmt.inspect(path)["arrays"]}
        assert {r["dtype"] for r in rows.values()} == {dtype}
        if not caps.stores(dtype):      # kept through the record: every reader says so
            assert all(r["stored_as"] == carrier for r in rows.values())
            assert "unbound metadata" in back.meta["snapops_dtypes_note"]
            assert any("unbound metadata" in n for n in report.notes)

    def test_a_dtype_nothing_can_hold_is_refused_by_name(self, tmp_path):
        if self.refused_dtype is None:       # the format stores every numpy dtype as itself
            array = np.zeros(3, "datetime64[s]")
            back = self.fmt.load(self.fmt.save({"t": array}, self.target(tmp_path)).path)
            assert same_bits(array, back["t"])
            return
        with pytest.raises(DataError, match=r"array 't'.*; FOLD keeps it"):
            self.fmt.save({"t": np.zeros(3, self.refused_dtype)}, self.target(tmp_path))
        assert not list(tmp_path.iterdir()), "no partial file may be left behind"

    def test_torch_state_dict_round_trips_with_dtypes_and_names(self, tmp_path):
        import torch

        from snapops.formats.tensors import numpy_to_tensor

        state = {"layer.0.weight": torch.randn(4, 3).to(torch.bfloat16),
                 "layer.0.bias": torch.randn(3),
                 "head.weight": torch.randn(2, 3).to(torch.float16),
                 "step": torch.tensor(12, dtype=torch.int64),
                 "mask": torch.tensor([True, False, True])}
        path = self.fmt.save(state, self.target(tmp_path), gen=1, ts=TS).path
        back = self.fmt.load(path)
        assert sorted(back.arrays) == sorted(state)
        for key, tensor in state.items():
            restored = numpy_to_tensor(back[key])
            assert restored.dtype == tensor.dtype and torch.equal(restored, tensor), key

    def test_names_that_are_not_identifiers_round_trip(self, tmp_path):
        names = ["layer.0.weight", "a-b", "é/ü", "with space", "blocks__0", "x" * 200]
        state = {n: np.full(2, i, np.int32) for i, n in enumerate(names)}
        back = self.fmt.load(self.fmt.save(state, self.target(tmp_path)).path)
        assert sorted(back.arrays) == sorted(names)
        for name, array in state.items():
            assert same_bits(array, back[name]), name

    # -- options --------------------------------------------------------------------------------

    def test_gen_ts_build_are_kept_in_the_file(self, tmp_path):
        path = self.fmt.save({"w": np.ones(2)}, self.target(tmp_path), gen=7, ts=TS,
                             build="b1").path
        meta = self.fmt.load(path).meta
        assert (str(meta["gen"]), meta["ts"], meta["build"]) == ("7", TS, "b1")

    def test_unknown_options_are_errors_naming_the_allowed_ones(self, tmp_path):
        with pytest.raises(DataError, match=r"unknown option 'bogus'; allowed: gen, ts, build"):
            self.fmt.save({"w": np.ones(2)}, self.target(tmp_path), bogus=1)
        path = self.save_probe(tmp_path)
        with pytest.raises(DataError, match=r"unknown option 'bogus'.*require_signature"):
            self.fmt.verify(path, bogus=1)
        with pytest.raises(DataError, match=r"unknown option 'bogus'.*require_signature"):
            self.fmt.load(path, bogus=1)
        with pytest.raises(DataError, match="verify: level must be one of"):
            self.fmt.verify(path, level="thorough")
        with pytest.raises(DataError, match="load: level must be one of"):
            self.fmt.load(path, level="thorough")

    # -- bytes ----------------------------------------------------------------------------------

    def test_write_result_digest_is_the_file_digest(self, tmp_path):
        result = self.fmt.save({"probe": PROBE}, self.target(tmp_path), gen=1, ts=TS)
        data = Path(result.path).read_bytes()
        assert (result.format, result.size, result.arrays, result.raw_bytes) == (
            self.name, len(data), 1, PROBE.nbytes)
        assert result.sha256 == hashlib.sha256(data).hexdigest()

    def test_same_input_same_bytes_twice_and_across_processes(self, tmp_path):
        script = ("import sys, snapops\n"
                  "from tests.formats.conformance import TS, determinism_state\n"
                  "snapops.save(determinism_state(), sys.argv[1], format=sys.argv[2], gen=2, "
                  "ts=TS)\n")
        outputs = []
        for i in range(2):
            target = self.target(tmp_path / f"run{i}")
            target.parent.mkdir(parents=True)
            subprocess.run([sys.executable, "-c", script, str(target), self.name], check=True,
                           cwd=REPO)
            outputs.append(self.all_bytes(target))
        assert outputs[0] == outputs[1]
        self.fmt.save(determinism_state(), self.target(tmp_path / "run0"), gen=2, ts=TS)
        assert self.all_bytes(self.target(tmp_path / "run0")) == outputs[0]

    def all_bytes(self, path: Path) -> dict[str, bytes]:
        files = sorted(p for p in path.parent.rglob("*") if p.is_file())
        return {p.name: p.read_bytes() for p in files}

    # -- hostile input --------------------------------------------------------------------------

    def test_truncation_anywhere_is_a_typed_error(self, tmp_path):
        path = self.save_probe(tmp_path)
        victim = self.data_file(path)
        data = victim.read_bytes()
        assert len(data) <= self.truncation_limit, "keep the probe file small"
        for cut in representative_offsets(data):
            victim.write_bytes(data[:cut])
            if outcome(self.fmt, path) == "ok":
                assert self.valid_prefix(data[:cut]), f"truncated at {cut} of {len(data)}"

    def valid_prefix(self, prefix: bytes) -> bool:
        """True for a prefix that is a complete file of its own (none by default)."""
        return False

    def test_flipped_bits_never_escape_as_untyped_errors(self, tmp_path):
        path = self.save_probe(tmp_path)
        victim = self.data_file(path)
        data = victim.read_bytes()
        span = self.probe_span(path)
        for at in representative_offsets(data):
            hurt = bytearray(data)
            hurt[at] ^= 0x10
            victim.write_bytes(bytes(hurt))
            result = outcome(self.fmt, path)
            if span and span[0] <= at < span[1] and self.fmt.capabilities.has_integrity:
                assert result != "ok", f"a flipped bit in array data at {at} went unnoticed"

    def test_array_data_is_covered_where_the_format_says_so(self, tmp_path):
        path = self.save_probe(tmp_path)
        span = self.probe_span(path)
        if not self.fmt.capabilities.has_integrity:
            notes = " ".join(self.fmt.verify(path).notes)
            assert re.search(r"no checksum|unchecked|not detectable", notes), notes
            return
        assert span is not None, "the probe's bytes should be findable (store them raw)"

    def test_huge_hostile_file_is_refused_without_allocating_its_claims(self, tmp_path):
        path = self.save_probe(tmp_path)
        victim = self.data_file(path)
        head = victim.read_bytes()[:64]
        junk = np.random.default_rng(3).integers(0, 256, 2 << 20, dtype=np.uint8).tobytes()
        victim.write_bytes(head + junk)
        tracemalloc.start()
        try:
            assert outcome(self.fmt, path) != "ok"
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 64 << 20

    # -- capabilities ---------------------------------------------------------------------------

    def test_signature_capability_is_honoured(self, tmp_path, keydir):
        caps = self.fmt.capabilities
        if caps.can_sign:
            path = self.save_probe(tmp_path, sign_key=keydir / "signing.key")
            good = self.fmt.verify(path, trusted_keys=[keydir / "signing.pub"],
                                   require_signature=True)
            assert good.ok, good.failure
            other = tmp_path / "other"
            from snapops.formats.keys import generate_keys

            generate_keys(other)
            bad = self.fmt.verify(path, trusted_keys=[other / "signing.pub"])
            assert not bad.ok and bad.failure.check == "signature"
            return
        path = self.save_probe(tmp_path)
        report = self.fmt.verify(path, require_signature=True, require_hmac=True)
        assert not report.ok and "carry no signature" in str(report.failure)
        assert "snapops verify REPO --run R" in str(report.failure)
        with pytest.raises(SignatureError, match="carry no signature"):
            self.fmt.load(path, require_signature=True)

    def test_hmac_capability_is_honoured(self, tmp_path, keydir):
        if self.fmt.capabilities.can_hmac:
            path = self.save_probe(tmp_path, hmac_key=keydir / "hmac.key")
            assert self.fmt.verify(path, hmac_key=keydir / "hmac.key", require_hmac=True).ok
            wrong = tmp_path / "wrong.key"
            wrong.write_text("ab" * 32 + "\n")
            assert not self.fmt.verify(path, hmac_key=wrong).ok
            return
        path = self.save_probe(tmp_path)
        report = self.fmt.verify(path, require_hmac=True)
        assert not report.ok and "carry no HMAC" in str(report.failure)
        noted = self.fmt.verify(path, hmac_key=keydir / "hmac.key")
        assert noted.ok and any("HMAC key not used" in n for n in noted.notes)

    def test_mmap_capability_gives_read_only_views(self, tmp_path):
        path = self.save_probe(tmp_path)
        array = self.fmt.load(path)["probe"]
        mapped = isinstance(owner(array), mmap.mmap) and not array.flags.writeable
        assert mapped == self.fmt.capabilities.mmap

    def test_every_verify_level_passes_on_a_good_file(self, tmp_path):
        path = self.save_probe(tmp_path)
        for level in self.fmt.capabilities.verify_levels:
            report = self.fmt.verify(path, level=level)
            assert report.ok, (level, report.failure)

    def test_detect_finds_the_format(self, tmp_path):
        assert detect(self.save_probe(tmp_path)) is self.fmt

    def test_open_lazy_agrees_with_load(self, tmp_path):
        path = self.save_probe(tmp_path)
        snap = self.fmt.load(path)
        with self.fmt.open_lazy(path) as lazy:
            assert sorted(lazy.names) == sorted(snap.arrays)
            for key in lazy.names:
                dtype, shape = lazy.spec(key)
                assert (dtype, shape) == (snap[key].dtype, snap[key].shape)
                assert same_bits(lazy[key], snap[key])

    def test_open_lazy_names_a_missing_array_in_a_typed_error(self, tmp_path):
        path = self.save_probe(tmp_path)
        with self.fmt.open_lazy(path) as lazy:
            for ask in (lambda: lazy["no.such"], lambda: lazy.spec("no.such")):
                with pytest.raises(FormatError, match=r"no such (array|tensor)") as info:
                    ask()
                assert info.value.array == "no.such"

    def test_inspect_table_is_the_same_for_every_format(self, tmp_path):
        path = self.save_probe(tmp_path)
        info = self.fmt.inspect(path)
        json.dumps(info, default=str)
        rows = {r["name"]: r for r in info["arrays"]}
        assert rows["probe"]["dtype"] == "u32" and rows["probe"]["shape"] == [32]
        assert rows["w"]["dtype"] == dtype_name(np.dtype(np.float32)) and rows["w"]["bytes"] == 24
        text = render_inspect(info)
        assert "probe: u32 [32]" in text and "w: f32 [2x3]" in text
        if self.fmt.capabilities.chunk_index:
            assert "chunks" in info or all("chunks" in r for r in rows.values())

    def test_bf16_is_kept_where_declared(self, tmp_path):
        array = np.arange(6, dtype=np.float32).astype(ml_dtypes.bfloat16)
        path = self.fmt.save({"h": array}, self.target(tmp_path)).path
        row = self.fmt.inspect(path)["arrays"][0]
        assert row["dtype"] == "bf16"
        assert ("stored_as" not in row) == self.fmt.capabilities.keeps_bf16
