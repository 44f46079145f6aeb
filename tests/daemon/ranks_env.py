"""Multi-rank test rigs: a daemon set up for a world of ranks (optionally one node of several),
and a world of real ``torch.distributed`` rank processes (:mod:`tests.daemon.rank_worker`)."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from pathlib import Path

from snapops.config import load_config
from snapops.daemon.client import WAL_NAME
from snapops.daemon.ranks import Cluster
from snapops.daemon.wal import replay

from .daemon_env import DaemonEnv

REPO = Path(__file__).resolve().parents[2]
REPLY_TIMEOUT = 120.0      # a rank that does not answer by then is stuck (a dead peer)


class RankedEnv(DaemonEnv):
    """A DaemonEnv whose config has a ``[cluster]`` section and its own spool folder."""

    def __init__(self, root: Path, remotes: dict[str, str], *, world: int, timeout: float = 60,
                 spool: str = "spool", cluster: str = "", repo: Path | None = None,
                 **options) -> None:
        super().__init__(root, remotes, repo=repo, **options, extra=(
            f"[cluster]\nworld_size = {world}\nrank_timeout = {timeout}\n{cluster}"))
        text = self.config.read_text().replace(
            "[daemon]\n", f'[daemon]\nspool_dir = "{spool}"\nabandon_after = 2.0\n', 1)
        self.config.write_text(text)
        self.spool = root / spool
        self.world = world

    def state(self):
        scope = Cluster.from_config(load_config(self.config, env={})).wal_scope()
        return replay(self.spool / WAL_NAME, **scope)[0]

    def status(self) -> dict:
        from snapops.daemon.walstatus import status_from

        return status_from(self.state(), set(self.remotes))


class World:
    """``size`` rank processes in one gloo process group, each with its own Snapshotter on
    ``spool``; commands go to every rank (or the ones named) and wait for their echo."""

    def __init__(self, root: Path, spool: Path, size: int, *, name: str,
                 clone: Path | None = None, ranks: range | None = None) -> None:
        store = root / f"{name}.store"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
        extra = ["--clone", str(clone)] if clone else []
        self.procs = {
            rank: subprocess.Popen(
                [sys.executable, "-m", "tests.daemon.rank_worker", "--spool", str(spool),
                 "--rank", str(rank), "--world", str(size), "--store", str(store), *extra],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO, env=env)
            for rank in (ranks if ranks is not None else range(size))}
        self._expect("ready", self.procs)

    def do(self, command: str, ranks=None) -> None:
        chosen = {r: self.procs[r] for r in (ranks if ranks is not None else self.procs)}
        for proc in chosen.values():
            proc.stdin.write(command + "\n")
            proc.stdin.flush()
        self._expect(command, chosen)

    def _expect(self, reply: str, procs: dict) -> None:
        for rank, proc in procs.items():
            ready, _, _ = select.select([proc.stdout], [], [], REPLY_TIMEOUT)
            line = proc.stdout.readline().strip() if ready else "(nothing)"
            assert line == reply, f"rank {rank} answered {line!r} to {reply!r} " \
                                  f"(exit {proc.poll()})"

    def kill(self, rank: int) -> None:
        proc = self.procs.pop(rank)
        proc.kill()
        proc.wait(30)
        proc.stdin.close()
        proc.stdout.close()

    def close(self) -> None:
        """Ask every rank to leave; kill the ones that cannot (their peers are gone)."""
        for proc in self.procs.values():
            try:
                proc.stdin.write("exit\n")
                proc.stdin.flush()
            except OSError:
                pass
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
            for stream in (proc.stdin, proc.stdout):
                try:
                    stream.close()
                except OSError:
                    pass
        self.procs = {}
