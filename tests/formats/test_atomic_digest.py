"""The digest of what an atomic writer wrote, computed on the way (formats.atomic)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading

import numpy as np
import pytest


from snapops.formats.atomic import DigestingFile, Writeback, atomic_write_digest
from tests.formats.helper_threads import helper_threads, wait_helpers_idle


def pieces() -> list[bytes]:
    rng = np.random.default_rng(1)
    sizes = [3, 1 << 20, 17, 600 << 10, 2 << 20, 5]     # inline and helper-thread pieces
    return [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes]


@pytest.mark.parametrize("stable", [False, True])
def test_digest_of_sequential_writes_is_the_file_digest(tmp_path, stable):
    path = tmp_path / "x.bin"
    with atomic_write_digest(path, stable=stable) as f:
        for piece in pieces():
            f.write(memoryview(piece))
    data = path.read_bytes()
    assert (f.size, f.hexdigest()) == (len(data), hashlib.sha256(data).hexdigest())


def test_a_reused_buffer_is_safe_without_stable(tmp_path):
    buffer = bytearray(1 << 20)
    with atomic_write_digest(tmp_path / "x.bin") as f:
        for value in range(4):
            buffer[:] = bytes([value]) * len(buffer)
            f.write(buffer)
    assert f.hexdigest() == hashlib.sha256((tmp_path / "x.bin").read_bytes()).hexdigest()


def test_patched_files_are_read_back_once(tmp_path):
    path = tmp_path / "x.bin"
    with atomic_write_digest(path, seekable=True) as f:
        f.write(bytes(8))
        for piece in pieces():
            f.write(piece)
        f.seek(0)
        f.write(b"HEADER!!")
        f.seek(0, 2)
    data = path.read_bytes()
    assert data.startswith(b"HEADER!!") and f.hexdigest() == hashlib.sha256(data).hexdigest()


def test_sequential_files_cannot_seek(tmp_path):
    with atomic_write_digest(tmp_path / "x.bin") as f:
        with pytest.raises(OSError, match="seek"):
            f.seek(0)


def test_a_failed_write_leaves_no_file_and_its_helper_idle(tmp_path):
    for _ in range(5):
        with pytest.raises(RuntimeError, match="disk on fire"):
            with atomic_write_digest(tmp_path / "x.bin", stable=True) as f:
                f.write(bytes(2 << 20))
                raise RuntimeError("disk on fire")
        assert list(tmp_path.iterdir()) == []
        wait_helpers_idle()
        assert helper_threads() >= 1


def test_helpers_are_reused_and_one_per_concurrent_writer(tmp_path):
    def write(name: str) -> str:
        with atomic_write_digest(tmp_path / name) as f:
            for _ in range(4):
                f.write(bytes(1 << 20))
        return f.hexdigest()

    write("warm")
    before = helper_threads()
    for n in range(20):
        assert write(f"a{n}") == hashlib.sha256(bytes(4 << 20)).hexdigest()
    assert helper_threads() == before
    writers = [threading.Thread(target=write, args=(f"c{n}",)) for n in range(3)]
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    assert before <= helper_threads() <= before + 3


INTERRUPTED_WRITES = r"""
import faulthandler, os, random, signal, sys, warnings
from snapops.formats.atomic import atomic_write_digest

def interrupt(*_):
    raise KeyboardInterrupt

signal.signal(signal.SIGALRM, interrupt)
sys.unraisablehook = lambda unraisable: None    # landed in a finaliser: nothing to undo
warnings.simplefilter("ignore", ResourceWarning)
faulthandler.dump_traceback_later(60, exit=True)
rng, piece, interrupted = random.Random(7), bytes(1 << 20), 0
for i in range(600):
    try:                # the alarm may also land before the write starts or after it ended
        try:
            signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.0001, 0.004))
            with atomic_write_digest(os.path.join(sys.argv[1], "x.bin"),
                                     stable=bool(i % 2)) as f:
                for _ in range(8):
                    f.write(piece)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except KeyboardInterrupt:
        interrupted += 1
