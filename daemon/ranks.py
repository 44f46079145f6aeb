"""Multi-rank runs on the daemon's side: which ranks this daemon serves, when a generation
waited too long for its missing ranks, and a spooled generation's parts opened as pieces.

``[cluster]`` in the config says the run's ``world_size``, the ``ranks`` whose trainers write to
this daemon's spool (all of them on a single machine), how long a generation waits for the
ranks that have not delivered (``rank_timeout``, counted from its first part's record), and for
multi-node runs this daemon's ``node`` name, the ``committer`` node and the ``remote`` that
parts travel through (see :mod:`snapops.daemon.nodes`).

Example::

    cluster = Cluster.from_config(load_config(overrides={"cluster.world_size": 4}))
    sorted(cluster.local), cluster.committer, cluster.multi_node
    # -> ([0, 1, 2, 3], True, False)
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from snapops.config.schema import Config, RemoteConfig
from snapops.formats.errors import ConfigError, FormatError
from snapops.formats.generation.plan import Shard
from snapops.formats.generation.write import whole

from .lifecycle import REQ, Generation
from .spool import Spool, spool_name
from .wal import NODE, WalState

_RANKS = re.compile(r"([0-9]{1,6})(?:-([0-9]{1,6}))?")


@dataclass(frozen=True)
class Cluster:
    world: int
    local: frozenset[int]               # ranks whose trainers write to this spool
    timeout: float
    node: str | None = None
    committer: bool = True              # this daemon assembles, seals and commits
    remote: RemoteConfig | None = None  # where parts travel (multi-node)

    @classmethod
    def from_config(cls, config: Config) -> "Cluster":
        """The cluster section checked as a whole; ConfigError names the key."""
        c = config.cluster
        local = parse_ranks(c.ranks, c.world_size) if c.ranks else frozenset(range(c.world_size))
        if bool(c.node) != bool(c.committer):
            raise ConfigError("cluster.committer: give node and committer together")
        for key in ("node", "committer"):
            value = getattr(c, key)
            if value and not re.fullmatch(NODE, value):
                raise ConfigError(f"cluster.{key}: expected [A-Za-z0-9][A-Za-z0-9_.-]{{0,63}}, "
                                  f"got {value!r}")
        committer = c.node == c.committer
        multi_node = len(local) < c.world_size
        if multi_node and not c.node:
            raise ConfigError(f"cluster.node: this daemon serves ranks {sorted(local)} of "
                              f"{c.world_size}; name the node and the committer")
        if c.node and not config.seal.hmac_key:   # anyone who can push can write a part
            raise ConfigError("seal.hmac_key: nodes authenticate their parts with it; give "
                              "every node the run's HMAC key")
        return cls(c.world_size, local, c.rank_timeout, c.node or None, committer,
                   _part_remote(config) if c.node else None)

    @property
    def ranked(self) -> bool:
        """Ranks write their parts as ``gen-N-rR.spool`` with ``world=`` in their REQ."""
        return self.world > 1

    @property
    def multi_node(self) -> bool:
        return len(self.local) < self.world

    def wal_scope(self) -> dict:
        """How a :class:`WalState` of this daemon's spool is set up."""
        expect = range(self.world) if self.committer else sorted(self.local)
        return {"writers": frozenset(map(str, self.local)),
                "expect": frozenset(map(str, expect)), "world": self.world}

    def state(self) -> WalState:
        return WalState(**self.wal_scope())


def parse_ranks(text: str, world: int) -> frozenset[int]:
    """``"0-3,8"`` -> {0, 1, 2, 3, 8}; ConfigError unless every rank is below ``world``."""
    ranks: set[int] = set()
    for item in text.replace(" ", "").split(","):
        m = _RANKS.fullmatch(item)
        if not m:
            raise ConfigError(f"cluster.ranks: expected ranks like 0-3,8, got {text!r}")
        low, high = int(m.group(1)), int(m.group(2) or m.group(1))
        if not low <= high < world:
            raise ConfigError(f"cluster.ranks: {item} is not a range within 0..{world - 1} "
                              f"(cluster.world_size = {world})")
        ranks.update(range(low, high + 1))
    return frozenset(ranks)


def _part_remote(config: Config) -> RemoteConfig:
    remotes = {r.name: r for r in config.repo.remotes}
    name = config.cluster.remote or next(iter(remotes), "")
    if name not in remotes:
        raise ConfigError(f"cluster.remote: parts travel through a [[repo.remote]]; "
                          f"{name or 'none'} is not one (known: {', '.join(remotes) or 'none'})")
    return remotes[name]


def overdue(state: WalState, cluster: Cluster, waits: RankWaits,
            now: float) -> dict[int, list[str]]:
    """{gen: missing ranks} of requested generations that have waited (``waits``) more than
    ``rank_timeout`` seconds for their parts (multi-rank runs only); ``now``: wall clock."""
    if not cluster.ranked:
        return {}
    late = {}
    for gen in state.in_state(REQ):
        if gen.problem is None and waits.waited(gen, now) > cluster.timeout:
            late[gen.gen] = gen.missing(state.expect)
    return late


