"""One generation's step of the snapops daemon (:mod:`.service`): serialize, seal, ledger and
commit it, or drop it, or count a failed attempt and back off before the retry.

Multi-node runs: a contributor node pushes its part instead of committing, the committer takes
the other nodes' parts in and assembles them (:mod:`snapops.daemon.nodes`).
"""

from __future__ import annotations

import logging
import time

from snapops.formats.errors import DataError, FormatError, GitError
from snapops.formats.generation.manifest import gen_text, parse_manifest
from snapops.formats.generation.plan import LayoutError
from snapops.formats.generation.source import FolderSource
from snapops.formats.generation.verify import GenerationOptions, verify_generation

from .lifecycle import COMMITTED, DROPPED, PUSHED, REQ, SERIALIZED, SPOOLED
from .redact import redact_url
from .nodes import build_part, forget_part, part_ref, publish_part
from .parts import PartHeader
from .ranks import OpenedParts, open_local_parts
from .serialize import generation_spec, ledger_path, run_dir, serialize_generation
from .wal import WalError, error_token
from .lfsstore import LFSCONFIG, write_lfs_files
from .worktree import ATTRIBUTES, restore_paths, write_delta_attributes

log = logging.getLogger("snapops.daemon")
MAX_FAILURES = 20
UNFINISHED = (REQ, SPOOLED, SERIALIZED)
DEAD_LOCK_AGE = 1.0       # seconds a git lock must exist before a retry may remove it


