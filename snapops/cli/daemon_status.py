"""The human form of ``snapops daemon status``: ISO times, relative times, sizes, a table.

Reads the dict ``run_status`` builds (the same one ``--json`` prints) and the WAL state; keys
it does not know (in ``dropped`` or ``failures`` entries, say) are shown as ``key=value``.

Example::

    print(render_status(status, wal_state, ["origin"], now=time.time()))
    # -> daemon: running (pid 4242, up 3 h 2 min, since 2026-05-01T10:00:00Z)
    
"""

from __future__ import annotations

import datetime as dt
import math

from snapops.bench._measure import fmt_bytes

__all__ = ["iso_time", "relative", "render_status"]

TABLE_ROWS = 20


def iso_time(epoch) -> str:
    """``2026-05-01T10:00:00Z`` for unix seconds; ``-`` for None or nonsense."""
    try:
        moment = dt.datetime.fromtimestamp(float(epoch), dt.timezone.utc)
    except (TypeError, ValueError, OverflowError, OSError):
        return "-"
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def relative(seconds) -> str:
    """``31 s``, ``4 min 10 s``, ``2 h 5 min`` for a duration; ``-`` for no number."""
    seconds = float(seconds)
    if not math.isfinite(seconds):
        return "-"
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def _rate(rate) -> str:
    return f"{fmt_bytes(rate)}/s" if rate else "unknown rate"


def _entry(item) -> str:
    """One dropped/failure entry of any shape, on one line."""
    if not isinstance(item, dict):
        return f"gen {item}" if isinstance(item, int) else str(item)
    times = [iso_time(item[key]) for key in ("time", "ts", "at") if key in item]
    parts = times + ([f"gen {item['gen']}"] if "gen" in item else [])
    parts += [f"{key}={item[key]}" for key in sorted(item)
              if key not in ("gen", "time", "ts", "at")]
    return " ".join(parts)


def _header(status: dict, now: float) -> list[str]:
    daemon = status.get("daemon") or {}
    state = "running" if status.get("daemon_running") else "not running"
    started = daemon.get("started")
    if status.get("daemon_running") and isinstance(started, (int, float)):
        state += (f" (pid {daemon.get('pid')}, up {relative(now - started)}, "
                  f"since {iso_time(started)})")
    pushed = ", ".join(f"{r} {g if g is not None else '-'}"
                       for r, g in (status.get("last_pushed") or {}).items()) or "-"
    lines = [f"daemon: {state}",
             f"last generation: requested {status.get('last_requested')}, "
             f"spooled {status.get('last_spooled')}, committed {status.get('last_committed')}, "
             f"pushed {pushed}"]
    waiting = status.get("waiting_to_serialize") or []
    if waiting:
        lines.append(f"waiting to serialize: {', '.join(map(str, waiting))}")
    retry_at = daemon.get("retry_at")
    if isinstance(retry_at, (int, float)) and retry_at > now:
        lines.append(f"serialize/commit: next retry in {relative(retry_at - now)} "
                     f"(at {iso_time(retry_at)})")
    return lines


def _in_flight(flight: dict, now: float) -> str:
    gens = flight.get("gens") or []
    what = f"gen {gens[0]}" if len(gens) == 1 else f"gens {gens[0]}..{gens[-1]}" if gens else "-"
    phase = flight.get("phase") or "starting"
    percent = flight.get("percent")
    progress = f"{phase} {percent}%" if percent is not None else phase
    seconds = flight.get("seconds")
    if seconds is None and isinstance(flight.get("started"), (int, float)):
        seconds = now - flight["started"]
    return (f"  pushing {what} ({fmt_bytes(flight.get('bytes') or 0)}): {progress}, "
            f"{fmt_bytes(flight.get('sent') or 0)} sent at {_rate(flight.get('rate'))}, "
            f"for {relative(seconds or 0)}")


def _remote(name: str, info: dict, now: float) -> list[str]:
    pending = info.get("pending") or []
    lines = [f"remote {name}: {info.get('url', '')}"]
    if pending:
        shown = ", ".join(map(str, pending[:12])) + (" ..." if len(pending) > 12 else "")
        unmeasured = info.get("unmeasured") or 0
        size = fmt_bytes(info.get("pending_bytes") or 0) + (
            f" + {unmeasured} not sized yet" if unmeasured else "")
        lines.append(f"  pending: {len(pending)} generation(s), {size}: {shown}")
    else:
        lines.append("  pending: nothing")
    if info.get("in_flight"):
        lines.append(_in_flight(info["in_flight"], now))
    if pending and info.get("eta") is not None:
        lines.append(f"  time to drain: ~{relative(info['eta'])} at {_rate(info.get('rate'))}")
    if info.get("last_error"):
        lines.append(f"  last error (attempt {info.get('attempts')}): {info['last_error']}")
    retry = info.get("next_retry")
    if isinstance(retry, (int, float)):
        lines.append(f"  next retry in {relative(retry - now)} (at {iso_time(retry)})")
    if info.get("last_pushed") is not None:
        lines.append(f"  last pushed: gen {info['last_pushed']} at "
                     f"{iso_time(info.get('last_success'))}")
    if info.get("default_branch"):
        lines.append(f"  also updates {info['default_branch']} (the remote's HEAD)")
    return lines


def _table(wal_state, remotes: list[str]) -> list[str]:
    gens = sorted(wal_state.gens)[-TABLE_ROWS:]
    if not gens:
        return ["generations: none yet"]
    rows = [("gen", "state", "pushed to", "note")]
    for gen in gens:
        record = wal_state.gens[gen]
        pushed = ",".join(r for r in remotes if r in record.pushed) or "-"
        note = record.fields.get("reason", "") if record.state == "DROPPED" else ""
        rows.append((str(gen), record.state or "-", pushed, note))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    title = f"generations (last {len(gens)} of {len(wal_state.gens)}):"
    return [title] + ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
                      for row in rows]


def render_status(status: dict, wal_state, remotes: list[str], *, now: float) -> str:
    """The whole human report, one string."""
    lines = _header(status, now)
    push = (status.get("daemon") or {}).get("push") or {}
    for name in remotes or sorted(push):
        lines += _remote(name, push.get(name) or {}, now)
    dropped = status.get("dropped_details") or status.get("dropped") or []
    if dropped:
        lines.append(f"dropped (last {min(10, len(dropped))} of {len(dropped)}):")
        lines += [f"  {_entry(item)}" for item in dropped[-10:]]
    daemon = status.get("daemon") or {}
    for key, title in (("waiting_for_spool", "waiting for their spool file"),
                       ("waiting_for_ranks", "waiting for ranks")):
        if daemon.get(key):
            lines.append(f"{title}: " + "; ".join(_entry(item) for item in daemon[key][:10]))
    failures = daemon.get("failures") or []
    if failures:
        lines.append(f"failures (last {min(5, len(failures))} of {len(failures)}):")
        lines += [f"  {_entry(item)}" for item in failures[-5:]]
    if status.get("wal_corrupt_lines"):
        lines.append(f"WAL: {status['wal_corrupt_lines']} corrupt line(s) skipped")
    return "\n".join(lines + [""] + _table(wal_state, remotes))
