"""Every format converts to every other: a snapshot read from one file is written to each
format with its arrays bit-exact and their dtypes (stored or recorded), and without the facts
of the file it was read from (a WTXT header's capabilities, digests and chain describe that
file, not the new one)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import snapops
from snapops.cli import main
from snapops.formats.contract import DTYPE_NOTE_KEY, FILE_FACTS

FORMATS = ["wtxt", "aero", "fold", "pycauset", "finf", "npz", "safetensors", "pt"]


def state() -> dict[str, np.ndarray]:
    """Native dtypes of every format, and ones some keep only as a recorded dtype."""
    rng = np.random.default_rng(7)
    return {"w": rng.standard_normal((16, 8)).astype(np.float32),
            "step": np.arange(5, dtype=np.int64), "mask": rng.integers(0, 2, 9, np.uint8),
            "half": rng.standard_normal(6).astype(np.float16),
            "brain": rng.standard_normal((2, 3)).astype(ml_dtypes.bfloat16),
            "flags": rng.integers(0, 2, 7).astype(bool),
            "phase": (rng.standard_normal(3) + 1j).astype(np.complex64),
            "scale": rng.standard_normal(4).astype(ml_dtypes.float8_e4m3fn)}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sources")
    first = folder / "first.wtxt"
    snapops.save(state(), first, gen=3, row_blocking=True)
    read = snapops.load(first)                   # carries the WTXT file's header facts
    # every header field is either a file fact or describes the state (a new field must be
    # sorted into one or the other)
    assert set(read.meta) - FILE_FACTS - {DTYPE_NOTE_KEY} == \
        {"schema", "gen", "ts", "build", "host", "cuda"}
    assert FILE_FACTS <= set(read.meta)
    paths = {}
    for fmt in FORMATS:
        paths[fmt] = folder / f"source.{fmt}"
        snapops.save(read, paths[fmt])
    return paths


@pytest.mark.parametrize("source", FORMATS)
def test_a_snapshot_read_from_any_format_is_written_to_every_format(source, sources,
                                                                    tmp_path):
    read = snapops.load(sources[source])
    for target in FORMATS:
        out = tmp_path / f"out.{target}"
        written = snapops.save(read, out)
        back = snapops.load(out)
        assert back.equal(snapops.formats.model.Snapshot(state())), (source, target)
        own = FILE_FACTS & set(back.meta)
        if target == "wtxt":          # the new file's own facts, not its source's
            assert back.meta["merkle_this"] == written.merkle_this
            assert back.meta["format"] == "wtxt"
        else:
            assert not own, (source, target, sorted(own))
        if target not in ("npz", "safetensors", "pt"):
            assert back.meta["gen"] == 3, (source, target, back.meta)


def test_convert_from_wtxt_to_fold_and_pycauset(sources, tmp_path, capsys):
    for target in ("fold", "pycauset"):
        out = tmp_path / f"out.{target}"
        assert main(["convert", str(sources["wtxt"]), str(out)]) == 0, capsys.readouterr().err
        assert snapops.load(out).equal(snapops.formats.model.Snapshot(state()))