class GenerationStep:
    """The per-generation methods of :class:`snapops.daemon.service.Daemon` (a mixin: the
    state they use is set up by ``Daemon.__init__`` and ``Daemon.run``)."""

    # --- one generation --------------------------------------------------------------------

    def _advance(self, gen: int) -> bool:
        """Serialize, seal, ledger and commit ``gen`` (a contributor: push its part), or drop
        it; False to stop this pass."""
        record = self.state.gens[gen]
        if record.problem:
            return self._drop(gen, "bad_record", record.problem)
        newest = max((g.gen for g in self.state.in_state(COMMITTED, PUSHED)), default=-1)
        if gen <= newest:
            return self._drop(gen, "out_of_order", f"gen {gen} after committed gen {newest}")
        try:
            opened = open_local_parts(self.spool_dir, record, self.cluster)
        except FormatError as exc:
            return self._drop(gen, "bad_spool", exc)
        if self._sweep_locks:
            self._clear_dead_locks()
        started = time.perf_counter()
        try:
            done = self._commit(gen, opened) if self.cluster.committer else \
                self._contribute(gen, opened)
        except LayoutError as exc:
            return self._drop(gen, "bad_layout", exc)
        except DataError as exc:
            return self._drop(gen, "unserializable", exc)
        except (OSError, GitError) as exc:  # disk, permissions, git: not this gen's fault
            self._sweep_locks = True
            return self._fail(gen, "serialize/commit", exc, counted=False)
        except Exception as exc:  # format or ledger refusals, anything the data provoked
            if not isinstance(exc, FormatError):
                log.exception("gen %d: unexpected error", gen)
            self._sweep_locks = True
            return self._fail(gen, "serialize/commit", exc, counted=True)
        finally:
            opened.close()
        self.consecutive_failures = 0
        self.attempts.pop(gen, None)
        if self.cluster.committer:
            self.pushq.enqueue(gen)
            log.info("gen %d committed %s (%s) in %.2f s (serialize %.2f s)", gen, done[0][:12],
                     done[1], time.perf_counter() - started, self._serialize_s)
        else:
            log.info("gen %d: part %s pushed to %s", gen, done[0][:12], done[1])
        return True

    def _clear_dead_locks(self) -> None:
        """Before retrying a failed serialize/commit step: remove the git lock files a git
        child of this daemon left when it died mid-command (killed, SIGXFSZ, ...); git would
        refuse every retry otherwise. Never one a live git process may hold (see
        :meth:`SnapshotRepo.clear_dead_locks`)."""
        self._sweep_locks = False
        try:
            removed, kept = self.repo.clear_dead_locks(min_age=DEAD_LOCK_AGE)
        except (GitError, OSError) as exc:
            log.error("cannot clear git lock files before the retry: %s", exc)
            return
        if removed:
            log.warning("removed %d git lock file(s) left by a git that is no longer running: "
                        "%s", len(removed), ", ".join(removed))
        if kept:
            log.warning("git lock file(s) kept before the retry: %s", "; ".join(kept))

    def _commit(self, gen: int, opened: OpenedParts) -> tuple[str, str]:
        tag = f"{self.config.snapshot.run}/gen-{gen:06d}"
        done = self.repo.tag_commit(tag)
        if done is not None:  # committed before a crash took the COMMITTED record with it:
            # serializing again would chain the generation to itself
            self._record(COMMITTED, gen, commit=done, tag=tag)
            return done, tag
        restore_paths(self.repo_dir, self.config.repo.branch,
                      [run_dir(self.config), ledger_path(self.config), ATTRIBUTES, LFSCONFIG],
                      self.worktree)
        previous = self.repo.head_file(f"{run_dir(self.config)}/MANIFEST")
        received, ts = (), opened.ts
        if self.exchange is not None:
            received, remote_ts = self.exchange.received(self.state.gens[gen],
                                                         self.repo_dir / run_dir(self.config))
            ts = min(filter(None, (ts, remote_ts)), default=None)
        ts = ts or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.clock()))
        started = time.perf_counter()
        written = serialize_generation(self.repo_dir, gen, opened.ranks, ts, self.config,
                                       self.sealing, previous, received=received, lfs=self.lfs)
        self._serialize_s = time.perf_counter() - started
        if received:  # other nodes' bytes: the whole generation is checked before it lands
            self._verify_worktree()
            if self.lfs is not None:   # and their objects are on the LFS server
                self.lfs.check_on_server([s for part in received for s in part.shards])
        if self.state.gens[gen].state == SPOOLED:
            self._record(SERIALIZED, gen, merkle=written.merkle_this)
        message = (f"snapops: {self.config.snapshot.run} gen {gen} "
                   f"merkle_this={written.merkle_this}")
        paths = written.paths + write_delta_attributes(
            self.repo_dir, self.config.repo.delta, [] if self.lfs else written.dense)
        if self.lfs is not None:
            paths += write_lfs_files(self.repo_dir, self.config)
        stored = {}
        if self.lfs is None:
            stored = self._pack_shards(gen, written.paths, written.dense)
        commit = self.repo.commit_generation(paths, message, tag, stored=stored)
        self.worktree.committed(self.repo_dir, commit, paths)
        self._record(COMMITTED, gen, commit=commit, tag=tag)  # a retry finds the tag
        if self.lfs is not None:  # the next generation's bases only
            self.lfs.trim(parse_manifest(self.repo.head_file(f"{run_dir(self.config)}/MANIFEST"),
                                         "committed MANIFEST"))
        return commit, tag

    def _pack_shards(self, gen: int, paths: list[str], dense: list[str]) -> dict[str, str]:
        """Large shards go into the daemon's own pack (daemon/shardpack.py): sparsely changed
        ones as deltas (unless ``repo.delta = "never"``), the others whole; returns the stored
        ones' object ids by path. A failure costs only speed: the commit stores those shards
        through ``git add`` instead."""
        started = time.perf_counter()
        if self.config.repo.delta == "never":
            dense = paths
        try:
            packed = self.repo.pack_shards(paths, dense)
        except GitError as exc:
            log.warning("gen %d: shards not packed by the daemon (git add stores them): %s",
                        gen, exc)
            return {}
        except Exception:  # an optimisation: never the reason a generation fails
            log.exception("gen %d: shards not packed by the daemon (git add stores them)", gen)
            return {}
        if packed is None:
            return {}
        log.info("gen %d: %d shard(s) packed, %d of them as deltas (%d bytes for %d), "
                 "in %.2f s", gen, len(packed.paths), packed.deltas, packed.delta_bytes,
                 packed.blob_bytes, time.perf_counter() - started)
        return dict(zip(packed.paths, packed.oids))

    def _verify_worktree(self) -> None:
        report = verify_generation(FolderSource(self.repo_dir), self.config.snapshot.run,
                                   GenerationOptions(hmac_key=self.sealing.hmac_key))
        if not report.ok:
            raise report.failure

    def _contribute(self, gen: int, opened: OpenedParts) -> tuple[str, str]:
        """A contributor node's generation: its ranks' part, pushed to its part ref."""
        node, remote = self.cluster.node, self.cluster.remote
        ref = part_ref(self.config.snapshot.run, gen, node)
        scratch = self.state_dir / "parts" / gen_text(gen)
        ts = opened.ts or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.clock()))
        header = PartHeader(self.config.snapshot.run, gen, node, self.cluster.world,
                            tuple(sorted(self.cluster.local)), ts, self.config.snapshot.format,
                            self.config.repo.store)
        # a contributor writes keyframes only (no earlier MANIFEST here to take bases from);
        # each is uploaded before the part is committed
        commit = build_part(self.git, scratch, generation_spec(self.config, self.sealing,
                                                               self.lfs), header,
                            opened.ranks, self.sealing.hmac_key)
        if self.state.gens[gen].state == SPOOLED:
            self._record(SERIALIZED, gen, commit=commit, ref=ref)
        publish_part(self.git, remote.url, ref, commit)
        self._record(COMMITTED, gen, commit=commit, ref=ref)
        self._record(PUSHED, gen, remote=remote.name)
        forget_part(self.git, scratch, ref)
        if self.lfs is not None:  # uploaded, and never a base here: nothing to keep
            self.lfs.trim_to([])
        return commit, ref

    def _drop(self, gen: int, reason: str, why: Exception | str, **fields) -> bool:
        """Record ``gen`` DROPPED with ``reason`` and the error; True: go on with later gens."""
        log.error("gen %d dropped (%s): %s", gen, reason, why)
        self._note_failure(gen, reason, why)
        self.attempts.pop(gen, None)
        if self.state.gens[gen].state in UNFINISHED:
            try:
                self._record(DROPPED, gen, reason=reason, error=error_token(why), **fields)
            except WalError as exc:  # disk full: the drop is retried on the next pass
                log.error("cannot record the drop of gen %d: %s", gen, exc)
                return False
        return True

    def _fail(self, gen: int, stage: str, exc: Exception, *, counted: bool) -> bool:
        """A failed attempt: retried after a backoff; after ``max_attempts`` counted ones,
        dropped (``reason=failed``). Returns whether the pass may go on."""
        if counted:
            self.attempts[gen] = self.attempts.get(gen, 0) + 1
            if self.attempts[gen] >= self.config.daemon.max_attempts:
                return self._drop(gen, "failed", f"{stage} failed {self.attempts[gen]} times, "
                                                 f"last: {exc}")
        self.consecutive_failures += 1
        cfg = self.config.daemon
        delay = min(cfg.retry_max, cfg.retry_initial * 2 ** min(self.consecutive_failures - 1, 16))
        self.retry_at = self.clock() + delay
        log.error("gen %d: %s failed, retrying in %.1fs: %s", gen, stage, delay, exc)
        self._note_failure(gen, stage, exc)
        return False

    def _note_failure(self, gen: int, stage: str, exc: Exception | str) -> None:
        self.failures.append({"gen": gen, "stage": stage, "error": redact_url(str(exc))[:500],
                              "time": self.clock(), "attempts": self.attempts.get(gen, 0)})
        del self.failures[:-MAX_FAILURES]
