"""Snapshotter arguments are untrusted: each bad one is a typed one-line error at the call that got
it, never a spool file the daemon refuses, a dead spool thread or a hang."""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest

from snapops.daemon import client
from snapops.daemon.client import Snapshotter
from snapops.daemon.lifecycle import DROPPED
from snapops.daemon.spool import MAX_GEN, MAX_HEADER, Spool, spool_files
from snapops.daemon.wal import replay
from snapops.formats.errors import ConfigError, DataError
from snapops.formats.generation.plan import Shard


def within(seconds: float, fn, *args, **kwargs):
    """fn's result (or its exception, raised here); a hang fails the test instead of hanging."""
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # handed to the test thread
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{getattr(fn, '__name__', fn)} hung for {seconds} s"
    if "error" in out:
        raise out["error"]
    return out.get("value")


def _spooled(folder) -> dict:
    found = {}
    for gen, path in spool_files(folder):
        with Spool(path) as spool:   # the daemon's own reader accepts every file
            found[gen] = sorted(spool.arrays())
    return found


@pytest.mark.parametrize("state, gen, says", [
    ({"a\nb": np.ones(2)}, 1, r"array 'a\\nb' name: expected 1 to 1024 printable characters"),
    ({"": np.ones(2)}, 1, r"array '' name: expected 1 to 1024 printable"),
    ({"x" * 1025: np.ones(2)}, 1, r"name: expected 1 to 1024 printable"),
    ({"deep": np.ones((1,) * 33)}, 1, r"array 'deep' shape: expected a list of at most 32 sizes"),
    ({"ld": np.ones(2, np.longdouble)}, 1,
     r"array 'ld': dtype float128 cannot be snapshotted \(a spool holds f16, .*c64, f8e4m3fn"),
    ({"w": np.ones(2)}, MAX_GEN + 1, r"gen: expected an integer in 0\.\.999999999999999999"),
    ({"w": np.ones(2)}, 10**30, r"gen: expected an integer in 0\.\."),
    ({"rag": [[1], [1, 2]]}, 1, r"array 'rag': expected an array or tensor, got list"),
    ({"sh": Shard(np.ones(2), global_shape=(2**70,), offsets=(0,))}, 1,
     r"array 'sh' global_shape: expected an integer in 0\.\."),
])
def test_request_refuses_what_the_daemon_would_refuse(tmp_path, state, gen, says):
    with Snapshotter(tmp_path) as snap:
        with pytest.raises(DataError, match=says):
            snap.request(state, gen)
        snap.request({"ok": np.ones(2)}, MAX_GEN)   # it goes on working, up to the last gen
        assert snap.flush(timeout=30)
    assert _spooled(tmp_path) == {MAX_GEN: ["ok"]}


