"""Progress bars (one helper, snapops.cli._common.progress_bar): drawn on stderr only when it
is a terminal and the output is not --json; never on a pipe."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios

import numpy as np

import snapops


def run_on_tty(*argv: str) -> tuple[int, str, str]:
    """Run snapops with stderr on a pseudo-terminal; (exit code, stdout, what the tty got)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "snapops", *argv], stdout=subprocess.PIPE,
                            stderr=slave, text=True)
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:            # EIO: the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    out = proc.stdout.read()
    proc.stdout.close()
    os.close(master)
    return proc.wait(), out, seen.decode(errors="replace")


def test_bars_on_a_terminal_only_and_never_with_json(tmp_path):
    src = tmp_path / "s.npz"
    snapops.save({"w": np.ones((64, 64), np.float32)}, src)
    code, _, tty = run_on_tty("convert", str(src), str(tmp_path / "s.wtxt"))
    assert code == 0 and "convert:" in tty and "/3 " in tty, tty
    code, _, tty = run_on_tty("verify", str(tmp_path / "s.wtxt"), str(src))
    assert code == 0 and "verify" in tty and "%" in tty, tty
    code, out, tty = run_on_tty("verify", "--json", str(tmp_path / "s.wtxt"))
    assert code == 0 and '"ok": true' in out and tty == "", tty
    piped = subprocess.run([sys.executable, "-m", "snapops", "convert", str(src),
                            str(tmp_path / "t.wtxt")], capture_output=True, text=True,
                           check=False)
    assert piped.returncode == 0 and piped.stderr == ""


def test_bench_counts_its_measured_operations_on_a_terminal():
    code, _, tty = run_on_tty("bench", "wtxt", "--size", "256KiB")
    assert code == 0 and "bench wtxt:" in tty and "op" in tty, tty
    code, out, tty = run_on_tty("bench", "wtxt", "--size", "256KiB", "--json")
    assert code == 0 and out.lstrip().startswith("{") and tty == "", tty
