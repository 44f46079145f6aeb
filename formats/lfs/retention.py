"""Retention for the LFS store: which generations keep their objects, which objects go.

A policy keeps the last ``keep_last`` generations, every ``keep_every``-th (gen divisible by
it), and milestones (gens named explicitly, e.g. by milestone tags). A kept generation keeps
every object its shards need: each shard's stored object and, for residuals, the whole chain
back to its keyframe, so pruning never breaks a kept generation's chain. Every other object
is pruned from the store through a store-side :class:`ObjectPruner` (the LFS batch API has no
delete). Pruned generations keep their MANIFESTs and ledger lines in Git; the record file
``retention/<run>.retention`` (committed beside them) says which were pruned under which
policy, and verification reports them as "pruned by retention (policy ...)".

Record grammar (ASCII, LF ends)::

    SNAPOPS-RETENTION 1
    policy keep_last=<n> keep_every=<n> milestones=<gen,...|->
    pruned <gen,...|->

>>> rec = RetentionRecord(Policy(4, 5, frozenset({3})), frozenset({1, 2}))
>>> parse_record(rec.render()) == rec
True
>>> rec.note(2)
'gen 2 pruned by retention (policy keep_last=4 keep_every=5 milestones=3)'
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from snapops.formats.errors import FormatError
from snapops.formats.generation.manifest import Manifest, ShardRecord

MAGIC = "SNAPOPS-RETENTION 1"
MAX_RECORD = 4 << 20
_GENS = r"-|(?:0|[1-9][0-9]{0,17})(?:,(?:0|[1-9][0-9]{0,17}))*"
_RECORD = re.compile(MAGIC + r"\npolicy keep_last=(?P<last>[1-9][0-9]{0,8}) "
                     r"keep_every=(?P<every>0|[1-9][0-9]{0,8}) milestones=(?P<milestones>"
                     + _GENS + r")\npruned (?P<pruned>" + _GENS + r")\n")


def record_path(run: str) -> str:
    return f"retention/{run}.retention"


@dataclass(frozen=True)
class Policy:
    keep_last: int
    keep_every: int = 0                 # 0: none
    milestones: frozenset[int] = frozenset()

    def describe(self) -> str:
        return (f"keep_last={self.keep_last} keep_every={self.keep_every} "
                f"milestones={_gens(self.milestones)}")

    def kept(self, gens: list[int]) -> set[int]:
        ordered = sorted(gens)
        keep = set(ordered[-self.keep_last:])
        if self.keep_every:
            keep |= {g for g in ordered if g % self.keep_every == 0}
        return keep | (self.milestones & set(ordered))


@dataclass(frozen=True)
class RetentionRecord:
    policy: Policy
    pruned: frozenset[int]

    def render(self) -> bytes:
        return (f"{MAGIC}\npolicy {self.policy.describe()}\npruned {_gens(self.pruned)}\n"
                ).encode("ascii")

    def note(self, gen: int) -> str | None:
        """What verification reports for a pruned generation; None for a kept one."""
        if gen not in self.pruned:
            return None
        return f"gen {gen} pruned by retention (policy {self.policy.describe()})"


def _gens(gens) -> str:
    return ",".join(str(g) for g in sorted(gens)) or "-"


def _parse_gens(text: str, what: str, path: str) -> frozenset[int]:
    gens = [] if text == "-" else [int(g) for g in text.split(",")]
    if any(a >= b for a, b in zip(gens, gens[1:])):
        raise FormatError(f"the {what} generations are not in increasing order, each once",
                          path=path, check="retention", expected="e.g. 1,2,6 (as snapops "
                          "writes them)", got=text[:80])
    return frozenset(gens)


def parse_record(data: bytes, path: str = "retention record") -> RetentionRecord:
    """The record in ``data``; FormatError unless it is one as snapops writes it (canonical,
    and pruning no generation its own policy keeps: no milestone, no multiple of
    ``keep_every``)."""
    m = _RECORD.fullmatch(data[:MAX_RECORD + 1].decode("ascii", "replace"))
    if m is None or len(data) > MAX_RECORD:
        raise FormatError("not a retention record", path=path, offset=0, check="retention",
                          expected=f"{MAGIC} / policy ... / pruned ... lines",
                          got=repr(data[:60]))
    policy = Policy(int(m["last"]), int(m["every"]),
                    _parse_gens(m["milestones"], "milestone", path))
    pruned = _parse_gens(m["pruned"], "pruned", path)
    kept = sorted(g for g in pruned if g in policy.milestones
                  or (policy.keep_every and g % policy.keep_every == 0))
    if kept:
        raise FormatError(f"it prunes gen {kept[0]}, which its own policy keeps", path=path,
                          check="retention", expected=f"no milestone and no multiple of "
                          f"keep_every pruned ({policy.describe()})", got=_gens(kept)[:80])
    return RetentionRecord(policy, pruned)


def check_not_pruned(record: RetentionRecord, gen: int, path: str) -> None:
    """FormatError when ``record`` prunes ``gen``, the newest generation of the tree that holds
    the record: every policy keeps the newest (``keep_last`` >= 1)."""
    if gen in record.pruned:
        raise FormatError(f"it prunes gen {gen}, the newest generation of its own tree",
                          path=path, check="retention",
                          expected=f"pruned generations older than gen {gen}",
                          got=_gens(record.pruned)[-80:])


@dataclass
class RetentionPlan:
    kept: set[int]
    pruned: set[int]
    keep_objects: set[str] = field(default_factory=set)
    prune_objects: set[str] = field(default_factory=set)


def chain_objects(manifests: dict[int, Manifest], gen: int, shard: ShardRecord) -> set[str]:
    """The objects that restoring ``shard`` of generation ``gen`` needs (its chain)."""
    needed, record = set(), shard
    for _ in range(len(manifests) + 1):
        needed.add(record.object)
        if record.encoding != "res":
            return needed
        base = manifests.get(record.base)
        record = base.shard(shard.path) if base is not None else None
        if record is None:
            raise FormatError(f"gen {gen}: the base of {shard.path} (gen {shard.base}) is "
                              "not among the generations", check="retention")
    raise FormatError(f"gen {gen}: residual chain of {shard.path} loops", check="retention")


def plan_retention(manifests: dict[int, Manifest], policy: Policy,
                   elsewhere: frozenset[str] = frozenset()) -> RetentionPlan:
    """Which generations and objects stay under ``policy`` (``manifests``: every generation
    of the run by gen, LFS-store ones; others are ignored). ``elsewhere``: the objects other
    runs of the store use, never pruned (identical shards of two runs are one object)."""
    lfs = {g: m for g, m in manifests.items() if m.header.store == "lfs"}
    kept = policy.kept(list(lfs))
    plan = RetentionPlan(kept, set(lfs) - kept)
    every: set[str] = set()
    for gen, manifest in lfs.items():
        for shard in manifest.shards:
            every.add(shard.object)
            if gen in kept:
                plan.keep_objects |= chain_objects(lfs, gen, shard)
    plan.prune_objects = every - plan.keep_objects - elsewhere
    return plan


class ObjectPruner(Protocol):
    """The store side of pruning: delete one object by oid (True when it was there)."""

    def delete(self, oid: str) -> bool: ...


class LocalStoragePruner:
    """Objects in a folder, one file per oid: ``<root>/<oid>`` (giftless's local backend, whose
    root is ``<storage>/<org>/<repo>``) or ``<root>/<oid[0:2]>/<oid[2:4]>/<oid>`` (git-lfs's
    own object folder layout)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def delete(self, oid: str) -> bool:
        if not re.fullmatch(r"[0-9a-f]{64}", oid):
            raise FormatError("not an LFS object id", check="retention", got=oid[:80])
        found = False
        for path in (self.root / oid, self.root / oid[:2] / oid[2:4] / oid):
            try:
                path.unlink()
                found = True
            except FileNotFoundError:
                pass
        return found


def apply_retention(plan: RetentionPlan, pruner: ObjectPruner) -> int:
    """Delete the plan's pruned objects; how many were there."""
    return sum(pruner.delete(oid) for oid in sorted(plan.prune_objects))
