"""Several daemons ("nodes", one per machine) make one generation through the shared remote.

No coordination service: the shared remote is the meeting point. Protocol (``docs/formats/
parts.md`` has the whole of it, crash cases included):

* a **contributor** node, once every rank it serves has spooled generation N, writes the shards
  of its ranks (``shards/r<rank>/...``) and a ``PART`` file (:mod:`snapops.daemon.parts`), makes
  them one commit (no parent, dates from the generation's ts) and force-pushes it to its own
  ref ``refs/snapops/parts/<run>/<gen>/<node>``; WAL: SERIALIZED (committed locally),
  COMMITTED + PUSHED (on the remote). It never touches the branch or the tags.
* the **committer** node lists those refs every ``poll_interval`` (:class:`PartExchange`),
  fetches new ones, checks each part (tree, PART, seal, ranks) and records its ranks' parts in
  its own WAL (REQ and SPOOLED with ``part=<rank> node=<node> commit=<sha>``). When every rank
  of the world is in, it places the parts' files in its work tree, writes the MANIFEST over all
  of them, verifies the generation, commits, tags and pushes it like any other. Once a
  generation is pushed to the parts remote, or dropped, its part refs are deleted.

Git objects carry the shard bytes (``store = "git"``). With ``store = "lfs"`` a contributor
uploads each shard to the LFS server as a keyframe before it commits the part, whose tree holds
the pointer files (the PART names each object); the committer places the pointers, checked
byte for byte against the PART, and stores its own ranks' shards as usual (residuals too).
"""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from snapops.formats.atomic import atomic_write, atomic_write_bytes
from snapops.formats.errors import FormatError, GitError, LimitError
from snapops.formats.generation.manifest import ShardRecord, gen_text, parse_gen_text
from snapops.formats.generation.plan import Shard
from snapops.formats.generation.write import (
    GenerationSpec, PartWritten, changed_share, write_part,
)
from snapops.formats.gitcmd import ref_lines, run_git, run_listing, tree_records
from snapops.formats.gitwatch import fetch_floor
from snapops.formats.lfs.pointer import render_pointer

from .lifecycle import COMMITTED, DROPPED, PUSHED, REQ, SPOOLED, Generation
from .parts import MAX_BYTES, PartFile, PartHeader, parse_part, render_part
from .ranks import Cluster
from .redact import redact_url
from .wal import NODE, WalState

log = logging.getLogger("snapops.nodes")
PART_FILE = "PART"
BLOCK = 1 << 20
DELETE_BATCH = 256                  # refs one poll deletes (push's work: refs x remote refs)
_NODE = re.compile(NODE)


def part_ref(run: str, gen: int, node: str) -> str:
    """``refs/snapops/parts/run1/000042/node-b``"""
    return f"refs/snapops/parts/{run}/{gen_text(gen)}/{node}"


def parse_ref(ref: str, run: str) -> tuple[int, str] | None:
    """(gen, node) of a part ref of ``run``, None for anything else."""
    prefix = f"refs/snapops/parts/{run}/"
    if not ref.startswith(prefix):
        return None
    text, _, node = ref[len(prefix):].partition("/")
    gen = parse_gen_text(text)
    if gen is None or not _NODE.fullmatch(node):
        return None     # any ref name can be pushed: only the canonical spelling is a part
    return gen, node


