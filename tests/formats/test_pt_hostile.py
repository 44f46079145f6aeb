"""Hostile ``.pt`` pickles that torch itself handles badly: refused by snapops before
``torch.load`` sees them."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import zipfile

import pytest

import snapops
from snapops.formats.errors import FormatError

TIMEOUT = 60     # the unfixed load ran for minutes


def with_pickle(tmp_path, edit) -> str:
    """A real torch.save file whose data.pkl is ``edit(data.pkl)``, re-zipped with right CRCs."""
    import torch

    good = tmp_path / "good.pt"
    torch.save({"w": torch.ones(3)}, good)
    out = io.BytesIO()
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            body = src.read(info)
            dst.writestr(info, edit(body) if info.filename.endswith("data.pkl") else body)
    path = tmp_path / "bad.pt"
    path.write_bytes(out.getvalue())
    return str(path)


def load_in_a_child(path: str) -> subprocess.CompletedProcess:
    """``snapops.load(path)`` in a child that prints the FormatError; a test failure when it
    runs past TIMEOUT (a hang in torch cannot be interrupted in this process)."""
    code = ("import snapops, sys\n"
            "try:\n    snapops.load(sys.argv[1])\n"
            "except snapops.FormatError as exc:\n    print(exc)\n")
    try:
        return subprocess.run([sys.executable, "-c", code, path], capture_output=True,
                              text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"snapops.load of a hostile .pt ran past {TIMEOUT} s")


def long_global(body: bytes) -> bytes:
    assert b"ctorch._utils\n" in body
    return body.replace(b"ctorch._utils\n", b"ctorch" + b"[" * 100_000 + b"\n", 1)


def test_a_huge_global_name_is_refused_before_torch_quotes_it(tmp_path):
    """torch's weights_only error quotes the refused GLOBAL and searches that message with
    backtracking regexes: a 100,000-character name held torch.load for minutes (fuzzer,
    pt-members target, --seed 44 case 252)."""
    path = with_pickle(tmp_path, long_global)
    done = load_in_a_child(path)
    assert re.search(r"a pickle GLOBAL argument of 1000\d\d characters .* got good/data\.pkl "
                     r"at byte \d+$", done.stdout.strip()), (done.stdout, done.stderr[-2000:])
    report = snapops.verify(path)
    assert not report.ok and "GLOBAL argument" in str(report.failure)


def unterminated_global(body: bytes) -> bytes:
    """The GLOBAL's line never ends: torch reads it to the end of the record as the name."""
    start = body.index(b"ctorch._utils\n")
    return body[:start] + b"ctorch._" + b"[" * (len(body) + 80_000)


def test_a_global_line_without_its_newline_is_refused_before_torch_reads_it(tmp_path):
    """pickletools refuses a GLOBAL line with no newline; torch reads the rest of the record
    as the name and quoted 80,000 characters into its backtracking regexes (fuzzer,
    pt-members target, --seed 2703 case 610): the load must not wait for torch to agree."""
    path = with_pickle(tmp_path, unterminated_global)
    done = load_in_a_child(path)
    assert done.stdout.strip().endswith(
        "not a pickle a state_dict is written as; expected pickle opcodes Python's pickletools "
        "reads, got good/data.pkl: no newline found when trying to read stringnl"), \
        (done.stdout, done.stderr[-2000:])
    report = snapops.verify(path)
    assert not report.ok and "pickletools" in str(report.failure)


def test_names_up_to_the_limit_still_load(tmp_path):
    import torch

    from snapops.formats.pt import MAX_PICKLE_TEXT

    name = "n" * MAX_PICKLE_TEXT
    torch.save({name: torch.arange(3)}, tmp_path / "long.pt")
    assert snapops.load(tmp_path / "long.pt")[name].tolist() == [0, 1, 2]
    torch.save({name + "x": torch.arange(3)}, tmp_path / "longer.pt")
    with pytest.raises(FormatError, match="BINUNICODE argument of 1025 characters"):
        snapops.load(tmp_path / "longer.pt")


