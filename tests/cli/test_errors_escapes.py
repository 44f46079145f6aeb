"""Bytes from untrusted files and names never reach the terminal raw: terminal escapes,
newlines, NULs and other controls in a file's content, in an array name or in a file name are
printed escaped (``\\x1b``, ``\\n``) by errors, ``verify`` and ``inspect``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import snapops
from snapops.formats.errors import printable

SNAPOPS = str(Path(sys.executable).with_name("snapops"))
EVIL_NAME = "\x1b[2J\x1b[31mevil\nfake line"
# every C0 control but the newline that ends a line, DEL, and the C1 block (CSI is \x9b)
RAW_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def run_cli(*args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([SNAPOPS, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          errors="surrogateescape", timeout=120, check=False)


def assert_clean(proc: subprocess.CompletedProcess) -> None:
    """No raw control character in what was printed (newlines only end lines)."""
    assert not RAW_CONTROL.search(proc.stdout + proc.stderr), repr(proc.stdout + proc.stderr)


@pytest.fixture()
def snapshot(tmp_path) -> Path:
    np.savez(tmp_path / "state.npz", w=np.arange(6, dtype=np.float32))
    assert run_cli("convert", "state.npz", "s.wtxt", cwd=tmp_path).returncode == 0
    return tmp_path / "s.wtxt"


def test_printable_escapes_controls_and_leaves_plain_text_alone():
    assert printable("x.wtxt:3: [crc32c] expected 1a2b, got 3c4d") == \
        "x.wtxt:3: [crc32c] expected 1a2b, got 3c4d"
    assert printable("a\x00b\x7fc\x9bd\u202ee\nf") == "a\\x00b\\x7fc\\x9bd\\u202ee\\nf"
    assert printable(printable(EVIL_NAME)) == printable(EVIL_NAME)
    assert printable("poids_é.wtxt") == "poids_é.wtxt"


def test_verify_escapes_a_terminal_escape_at_the_start_of_a_file(tmp_path):
    (tmp_path / "esc.wtxt").write_bytes(b"\x1b[31mRED\n")
    proc = run_cli("verify", "esc.wtxt", cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr == "FAIL esc.wtxt:1: [grammar] expected WTXT 1, got \\x1b[31mRED\n"


def test_inspect_escapes_a_header_field_holding_an_escape(snapshot):
    data = snapshot.read_bytes()
    assert b" build=unknown " in data
    snapshot.write_bytes(data.replace(b" build=unknown ", b" build=\x1b[31mX ", 1))
    proc = run_cli("inspect", snapshot.name, cwd=snapshot.parent)
    assert proc.returncode == 2
    assert_clean(proc)
    assert "build=\\x1b[31mX" in proc.stderr and proc.stderr.count("\n") == 1


def test_inspect_escapes_array_names(tmp_path):
    snapops.save({EVIL_NAME: np.ones(2, dtype=np.float32)}, tmp_path / "evil.fold")
    proc = run_cli("inspect", "evil.fold", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert_clean(proc)
    assert "  \\x1b[2J\\x1b[31mevil\\nfake line: f32 [2]" in proc.stdout
    assert not any(line.startswith("fake line") for line in proc.stdout.splitlines())


def test_binary_input_is_shown_escaped_by_convert_verify_and_inspect(tmp_path):
    (tmp_path / "bin.wtxt").write_bytes(b"BIN\x00\x01\x1b[2J\x7f\xc2\x9bend\nmore")
    for argv in (["convert", "bin.wtxt", "out.wtxt"], ["verify", "bin.wtxt"],
                 ["inspect", "bin.wtxt"]):
        proc = run_cli(*argv, cwd=tmp_path)
        assert proc.returncode in (1, 2) and proc.stderr.count("\n") == 1, proc.stderr
        assert_clean(proc)
        assert proc.stderr.endswith(
            "bin.wtxt:1: [grammar] expected WTXT 1, got BIN\\x00\\x01\\x1b[2J\\x7f\\xc2\\x9bend\n")
    assert not (tmp_path / "out.wtxt").exists()


def test_a_file_name_with_a_newline_stays_on_its_line(snapshot):
    odd = snapshot.with_name("new\nline\x1b[1m.wtxt")
    snapshot.rename(odd)
    verified = run_cli("verify", odd.name, cwd=odd.parent)
    assert verified.returncode == 0, verified.stderr
    assert verified.stdout.splitlines()[0].startswith("OK new\\nline\\x1b[1m.wtxt: wtxt,")
    inspected = run_cli("inspect", odd.name, cwd=odd.parent)
    assert inspected.stdout.startswith("new\\nline\\x1b[1m.wtxt: wtxt\n")
    missing = run_cli("inspect", "gone\n\x1b[2J.wtxt", cwd=odd.parent)
    assert missing.returncode == 2
    for proc in (verified, inspected, missing):
        assert_clean(proc)
