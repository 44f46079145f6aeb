"""Restore a sealed generation from a repository or a URL: verified, original names and dtypes.

:func:`load_generation` reads one generation (by gen, by revision, or the newest on the
default branch) through :class:`~snapops.formats.generation.source.GitTreeSource` and the one
generation loader, so what comes back passed the generation verifier; :func:`latest_verified`
walks back from the newest generation tag to the first that verifies, saying why each newer
one was skipped. Verification options are those of
:class:`~snapops.formats.generation.verify.GenerationOptions` (``trusted_keys``, ``hmac_key``,
``require_signature``, ``require_hmac``, ``identity``, ``deep``...). By default ``deep`` is
off here: the format's reader decodes each shard (``load(verify=False)``: for WTXT the
grammar, base64 and CRC32C, not the SHA-256s inside the file) while the others are still
copied out, and its arrays are proven by their BLAKE3 against the content digest the sealed
MANIFEST lists for the shard; where that differs, the file's SHA-256 against the MANIFEST
decides (see :func:`~snapops.formats.generation.load.load_from_source`); ``deep=True`` adds
each format's own full verification first (one more read of every shard). A run in the Git
LFS store restores the same way, its shards rebuilt from exactly their keyframe and residual
chains (:mod:`snapops.restore_lfs`; options ``lfs_url``, ``lfs_token_file``, ``lfs_cache``).

Example::

    snap = load_generation("git://host/snapshots.git", "run1", gen=12, trusted_keys="keys/")
    snap["layer.0.weight"].dtype.name, snap.meta["gen"]
    # -> ('bfloat16', 12)
    snap, skipped = latest_verified("/srv/git/snapshots.git", "run1", trusted_keys="keys/")
    skipped   # -> [(13, 'snapshots/run1/shards/0000.aero: [digest] file bytes do not ...')]
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator
from typing import Any

from snapops.formats.errors import DataError, FormatError, SnapopsError
from snapops.formats.generation.load import load_from_source
from snapops.formats.generation.verify import GenerationOptions
from snapops.formats.model import Snapshot

from .remote import NotACommit, Repository, check_run, gen_tag, open_repository
from .restore_lfs import LfsAccess, LfsSettings

__all__ = ["RestoreFailed", "generation_options", "latest_verified", "load_generation"]

# the loader's own hooks (on_shard, by_content) and a hook's memo are not a caller's options
_FIELDS = {f.name for f in dataclasses.fields(GenerationOptions)} - {
    "memo", "expect_prev", "on_shard", "by_content"}
# Generations latest_verified tries at most: whoever can push tags can push thousands of
# bogus ones above the real generations, each one a fetch and a failed verification.
MAX_TRIED = 100


class RestoreFailed(FormatError):
    """The generation did not verify (or no generation did): its failure, with where it was."""

    check = "restore"

    def __init__(self, where: str, failure: BaseException | str,
                 skipped: list[tuple[int, str]] | None = None) -> None:
        self.where, self.failure, self.skipped = where, failure, skipped or []
        super().__init__(f"{where}: {failure}")

    def __str__(self) -> str:
        return f"{self.where}: {self.failure}"


def generation_options(**options: Any) -> GenerationOptions:
    """GenerationOptions for a restore (``deep`` off unless given); an unknown name is an error
    that lists the allowed ones."""
    unknown = sorted(set(options) - _FIELDS)
    if unknown:
        raise DataError(f"unknown option {unknown[0]!r}; allowed: {', '.join(sorted(_FIELDS))}")
    return GenerationOptions(**{"deep": False, **options})


Progress = Callable[[int], object]


def load_generation(repo_or_url: str | os.PathLike, run: str, *, gen: int | None = None,
                    rev: str | None = None, verify: bool = True, progress: Progress | None = None,
                    lfs_url: str | None = None, lfs_token_file: str | os.PathLike | None = None,
                    lfs_cache: str | os.PathLike | None = None,
                    lfs_progress: Progress | None = None, **options: Any) -> Snapshot:
    """Generation ``gen`` of ``run`` (its tag ``<run>/gen-NNNNNN``), or the one at ``rev``, or
    the newest on the default branch, from a local repository or a URL (a shallow fetch of
    just that commit). Verified as a whole unless ``verify=False``; RestoreFailed when it does
    not verify, ConfigError for a bad name, revision or URL. ``meta``: run, gen, ts, build,
    keyid, format, source, lfs_fetched. ``progress(nbytes)`` is called as each file leaves git.

    A run in the Git LFS store (``store=lfs``) restores the same way: its shards are rebuilt
    from their keyframes and residuals, downloading exactly the LFS objects of this
    generation's chains (``meta["lfs_fetched"]`` counts them) from ``lfs_url`` (default: the
    tree's ``.lfsconfig``, else derived from the remote URL) with the bearer token in
    ``lfs_token_file``, through ``lfs_cache`` (default: a temporary folder);
    ``lfs_progress(nbytes)`` is called as the objects' bytes arrive. From a URL this
    also fetches, each at depth 1, the tags of the older generations the chains start from
    (for their MANIFESTs) and the default branch's commit (for the retention record); a
    generation pruned by retention is a RestoreFailed with that reason; an LFS endpoint that
    fails (unreachable, refuses the token, not an LFS server) a ConfigError naming it
    (redacted); a malformed retention record a FormatError. See :mod:`snapops.restore_lfs`."""
    opts = generation_options(**options)
    check_run(run)
    settings = LfsSettings(lfs_url, lfs_token_file, lfs_cache, lfs_progress)
    with open_repository(repo_or_url) as repo:
        return _load(repo, LfsAccess(repo, settings), run, gen, rev, verify, opts, progress)


def latest_verified(repo_or_url: str | os.PathLike, run: str, *, verify: bool = True,
                    progress: Progress | None = None, lfs_url: str | None = None,
                    lfs_token_file: str | os.PathLike | None = None,
                    lfs_cache: str | os.PathLike | None = None,
                    lfs_progress: Progress | None = None,
                    **options: Any) -> tuple[Snapshot, list[tuple[int, str]]]:
    """The newest generation of ``run`` (by its tags) that verifies, and ``(gen, reason)`` for
    each newer one skipped (one pruned by retention: that reason; a tag on a tree or a blob
    too); RestoreFailed (with ``skipped``) when none of the newest :data:`MAX_TRIED` does.
    LFS options as :func:`load_generation`."""
    opts = generation_options(**options)
    check_run(run)
    skipped: list[tuple[int, str]] = []
    settings = LfsSettings(lfs_url, lfs_token_file, lfs_cache, lfs_progress)
    with open_repository(repo_or_url) as repo:
        lfs = LfsAccess(repo, settings)
        gens = repo.generations(run)
        for gen in gens[:MAX_TRIED]:
            try:
                return _load(repo, lfs, run, gen, None, verify, opts, progress), skipped
            except RestoreFailed as exc:
                skipped.append((gen, str(exc.failure)))
            except NotACommit as exc:     # a tag on a tree or a blob
                skipped.append((gen, str(exc)))
        shown = repo.shown
    raise RestoreFailed(shown, _none_verifies(run, gens), skipped)


def _none_verifies(run: str, gens: list[int]) -> str:
    if not gens:
        return f"no generation tag of run {run} ({gen_tag(run, 1)}...)"
    if len(gens) > MAX_TRIED:
        return (f"none of the newest {MAX_TRIED} generation tags of run {run} verifies; "
                f"{len(gens) - MAX_TRIED} older ones not tried (from gen {gens[MAX_TRIED]} "
                "down: restore one of them by its gen)")
    return f"no generation tag of run {run} verifies"


def _load(repo: Repository, lfs: LfsAccess, run: str, gen: int | None, rev: str | None,
          verify: bool, opts: GenerationOptions, progress: Progress | None) -> Snapshot:
    with repo.tree(run, gen=gen, rev=rev) as (source, where):
        fetched = lfs.fetched
        source, opts = lfs.wrap(source, run, opts)
        if progress is not None:
            source = _Counted(source, progress)
        try:
            snap = load_from_source(source, run, verify=verify, options=opts)
        except SnapopsError as exc:   # formats, keys, decryption, LFS objects: typed, one line
            failure = lfs.endpoint_failure()
            if failure is not None:   # not this generation's fault: no use trying another
                raise failure from None
            raise RestoreFailed(where, exc) from None
    if gen is not None and snap.meta["gen"] != gen:
        raise RestoreFailed(where, FormatError(
            "the tag does not name its generation", path=f"refs/tags/{gen_tag(run, gen)}",
            check="tag", expected=f"generation {gen}", got=f"generation {snap.meta['gen']}"))
    snap.meta["source"] = where
    snap.meta["lfs_fetched"] = lfs.fetched - fetched
    return snap


class _Counted:
    """A source that reports the size of each file the first time it is materialised."""

    def __init__(self, inner, progress: Progress) -> None:
        self.inner, self.progress, self.label = inner, progress, inner.label
        self._seen: set[str] = set()

    def entries(self, folder: str):
        return self.inner.entries(folder)

    def read(self, path: str, limit: int) -> bytes:
        return self.inner.read(path, limit)

    def release(self, path: str) -> None:
        release = getattr(self.inner, "release", None)
        if release is not None:
            release(path)

    def hashed(self, local) -> str | None:
        known = getattr(self.inner, "hashed", None)
        return known(local) if known is not None else None

    @contextlib.contextmanager
    def file(self, path: str, *, digest: bool = True) -> Iterator:
        with self.inner.file(path, digest=digest) as local:
            if path not in self._seen:
                self._seen.add(path)
                self.progress(os.path.getsize(local))
            yield local
