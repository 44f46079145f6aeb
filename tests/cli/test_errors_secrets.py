"""Key material never appears in a message: a key file passed where another file belongs, a
key value given instead of its path (flag, environment or config), a cut identity. Each test
runs the installed ``snapops`` and looks for the secret in everything it printed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SNAPOPS = str(Path(sys.executable).with_name("snapops"))


def run_cli(*args, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([SNAPOPS, *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A folder with fresh keys (keys/) and a converted snapshot (s.wtxt)."""
    folder = tmp_path_factory.mktemp("secrets")
    np.savez(folder / "state.npz", w=np.arange(6, dtype=np.float32))
    for argv in (["keys", "generate", "keys"], ["convert", "state.npz", "s.wtxt"]):
        assert run_cli(*argv, cwd=folder).returncode == 0
    return folder


def secret_of(path: Path) -> str:
    return path.read_text().strip()


def assert_not_echoed(secret: str, proc: subprocess.CompletedProcess) -> None:
    said = proc.stdout + proc.stderr
    # any 24-character piece of the secret would already be too much
    pieces = {secret[i:i + 24] for i in range(0, max(len(secret) - 24, 0) + 1, 8)}
    assert not [p for p in pieces if p in said], said


def test_an_hmac_key_given_as_recipients_file_is_named_not_shown(work):
    proc = run_cli("encrypt", "s.wtxt", "x.age", "-R", "keys/hmac.key", cwd=work)
    assert proc.returncode == 2
    assert proc.stderr.startswith("snapops: error: keys/hmac.key:1: unsupported recipient")
    assert "looks like key material" in proc.stderr
    assert_not_echoed(secret_of(work / "keys/hmac.key"), proc)
    assert not (work / "x.age").exists()


def test_an_age_identity_cut_by_one_character_is_not_shown(work):
    cut = secret_of(work / "keys/age.key")[1:]
    (work / "cut.key").write_text(cut + "\n")
    proc = run_cli("encrypt", "s.wtxt", "x.age", "-R", "cut.key", cwd=work)
    assert proc.returncode == 2 and "cut.key:1:" in proc.stderr, proc.stderr
    assert_not_echoed(cut, proc)


def test_an_unknown_recipient_names_only_its_key_type(work):
    proc = run_cli("encrypt", "s.wtxt", "x.age", "-r", "ssh-dss AAAAB3NzaC1kc3MAAACBAPx1",
                   cwd=work)
    assert proc.returncode == 2
    assert "unsupported recipient of key type 'ssh-dss': expected" in proc.stderr
    assert "AAAAB3" not in proc.stderr


@pytest.mark.parametrize("flag, key", [("--hmac-key", "hmac.key"), ("--trusted-key", "signing.key"),
                                       ("--identity", "age.key")])
def test_verify_refuses_a_key_value_given_as_a_path_without_repeating_it(work, flag, key):
    secret = secret_of(work / "keys" / key)
    proc = run_cli("verify", "s.wtxt", flag, secret, cwd=work)
    assert proc.returncode == 2, proc.stderr
    assert "looks like key material, not a path" in proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert_not_echoed(secret, proc)


def test_decrypt_refuses_an_identity_value_without_repeating_it(work):
    secret = secret_of(work / "keys/age.key")
    proc = run_cli("decrypt", "x.age", "out.wtxt", "--identity", secret, cwd=work)
    assert proc.returncode == 2
    assert "identity: looks like key material" in proc.stderr, proc.stderr
    assert_not_echoed(secret, proc)


def daemon_config(folder: Path, hmac_key: str) -> Path:
    config = folder / "snapops.toml"
    config.write_text(f'[seal]\nhmac_key = "{hmac_key}"\n[repo]\npath = "repo"\n')
    return config


def test_the_daemon_names_the_setting_when_the_environment_holds_the_key(work, tmp_path):
    secret = secret_of(work / "keys/hmac.key")
    config = daemon_config(tmp_path, str(work / "keys/hmac.key"))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SNAPOPS_SEAL_HMAC_KEY": secret}
    proc = run_cli("daemon", "run", "--config", config, cwd=tmp_path, env=env)
    assert proc.returncode == 2
    assert proc.stderr == ("snapops: error: seal.hmac_key: looks like key material, not a path "
                           "(not shown): give the path of the key file\n")
    assert_not_echoed(secret, proc)


def test_the_daemon_names_the_setting_when_the_config_holds_the_key(work, tmp_path):
    secret = secret_of(work / "keys/hmac.key")
    proc = run_cli("daemon", "run", "--config", daemon_config(tmp_path, secret), cwd=tmp_path)
    assert proc.returncode == 2 and "seal.hmac_key: looks like key material" in proc.stderr
    assert_not_echoed(secret, proc)


def test_a_key_setting_of_the_wrong_type_is_not_repeated(tmp_path):
    digits = "1234567890" * 4
    (tmp_path / "snapops.toml").write_text(f"[seal]\nhmac_key = {digits}\n")
    proc = run_cli("daemon", "run", "--config", "snapops.toml", cwd=tmp_path)
    assert proc.returncode == 2
    assert "seal.hmac_key: expected str, got int" in proc.stderr and digits not in proc.stderr


def test_a_missing_key_file_at_a_plain_path_is_still_named(work):
    proc = run_cli("verify", "s.wtxt", "--hmac-key", "keys/nokey", cwd=work)
    assert proc.returncode == 2
    assert proc.stderr == ("snapops: error: keys/nokey: HMAC key: cannot read: No such file or "
                           "directory\n")


def test_an_existing_key_file_whose_name_looks_like_a_key_is_read(work, tmp_path):
    named = tmp_path / ("ab12" * 16)
    named.write_bytes((work / "keys/hmac.key").read_bytes())
    converted = run_cli("convert", work / "state.npz", "h.wtxt", "--hmac-key", named.name,
                        cwd=tmp_path)
    assert converted.returncode == 0, converted.stderr
    proc = run_cli("verify", "h.wtxt", "--hmac-key", named.name, "--require-hmac", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
