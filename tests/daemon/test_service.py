"""The daemon end to end with real Git: pushes to a bare repo and to git daemon on 127.0.0.1,
remote outages, SIGKILL at random points, a full disk, an unwritable repo, bad spool/WAL."""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from snapops.cli import main
from snapops.daemon.lifecycle import DROPPED, PUSHED
from snapops.formats.generation.load import load_from_source
from snapops.formats.generation.source import FolderSource
from snapops.formats.generation.verify import GenerationOptions, verify_generation
from snapops.formats.ledger import Ledger

from .daemon_env import DaemonEnv, down_remote, state_for
from .gitserve import GitDaemon, git, init_bare


def verify_remote(env: DaemonEnv, url: str, tmp_path, expected: dict[int, dict]) -> list[str]:
    """Clone ``url`` and check every generation tag: files, MANIFEST, ledger, arrays."""
    clone = tmp_path / f"clone-{random.randrange(1 << 30)}"
    git("clone", "-q", url, str(clone))
    tags = env.remote_tags(url)
    for tag in tags:
        git("checkout", "-q", tag, cwd=clone)
        options = GenerationOptions(hmac_key=env.keys / "hmac.key",
                                    trusted_keys=[env.keys / "signing.pub"])
        report = verify_generation(FolderSource(clone), "t", options)
        assert report.ok, (tag, report.failure)
        gen = int(tag.rsplit("-", 1)[1])
        if gen in expected:
            loaded = load_from_source(FolderSource(clone), "t", verify=False)
            for name, array in expected[gen].items():
                assert np.array_equal(loaded[name], array), (tag, name)
    git("checkout", "-q", "main", cwd=clone)
    ledger = Ledger(clone / "ledger" / "t.ledger", root=clone)
    assert ledger.verify(check_files=False).ok
    assert [e.gen for e in ledger.entries()] == [int(t.rsplit("-", 1)[1]) for t in tags]
    shutil.rmtree(clone)
    return tags


def pushed_counts(env: DaemonEnv) -> dict[tuple[int, str], int]:
    counts: dict[tuple[int, str], int] = {}
    from snapops.daemon.wal import WalReader

    for record in WalReader(env.spool / "wal.log").read_new():
        if record.event == PUSHED:
            key = (record.gen, record.fields["remote"])
            counts[key] = counts.get(key, 0) + 1
    return counts


