"""What ``snapops daemon status`` shows that the WAL alone tells: the last generation in each
state, the push queue per remote, dropped generations and why, refused WAL records. The running
daemon adds what only it knows (``Daemon.status``)."""

from __future__ import annotations

from .lifecycle import COMMITTED, DROPPED, PUSHED, REQ, SERIALIZED, SPOOLED
from .wal import WalState


def status_from(state: WalState, remotes: set[str], **extra) -> dict:
    """What ``snapops daemon status`` shows; computable from the WAL alone.

    ``dropped_details`` names why each of the last 50 dropped generations was dropped
    (``reason`` from :data:`snapops.daemon.lifecycle.DROP_REASONS`, ``error`` as recorded);
    ``wal_rejected`` counts the records refused (illegal transition, foreign writer) and
    ``wal_rejected_records`` shows the last 20 with the reason. The daemon adds its own keys
    through ``extra`` (see :meth:`Daemon.status`).
    """
    def last(*states):
        gens = [g.gen for g in state.gens.values() if g.state in states]
        return max(gens) if gens else None

    committed = [g for g in state.gens.values() if g.state in (COMMITTED, PUSHED)]
    unpushed = sorted(g.gen for g in committed if not g.fully_pushed(remotes))
    dropped = state.in_state(DROPPED)[-50:]
    return {
        "last_requested": max(state.gens) if state.gens else None,
        "last_spooled": last(SPOOLED, SERIALIZED, COMMITTED, PUSHED),
        "last_committed": last(COMMITTED, PUSHED),
        "last_pushed": {r: max((g.gen for g in committed if r in g.pushed), default=None)
                        for r in sorted(remotes)},
        "waiting_to_serialize": sorted(g.gen for g in state.gens.values()
                                       if g.state in (REQ, SPOOLED, SERIALIZED)),
        "push_queue_depth": len(unpushed),
        "push_queue": unpushed[:50],
        "dropped": [g.gen for g in dropped],
        "dropped_details": [{"gen": g.gen, "reason": g.fields.get("reason", "unknown"),
                             "error": g.fields.get("error"), "by": g.fields.get("by"),
                             "missing": g.fields.get("missing"), "part": g.fields.get("part")}
                            for g in dropped],
        "wal_rejected": state.rejected_total,
        "wal_rejected_records": [
            {"line": record.line_no, "event": record.event, "gen": record.gen,
             "writer": record.fields.get("w"), "why": why}
            for record, why in list(state.rejected)[-20:]],
        **extra,
    }