class NodeGit:
    """The real ``git`` in the daemon's repository through the one git runner
    (:func:`snapops.formats.gitcmd.run_git`), every call aborted after ``stall`` seconds
    without progress."""

    def __init__(self, repo: Path, stall: float) -> None:
        self.repo, self.stall = Path(repo), stall

    def _call(self, args: tuple[str, ...], input: bytes | None, env: dict | None,
              cwd: Path | None, check: bool, keep_free: tuple[str, int] | None = None):
        return run_git(args, cwd=cwd or self.repo, input=input, env=env, check=check,
                       stall=self.stall, what=args[0], redact=_url_redactions(args),
                       keep_free=keep_free)

    def run(self, *args: str, input: bytes | None = None, env: dict | None = None,
            cwd: Path | None = None, keep_free: tuple[str, int] | None = None) -> bytes:
        """stdout of ``git args``; GitError (URLs redacted) when it fails, stalls, or runs
        the disk low (``keep_free``, as :func:`~snapops.formats.gitcmd.run_git` takes it)."""
        return self._call(args, input, env, cwd, check=True, keep_free=keep_free).stdout

    def succeeds(self, *args: str) -> bool:
        return self._call(args, None, None, None, check=False).ok

    def text(self, *args: str, **kwargs) -> str:
        return self.run(*args, **kwargs).decode("utf-8", "replace").strip()

    def open_blob(self, spec: str):
        from snapops.hooks.gitio import Git

        return Git(self.repo).open_blob(spec)


# --- contributor --------------------------------------------------------------------------

@dataclass(frozen=True)
class Published:
    commit: str
    ref: str


def _url_redactions(args) -> dict[str, str]:
    return {arg: redact_url(arg) for arg in args if "://" in arg or "@" in arg}


