"""The training-side Snapshotter: pinning, coalescing, blocking, ordering, errors."""

from __future__ import annotations

import threading

import ml_dtypes
import numpy as np
import pytest

from snapops.daemon.client import Snapshotter
from snapops.daemon.lifecycle import DROPPED, SPOOLED
from snapops.daemon.spool import Spool, spool_files
from snapops.daemon.wal import replay
from snapops.formats.errors import DataError, SnapopsError


def _state(value: float = 1.0):
    return {"w": np.full((64, 32), value, np.float32), "step": np.array(int(value), np.int64)}


def _states(spool_dir):
    return {g: x for g, x in replay(spool_dir / "wal.log")[0].gens.items()}


def test_request_pins_a_copy(tmp_path):
    state = _state(1.0)
    with Snapshotter(tmp_path, max_in_flight=4) as snap:
        snap.request(state, 1)
        state["w"][:] = 99.0  # training goes on mutating its arrays
    [(gen, path)] = spool_files(tmp_path)
    with Spool(path) as spool:
        assert gen == 1 and float(spool.arrays()["w"][0, 0]) == 1.0


def test_coalesce_replaces_newest_waiting_and_records_it(tmp_path):
    gate, entered = threading.Event(), threading.Event()
    snap = Snapshotter(tmp_path, max_in_flight=2)
    import snapops.daemon.client as client

    original = client.write_spool

    def slow_write(*args, **kwargs):
        entered.set()
        gate.wait(10)
        return original(*args, **kwargs)

    client.write_spool = slow_write
    try:
        snap.request(_state(1), 1)
        assert entered.wait(10)  # gen 1 is being written; 2..6 wait or coalesce
        for gen in range(2, 7):
            snap.request(_state(gen), gen)
        gate.set()
        snap.close()
    finally:
        client.write_spool = original
    states = _states(tmp_path)
    spooled = sorted(g for g, s in states.items() if s.state == SPOOLED)
    dropped = sorted(g for g, s in states.items() if s.state == DROPPED)
    assert spooled[0] == 1 and spooled[-1] == 6 and len(spooled) == 3
    assert sorted(spooled + dropped) == list(range(1, 7))
    assert all(states[g].fields["reason"] == "coalesced" for g in dropped)


def test_block_policy_never_drops(tmp_path):
    with Snapshotter(tmp_path, max_in_flight=1, policy="block") as snap:
        for gen in range(1, 6):
            snap.request(_state(gen), gen)
    assert all(s.state == SPOOLED for s in _states(tmp_path).values())
    assert [g for g, _ in spool_files(tmp_path)] == [1, 2, 3, 4, 5]


def test_generations_must_increase_across_restarts(tmp_path):
    with Snapshotter(tmp_path) as snap:
        snap.request(_state(), 5)
        with pytest.raises(DataError, match="not greater"):
            snap.request(_state(), 5)
    with Snapshotter(tmp_path) as snap:
        with pytest.raises(DataError, match=r"gen 3 is not greater than"):
            snap.request(_state(), 3)
        snap.request(_state(), 6)


def test_bad_inputs_are_typed_errors(tmp_path):
    with Snapshotter(tmp_path) as snap:
        with pytest.raises(DataError, match=r"array 'o': dtype object cannot be"):
            snap.request({"o": np.array([object()])}, 1)
        with pytest.raises(DataError, match=r"expected a mapping of arrays \(or"):
            snap.request([1, 2], 1)
        with pytest.raises(DataError, match=r"gen must be an int >="):
            snap.request(_state(), -1)
    with pytest.raises(DataError, match=r"policy"):
        Snapshotter(tmp_path, policy="fifo")


def test_spool_failure_surfaces_to_the_trainer(tmp_path):
    import snapops.daemon.client as client

    original = client.write_spool
    client.write_spool = lambda *a, **k: (_ for _ in ()).throw(OSError(28, "No space left"))
    try:
        snap = Snapshotter(tmp_path)
        snap.request(_state(), 1)
        with pytest.raises(SnapopsError, match="No space"):
            snap.close()
    finally:
        client.write_spool = original


def test_torch_tensors_are_pinned(tmp_path):
    import torch  # .ci/setup installs torch==2.13.0 (CPU)

    model = torch.nn.Linear(8, 4)
    with torch.no_grad():
        model.weight.fill_(0.5)
    state = {"lin.w": model.weight, "half": torch.ones(3, dtype=torch.bfloat16) * 1.5}
    with Snapshotter(tmp_path) as snap:
        snap.request(state, 1)
        with torch.no_grad():
            model.weight.fill_(2.0)
        snap.request(model, 2)
    files = dict(spool_files(tmp_path))
    with Spool(files[1]) as spool:
        arrays = spool.arrays()
        assert float(arrays["lin.w"][0, 0]) == 0.5
        assert arrays["half"].dtype == ml_dtypes.bfloat16 and spool.entries[1].logical == "bf16"
        assert int(arrays["half"].view(np.uint16)[0]) == 0x3FC0  # bf16 bits of 1.5
        assert float(arrays["half"][0]) == 1.5
    with Spool(files[2]) as spool:
        assert float(spool.arrays()["weight"][0, 0]) == 2.0
