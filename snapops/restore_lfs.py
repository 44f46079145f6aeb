"""The LFS side of a restore: an LFS-store generation's shards rebuilt from exactly their chain.

For a generation whose MANIFEST says ``store=lfs`` the commit's tree (pointer files) is wrapped
in an :class:`~snapops.formats.lfs.source.LfsSource`: each pointer is checked against the sealed
MANIFEST, then the shard's keyframe, or its residual and (recursively) its bases, are fetched
from the LFS server into one object cache, and the rebuilt shard is verified like a Git-stored
one. The older MANIFESTs a chain starts from come from their generation tags
(:meth:`~snapops.remote.Repository.manifests`), the retention record from the default branch
(:meth:`~snapops.remote.Repository.retention`): a pruned generation is refused with the
retention reason before anything is fetched. The endpoint is ``lfs_url``, else the tree's
``.lfsconfig``, else git-lfs's discovery from the remote URL
(:mod:`snapops.formats.lfs.access`). An endpoint that cannot be reached or does not answer as a
Git LFS server ends the restore with one ConfigError naming it (redacted) and what was
expected; a missing or corrupt object fails that generation only.

Example::

    access = LfsAccess(repo, LfsSettings(token_file="keys/lfs-read.token"))
    source, options = access.wrap(source, "run1", options)
    load_from_source(source, "run1", options=options)
    access.fetched          # -> 2 (keyframe 7 and the residual of gen 8)
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from dataclasses import dataclass
from typing import Callable

from snapops.daemon.redact import redact_url
from snapops.formats.errors import ConfigError, FormatError
from snapops.formats.generation.verify import GenerationOptions, read_manifest
from snapops.formats.lfs.access import (
    MAX_LFSCONFIG,
    choose_endpoint,
    commit_file,
    open_client,
    read_token,
    token_for,
)
from snapops.formats.lfs.objects import ObjectStore
from snapops.formats.lfs.source import LfsSource

from .remote import Repository


@dataclass(frozen=True)
class LfsSettings:
    """``lfs_url``: the endpoint (default: the tree's ``.lfsconfig``, else derived from the
    remote URL); ``lfs_token_file``: a bearer token, one line; ``lfs_cache``: a folder kept
    for later restores (default: a private temporary folder); ``progress(nbytes)`` as the
    objects' bytes arrive."""

    url: str | None = None
    token_file: str | os.PathLike | None = None
    cache: str | os.PathLike | None = None
    progress: Callable[[int], object] | None = None     # bytes of LFS objects downloaded


class LfsAccess:
    """One restore call's LFS side: the token (read once), one object cache, one client per
    endpoint."""

    def __init__(self, repo: Repository, settings: LfsSettings) -> None:
        self.repo, self.settings = repo, settings
        self.token = read_token(settings.token_file, "lfs_token_file")
        self._stores: dict[str, ObjectStore] = {}
        self._root: str | None = None      # the object cache, made on first use

    @property
    def fetched(self) -> int:
        """LFS objects downloaded so far (over every endpoint)."""
        return sum(store.fetched for store in self._stores.values())

    def wrap(self, source, run: str, options: GenerationOptions
             ) -> tuple[object, GenerationOptions]:
        """``source`` with its LFS-store shards rebuilt, and ``options`` with the run's
        retention record; both unchanged for a Git-store generation."""
        try:
            _, manifest = read_manifest(source, run)
        except FormatError:
            return source, options      # the verifier reports a bad MANIFEST its own way
        if manifest.header.store != "lfs":
            return source, options
        record = self.repo.retention(run)
        options = dataclasses.replace(options, retention=record)
        if record is not None and record.note(manifest.header.gen) is not None:
            return source, options      # refused by the loader, with the retention reason
        store = self._store(source, run, manifest.header.gen)
        return LfsSource(source, run, store, manifests=self.repo.manifests(run)), options

    def endpoint_failure(self) -> ConfigError | None:
        """The error to end the restore with when an endpoint itself failed."""
        for url, store in self._stores.items():
            failure = store.client.batch_failure if store.client is not None else None
            if failure is not None:
                return ConfigError(f"LFS endpoint {redact_url(url)[:200]}: {failure}; expected "
                                   "a Git LFS server whose batch API grants read access (check "
                                   "lfs_url / --lfs-url, the tree's .lfsconfig and the token)")
        return None

    def _store(self, source, run: str, gen: int) -> ObjectStore:
        commit = getattr(source, "commit", None)
        lfsconfig = commit_file(self.repo.git, commit, ".lfsconfig", MAX_LFSCONFIG) \
            if commit else None
        url, origin = choose_endpoint(self.settings.url, lfsconfig, self.repo.remote_url())
        if url is None and not self.settings.cache:
            raise ConfigError(f"run {run} gen {gen} keeps its shards in Git LFS (store=lfs) and "
                              "no LFS endpoint is known: expected lfs_url (--lfs-url), a "
                              ".lfsconfig url in the tree, or an http(s) remote to derive it from")
        key = url or ""
        if key not in self._stores:
            token = token_for(self.token, url, origin, self.repo.remote_url()) if url else None
            client = open_client(url, token, origin, self.settings.progress) if url else None
            if self._root is None:
                self._root = os.fspath(self.settings.cache) if self.settings.cache else \
                    tempfile.mkdtemp(prefix="lfs-", dir=self.repo.work)
            # a cache of our own goes with the restore: no fsyncs (a given one is kept)
            self._stores[key] = ObjectStore(self._root, client,
                                            durable=bool(self.settings.cache))
        return self._stores[key]
