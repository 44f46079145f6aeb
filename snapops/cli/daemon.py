"""snapops daemon run / status, and snapops request (hand a state file to a running daemon)."""

from __future__ import annotations

import json
import os
import sys
import time

from snapops.config import load_config, resolve

from ._common import EXIT_INPUT, add_command, add_group, report_error
from ._options import generation


def _config(args):
    overrides = {}
    if getattr(args, "spool_dir", None):
        overrides["daemon.spool_dir"] = args.spool_dir
    return load_config(args.config, overrides=overrides)


def run_daemon(args) -> int:
    from snapops.daemon.logs import setup_logging
    from snapops.daemon.service import Daemon
    from snapops.formats.gitcmd import forget_hook_environment

    forget_hook_environment()   # gitpython's git children inherit os.environ as it is
    config = _config(args)
    setup_logging(config.daemon.log_level, config.daemon.log_format)
    return Daemon(config).run()


MAX_STATUS = 4 << 20
# what only the running daemon knows (state/status.json), shown beside what the WAL says
DAEMON_KEYS = ("pid", "started", "failures", "push", "retry_at", "retrying", "waiting_for_spool",
               "waiting_for_ranks", "wal_problem", "leftovers_removed", "node", "committer",
               "ranks", "parts_remote_reachable", "parts_refused")


def run_status(args) -> int:
    from snapops.daemon.client import WAL_NAME
    from snapops.daemon.ranks import Cluster
    from snapops.daemon.walstatus import status_from
    from snapops.daemon.wal import replay

    config = _config(args)
    state_file = resolve(config, config.daemon.state_dir) / "status.json"
    wal_state, reader = replay(resolve(config, config.daemon.spool_dir) / WAL_NAME,
                               **Cluster.from_config(config).wal_scope())
    remotes = {r.name for r in config.repo.remotes}
    status = status_from(wal_state, remotes)
    daemon, unreadable = daemon_state(state_file)
    status["daemon"] = {k: daemon.get(k) for k in DAEMON_KEYS}
    status["daemon_running"] = _running(resolve(config, config.daemon.state_dir))
    status["wal_corrupt_lines"] = len(reader.bad)
    if unreadable is not None:
        status["daemon_status_unreadable"] = unreadable
    if reader.problem is not None:       # the WAL exists but cannot be read: nothing is known
        status["wal_unreadable"] = reader.problem
    if args.json:
        json.dump(status, sys.stdout, indent=2, sort_keys=True, default=str)
        print()
        return EXIT_INPUT if reader.problem is not None else 0
    from .daemon_status import render_status

    try:
        text = render_status(status, wal_state, sorted(remotes), now=time.time())
    except (AttributeError, TypeError, KeyError, ValueError, IndexError, OverflowError) as exc:
        # status.json has a shape this snapops never writes: report the WAL's side alone
        unreadable = f"{type(exc).__name__}: {exc}"[:200]
        status["daemon"] = dict.fromkeys(DAEMON_KEYS)
        text = render_status(status, wal_state, sorted(remotes), now=time.time())
    print(text)
    if unreadable is not None:
        print(f"snapops: warning: {state_file}: not the daemon's status as this snapops writes "
              f"it ({unreadable}); shown without it", file=sys.stderr)
    if reader.problem is not None:
        report_error("the WAL cannot be read (above): the generations shown are unknown, "
                     "not absent")
        return EXIT_INPUT
    return 0


def daemon_state(path) -> tuple[dict, str | None]:
    """What the running daemon last wrote (``{}`` when absent), and why it was set aside when
    it is not a JSON object (a FIFO, a device or a huge file is never read whole)."""
    from snapops.formats.errors import FormatError
    from snapops.formats.iosafe import read_small_text

    try:
        text = read_small_text(path, MAX_STATUS, follow=True)
        daemon = json.loads(text) if text is not None else {}
    except FormatError as exc:
        return {}, exc.message
    except (ValueError, RecursionError) as exc:
        return {}, f"{type(exc).__name__}: {exc}"[:200]
    return (daemon, None) if isinstance(daemon, dict) else ({}, "not a JSON object")


def _running(state_dir) -> bool:
    import fcntl

    path = state_dir / "daemon.lock"
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def run_request(args) -> int:
    from snapops.daemon.client import Snapshotter
    from snapops.formats.registry import detect

    config = _config(args)
    snapshot = detect(args.state).load(args.state)
    with Snapshotter(resolve(config, config.daemon.spool_dir),
                     max_in_flight=config.client.max_in_flight,
                     policy=config.client.policy) as client:
        client.request(snapshot.arrays, args.gen)
    print(f"requested gen {args.gen} ({len(snapshot)} arrays, {snapshot.nbytes} bytes)")
    return 0


def register(sub) -> None:
    p = add_group(sub, "daemon", help="run or inspect the snapshot daemon",
                  description="The snapshot daemon serializes, seals, commits and pushes "
                  "the generations training processes request.",
                  example="snapops daemon status --config snapops.toml")
    dsub = p.add_subparsers(dest="daemon_command", metavar="ACTION")
    run = add_command(
        dsub, "run", help="run the daemon in the foreground (SIGTERM stops it cleanly)",
        description="Watch the spool folder, turn every requested generation into verified "
                    "snapshot files, a ledger line, a commit and a tag, and push them through a "
                    "persistent resend queue.",
        example="snapops daemon run --config /etc/snapops/snapops.toml", func=run_daemon)
    status = add_command(
        dsub, "status", help="generations, push queue per remote, progress, failures",
        description="Show what the WAL and the daemon's status file say: the last "
                    "generations and their states, per remote the pending generations and "
                    "their bytes, the push in flight with its progress and rate, the time to "
                    "drain, the next retry; dropped generations and failures. --json prints "
                    "the same as one JSON object (epoch times, bytes).",
        example="snapops daemon status --config snapops.toml --json", func=run_status)
    for q in (run, status):
        q.add_argument("--config", help="TOML config (default: built-in defaults + SNAPOPS_*)")
    status.add_argument("--json", action="store_true", help="print the status as one JSON object")
    p.set_defaults(func=lambda a: (p.print_help(sys.stderr), 2)[1])
    req = add_command(
        sub, "request", help="hand a state file to the daemon as generation N",
        description="Load a state (.npz, .safetensors, any snapshot format) and request it as "
                    "generation N through the spool folder, as a training process would.",
        example="snapops request --gen 12 state.npz --config snapops.toml", func=run_request)
    req.add_argument("state", help="state file (.npz, .safetensors, any snapshot format)")
    req.add_argument("--gen", type=generation, required=True, metavar="N",
                     help="generation number to request the state as")
    req.add_argument("--config", help="TOML config of the daemon (default: built-in defaults + "
                                      "SNAPOPS_*)")