class RankWaits:
    """How long each generation waiting for ranks has waited, on the monotonic clock: its
    first part's WAL stamp (``t=``, the writer's wall clock) is taken over once, when first
    seen, so a wall clock stepped afterwards (NTP soon after boot) changes nothing. A stamp
    first seen after a step the daemon noticed may be from before it: its wait then counts
    at most from the step (a rank may get a little longer, never less)."""

    def __init__(self, mono=time.monotonic) -> None:
        self._mono = mono
        self._since: dict[int, float] = {}
        self._stepped: float | None = None      # monotonic time of the last step noticed

    def stepped(self) -> None:
        self._stepped = self._mono()

    def waited(self, gen: Generation, now: float) -> float:
        """Seconds ``gen`` has waited; ``now``: the daemon's wall clock."""
        if gen.gen not in self._since:
            mono = self._mono()
            waited = max(0.0, now - (gen_since(gen) or now))
            if self._stepped is not None:
                waited = min(waited, mono - self._stepped)
            self._since[gen.gen] = mono - waited
        return self._mono() - self._since[gen.gen]

    def keep(self, gens: set[int]) -> None:
        """Forget the generations no longer waiting."""
        self._since = {gen: at for gen, at in self._since.items() if gen in gens}


def gen_since(gen: Generation) -> float:
    """When the generation's first part record was written (its ``t=``)."""
    times = [float(p.since) for p in gen.parts.values() if p.since]
    return min(times, default=0.0)


@dataclass
class OpenedParts:
    """The spooled parts of one generation, mapped: ``ranks`` {rank: {name: Shard}} (rank None
    for a single trainer), the generation's ``ts`` (the earliest of its parts)."""

    ranks: dict[int | None, dict[str, Shard]] = field(default_factory=dict)
    ts: str | None = None
    spools: list[Spool] = field(default_factory=list)

    def close(self) -> None:
        self.ranks.clear()   # drop the views into the maps before closing them
        for spool in self.spools:
            spool.close()


def open_local_parts(spool_dir: Path, record: Generation, cluster: Cluster) -> OpenedParts:
    """The spool files of this daemon's ranks for ``record``, CRC-checked; FormatError naming
    the rank if one is unreadable, hostile, of another gen, rank or world."""
    opened = OpenedParts()
    try:
        for rank in sorted(cluster.local):
            part = record.parts.get(str(rank))
            if part is None:
                continue  # a contributor's own part only: the other nodes' arrive later
            key = rank if cluster.ranked else None
            name = part.fields.get("file", spool_name(record.gen, key))
            spool, arrays = load_spool(spool_dir, name, record.gen, key, cluster.world)
            opened.spools.append(spool)
            opened.ranks[key] = pieces(spool, arrays)
            ts = spool.meta.get("ts")
            if ts and (opened.ts is None or ts < opened.ts):
                opened.ts = ts
    except BaseException:
        opened.close()
        raise
    return opened


def load_spool(spool_dir: Path, name: str, gen: int, rank: int | None,
               world: int) -> tuple[Spool, dict[str, np.ndarray]]:
    """The spool ``name`` of rank ``rank``'s part of ``gen`` and its CRC-checked arrays: a plain
    file name in the spool folder (the WAL grammar allows no ``/``; checked again here), a
    regular file opened without blocking, holding that gen, rank and world. FormatError
    otherwise."""
    try:
        if "/" in name or name in ("", ".", ".."):
            raise FormatError(path=name, expected="a file name in the spool folder", got=name)
        spool = Spool(spool_dir / name)
    except FormatError as exc:
        raise _of_rank(exc, rank)
    try:
        meta = (spool.gen, spool.meta.get("rank"), spool.meta.get("world", 1))
        if meta != (gen, rank, world):
            raise FormatError("a spool file of another part", path=spool.path,
                              expected=f"gen {gen} rank {rank} world {world}",
                              got=f"gen {meta[0]} rank {meta[1]} world {meta[2]}")
        return spool, spool.arrays(check=True)
    except BaseException as exc:
        spool.close()
        raise _of_rank(exc, rank) if isinstance(exc, FormatError) else exc


def _of_rank(exc: FormatError, rank: int | None) -> FormatError:
    """The error with the rank whose part it concerns named first."""
    if rank is not None:
        exc.message = f"rank {rank}: {exc.message or 'unusable spool file'}"
        exc.args = (str(exc),)
    return exc


def pieces(spool: Spool, arrays: dict[str, np.ndarray]) -> dict[str, Shard]:
    """A spool's arrays as pieces: Shards where the spool gives a box, else whole arrays."""
    out = whole({e.name: arrays[e.name] for e in spool.entries if e.global_shape is None})
    for e in spool.entries:
        if e.global_shape is not None:
            out[e.name] = Shard(arrays[e.name], global_shape=e.global_shape, offsets=e.offsets)
    return out