def build_part(git: NodeGit, scratch: Path, spec: GenerationSpec, header: PartHeader,
               ranks: dict[int | None, dict[str, Shard]], hmac_key: bytes | None) -> str:
    """Write the part of ``header.ranks`` under ``scratch`` and commit it (not on any branch);
    returns the commit. Dated by the generation's ts, so the same part makes the same commit."""
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    written = write_part(scratch, spec, header.gen, header.ts, ranks, None)
    atomic_write_bytes(scratch / PART_FILE, render_part(PartFile(header, written), hmac_key))
    index = scratch.parent / f".{scratch.name}.index"
    env = {"GIT_INDEX_FILE": str(index), "GIT_WORK_TREE": str(scratch),
           "GIT_DIR": str((git.repo / git.text("rev-parse", "--git-dir")).resolve())}
    try:
        git.run("read-tree", "--empty", env=env)
        git.run("add", "-A", "-f", "--", ".", env=env, cwd=scratch)
        tree = git.text("write-tree", env=env)
    finally:
        index.unlink(missing_ok=True)
    date = f"{header.ts[:-1]}+0000"
    who = {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
    message = f"snapops part: {header.run} gen {header.gen} node {header.node}\n"
    return git.text("commit-tree", "--no-gpg-sign", tree, input=message.encode(), env=who)


def publish_part(git: NodeGit, url: str, ref: str, commit: str) -> None:
    """Point ``ref`` at ``commit`` here and on ``url`` (forced: only this node writes it)."""
    git.run("update-ref", ref, commit)
    git.run("push", "--porcelain", "--no-verify", url, f"+{ref}:{ref}")


def forget_part(git: NodeGit, scratch: Path, ref: str) -> None:
    git.succeeds("update-ref", "-d", ref)
    shutil.rmtree(scratch, ignore_errors=True)


# --- committer ----------------------------------------------------------------------------

@dataclass(frozen=True)
class RemotePart:
    gen: int
    node: str
    commit: str
    ref: str


def list_parts(git: NodeGit, url: str, run: str) -> list[RemotePart]:
    out = git.run("ls-remote", "--refs", url, f"refs/snapops/parts/{run}/*")
    found = []
    for line in ref_lines(out):
        sha, _, ref = line.partition("\t")
        where = parse_ref(ref, run)
        if where is not None:
            found.append(RemotePart(where[0], where[1], sha, ref))
    return sorted(found, key=lambda p: (p.gen, p.node))


def read_part(git: NodeGit, commit: str, hmac_key: bytes | None) -> PartFile:
    """The PART of a part commit, checked, and its tree holding exactly the files it lists
    (regular files of the listed sizes). FormatError otherwise. The PART (and its seal) is
    checked before the tree is walked, and the walk stops at the first entry the PART does
    not imply: a small pushed tree can stand for billions of paths."""
    where = f"part commit {commit[:12]}"
    _parentless_commit(git, commit, where)
    size = _part_size(git, commit, where)
    with git.open_blob(f"{commit}:{PART_FILE}") as stream:
        data = stream.read(size)
    part = parse_part(data, f"{where}:{PART_FILE}", hmac_key)
    want = {PART_FILE: size, **{s.path: _in_tree(s)[0] for s in part.written.shards},
            **{f.path: f.size for f in part.written.files}}
    _check_tree(git, commit, want, where)
    return part


def _parentless_commit(git: NodeGit, commit: str, where: str) -> None:
    kind = git.text("cat-file", "-t", commit)
    if kind != "commit" or git.succeeds("rev-parse", "-q", "--verify", f"{commit}^1"):
        raise FormatError("not a part commit", path=where, check="fileset",
                          expected="a commit without parents", got=kind)


def _part_size(git: NodeGit, commit: str, where: str) -> int:
    listed = git.run("ls-tree", "-l", "-z", "--full-tree", commit, "--", PART_FILE)
    entry = next(tree_records(listed), None)
    if entry is None or entry[:2] != ("100644", "blob") or entry.size is None \
            or entry.size > MAX_BYTES:
        raise FormatError("no PART file of a bounded size", path=where, check="fileset",
                          expected=f"a regular file PART of at most {MAX_BYTES} bytes")
    return entry.size


def _check_tree(git: NodeGit, commit: str, want: dict[str, int], where: str) -> None:
    """The commit's tree holds exactly ``want`` (path: size, regular files) and the folders
    leading to them; listing more entries than that is refused as it is seen."""
    folders = {path.rsplit("/", i)[0] for path in want for i in range(1, path.count("/") + 1)}
    try:
        listed = run_listing(["ls-tree", "-r", "-t", "-l", "-z", "--full-tree", commit],
                             cwd=git.repo, what="ls-tree", max_paths=len(want) + len(folders))
    except LimitError as exc:
        raise FormatError("the part's files are not what its PART lists", path=where,
                          check="fileset", expected=exc.expected, got="more") from None
    seen = set()
    for mode, kind, _, size, path in tree_records(listed):
        if path in folders and (mode, kind) == ("040000", "tree"):
            continue
        if path not in want or (mode, kind) != ("100644", "blob") or size != want[path]:
            raise FormatError("the part's files are not what its PART lists",
                              path=f"{where}:{path[:200]}", check="fileset",
                              expected="a regular file (100644) of the listed size",
                              got=f"{mode} {kind} {size}")
        seen.add(path)
    if len(seen) != len(want):
        missing = sorted(set(want) - seen)[0]
        raise FormatError("the part's files are not what its PART lists",
                          path=f"{where}:{missing}", check="fileset", got="missing")


def tree_bytes(shard: ShardRecord) -> bytes | None:
    """What a part commit holds for an LFS-store shard: its pointer file (None: the shard)."""
    if shard.object is None or shard.object_size is None:
        return None
    return render_pointer(shard.object, shard.object_size)


def _in_tree(shard: ShardRecord) -> tuple[int, str]:
    """Size and SHA-256 of what the part commit holds for ``shard``."""
    pointer = tree_bytes(shard)
    if pointer is None:
        return shard.size, shard.sha256
    return len(pointer), hashlib.sha256(pointer).hexdigest()


def place_part(git: NodeGit, commit: str, part: PartFile, folder: Path) -> PartWritten:
    """Write the part's files into the run folder (atomically, each checked against its size
    and SHA-256); returns the part as the generation writer takes it."""
    written = part.written
    records = [(s.path, *_in_tree(s), s.format) for s in written.shards] + \
        [(f.path, f.size, f.sha256, None) for f in written.files]
    written.dense = []
    for path, size, sha256, fmt in records:
        target = folder / path
        target.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()

        def check(tmp: Path) -> None:
            if tmp.stat().st_size != size or digest.hexdigest() != sha256:
                raise FormatError("a part file differs from its PART record",
                                  path=f"part commit {commit[:12]}:{path}", check="digest",
                                  expected=f"{size} bytes sha256={sha256}")
            if text_format(fmt) and target.exists() and changed_share(target, tmp) > 0.5:
                written.dense.append(path)

        with git.open_blob(f"{commit}:{path}") as stream, \
                atomic_write(target, before_replace=check) as out:
            while block := stream.read(BLOCK):
                digest.update(block)
                out.write(block)
    return written


def delete_parts(git: NodeGit, url: str, refs: list[str]) -> None:
    """Delete ``refs`` on ``url`` and here (one push: keep them to a few hundred)."""
    if refs:
        git.run("push", "--porcelain", "--no-verify", url, *(f":{ref}" for ref in refs))
        git.run("update-ref", "--stdin", input="".join(f"delete {ref}\n" for ref in refs)
                .encode())


@dataclass
class PartExchange:
    """The committer's half of the protocol: poll the parts remote, take in new parts as WAL
    records, sweep the refs of finished generations, place received parts for assembly."""

    git: NodeGit
    cluster: Cluster
    run: str
    format: str
    hmac_key: bytes | None
    store: str = "git"                                      # the run's store: parts must match
    interval: float = 2.0                                   # seconds between two polls
    reachable: bool = True                                  # the last poll reached the remote
    refused: dict[tuple[int, str], str] = field(default_factory=dict)   # (gen, node) -> why
    refused_commit: dict[tuple[int, str], str] = field(default_factory=dict)  # -> its commit
    taken: set[tuple[int, str, str]] = field(default_factory=set)   # (gen, node, commit)
    next_at: float = 0.0
    outstanding: bool = False                               # the last poll saw part refs

    def poll(self, state: WalState, record: Callable[..., None], now: float) -> None:
        """One round (at most one per ``interval``): list, sweep, take in.
        ``record(event, gen, **fields)`` appends to the WAL. Remote failures leave
        ``reachable`` False (and raise nothing)."""
        if now < self.next_at:
            return
        self.next_at = now + self.interval
        url = self.cluster.remote.url
        try:
            remote = list_parts(self.git, url, self.run)
            self.reachable, self.outstanding = True, bool(remote)
        except GitError as exc:
            self.reachable = False
            log.error("cannot list parts on %s: %s", redact_url(url), exc)
            return
        finished = {g.gen for g in state.gens.values() if self._finished(g)}
        newest = max(finished, default=-1)
        stale = [p.ref for p in remote if p.gen in finished] + \
            [p.ref for p in remote if p.gen not in state.gens and p.gen < newest]
        try:   # anyone who can push can make more refs than one push deletes in good time
            delete_parts(self.git, url, stale[:DELETE_BATCH])
        except GitError as exc:
            log.error("cannot delete part refs on %s: %s", redact_url(url), exc)
        stale = set(stale)
        self._forget([p for p in remote if p.ref not in stale])
        for part in remote:
            if part.ref not in stale and self._wanted(state, part):
                self._take(state, part, record)

    def _finished(self, gen: Generation) -> bool:
        """Dropped, or committed and pushed to the parts remote: its parts are not needed."""
        return gen.state == DROPPED or (
            gen.state in (COMMITTED, PUSHED) and self.cluster.remote.name in gen.pushed)

    def _forget(self, listed: list[RemotePart]) -> None:
        """Keep what is known of the part commits still listed only: a ref moved to another
        commit is looked at again."""
        live = {(p.gen, p.node, p.commit) for p in listed}
        self.taken &= live
        for key, commit in list(self.refused_commit.items()):
            if (*key, commit) not in live:
                self.refused.pop(key, None)
                del self.refused_commit[key]

    def _wanted(self, state: WalState, part: RemotePart) -> bool:
        """Another node's commit, not refused nor taken in since this daemon started, of a
        newer gen still waiting. After a restart each is read once more: a crash may have
        come between the records of its ranks."""
        key = (part.gen, part.node)
        if part.node == self.cluster.node or self.refused_commit.get(key) == part.commit or \
                (*key, part.commit) in self.taken:
            return False
        record = state.gens.get(part.gen)
        if record is not None and record.state != REQ:
            return False
        newest = max((g.gen for g in state.in_state(COMMITTED, PUSHED)), default=-1)
        return part.gen > newest

    def _take(self, state: WalState, part: RemotePart, record: Callable[..., None]) -> None:
        key = (part.gen, part.node)
        try:
            found = self._fetch(state, part)
        except GitError as exc:
            log.error("cannot fetch the part of node %s for gen %d: %s", part.node, part.gen,
                      exc)
            return
        except FormatError as exc:
            self.refused[key], self.refused_commit[key] = str(exc), part.commit
            log.error("gen %d: the part of node %s is refused: %s", part.gen, part.node, exc)
            return
        self.refused.pop(key, None)
        self.refused_commit.pop(key, None)
        known = state.gens[part.gen].parts if part.gen in state.gens else {}
        for rank in found.header.ranks:  # after a crash between them, only what is missing
            fields = {"part": rank, "node": part.node}
            if str(rank) not in known:
                record(REQ, part.gen, world=self.cluster.world, **fields)
            if getattr(known.get(str(rank)), "state", REQ) == REQ:
                record(SPOOLED, part.gen, commit=part.commit, **fields)
        self.taken.add((*key, part.commit))
        log.info("gen %d: part of node %s (ranks %s) received", part.gen, part.node,
                 ",".join(map(str, found.header.ranks)))

    def _fetch(self, state: WalState, part: RemotePart) -> PartFile:
        if self.hmac_key is None:   # anyone who can push could write any part
            raise FormatError("this committer has no HMAC key ([seal] hmac_key): no part can "
                              "be authenticated", path=part.ref, check="hmac")
        self.git.run("fetch", "--no-tags", "--no-write-fetch-head", self.cluster.remote.url,
                     f"+{part.ref}:{part.ref}", keep_free=fetch_floor(self.git.repo))
        # the ref may have moved since it was listed: keep the commit recorded (a GitError if
        # it is not here; the next poll lists the new one)
        self.git.run("update-ref", part.ref, part.commit)
        found = read_part(self.git, part.commit, self.hmac_key)
        self._check(state, part, found)
        return found

    def _check(self, state: WalState, part: RemotePart, found: PartFile) -> None:
        """The part is for this run, gen, node, world and format, and brings ranks that are
        served elsewhere and not already in."""
        h = found.header
        want = (self.run, part.gen, part.node, self.cluster.world, self.format, self.store)
        got = (h.run, h.gen, h.node, h.world, h.format, h.store)
        if got != want:
            raise FormatError("a part for another run, gen, node, world, format or store",
                              path=part.ref, check="part", expected=str(want), got=str(got))
        record = state.gens.get(part.gen)
        known = record.parts if record is not None else {}
        for rank in h.ranks:
            other = known.get(str(rank))
            if rank in self.cluster.local or (other is not None and (
                    other.fields.get("node") != part.node or
                    other.fields.get("commit", part.commit) != part.commit)):
                raise FormatError(f"rank {rank} is already served by another node or part "
                                  "commit", path=part.ref, check="part")

    def received(self, record: Generation, folder: Path
                 ) -> tuple[tuple[PartWritten, ...], str | None]:
        """Place every remote part of ``record`` into ``folder`` (the run folder, reset to the
        last commit); returns them and their earliest ts. FormatError when one is gone or
        damaged."""
        commits = sorted({p.fields["commit"] for p in record.parts.values()
                          if "commit" in p.fields})
        parts, ts = [], None
        for commit in commits:
            if not self.git.succeeds("cat-file", "-e", f"{commit}^{{commit}}"):
                raise FormatError("the part commit is no longer here", path=commit,
                                  check="fileset")
            found = read_part(self.git, commit, self.hmac_key)
            parts.append(place_part(self.git, commit, found, folder))
            ts = min(ts or found.header.ts, found.header.ts)
        return tuple(parts), ts


def text_format(name: str | None) -> bool:
    """Line-oriented text (WTXT): git's delta search can pay off unless most lines changed
    (None: a companion file, not a shard)."""
    from snapops.formats.registry import handler

    return name is not None and handler(name).capabilities.streams_text
