"""Secrets in remote URLs never reach a log, the status file, ``daemon status`` or the WAL;
the state folder and the status file are private."""

from __future__ import annotations

import io
import json
import logging
import stat
import subprocess
import sys

import pytest

from snapops.daemon.logs import setup_logging
from snapops.daemon.redact import redact_data, redact_url

from .daemon_env import DaemonEnv, state_for

SECRETS = ("TOKEN1", "PASSWORD2", "QUERY3", "FRAGMENT4", "OAUTH5")
REMOTES = {  # every shape a credential can take in a remote URL; nothing listens on port 1
    "token": "http://TOKEN1@127.0.0.1:1/a.git",
    "password": "https://user:PASSWORD2@127.0.0.1:1/b.git",
    "query": "http://127.0.0.1:1/c.git?access_token=QUERY3&ref=main",
    "fragment": "http://127.0.0.1:1/d.git#FRAGMENT4",
    "oauth": "https://OAUTH5:x-oauth-basic@127.0.0.1:1/e.git",
}


@pytest.mark.parametrize("url, shown", [
    ("https://TOKEN@host/x.git", "https://***@host/x.git"),
    ("https://user:pw@host:8443/x.git", "https://***@host:8443/x.git"),
    ("https://oauth2:TOKEN@host/x.git", "https://***@host/x.git"),
    ("https://host/x.git?access_token=T&ref=main", "https://host/x.git?access_token=***&ref=***"),
    ("https://host/x.git?TOKEN", "https://host/x.git?***"),
    ("https://host/x.git#TOKEN", "https://host/x.git#***"),
    ("HTTP://T@host/x", "HTTP://***@host/x"),
    ("ssh://git@host/x.git", "ssh://git@host/x.git"),
    ("ssh://git:pw@host/x.git", "ssh://git:***@host/x.git"),
    ("git@host:org/x.git", "git@host:org/x.git"),
    ("/srv/git/x.git", "/srv/git/x.git"),
    ("git://127.0.0.1:9418/x.git", "git://127.0.0.1:9418/x.git"),
    ("http://[::1/x?tok=T", "http://[::1/x?tok=***"),  # not a valid URL: masked all the same
])
def test_every_url_shape_is_redacted(url, shown):
    assert redact_url(url) == shown
    text = f"fatal: unable to access '{url}': 403"
    assert redact_url(text) == f"fatal: unable to access '{shown}': 403"
    assert redact_data({"remote": [url]}) == {"remote": [shown]}


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_log_lines_are_redacted(fmt):
    logger = logging.getLogger("snapops")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    stream = io.StringIO()
    try:
        setup_logging("info", fmt, stream)
        log = logging.getLogger("snapops.daemon.test")
        log.error("push to %s failed", REMOTES["token"])
        try:
            raise OSError(f"cannot reach {REMOTES['query']}")
        except OSError:
            log.exception("while pushing to %s", REMOTES["oauth"])
    finally:
        logger.handlers[:], logger.level, logger.propagate = saved
    out = stream.getvalue()
    assert "http://***@127.0.0.1:1/a.git" in out and "access_token=***" in out
    assert not any(secret in out for secret in SECRETS)


def test_daemon_never_shows_a_secret_and_keeps_its_state_private(tmp_path):
    env = DaemonEnv(tmp_path, REMOTES)
    env.config.write_text(env.config.read_text().replace(
        "poll_interval = 0.2\n", 'poll_interval = 0.2\nlog_format = "json"\n'))
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o755)
    (state_dir / "status.json").write_text("{}")
    (state_dir / "status.json").chmod(0o644)
    try:
        env.start()
        with env.client() as client:
            client.request(state_for(1), 1)
        env.wait(lambda: _all_pushes_failed(state_dir), 120, what="a failed push per remote")
        outputs = [env.log.read_text(), (state_dir / "status.json").read_text(),
                   (env.spool / "wal.log").read_text()]
        for extra in ([], ["--json"]):
            proc = subprocess.run([sys.executable, "-m", "snapops", "daemon", "status",
                                   "--config", str(env.config), *extra], capture_output=True,
                                  text=True, timeout=120)
            assert proc.returncode == 0, proc.stderr
            outputs += [proc.stdout, proc.stderr]
        assert env.terminate() == 0
    finally:
        env.kill()
    outputs.append(env.log.read_text())
    assert not [s for s in SECRETS for text in outputs if s in text]
    assert "http://***@127.0.0.1:1/a.git" in outputs[1]
    assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((state_dir / "status.json").stat().st_mode) == 0o600
    assert stat.S_IMODE((state_dir / "daemon.lock").stat().st_mode) == 0o600


def _all_pushes_failed(state_dir) -> bool:
    try:
        push = json.loads((state_dir / "status.json").read_text()).get("push") or {}
    except (OSError, ValueError):
        return False
    return set(push) == set(REMOTES) and all(r["last_error"] for r in push.values())