def test_a_header_over_the_spool_limit_is_refused_at_request(tmp_path):
    names = [f"{i:05d}" + "x" * 1000 for i in range(MAX_HEADER // 1000 + 100)]
    with Snapshotter(tmp_path) as snap:
        with pytest.raises(DataError, match=r"spool header: expected under 16777216 bytes"):
            snap.request({n: np.zeros(0, np.float32) for n in names}, 1)
    assert spool_files(tmp_path) == []


def test_every_dtype_comes_back_from_the_spool_with_its_value_whatever_its_byte_order(tmp_path):
    import ml_dtypes

    state = {"c": np.array([1 + 2j, -3.5j], ">c8"), "c_le": np.array([1 + 2j], "<c8"),
             "h": np.array([1.5, -2], ">f2"), "i": np.arange(3, dtype=">i8"),
             "f8": np.array([0.5, 448], ml_dtypes.float8_e4m3fn),
             "bf": np.array([1.5, -0.25], ml_dtypes.bfloat16)}
    with Snapshotter(tmp_path) as snap:
        snap.request(state, 1)
    [(_, path)] = spool_files(tmp_path)
    with Spool(path) as spool:
        back = spool.arrays()
        for name, array in state.items():
            assert back[name].dtype == array.dtype.newbyteorder("<"), name
            assert np.array_equal(back[name], array), name
        del back


def _torch_cases():
    import torch

    with warnings.catch_warnings():   # torch deprecates quantized tensors, calls chalf new
        warnings.simplefilter("ignore")
        quantized = torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8)
        chalf = torch.ones(2, dtype=torch.complex32)
    return [
        (torch.ones(2, dtype=torch.complex128), r"array 't': dtype complex128 cannot be"),
        (chalf, r"array 't': torch dtype complex32 has no exact"),
        (quantized, r"array 't': .*quantized tensors are not supported"),
        (torch.ones(2, device="meta"), r"array 't': cannot copy the tensor to the CPU"),
        (torch.ones(2).to_sparse(), r"array 't': torch.sparse_coo .* not supported"),
    ]


def test_torch_tensors_the_spool_cannot_hold_are_data_errors(tmp_path):
    with Snapshotter(tmp_path) as snap:
        for tensor, says in _torch_cases():
            with pytest.raises(DataError, match=says):
                snap.request({"t": tensor}, 1)
        snap.request({"t": _torch_cases()[0][0].real.contiguous()}, 1)
    assert _spooled(tmp_path) == {1: ["t"]}


@pytest.mark.parametrize("options, error, says", [
    ({"spool_nice": "x"}, ConfigError, r"spool_nice: expected an int in -20\.\.19"),
    ({"spool_nice": None}, ConfigError, r"spool_nice: expected an int"),
    ({"spool_nice": 2**70}, ConfigError, r"spool_nice: expected an int in -20\.\.19"),
    ({"spool_nice": True}, ConfigError, r"spool_nice: expected an int"),
    ({"max_in_flight": "x"}, DataError, r"max_in_flight: expected an int >= 1, got 'x'"),
    ({"max_in_flight": None}, DataError, r"max_in_flight: expected an int >= 1, got None"),
    ({"max_in_flight": 0}, DataError, r"max_in_flight: expected an int >= 1, got 0"),
    ({"clock": None}, ConfigError, r"clock: expected a callable returning seconds"),
    ({"policy": np.array([1, 2])}, DataError, r"policy: expected coalesce or block"),
])
def test_bad_constructor_options_are_refused_up_front(tmp_path, options, error, says):
    with pytest.raises(error, match=says):
        snap = within(20, Snapshotter, tmp_path, **options)
        within(20, snap.close)    # (before the fix: got here, with a dead spool thread)
    with Snapshotter(tmp_path) as snap:   # nothing was left holding the spool
        snap.request({"w": np.ones(2)}, 1)


@pytest.mark.parametrize("spool_dir, says", [
    (None, r"^spool_dir: expected a str or os.PathLike, got NoneType$"),
    ("", r"^spool_dir: expected a file name, got an empty string$"),
    (b"spool", r"^spool_dir: expected a str or os.PathLike, got bytes$"),
    ("/dev/null/x", r"^spool_dir /dev/null/x: expected a folder that exists or can be created, "
                    r"got Not a directory$"),
    ("a\0b", r"^'a\\x00b': a spool_dir cannot hold a NUL byte$"),
])
def test_a_bad_spool_dir_is_a_config_error(spool_dir, says):
    with pytest.raises(ConfigError, match=says):
        Snapshotter(spool_dir)


@pytest.mark.parametrize("clock, says", [
    (lambda: "x", r"clock\(\) returned 'x': expected seconds since the epoch"),
    (lambda: 1e300, r"clock\(\) returned 1e\+300: expected seconds"),
    (lambda: float("nan"), r"clock\(\) returned nan: expected seconds"),
    (lambda: -1, r"clock\(\) returned -1: expected seconds"),
    (lambda: 1 / 0, r"clock\(\) raised ZeroDivisionError: division by zero"),
])
def test_a_bad_clock_is_a_config_error_at_request(tmp_path, clock, says):
    with Snapshotter(tmp_path, clock=clock) as snap:
        with pytest.raises(ConfigError, match=says):
            snap.request({"w": np.ones(2)}, 1)
    assert spool_files(tmp_path) == []


def _with_a_broken_spool(folder) -> tuple[Snapshotter, threading.Event]:
    """A Snapshotter whose spool thread raises (a bug) once ``gate`` is set."""
    snap = Snapshotter(folder, policy="block", max_in_flight=1)
    gate = threading.Event()

    def broken(item):
        gate.wait(10)
        raise RuntimeError("boom")

    snap._spool = broken
    return snap, gate


def test_a_dead_spool_thread_fails_every_call_and_never_hangs(tmp_path):
    snap, gate = _with_a_broken_spool(tmp_path)
    snap.request({"w": np.ones(2)}, 1)
    snap.request({"w": np.ones(2)}, 2)   # waits behind gen 1
    gate.set()
    with pytest.raises(client.SpoolThreadDied,
                       match=r"the spool thread died \(RuntimeError: boom\); "
                             r"generations \[1, 2\] were not spooled"):
        within(20, snap.flush, timeout=15)
    with pytest.raises(client.SpoolThreadDied, match=r"RuntimeError: boom"):
        within(20, snap.request, {"w": np.ones(2)}, 3)
    with pytest.raises(client.SpoolThreadDied, match=r"RuntimeError: boom"):
        within(20, snap.close)
    gens = replay(tmp_path / "wal.log")[0].gens
    assert gens[1].state == gens[2].state == DROPPED
    assert gens[1].fields["reason"] == "spool_failed"
    with Snapshotter(tmp_path) as again:   # the lock was released
        again.request({"w": np.ones(2)}, 4)
    assert list(_spooled(tmp_path)) == [4]


def test_a_blocked_request_wakes_when_the_spool_thread_dies(tmp_path):
    snap, gate = _with_a_broken_spool(tmp_path)
    snap.request({"w": np.ones(2)}, 1)
    snap.request({"w": np.ones(2)}, 2)
    threading.Timer(0.2, gate.set).start()
    with pytest.raises(client.SpoolThreadDied, match=r"RuntimeError: boom"):
        within(20, snap.request, {"w": np.ones(2)}, 3)   # blocked for room, then woken
    with pytest.raises(client.SpoolThreadDied, match=r"RuntimeError: boom"):
        within(20, snap.close)


@pytest.mark.parametrize("timeout", ["x", -1, float("nan"), True])
def test_a_bad_flush_timeout_is_a_data_error(tmp_path, timeout):
    with Snapshotter(tmp_path) as snap:
        with pytest.raises(DataError, match=r"timeout: expected seconds in 0\.\."):
            snap.flush(timeout)
        with pytest.raises(DataError, match=r"timeout: expected seconds in 0\.\."):
            snap.close(timeout)


@pytest.mark.parametrize("options, says", [
    ({"global_shape": "84", "offsets": (1,)}, r"global_shape: expected a sequence of int"),
    ({"global_shape": (8,), "offsets": (1.7,)}, r"offsets: expected a sequence of integers"),
    ({"global_shape": (8.0,), "offsets": (1,)}, r"global_shape: expected a sequence of integers"),
    ({"global_shape": (True,), "offsets": (0,)}, r"global_shape: expected a sequence of integers"),
    ({"global_shape": (8,), "offsets": ("1",)}, r"offsets: expected a sequence of integers"),
    ({"global_shape": (8,), "offsets": (-1,)}, r"offsets: expected integers >= 0"),
    ({"global_shape": 8, "offsets": (1,)}, r"global_shape: expected a sequence of integers"),
])
def test_shard_dims_must_be_real_integers(options, says):
    with pytest.raises(DataError, match=says):
        Shard(np.ones(2), **options)


def test_shard_dims_take_numpy_integers_and_lists():
    shard = Shard(np.ones(2), global_shape=[np.int64(8)], offsets=(np.uint8(1),))
    assert shard.global_shape == (8,) and shard.offsets == (1,)
    assert type(shard.global_shape[0]) is int
    with pytest.raises(DataError, match=r"Shard: local: expected a numpy array or a torch"):
        Shard("ab", global_shape=(8,), offsets=(0,))
