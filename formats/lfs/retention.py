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


def _parse_gens(text: str) -> frozenset[int]:
    return frozenset() if text == "-" else frozenset(int(g) for g in text.split(","))


def parse_record(data: bytes, path: str = "retention record") -> RetentionRecord:
    m = _RECORD.fullmatch(data[:MAX_RECORD + 1].decode("ascii", "replace"))
    if m is None or len(data) > MAX_RECORD:
        raise FormatError("not a retention record", path=path, offset=0, check="retention",
                          expected=f"{MAGIC} / policy ... / pruned ... lines",
                          got=repr(data[:60]))
    policy = Policy(int(m["last"]), int(m["every"]), _parse_gens(m["milestones"]))
    return RetentionRecord(policy, _parse_gens(m["pruned"]))


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


def plan_retention(manifests: dict[int, Manifest], policy: Policy) -> RetentionPlan:
    """Which generations and objects stay under ``policy`` (``manifests``: every generation
    of the run by gen, LFS-store ones; others are ignored)."""
    lfs = {g: m for g, m in manifests.items() if m.header.store == "lfs"}
    kept = policy.kept(list(lfs))
    plan = RetentionPlan(kept, set(lfs) - kept)
    every: set[str] = set()
    for gen, manifest in lfs.items():
        for shard in manifest.shards:
            every.add(shard.object)
            if gen in kept:
                plan.keep_objects |= chain_objects(lfs, gen, shard)
    plan.prune_objects = every - plan.keep_objects
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
