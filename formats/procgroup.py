"""Ending a process group the way git cleans up, and the guard process that does it for an
owner killed by SIGKILL (see :class:`snapops.formats.gitcmd.ChildGuard`).

Standard library only: the guard runs this file as a script (``python -I -S procgroup.py``)
and so starts in a tenth of the time an import of snapops (numpy and all) would take; every
daemon start pays for it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time

GRACE = 3.0                     # seconds git gets after SIGTERM to remove its temporary files
ROUND = 0.5                     # seconds the processes signalled in one round get to end
SETTLE = 0.1                    # seconds their parents get to react before the next round


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def end_group(pgid: int) -> None:
    """SIGTERM to the group's leaves (processes with no child in it), round after round,
    each parent getting time to see its child fail; SIGKILL for what is left after GRACE
    seconds. So every parent cleans up as on any error: a local ``receive-pack`` (a member of
    the group) removes its quarantine ``objects/tmp_objdir-incoming-*``, which it leaves in
    the remote when it is itself killed while a hook or index-pack runs."""
    deadline = time.monotonic() + GRACE
    signalled: set[int] = set()
    while time.monotonic() < deadline:
        members = group_members(pgid)
        if not members:
            return
        parents = set(members.values())
        leaves = {pid for pid in members if pid not in parents}
        for pid in leaves - signalled:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
        signalled |= leaves
        round_end = min(deadline, time.monotonic() + ROUND)
        while time.monotonic() < round_end and leaves & set(group_members(pgid)):
            time.sleep(0.02)
        time.sleep(SETTLE)  # the parents react to their children's end
    signal_group(pgid, signal.SIGKILL)


def group_members(pgid: int, *, live: bool = True) -> dict[int, int]:
    """pid -> parent pid of the processes in group ``pgid`` (``live``: zombies left out)."""
    members = {}
    with os.scandir("/proc") as entries:
        pids = [entry.name for entry in entries if entry.name.isdigit()]
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()  # after "pid (comm)": state ppid pgrp
        if len(fields) > 2 and fields[2] == str(pgid).encode() \
                and not (live and fields[0] == b"Z"):
            members[int(pid)] = int(fields[1])
    return members


def guard_main() -> None:
    """The guard process, its channel from the owner on stdin: hold each registered group's
    pipes (``+PGID`` with the fds) until it is unregistered (``-PGID``) or the owner is gone,
    then end the groups still registered."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    channel = socket.socket(fileno=0)
    held: dict[int, list[int]] = {}
    while True:
        message, fds, _, _ = socket.recv_fds(channel, 64, 4)
        if not message:
            break
        text = message.decode("ascii", "replace")
        if text[:1] == "+" and text[1:].isdigit():
            held[int(text[1:])] = fds
            continue
        for fd in held.pop(int(text[1:]) if text[1:].isdigit() else -1, []) + fds:
            os.close(fd)
    for pgid in held:
        end_group(pgid)


if __name__ == "__main__":
    guard_main()