print(interrupted, os.listdir(sys.argv[1]))
"""


def test_ctrl_c_anywhere_in_a_digested_write_never_hangs_it(tmp_path):
    """Ctrl-C lands between any two bytecodes, also just after a `with lock:` took its lock
    (CPython gh-74174): with a thread pool behind the digest, 2 runs in 3 of this loop hung;
    a helper thread started per write raised RuntimeError (Thread.start waits on a lock)."""
    done = subprocess.run([sys.executable, "-c", INTERRUPTED_WRITES, str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    interrupted, left = done.stdout.split(maxsplit=1)
    assert int(interrupted) > 300 and left.strip() in ("[]", "['x.bin']"), done.stdout


def test_digest_before_finish_is_an_error(tmp_path):
    with open(tmp_path / "x.bin", "wb") as raw:
        with pytest.raises(RuntimeError, match="before the file was finished"):
            DigestingFile(raw).hexdigest()


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 3 * 4096 + 7])
def test_file_sha256_over_windows_matches_sha256sum(tmp_path, monkeypatch, size):
    from snapops.formats import integrity

    monkeypatch.setattr(integrity, "_HASH_WINDOW", 4096)   # several windows, each unmapped
    path = tmp_path / "f.bin"
    path.write_bytes(np.random.default_rng(size).integers(0, 256, size, np.uint8).tobytes())
    coreutils = subprocess.run(["sha256sum", str(path)], check=True, capture_output=True,
                               text=True).stdout.split()[0]
    assert integrity.file_sha256(path) == coreutils


def test_file_sha256_refuses_a_fifo(tmp_path):
    from snapops.formats.errors import FormatError
    from snapops.formats.integrity import file_sha256

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(FormatError, match="regular file"):
        file_sha256(fifo)


@pytest.mark.parametrize("stable", [False, True])
def test_durable_sequential_writes_start_writeback_in_steps(tmp_path, monkeypatch, stable):
    from snapops.formats import atomic

    started = []
    real = atomic.writeback_starter()
    assert real is not None                  # Linux: sync_file_range exists

    def recording():
        def start(fd, offset, length):
            started.append((offset, length))
            real(fd, offset, length)
        return start

    monkeypatch.setattr(atomic, "writeback_starter", recording)
    monkeypatch.setattr(Writeback, "STEP", 1 << 20)
    piece = np.random.default_rng(5).integers(0, 256, 300 << 10, np.uint8).tobytes()
    with atomic_write_digest(tmp_path / "x.bin", stable=stable) as f:
        for _ in range(12):
            f.write(piece)
    data = (tmp_path / "x.bin").read_bytes()
    assert data == piece * 12 and f.hexdigest() == hashlib.sha256(data).hexdigest()
    # contiguous ranges from the start, each at least a step, never past what was written
    assert [o for o, _ in started] == [0] + [o + n for o, n in started[:-1]]
    assert all(n >= 1 << 20 for _, n in started) and len(started) == 3
    assert started[-1][0] + started[-1][1] <= len(data)


@pytest.mark.parametrize("options", [dict(durable=False), dict(seekable=True)])
def test_no_writeback_for_throwaway_or_patched_files(tmp_path, monkeypatch, options):
    from snapops.formats import atomic

    started = []
    monkeypatch.setattr(atomic, "writeback_starter",
                        lambda: lambda fd, offset, length: started.append(offset))
    monkeypatch.setattr(Writeback, "STEP", 1 << 20)
    with atomic_write_digest(tmp_path / "x.bin", **options) as f:
        for _ in range(8):
            f.write(bytes(512 << 10))
    assert started == [] and (tmp_path / "x.bin").stat().st_size == 4 << 20


def test_a_forked_child_starts_its_own_helpers(tmp_path):
    """Helpers idle in the parent are not threads in a child (the fuzzer forks): the child
    must not hand its pieces to them and wait forever."""
    write = 'with atomic_write_digest(sys.argv[1] + "/{0}") as f:\n    f.write(bytes(1 << 20))\n'
    script = ("import os, sys\nfrom snapops.formats.atomic import atomic_write_digest\n"
              + write.format("parent") + "pid = os.fork()\nif pid == 0:\n    "
              + write.format("child").replace("\n", "\n    ") + "os._exit(0)\n"
              "os.waitpid(pid, 0)\nprint(sorted(os.listdir(sys.argv[1])))\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True,
                          text=True, timeout=60)
    assert done.stdout.strip() == "['child', 'parent']", done.stderr[-2000:]
