"""The request lifecycle as a transition table (h11 style): every transition is a WAL record.

    REQ -> SPOOLED -> SERIALIZED -> COMMITTED -> PUSHED (one record per remote)
    REQ / SPOOLED / SERIALIZED -> DROPPED

A generation is made of the parts of its training ranks (one part for a single trainer). Each
part goes REQ -> SPOOLED or REQ -> DROPPED through the same table, recorded by its rank (or by
the daemon on its behalf), and the generation follows its parts until the daemon takes over:
REQ with the first part requested, SPOOLED once every expected part is spooled, DROPPED as soon
as one part is dropped (a generation without one rank's part can never be whole). From
SPOOLED on, only the daemon's records move it.

DROPPED always carries ``reason=``: ``coalesced`` (a newer request replaced it),
``spool_failed`` (the spool writer could not write it, e.g. disk full), ``abandoned`` (its
writer died before spooling it), ``bad_record`` (a WAL record of it is malformed),
``bad_spool`` (its spool file is unreadable, hostile or corrupt), ``out_of_order`` (an equal
or newer generation is already committed), ``unserializable`` (the format refuses the data)
``failed`` (serializing or committing it kept failing), ``missing_ranks`` (ranks whose part
had not arrived ``cluster.rank_timeout`` seconds after the first; ``missing=`` names them) or
``bad_layout`` (the ranks' pieces overlap, leave holes or disagree on an array's dtype or
shape); ``error=`` says why where known.

The same table validates records written live and records replayed after a crash.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from snapops.formats.errors import SnapopsError

REQ, SPOOLED, SERIALIZED, COMMITTED, PUSHED, DROPPED = (
    "REQ", "SPOOLED", "SERIALIZED", "COMMITTED", "PUSHED", "DROPPED")
EVENTS = (REQ, SPOOLED, SERIALIZED, COMMITTED, PUSHED, DROPPED)
DROP_REASONS = ("coalesced", "spool_failed", "abandoned", "bad_record", "bad_spool",
                "out_of_order", "unserializable", "failed", "missing_ranks", "bad_layout")
PART_EVENTS = (REQ, SPOOLED, DROPPED)  # the records that concern one rank's part

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
    parts: dict[str, "Generation"] = field(default_factory=dict)  # rank -> its part
    since: str | None = None                               # t= of its first record

    def apply(self, event: str, fields: dict[str, str]) -> None:
        if event not in TRANSITIONS.get(self.state, frozenset()):
            raise IllegalTransition(self.gen, self.state, event)
        if self.since is None:
            self.since = fields.get("t")
        if event == PUSHED:
            self.pushed.add(fields.get("remote", ""))
        self.state = event
        self.fields.update(fields)

    def apply_part(self, rank: str, event: str, fields: dict[str, str],
                   expect: frozenset[str]) -> None:
        """Rank ``rank``'s part record (REQ, SPOOLED or DROPPED); the generation follows its
        parts while it is new or requested (see the module docstring). ``expect``: the ranks
        whose parts make the generation whole."""
        if event not in PART_EVENTS:
            raise IllegalTransition(self.gen, f"part {rank}", event)
        part = self.parts.get(rank) or Generation(self.gen)
        part.apply(event, fields)
        self.parts[rank] = part
        if self.state not in (None, REQ):
            return
        if event == DROPPED:
            self.apply(DROPPED, {**fields, "part": rank})
        elif self.state is None:
            self.apply(REQ, fields)
        elif event == SPOOLED and not self.missing(expect):
            self.apply(SPOOLED, fields)
        else:
            self.fields.update(fields)

    def missing(self, expect: frozenset[str]) -> list[str]:
        """The expected ranks whose part is not spooled, in rank order."""
        return sorted((r for r in expect if getattr(self.parts.get(r), "state", None)
                       != SPOOLED), key=lambda r: (len(r), r))

    def fully_pushed(self, remotes: set[str]) -> bool:
        return self.state in (COMMITTED, PUSHED) and remotes <= self.pushed

    @property
    def done(self) -> bool:
        return self.state == DROPPED
