"""Exit codes of ``snapops verify`` and ``inspect`` as the README states them: 1 when a file was
read and failed a check, 2 when an input or key file cannot be used at all (missing, a
folder, not a key, an age file and no identity) or a declared size is refused before
reading."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.formats.npz_bomb import write_bomb

SNAPOPS = str(Path(sys.executable).with_name("snapops"))


def run_cli(*args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([SNAPOPS, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=120, check=False)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """Keys (keys/), a good snapshot (s.wtxt) and one cut in half (cut.wtxt)."""
    folder = tmp_path_factory.mktemp("exits")
    np.savez(folder / "state.npz", w=np.arange(600, dtype=np.float32))
    for argv in (["keys", "generate", "keys"], ["convert", "state.npz", "s.wtxt"],
                 ["encrypt", "s.wtxt", "s.wtxt.age", "-R", "keys/age.pub"]):
        assert run_cli(*argv, cwd=folder).returncode == 0
    data = (folder / "s.wtxt").read_bytes()
    (folder / "cut.wtxt").write_bytes(data[:len(data) // 2])
    return folder


@pytest.mark.parametrize("argv, said", [
    (["missing.wtxt"], "FAIL missing.wtxt: [io] cannot read: No such file or directory\n"),
    (["keys"], "FAIL keys: [io] not a regular file (a folder)\n"),
    (["s.wtxt", "--hmac-key", "nokey"],
     "snapops: error: nokey: HMAC key: cannot read: No such file or directory\n"),
    (["s.wtxt", "--trusted-key", "nodir/"],
     "snapops: error: nodir: public key: cannot read: No such file or directory\n"),
    (["s.wtxt", "--identity", "noid"],
     "snapops: error: noid: identity: cannot read: No such file or directory\n"),
    (["s.wtxt.age"], "FAIL s.wtxt.age: [keys] age-encrypted: give an identity (--identity FILE) "
                     "to decrypt and verify it\n"),
    (["s.wtxt", "--hmac-key", "keys/age.key"],
     "snapops: error: keys/age.key: expected 64 lowercase hex digits and LF (an HMAC key)\n"),
])
def test_an_input_or_key_that_cannot_be_used_exits_2(work, argv, said):
    proc = run_cli("verify", *argv, cwd=work)
    assert (proc.returncode, proc.stderr) == (2, said)


def test_a_file_that_is_read_and_fails_a_check_exits_1(work):
    proc = run_cli("verify", "cut.wtxt", "--hmac-key", "keys/hmac.key", cwd=work)
    assert proc.returncode == 1
    assert proc.stderr.startswith("FAIL cut.wtxt:") and "[io]" not in proc.stderr


def test_the_other_files_are_still_reported_when_one_is_missing(work):
    proc = run_cli("verify", "s.wtxt", "missing.wtxt", "cut.wtxt", "--json", cwd=work)
    assert proc.returncode == 2
    assert proc.stdout.count('"path"') >= 3 and '"ok": true' in proc.stdout


def test_inspect_refuses_a_bomb_with_exit_2(tmp_path):
    write_bomb(tmp_path / "bomb.npz")
    proc = run_cli("inspect", "bomb.npz", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith("snapops: error: bomb.npz: [limit] array w: expected at most")