def test_pushes_to_bare_repo_and_git_daemon(tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    init_bare(served / "snap.git")
    server = GitDaemon(served)
    server.start()
    bare = init_bare(tmp_path / "remote.git")
    env = DaemonEnv(tmp_path, {"bare": str(bare), "net": server.url("snap.git")})
    try:
        env.start()
        expected = {}
        with env.client(policy="block") as client:
            for gen in (1, 2, 3):
                expected[gen] = state_for(gen)
                client.request(expected[gen], gen)
        env.wait(env.all_pushed, what="both remotes")
        assert env.terminate() == 0
        for url in (str(bare), server.url("snap.git")):
            assert verify_remote(env, url, tmp_path, expected) == \
                ["t/gen-000001", "t/gen-000002", "t/gen-000003"]
        assert set(pushed_counts(env).values()) == {1}
        message = git("log", "-1", "--format=%s", "t/gen-000003", cwd=bare)
        assert "gen 3" in message and "merkle_this=" in message
    finally:
        env.kill()
        server.stop()


def test_remote_down_queue_grows_then_drains_in_order(tmp_path):
    served, server, env = down_remote(tmp_path)
    try:
        env.start()
        with env.client(policy="block") as client:
            for gen in range(1, 6):
                client.request(state_for(gen), gen)
        env.wait(lambda: env.status()["push_queue_depth"] == 5, what="5 queued pushes")
        time.sleep(1.0)
        assert env.status()["push_queue_depth"] == 5 and env.status()["last_pushed"]["net"] is None
        server.start()
        env.wait(env.all_pushed, what="queue drained")
        assert env.terminate() == 0
        assert set(pushed_counts(env).values()) == {1}
        log = git("log", "--format=%s", "main", cwd=served / "snap.git").splitlines()
        assert [line.split(" gen ")[1].split()[0] for line in reversed(log)] == \
            ["1", "2", "3", "4", "5"]
        verify_remote(env, server.url("snap.git"), tmp_path, {})
    finally:
        env.kill()
        server.stop()


@pytest.mark.parametrize("block", range(3))
@pytest.mark.slow
def test_sigkill_at_random_points_recovers_exactly(tmp_path, block):
    """5 kill/restart cycles per case (15 in the suite; ``python -m tests.daemon.soak`` runs
    as many as you like)."""
    rng = random.Random(1000 + block)
    bare = init_bare(tmp_path / "remote.git")
    env = DaemonEnv(tmp_path, {"origin": str(bare)})
    expected = {}

    def request(client):
        for _ in range(rng.randint(1, 3)):
            gen = len(expected) + 1
            expected[gen] = state_for(gen)
            client.request(expected[gen], gen)

    env.kill_cycles(rng, 5, request, pause=(0.0, 1.5))
    committed = assert_recovered_exactly(env, bare, tmp_path, expected)
    assert int(git("rev-list", "--count", "main", cwd=bare)) == len(committed)


def assert_recovered_exactly(env: DaemonEnv, bare: Path, tmp_path, expected: dict[int, dict]
                             ) -> list[int]:
    """Every requested generation is pushed or was coalesced; the remote holds exactly the
    pushed ones, each verified and equal to what was requested, each pushed once. Returns
    the pushed generations."""
    state = env.state()
    for g in expected:
        record = state.gens[g]
        assert record.state == PUSHED or (record.state == DROPPED
                                          and record.fields["reason"] == "coalesced"), record
    committed = sorted(g for g in expected if state.gens[g].state == PUSHED)
    tags = verify_remote(env, str(bare), tmp_path, expected)
    assert [int(t.rsplit("-", 1)[1]) for t in tags] == committed
    assert set(pushed_counts(env).values()) == {1}
    return committed


def _mount_tmpfs(path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                   check=True)


def test_disk_full_is_retried_and_never_commits_partial(tmp_path):
    mnt = tmp_path / "small"
    _mount_tmpfs(mnt, "600k")
    bare = init_bare(tmp_path / "remote.git")
    env = DaemonEnv(tmp_path, {"origin": str(bare)}, repo=mnt / "repo")
    try:
        env.start()
        big = {"w": np.random.default_rng(1).standard_normal((1024, 256)).astype(np.float32)}
        with env.client() as client:
            client.request(big, 1)
        env.wait(lambda: "No space left" in env.log.read_text(), what="disk full error")
        time.sleep(0.5)
        assert env.proc.poll() is None, "the daemon keeps running"
        status = subprocess.run([sys.executable, "-m", "snapops", "daemon", "status", "--config", str(env.config),
                                 "--json"], capture_output=True, text=True)
        assert status.returncode == 0 and '"last_committed": null' in status.stdout
        assert env.remote_tags(str(bare)) == []
        subprocess.run(["mount", "-o", "remount,size=64m", str(mnt)], check=True)
        env.wait(env.all_pushed, timeout=120, what="push after space was freed")
        assert env.terminate() == 0
        verify_remote(env, str(bare), tmp_path, {1: big})
    finally:
        env.kill()
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_unwritable_repo_is_retried(tmp_path):
    bare = init_bare(tmp_path / "remote.git")
    env = DaemonEnv(tmp_path, {"origin": str(bare)})
    (env.repo / "snapshots").mkdir(parents=True)
    subprocess.run(["chattr", "+i", str(env.repo / "snapshots")], check=True)
    try:
        env.start()
        with env.client() as client:
            client.request(state_for(1), 1)
        env.wait(lambda: "serialize/commit failed" in env.log.read_text(), what="repo error")
        assert env.proc.poll() is None and env.remote_tags(str(bare)) == []
        subprocess.run(["chattr", "-i", str(env.repo / "snapshots")], check=True)
        env.wait(env.all_pushed, timeout=120, what="push after the repo became writable")
        assert env.terminate() == 0
    finally:
        subprocess.run(["chattr", "-i", str(env.repo / "snapshots")], check=False)
        env.kill()


def test_bad_spool_and_wal_content_are_skipped(tmp_path):
    bare = init_bare(tmp_path / "remote.git")
    env = DaemonEnv(tmp_path, {"origin": str(bare)})
    with env.client() as client:
        client.request(state_for(1), 1)
        client.request(state_for(2), 2)
    spool = next(env.spool.glob("gen-*1.spool"))
    data = bytearray(spool.read_bytes())
    data[-10] ^= 0xFF
    spool.write_bytes(bytes(data))
    with open(env.spool / "wal.log", "ab") as wal:
        wal.write(b"this is not a record\nSPOOLED gen=99 crc=00000000\n")
    try:
        env.start()
        env.wait(env.all_pushed, what="good generations pushed")
        assert env.terminate() == 0
    finally:
        env.kill()
    state = env.state()
    assert state.gens[1].state == DROPPED and state.gens[1].fields["reason"] == "bad_spool"
    assert state.gens[2].state == PUSHED
    log = env.log.read_text()
    assert "corrupt record" in log and "bad_spool" in log
    assert env.remote_tags(str(bare)) == ["t/gen-000002"]


@pytest.mark.slow
def test_request_cli_status_and_second_daemon_refused(tmp_path, capsys):
    bare = init_bare(tmp_path / "remote.git")
    env = DaemonEnv(tmp_path, {"origin": str(bare)})
    np.savez(tmp_path / "state.npz", **state_for(4))
    try:
        env.start()
        env.wait(lambda: (tmp_path / "state" / "status.json").exists(), what="status file")
        second = subprocess.run([sys.executable, "-m", "snapops", "daemon", "run", "--config", str(env.config)],
                                capture_output=True, text=True, timeout=60)
        assert second.returncode == 2 and "another snapops daemon" in second.stderr
        assert main(["request", "--gen", "4", str(tmp_path / "state.npz"),
                     "--config", str(env.config)]) == 0
        env.wait(env.all_pushed, what="requested state pushed")
        capsys.readouterr()
        assert main(["daemon", "status", "--config", str(env.config)]) == 0
        out = capsys.readouterr().out
        assert "daemon: running" in out and "committed 4" in out
    finally:
        env.terminate()
        env.kill()


@pytest.mark.parametrize("fmt", ["aero", "fold", "pycauset", "finf"])
def test_binary_formats_are_committed_and_verified(tmp_path, fmt):
    bare = init_bare(tmp_path / "remote.git")
    env = DaemonEnv(tmp_path, {"origin": str(bare)}, fmt=fmt)
    expected = {1: state_for(1), 2: state_for(2)}
    try:
        env.start()
        with env.client(policy="block") as client:
            for gen, state in expected.items():
                client.request(state, gen)
        env.wait(env.all_pushed, what=f"{fmt} generations pushed")
        assert env.terminate() == 0
    finally:
        env.kill()
    assert verify_remote(env, str(bare), tmp_path, expected) == ["t/gen-000001", "t/gen-000002"]
    files = git("ls-tree", "-r", "--name-only", "main", cwd=bare).split()
    assert any(f.endswith(f".{fmt}") for f in files)


@pytest.mark.slow
def test_sealing_options_delta_wsum_age_retention_json_logs(tmp_path):
    """age-armored shards, DELTA v2 files, WSUM streaming shards, a retention ring of 1 and
    JSON logs, all from the config file."""
    bare = init_bare(tmp_path / "remote.git")
    from snapops.formats.keys import generate_keys

    generate_keys(tmp_path / "keys")
    recipient = (tmp_path / "keys" / "age.pub").read_text().strip()
    extra = (f'[client]\nmax_in_flight = 1\n')
    env = DaemonEnv(tmp_path, {"origin": str(bare)}, extra=extra)
    text = env.config.read_text()
    text = text.replace('build = "test"\n', 'build = "test"\nstreaming_threshold = "16KiB"\n'
                        'delta = true\n')
    text = text.replace('sign_key = "keys/signing.key"\n',
                        f'sign_key = "keys/signing.key"\nage_recipients = ["{recipient}"]\n')
    text = text.replace("poll_interval = 0.2\n", "poll_interval = 0.2\nlog_format = \"json\"\n")
    text = text.replace('path = "', 'retention = 1\npath = "', 1)
    env.config.write_text(text)
    expected = {g: state_for(g) for g in (1, 2, 3)}
    env.push_all(expected, what="sealed generations pushed")
    files = git("ls-tree", "-r", "--name-only", "main", cwd=bare).split()
    assert all(f.endswith((".wtxt.age", ".wtxt.wsum.age")) for f in files
               if "/shards/" in f), files
    assert any(f.endswith(".wsum.age") for f in files)
    clone = tmp_path / "clone"
    git("clone", "-q", str(bare), str(clone))
    options = GenerationOptions(hmac_key=env.keys / "hmac.key", identity=env.keys / "age.key",
                                trusted_keys=[env.keys / "signing.pub"])
    report = verify_generation(FolderSource(clone), "t", options)
    assert report.ok, report.failure
    loaded = load_from_source(FolderSource(clone), "t", options=options)
    assert np.array_equal(loaded["emb.weight"], expected[3]["emb.weight"])
    assert len(list(env.spool.glob("gen-*.spool"))) == 1  # the retention ring
    import json

    lines = [json.loads(line) for line in env.log.read_text().splitlines() if line.startswith("{")]
    assert any(entry["msg"].startswith("gen 3 committed") for entry in lines)
    assert all({"ts", "level", "logger", "msg"} <= set(entry) for entry in lines)


def test_delta_files_for_plain_wtxt_shards(tmp_path):
    bare = init_bare(tmp_path / "remote.git")
    env = DaemonEnv(tmp_path, {"origin": str(bare)})
    env.config.write_text(env.config.read_text().replace('build = "test"\n',
                                                         'build = "test"\ndelta = true\n'))
    try:
        env.start()
        with env.client(policy="block") as client:
            client.request(state_for(1), 1)
            client.request(state_for(2), 2)
        env.wait(env.all_pushed, what="generations pushed")
        assert env.terminate() == 0
    finally:
        env.kill()
    clone = tmp_path / "clone"
    git("clone", "-q", str(bare), str(clone))
    deltas = sorted(clone.glob("snapshots/t/shards/*.wtxtdelta"))
    assert deltas, "gen 2 changed a shard: its delta from gen 1 is committed beside it"
    from snapops.formats.wtxt.delta import apply_delta

    shard = Path(str(deltas[0]).removesuffix("delta"))
    git("show", f"t/gen-000001:snapshots/t/shards/{shard.name}", cwd=clone)
    base = tmp_path / "base.wtxt"
    base.write_bytes(subprocess.run(["git", "-C", str(clone), "show",
                                     f"t/gen-000001:snapshots/t/shards/{shard.name}"],
                                    capture_output=True, check=True).stdout)
    apply_delta(base, deltas[0], tmp_path / "rebuilt.wtxt")
    assert (tmp_path / "rebuilt.wtxt").read_bytes() == shard.read_bytes()


@pytest.mark.slow
def test_daemon_pushes_through_pre_receive_hook_and_ledger_matches_manifests(tmp_path):
    """The server side runs snapops' pre-receive hook on every daemon push (signatures
    required): clean generations are accepted, and every ledger line matches its MANIFEST."""
    bare = init_bare(tmp_path / "remote.git")
    env = DaemonEnv(tmp_path, {"origin": str(bare)})
    assert main(["hooks", "install", str(bare)]) == 0
    git("config", "snapops.trustedKeys", str(env.keys / "signing.pub"), cwd=bare)
    git("config", "snapops.requireSignature", "true", cwd=bare)
    try:
        env.start()
        with env.client(policy="block") as client:
            for gen in (1, 2, 3):
                client.request(state_for(gen), gen)
        env.wait(env.all_pushed, what="pushes through pre-receive")
        assert env.terminate() == 0
    finally:
        env.kill()
    assert env.remote_tags(str(bare)) == ["t/gen-000001", "t/gen-000002", "t/gen-000003"]
    clone = tmp_path / "clone"
    git("clone", "-q", str(bare), str(clone))
    report = Ledger(clone / "ledger" / "t.ledger", root=clone).verify(check_files=True)
    assert report.ok, report.failure
    manifest = clone / "snapshots" / "t" / "MANIFEST"
    manifest.write_bytes(manifest.read_bytes().replace(b"build=test", b"build=evil"))
    report = Ledger(clone / "ledger" / "t.ledger", root=clone).verify(check_files=True)
    assert not report.ok and report.failure.check == "file"
