"""The request lifecycle as a transition table (h11 style): every transition is a WAL record.

    REQ -> SPOOLED -> SERIALIZED -> COMMITTED -> PUSHED (one record per remote)
    REQ / SPOOLED / SERIALIZED -> DROPPED

DROPPED always carries ``reason=``: ``coalesced`` (a newer request replaced it),
``spool_failed`` (the spool writer could not write it, e.g. disk full), ``abandoned`` (its
writer died before spooling it), ``bad_record`` (a WAL record of it is malformed),
``bad_spool`` (its spool file is unreadable, hostile or corrupt), ``out_of_order`` (an equal
or newer generation is already committed), ``unserializable`` (the format refuses the data)
or ``failed`` (serializing or committing it kept failing); ``error=`` says why where known.

The same table validates records written live and records replayed after a crash.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from snapops.formats.errors import SnapopsError

REQ, SPOOLED, SERIALIZED, COMMITTED, PUSHED, DROPPED = (
    "REQ", "SPOOLED", "SERIALIZED", "COMMITTED", "PUSHED", "DROPPED")
EVENTS = (REQ, SPOOLED, SERIALIZED, COMMITTED, PUSHED, DROPPED)
DROP_REASONS = ("coalesced", "spool_failed", "abandoned", "bad_record", "bad_spool",
                "out_of_order", "unserializable", "failed")

# state -> events allowed next; PUSHED may repeat (one per remote).
TRANSITIONS: dict[str | None, frozenset[str]] = {
    None: frozenset({REQ}),
    REQ: frozenset({SPOOLED, DROPPED}),
    SPOOLED: frozenset({SERIALIZED, DROPPED}),
    SERIALIZED: frozenset({SERIALIZED, COMMITTED, DROPPED}),   # re-serialized after a crash
    COMMITTED: frozenset({PUSHED}),
    PUSHED: frozenset({PUSHED}),
    DROPPED: frozenset(),
}


class IllegalTransition(SnapopsError):
    def __init__(self, gen: int, state: str | None, event: str) -> None:
        super().__init__(f"gen {gen}: {event} is not allowed in state {state or 'new'}")
        self.gen, self.state, self.event = gen, state, event


@dataclass
class Generation:
    """What the WAL says about one generation."""

    gen: int
    state: str | None = None
    fields: dict[str, str] = field(default_factory=dict)   # merged record fields
    pushed: set[str] = field(default_factory=set)          # remotes that have it
    problem: str | None = None                             # why a record of it was malformed

    def apply(self, event: str, fields: dict[str, str]) -> None:
        if event not in TRANSITIONS.get(self.state, frozenset()):
            raise IllegalTransition(self.gen, self.state, event)
        if event == PUSHED:
            self.pushed.add(fields.get("remote", ""))
        self.state = event
        self.fields.update(fields)

    def fully_pushed(self, remotes: set[str]) -> bool:
        return self.state in (COMMITTED, PUSHED) and remotes <= self.pushed

    @property
    def done(self) -> bool:
        return self.state == DROPPED
