"""Keep the daemon's work repository bounded: it holds the last ``repo.retention`` generations
(and every one a remote still lacks), not the whole run.

Remotes keep the full history; locally, the commit of the oldest generation to keep becomes a
shallow boundary, older generations' tags are deleted and their objects pruned
(:meth:`SnapshotRepo.forget_history`). The daemon runs this from its main loop when an
apscheduler interval job (``repo.gc_interval``) says it is due; it is skipped (and tried again
later) while a push or commit runs.

Example::

    history_cut(state, {"origin"}, retention=8)
    # -> (33, '5f2c...', [1, 2, ..., 32])
"""

from __future__ import annotations

import logging

from .gitops import SnapshotRepo
from .lifecycle import COMMITTED, PUSHED
from .pushq import gen_tag
from .wal import WalState

__all__ = ["history_cut", "maintain"]

log = logging.getLogger(__name__)


def history_cut(state: WalState, remotes: set[str], retention: int
                ) -> tuple[int, str, list[int]] | None:
    """The generation to keep history from, its commit, and the older committed generations;
    None when nothing may go. Kept: the last ``retention`` committed generations and every
    one not yet on every remote (a remote that lacks history cannot take a shallow push)."""
    committed = state.in_state(COMMITTED, PUSHED)
    if len(committed) <= retention:
        return None
    keep = committed[-retention]
    unpushed = [g for g in committed if not g.fully_pushed(remotes)]
    if unpushed and unpushed[0].gen < keep.gen:
        keep = unpushed[0]
    older = [g.gen for g in committed if g.gen < keep.gen]
    commit = keep.fields.get("commit")
    if not older or not commit:
        return None
    return keep.gen, commit, older


def maintain(repo: SnapshotRepo, state: WalState, remotes: set[str], retention: int,
             run: str) -> bool:
    """Cut the local history if there is something to cut; False when it must be tried again
    later (a push or commit was running)."""
    cut = history_cut(state, remotes, retention)
    if cut is None:
        return True
    gen, commit, older = cut
    result = repo.forget_history(commit, [gen_tag(run, g) for g in older])
    if result is None:
        return False
    if result["before"] != result["after"]:
        log.info("work repository: history from gen %d kept, %d MiB -> %d MiB", gen,
                 result["before"] >> 20, result["after"] >> 20)
    return True