def test_a_length_past_the_end_of_a_legacy_file_is_refused_without_allocating_it(tmp_path):
    """A legacy (not zip) .pt whose first text length says 4 GiB: the opcode walk read it with
    file.read(n), which allocates n bytes first (MemoryError under the fuzzer's cap, --seed 45
    pt case 1360)."""
    import torch

    legacy = tmp_path / "legacy.pt"
    torch.save({"w": torch.ones(3)}, legacy, _use_new_zipfile_serialization=False)
    data = bytearray(legacy.read_bytes())
    at = data.index(b"X", 2)            # BINUNICODE: 'X', a 4-byte length, the text
    data[at + 1:at + 5] = (0xFFFFFFF0).to_bytes(4, "little")
    legacy.write_bytes(data)
    code = ("import resource, sys, snapops\n"
            "used = int(open('/proc/self/statm').read().split()[0]) * resource.getpagesize()\n"
            "resource.setrlimit(resource.RLIMIT_AS, (used + (1 << 30),) * 2)\n"
            "try:\n    snapops.load(sys.argv[1])\n"
            "except snapops.FormatError as exc:\n    print('typed')\n")
    done = subprocess.run([sys.executable, "-c", code, str(legacy)], capture_output=True,
                          text=True, timeout=TIMEOUT)
    assert done.stdout.strip() == "typed", done.stderr[-2000:]


# -- shapes numpy cannot hold, lazy CRC-32s, records shorter than their storage, Ctrl-C -----

def expect_everywhere(path, error, why: str) -> None:
    """verify fails with ``why``; load, inspect and open_lazy raise ``error`` matching it."""
    from snapops.formats.registry import handler

    report = snapops.verify(path)
    assert not report.ok and isinstance(report.failure, error), report
    assert re.search(why, str(report.failure)), report.failure
    for verb in (snapops.load, snapops.inspect, handler("pt").open_lazy):
        with pytest.raises(error, match=why):
            verb(path)


def test_an_empty_tensor_numpy_cannot_hold_is_a_limit_error(tmp_path):
    """torch holds an empty (0, 2**62) tensor; numpy refuses that shape with a bare
    ValueError, which escaped load, inspect and open_lazy while verify said ok."""
    import torch

    from snapops.formats.errors import LimitError

    path = tmp_path / "x.pt"
    torch.save({"w": torch.empty(0, 2**62), "v": torch.ones(2)}, path)
    expect_everywhere(path, LimitError, r"x\.pt: \[limit\] array w: expected dimensions "
                                        r"spanning at most \d+ bytes, got shape 0x4611")


def test_empty_tensors_of_ordinary_shapes_still_load(tmp_path):
    import torch

    path = tmp_path / "e.pt"
    torch.save({"w": torch.empty(0, 1 << 20), "s": torch.empty(0)}, path)
    snap = snapops.load(path)
    assert snap["w"].shape == (0, 1 << 20) and snap["s"].shape == (0,)
    assert snapops.verify(path).ok


def flip_in_record(path, needle: bytes) -> None:
    data = bytearray(path.read_bytes())
    at = data.find(needle)
    assert at > 0 and data.find(needle, at + 1) < 0
    data[at] ^= 1
    path.write_bytes(bytes(data))


def test_the_lazy_reader_checks_a_record_crc_before_returning_its_tensor(tmp_path):
    """open_lazy returned 10.000001 for a flipped bit that load and verify refuse."""
    import numpy as np

    from snapops.formats.registry import handler

    path = tmp_path / "lz.pt"
    snapops.save({"w": np.arange(64, dtype=np.float32), "v": np.full(3, 7, np.int16)}, path)
    flip_in_record(path, np.float32(10).tobytes())
    with handler("pt").open_lazy(path) as lazy:
        assert lazy["v"].tolist() == [7, 7, 7]            # its own record is intact
        for _ in range(2):                                 # refused again, not cached as good
            with pytest.raises(FormatError, match=r"lz\.pt: \[crc32\] array w: a record does "
                                                  r"not match its CRC-32 \(archive/data/\d\)"):
                lazy["w"]
        assert lazy.spec("w")[1] == (64,)                  # shapes need no data
    with pytest.raises(FormatError, match=r"\[crc32\] a record does not match its CRC-32"):
        snapops.load(path)


def test_the_lazy_reader_names_a_missing_array(tmp_path):
    import numpy as np

    from snapops.formats.registry import handler

    path = tmp_path / "m.pt"
    snapops.save({"w": np.ones(2, np.float32)}, path)
    with handler("pt").open_lazy(path) as lazy:
        for get in (lazy.__getitem__, lazy.spec):
            with pytest.raises(FormatError, match=r"m\.pt: \[grammar\] array nope: no such "
                                                  r"array; expected one of w, got nope"):
                get("nope")


def storage_twice_its_record(body: bytes) -> bytes:
    """The first tensor (and its storage) declares 8 floats; its record holds 4."""
    grown = body.replace(b"cpuq\x06K\x04t", b"cpuq\x06K\x08t", 1) \
        .replace(b"QK\x00K\x04\x85", b"QK\x00K\x08\x85", 1)
    assert grown.count(b"K\x08") == 2
    return grown


