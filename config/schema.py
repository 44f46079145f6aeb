"""The one config schema: frozen dataclasses with defaults, and how each key is parsed.

Layers: defaults < TOML file < ``SNAPOPS_<SECTION>_<KEY>`` environment < flags. Every error
names the key path (``snapshot.format: expected one of ...``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

FORMATS = ("wtxt", "fold", "aero", "pycauset", "finf")
POLICIES = ("coalesce", "block")
STORES = ("git", "lfs")


@dataclass(frozen=True)
class DaemonConfig:
    spool_dir: str = "spool"          # clients write the WAL and spooled generations here
    state_dir: str = "state"          # daemon-private: push queue, status, lock
    log_level: str = "info"
    log_format: str = "text"          # text | json
    poll_interval: float = 60.0       # safety rescan of the WAL; watchdog wakes it at once
    nice: int = 10                    # CPU niceness of the daemon and its git children: below
                                      # training, never starved (19 got ~1.5% of a busy core)
    cpu_policy: str = "batch"         # batch (never preempts training on wake-up) | normal
    io_class: str = "best-effort"     # best-effort (lowest level) | idle (only when no other
                                      # I/O: can starve) | none (inherit)
    max_attempts: int = 3             # tries of a generation whose data or ledger keeps failing,
                                      # then DROPPED reason=failed (disk and git outages are
                                      # retried without limit: they fail every generation alike)
    retry_initial: float = 0.5        # seconds before the first retry of a failed generation
    retry_max: float = 30.0           # cap of its exponential backoff
    abandon_after: float = 30.0       # seconds a REQ may wait for SPOOLED once its writer's
                                      # process is gone; then DROPPED reason=abandoned


@dataclass(frozen=True)
class ClientConfig:
    max_in_flight: int = 2            # pinned generations not yet spooled
    policy: str = "coalesce"          # coalesce | block


@dataclass(frozen=True)
class SnapshotConfig:
    run: str = "run"
    format: str = "wtxt"
    row_blocking: bool = True
    rows_per_chunk: int = 0           # 0: the format's default
    shard_max: int = 32 << 20         # raw bytes per shard file
    streaming_threshold: int = 1 << 30  # WTXT shards above this are written with WSUM
    delta: bool = False               # also write DELTA v2 files beside changed WTXT shards
    schema: str = "weights/v1"
    build: str = "unknown"
    host: str = "cpu"
    cuda: str = "off"


@dataclass(frozen=True)
class SealConfig:
    hmac_key: str = ""
    sign_key: str = ""
    age_recipients: tuple[str, ...] = ()


@dataclass(frozen=True)
class RemoteConfig:
    name: str
    url: str


@dataclass(frozen=True)
class RepoConfig:
    path: str = "snapshot-repo"
    branch: str = "main"
    author_name: str = "snapops"
    author_email: str = "snapops@localhost"
    retention: int = 8                # local ring: spool and work files of the last K gens
    compression: int = 0              # git zlib level: base64 of float weights barely
                                      # compresses (~75% at best) and zlib runs at ~30 MB/s
    delta: str = "auto"               # auto: the daemon's deltas for sparse shards, none for
                                      # dense ones | always: git may search too | never: whole
    gc_interval: float = 3600.0       # seconds between work-repository cleanups (0: never):
                                      # history older than the last `retention` generations
                                      # that every remote has is forgotten locally
    remotes: tuple[RemoteConfig, ...] = ()
    store: str = "git"                # git: shards in the tree | lfs: in a Git LFS store,
                                      # the tree holds pointers (keyframes and residuals)
    lfs_url: str = ""                 # the LFS endpoint ("": <first remote>[.git]/info/lfs)
    lfs_token_file: str = ""          # a bearer token for the LFS server (never logged)
    keyframe_every: int = 8           # LFS store: a restore applies at most K-1 residuals
                                      # (skip residuals: a keyframe every 2**(K-1) gens)


@dataclass(frozen=True)
class PushConfig:
    backoff_initial: float = 1.0
    backoff_max: float = 300.0
    backoff_factor: float = 2.0
    jitter: float = 0.2               # +- fraction of each delay
    stall_timeout: float = 120.0      # seconds without progress before a push is aborted
    timeout: float = 0.0              # wall-clock seconds for one git push (0: no limit)
    batch_bytes: int = 256 << 20      # bytes per git push: the oldest pending generation,
                                      # then each next one while the sum fits


@dataclass(frozen=True)
class ClusterConfig:
    world_size: int = 1               # training ranks of the run, on every node together
    ranks: str = ""                   # ranks whose trainers write to this daemon's spool:
                                      # "0-3", "4,5,6,7"; "" = all of them (a single node)
    rank_timeout: float = 300.0       # seconds a generation waits for its last ranks' parts
                                      # after its first one arrived; then DROPPED missing_ranks
    node: str = ""                    # this daemon's node name (multi-node runs)
    committer: str = ""               # the node that assembles, seals and pushes generations
    remote: str = ""                  # the [[repo.remote]] parts travel through ("": the first)


@dataclass(frozen=True)
class Config:
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    client: ClientConfig = field(default_factory=ClientConfig)
    snapshot: SnapshotConfig = field(default_factory=SnapshotConfig)
    seal: SealConfig = field(default_factory=SealConfig)
    repo: RepoConfig = field(default_factory=RepoConfig)
    push: PushConfig = field(default_factory=PushConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    base_dir: str = "."               # relative paths resolve against the config file's folder
