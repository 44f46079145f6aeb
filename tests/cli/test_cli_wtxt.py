"""The snapops CLI for WTXT: convert, verify (text and --json), inspect, keys, exit codes."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import numpy as np
import pytest

from snapops.cli import main
from tests.conftest import sample_state

TS = "2026-01-02T03:04:05Z"


@pytest.fixture
def npz(tmp_path):
    path = tmp_path / "state.npz"
    np.savez(path, **sample_state())
    return path


def test_convert_npz_to_wtxt_and_back(tmp_path, npz, capsys):
    out = tmp_path / "s.wtxt"
    assert main(["convert", str(npz), str(out), "--gen", "4", "--ts", TS, "--row-blocking"]) == 0
    assert "merkle_this=" in capsys.readouterr().out
    assert main(["convert", str(out), str(tmp_path / "back.npz")]) == 0
    with np.load(tmp_path / "back.npz") as back:
        for name, array in sample_state().items():
            assert np.array_equal(back[name], array) and back[name].dtype == array.dtype


def test_convert_safetensors_input(tmp_path):
    from safetensors.numpy import save_file

    state = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "n": np.arange(3, dtype=np.int64)}
    save_file(state, tmp_path / "m.safetensors")
    assert main(["convert", str(tmp_path / "m.safetensors"), str(tmp_path / "m.wtxt"),
                 "--ts", TS]) == 0
    assert main(["convert", str(tmp_path / "m.wtxt"), str(tmp_path / "m2.safetensors")]) == 0
    from safetensors.numpy import load_file

    assert np.array_equal(load_file(tmp_path / "m2.safetensors")["w"], state["w"])


def test_keys_generate_then_sealed_verify(tmp_path, npz, capsys):
    keys = tmp_path / "keys"
    assert main(["keys", "generate", str(keys)]) == 0
    printed = capsys.readouterr().out
    secret = (keys / "signing.key").read_text()
    assert secret.split("\n")[1] not in printed and (keys / "hmac.key").read_text() not in printed
    for name in ("signing.key", "hmac.key", "age.key"):
        assert stat.S_IMODE(os.stat(keys / name).st_mode) == 0o600
    assert main(["keys", "generate", str(keys)]) == 2  # refuses to overwrite
    out = tmp_path / "s.wtxt"
    assert main(["convert", str(npz), str(out), "--ts", TS, "--hmac-key", str(keys / "hmac.key"),
                 "--sign-key", str(keys / "signing.key"), "--audit", 'note="cli"']) == 0
    capsys.readouterr()
    assert main(["verify", str(out), "--hmac-key", str(keys / "hmac.key"), "--trusted-key",
                 str(keys), "--require-signature", "--require-hmac"]) == 0
    assert capsys.readouterr().out.startswith("OK ")


def test_verify_json_reports_first_failure(tmp_path, npz, capsys):
    out = tmp_path / "s.wtxt"
    main(["convert", str(npz), str(out), "--ts", TS])
    data = bytearray(out.read_bytes())
    at = data.index(b"crc32c=", data.index(b"arr name=ids")) + 7
    data[at] = ord("0") if data[at] != ord("0") else ord("1")
    out.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["verify", str(out), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)[0]
    assert report["ok"] is False
    assert report["failure"]["check"] == "crc32c"
    assert report["failure"]["array"] == "ids" and report["failure"]["chunk"] == 0
    assert report["failure"]["line"] == data[:at].count(b"\n") + 1


def test_verify_require_flags_fail_unsealed(tmp_path, npz, capsys):
    out = tmp_path / "s.wtxt"
    main(["convert", str(npz), str(out), "--ts", TS])
    assert main(["verify", str(out)]) == 0
    assert main(["verify", str(out), "--require-signature"]) == 1
    assert main(["verify", str(out), "--require-hmac"]) == 1
    err = capsys.readouterr().err
    assert "[signature]" in err and "[hmac]" in err


def test_inspect_json(tmp_path, npz, capsys):
    out = tmp_path / "s.wtxt"
    main(["convert", str(npz), str(out), "--ts", TS, "--gen", "12", "--row-blocking"])
    capsys.readouterr()
    assert main(["inspect", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["header"]["gen"] == 12
    emb = next(a for a in info["arrays"] if a["name"] == "emb")
    assert emb["shape"] == [40, 24] and emb["rows_per_chunk"] == 256


def test_input_errors_exit_2_with_a_clear_message(tmp_path, capsys):
    bad = tmp_path / "c128.npz"
    np.savez(bad, wide=np.ones(3, np.complex128))
    assert main(["convert", str(bad), str(tmp_path / "x.wtxt")]) == 2
    err = capsys.readouterr().err
    assert "wide" in err and "FOLD, PyCauset, npz and pt keep it" in err and "Traceback" not in err
    assert main(["convert", str(tmp_path / "missing.npz"), str(tmp_path / "x.wtxt")]) == 2
    assert main(["convert", str(bad), str(tmp_path / "x.unknown")]) == 2
    assert not (tmp_path / "x.wtxt").exists()


def test_every_command_help_ends_with_an_example():
    for argv in (["convert"], ["verify"], ["inspect"], ["keys", "generate"], ["bench", "wtxt"]):
        result = subprocess.run([sys.executable, "-m", "snapops", *argv, "--help"],
                                capture_output=True, text=True, check=True)
        assert "example:" in result.stdout and "snapops " in result.stdout.split("example:")[1]


def test_console_script_installed():
    result = subprocess.run(["snapops", "--version"], capture_output=True, text=True,
                            env=dict(os.environ, PATH=os.path.dirname(sys.executable) + ":"
                                     + os.environ["PATH"]))
    assert result.returncode == 0 and result.stdout.startswith("snapops ")


def test_convert_passes_format_options(tmp_path, capsys):
    np.savez(tmp_path / "s.npz", a=np.arange(12.0).reshape(3, 4))
    assert main(["convert", str(tmp_path / "s.npz"), str(tmp_path / "s.finf"),
                 "--option", "checksum=true"]) == 0
    data = (tmp_path / "s.finf").read_bytes()
    import hashlib

    raw = np.arange(12.0).reshape(3, 4).astype("<f8").tobytes()
    assert hashlib.md5(raw).digest()[:8] in data  # the block header carries the MD5
    assert main(["verify", str(tmp_path / "s.finf")]) == 0
    assert main(["convert", str(tmp_path / "s.npz"), str(tmp_path / "t.finf"),
                 "--option", "bogus=1"]) == 2
    assert "bogus" in capsys.readouterr().err
    assert not (tmp_path / "t.finf").exists()