def test_a_storage_longer_than_its_record_is_refused(tmp_path):
    """torch's mmap load takes ``numel`` bytes from where a record starts without comparing
    the record's size: the tensor got the bytes of the records after it, and verify said ok."""
    import torch

    good = tmp_path / "good.pt"
    torch.save({"a": torch.arange(4.0), "b": torch.arange(100.0, 104.0)}, good)
    path = tmp_path / "short.pt"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            body = src.read(info)
            dst.writestr(info, storage_twice_its_record(body)
                         if info.filename.endswith("data.pkl") else body)
    expect_everywhere(path, FormatError, r"short\.pt: \[grammar\] array a: tensor storage "
                                         r"is not the record it names; expected a stored "
                                         r"record of 32 bytes .* got good/data/0 of 16 bytes")


INTERRUPTED_SAVE = r"""
import os, signal, sys
import numpy as np
import snapops

target = os.path.join(sys.argv[1], "kb.pt")
snapops.save({"old": np.ones(2, np.float32)}, target)
big = {f"a{i}": np.zeros(1 << 22, np.float32) for i in range(16)}
warm = os.path.join(sys.argv[1], "warm.pt")     # imports done: the interrupt lands in writes
snapops.save(big, warm)
os.unlink(warm)

armed = False

def interrupt(*_):
    if armed:       # a timer that fired as the save ended must not hit the reset below
        raise KeyboardInterrupt

signal.signal(signal.SIGALRM, interrupt)
for delay in (0.02, 0.05, 0.1, 0.2):
    try:
        try:
            armed = True
            signal.setitimer(signal.ITIMER_REAL, delay)
            snapops.save(big, target)
        finally:
            armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)
    except BaseException as exc:
        left = sorted(os.listdir(sys.argv[1]))
        print(type(exc).__name__, list(snapops.load(target).arrays), left)
        break
    snapops.save({"old": np.ones(2, np.float32)}, target)     # finished: put it back
else:
    print("never interrupted")
"""


def test_a_ctrl_c_torch_turned_into_its_error_comes_out_as_itself():
    """A Ctrl-C handled as Python enters the sink's ``write``, before it can keep it: torch's
    RuntimeError ("unexpected pos") names it as its context, and the save raises it."""
    import io

    import torch
    from snapops.formats.pt import _RaisingSink

    class Interrupted(io.BytesIO):
        calls = 0

        def write(self, data):
            self.calls += 1
            if self.calls == 3:
                raise KeyboardInterrupt
            return super().write(data)

    with pytest.raises(RuntimeError, match="unexpected pos") as failed:
        torch.save({"a": torch.zeros(1000)}, Interrupted())
    with pytest.raises(KeyboardInterrupt):
        _RaisingSink(io.BytesIO()).reraise(failed.value)
    _RaisingSink(io.BytesIO()).reraise(RuntimeError("no context"))      # nothing to raise


def test_ctrl_c_during_a_save_is_a_keyboard_interrupt(tmp_path):
    """torch's C++ zip writer swallowed a KeyboardInterrupt raised in snapops' write and
    failed with RuntimeError "unexpected pos"; the old file survives, no temp file stays."""
    done = subprocess.run([sys.executable, "-c", INTERRUPTED_SAVE, str(tmp_path)],
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert done.stdout.strip() == "KeyboardInterrupt ['old'] ['kb.pt']", \
        (done.stdout, done.stderr[-2000:])


FULL_DISK = r"""
import os, resource, signal, sys
import numpy as np
import snapops
from snapops.formats.registry import handler

target = os.path.join(sys.argv[1], "fs.pt")
snapops.save({"old": np.ones(2, np.float32)}, target)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)       # writes past the limit fail with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (4 << 20, resource.RLIM_INFINITY))
big = {f"a{i}": np.zeros(1 << 20, np.float32) for i in range(4)}
for save in (handler("pt").save, snapops.save):
    try:
        save(big, target)
    except BaseException as exc:
        print(type(exc).__name__, exc)
print(list(snapops.load(target).arrays), sorted(os.listdir(sys.argv[1])))
"""


def test_a_write_error_during_a_save_comes_through_as_itself(tmp_path):
    """An OSError from the file (here: past RLIMIT_FSIZE, as a full disk) is no torch
    RuntimeError: the format raises it, snapops.save makes it its one-line DataError."""
    done = subprocess.run([sys.executable, "-c", FULL_DISK, str(tmp_path)],
                          capture_output=True, text=True, timeout=TIMEOUT)
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 3, (done.stdout, done.stderr[-2000:])
    assert re.fullmatch(r"OSError \[Errno 27\] File too large", lines[0]), lines
    assert re.fullmatch(r"DataError .*fs\.pt: cannot write: File too large", lines[1]), lines
    assert lines[2] == "['old'] ['fs.pt']", lines
