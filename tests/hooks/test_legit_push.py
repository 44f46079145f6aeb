"""What the daemon pushes is accepted by the real, installed pre-receive that requires
signatures and HMACs, for every shard format, age-armored (a text and a binary format), and
across a key rotation (a new key added to the trusted folder, the daemon restarted with it)."""

from __future__ import annotations

import numpy as np
import pytest

from snapops.formats.generation import parse_manifest
from snapops.formats.keys import generate_keys, keyid, load_public_key

from ..daemon.daemon_env import DaemonEnv, state_for
from .genrepo import Repo, git_env, guarded_remote

FORMATS = ["wtxt", "fold", "aero", "pycauset", "finf"]


def run_daemon(env: DaemonEnv, states: dict[int, dict]) -> None:
    env.push_all(states, what="generations accepted by the guarded remote")


def verified_remotely(remote: Repo, keys) -> None:
    """The remote's history as CI checks it, and its newest generation as a whole."""
    flags = ["--trusted-key", str(keys / "signing.pub"), "--hmac-key", str(keys / "hmac.key"),
             "--require-signature", "--require-hmac"]
    ci = remote.snapops("verify", "--ci", "--range", "main", *flags)
    assert ci.returncode == 0 and "snapops ci: OK" in ci.stderr, ci.stderr
    whole = remote.snapops("verify", str(remote.path), "--run", "t", *flags)
    assert whole.returncode == 0 and whole.stdout.startswith("OK snapshots/t/MANIFEST"), \
        whole.stderr


# age armor wraps any shard the same way: armored once as text and once as a binary format
CASES = [(fmt, False) for fmt in FORMATS] + [("wtxt", True), ("aero", True)]


@pytest.mark.parametrize(("fmt", "armored"), CASES,
                         ids=[f"{fmt}-{'age' if armored else 'plain'}" for fmt, armored in CASES])
def test_daemon_pushes_are_accepted(tmp_path, fmt, armored):
    env = DaemonEnv(tmp_path, {}, fmt=fmt)
    remote = guarded_remote(tmp_path / "remote.git", git_env(tmp_path), env.keys)
    text = env.config.read_text().replace("[push]", f'[[repo.remote]]\nname = "origin"\n'
                                                    f'url = "{remote.path}"\n[push]')
    if armored:
        recipient = (env.keys / "age.pub").read_text().strip()
        text = text.replace('sign_key = "keys/signing.key"\n',
                            f'sign_key = "keys/signing.key"\nage_recipients = ["{recipient}"]\n')
    env.config.write_text(text)
    env.remotes = {"origin": str(remote.path)}
    run_daemon(env, {gen: state_for(gen) for gen in (1, 2)})
    assert env.remote_tags(str(remote.path)) == ["t/gen-000001", "t/gen-000002"]
    files = remote.out("ls-tree", "-r", "--name-only", "main").split()
    suffix = f".{fmt}.age" if armored else f".{fmt}"
    assert any(f.endswith(suffix) for f in files), files
    verified_remotely(remote, env.keys)


def test_key_rotation_is_accepted_once_the_new_key_is_trusted(tmp_path):
    env = DaemonEnv(tmp_path, {})
    remote = guarded_remote(tmp_path / "remote.git", git_env(tmp_path), env.keys)
    env.config.write_text(env.config.read_text().replace(
        "[push]", f'[[repo.remote]]\nname = "origin"\nurl = "{remote.path}"\n[push]'))
    env.remotes = {"origin": str(remote.path)}
    run_daemon(env, {1: state_for(1)})
    rotated = tmp_path / "rotated"
    generate_keys(rotated)
    trusted = env.keys.parent / f"{env.keys.name}-trusted"
    (trusted / "rotated.pub").write_bytes((rotated / "signing.pub").read_bytes())
    env.config.write_text(env.config.read_text().replace(
        'sign_key = "keys/signing.key"', f'sign_key = "{rotated / "signing.key"}"'))
    run_daemon(env, {2: state_for(1) | {"step": np.array(2, np.int64)}})
    newest = parse_manifest(remote.git("show", "main:snapshots/t/MANIFEST", input=b"").stdout)
    assert newest.header.keyid == keyid(load_public_key(rotated / "signing.pub"))
    assert {s.gen for s in newest.shards} == {1, 2}  # shards of gen 1 (old key) reused
    ci = remote.snapops("verify", "--ci", "--range", "main", "--trusted-key", str(trusted),
                        "--hmac-key", str(env.keys / "hmac.key"), "--require-signature")
    assert ci.returncode == 0, ci.stderr
