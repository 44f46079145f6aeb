"""The one generation verifier: everything a sealed generation promises, checked from any source.

The daemon (before it commits), the hooks and CI (on pushed trees), ``snapops verify`` and
restore all call :func:`verify_generation`. In order, it checks:

1. ``snapshots/<run>/MANIFEST`` is a regular file, MANIFEST v2, canonical, for this run;
2. its seal: signature by a trusted key, HMAC under the key (as required or as keys allow);
3. the files under ``snapshots/<run>/`` are exactly those the MANIFEST lists (no missing, no
   extra), each a regular file (no symlink, no submodule);
4. the chain: ``prev`` names the generation it must follow (``expect_prev``) and gen increases;
5. the ledger: ``ledger/<run>.ledger`` chains and its last line seals this MANIFEST (both
   cheap: checked before the shards, so a bad one fails at once);
6. every shard: size and SHA-256 of its bytes (the ciphertext for age shards; with an identity
   the plaintext too), its suffix, its detected format and its declared format agree, its own
   full verification passes, and its arrays are what the MANIFEST's parts say (name, stored
   dtype, box shape); companions (WSUM, DELTA) by size and SHA-256. A restore, which returns
   arrays and not files, may prove a plain shard by what it decodes instead of its SHA-256:
   the BLAKE3 content digest the MANIFEST seals for it (``by_content``).
The first failure is reported as a FormatError naming file, line and check.

Example::

    report = verify_generation(FolderSource("repo"), "run1", GenerationOptions(trusted_keys="keys/"))
    report.ok, report.details["gen"]
    # -> (True, 12)
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import io
import math
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from snapops.formats.errors import FormatError, LfsError, SnapopsError
from snapops.formats.integrity import file_sha256
from snapops.formats.ledger import check_link, iter_lines
from snapops.formats.report import Report
from snapops.formats.workers import run_all

from .manifest import MAGIC, MAX_BYTES, Manifest, ShardRecord, parse_manifest
from .seal import check_seal
from .source import FILE, Entry, Source

AGE_SUFFIX = ".age"
LEDGER_MAX = 64 << 20
_UNSET: Any = object()


@dataclass(frozen=True)
class GenerationOptions:
    """What to demand. ``expect_prev``: the MANIFEST bytes this generation must follow (None:
    it must be the run's first generation; unset: not checked). ``deep``: also run each shard
    format's own full verification (the sealed SHA-256 already proves the bytes). ``memo``:
    a dict shared by the calls of one run (a hook checking many commits); a shard whose blob
    id, MANIFEST record and parts were verified before is not verified again."""

    trusted_keys: Any = None
    hmac_key: Any = None
    require_signature: bool = False
    require_hmac: bool = False
    identity: Any = None
    expect_prev: Any = _UNSET
    ledger: bool = True
    deep: bool = True
    workers: int = 3                # shards checked at once (3 keeps 2 cores busiest)
    memo: dict | None = None
    retention: Any = None           # LFS store: the run's RetentionRecord (pruned generations)
    retention_of_tree: bool = False  # the record is from the MANIFEST's own tree: it may not
    #                                  prune that generation (every policy keeps the newest)
    # called (from a worker thread) with a shard's path once its own check passed: a restore
    # decodes it meanwhile; nothing is returned unless the whole generation then verifies
    on_shard: Any = None
    # a restore's proof by content: called (from a worker thread) with a plain shard's
    # record, its copy and its WSUM's copy (or None), before the copy's SHA-256 is computed;
    # True when the arrays it decoded from the copy hash to the record's sealed content
    # digest (they are then exactly what was sealed, and the file's SHA-256 is not
    # computed); False, or an error: the file's SHA-256 decides, as without it
    by_content: Any = None


def pruned_note(manifest: Manifest, options: GenerationOptions) -> str | None:
    """"gen N pruned by retention (policy ...)" when retention pruned this generation;
    FormatError when a record from the generation's own tree prunes it."""
    if options.retention is None or manifest.header.store != "lfs":
        return None
    if options.retention_of_tree:
        from snapops.formats.lfs.retention import check_not_pruned, record_path

        check_not_pruned(options.retention, manifest.header.gen, record_path(manifest.header.run))
    return options.retention.note(manifest.header.gen)


def run_folder(run: str) -> str:
    return f"snapshots/{run}"


def manifest_path(run: str) -> str:
    return f"snapshots/{run}/MANIFEST"


def ledger_path(run: str) -> str:
    return f"ledger/{run}.ledger"


def read_manifest(source: Source, run: str) -> tuple[bytes, Manifest]:
    """The MANIFEST's bytes and model; FormatError when absent, too big, v1 or malformed."""
    path = manifest_path(run)
    data = source.read(path, MAX_BYTES)
    if data.startswith(b"SNAPOPS-MANIFEST 1\n"):
        raise FormatError("a version 1 MANIFEST carries no seal: this generation was written "
                          "before sealed generations and cannot be verified as one", path=path,
                          line=1, check="version", expected=MAGIC, got="SNAPOPS-MANIFEST 1")
    manifest = _parsed(data, path)
    manifest = dataclasses.replace(manifest, shards=list(manifest.shards),
                                   files=list(manifest.files), arrays=list(manifest.arrays))
    if manifest.header.run != run:
        raise FormatError("MANIFEST of another run", path=path, line=2, check="manifest",
                          expected=f"run={run}", got=f"run={manifest.header.run}")
    return data, manifest


@functools.lru_cache(maxsize=2)
def _parsed(data: bytes, path: str) -> Manifest:
    """One parse of the same MANIFEST bytes for the verifier, the loader and the LFS layer of
    one restore (8 ms each for 129 arrays); callers get their own lists (records are frozen)."""
    return parse_manifest(data, path)


def verify_generation(source: Source, run: str,
                      options: GenerationOptions = GenerationOptions()) -> Report:
    """Verify generation ``run`` as it is in ``source``; the Report's failure names the first
    problem, its notes what was not checked, its details gen, keyid, digest and shard count."""
    report = Report(path=manifest_path(run), format="generation")
    try:
        data, manifest = read_manifest(source, run)
        report.notes += check_seal(manifest, trusted_keys=options.trusted_keys,
                                   hmac_key=options.hmac_key,
                                   require_signature=options.require_signature,
                                   require_hmac=options.require_hmac, path=report.path)
        report.passed("seal")
        pruned = pruned_note(manifest, options)
        pointers = manifest.header.store == "lfs" and (
            pruned is not None or not getattr(source, "resolves_lfs", False))
        entries = check_fileset(source, run, manifest, pointers=pointers)
        report.passed("fileset")
        # the cheap checks before the shards: a bad chain or ledger line fails at once
        if options.expect_prev is not _UNSET:
            check_prev(manifest, options.expect_prev, report.path)
            report.passed("chain")
        if options.ledger:
            check_ledger_seal(source, run, manifest, data)
            report.passed("ledger")
        if pointers:
            check_lfs_pointers(source, run, manifest)
            report.passed("lfs-pointers")
            report.notes.append(pruned or f"{len(manifest.shards)} shard(s) in the LFS store: "
                                "pointers checked against the MANIFEST, contents not fetched "
                                "(--fetch-lfs to verify them)")
            if pruned:
                report.details["pruned"] = pruned
        else:
            _check_shards(source, run, manifest, options, report, entries)
    except FormatError as exc:
        return report.fail(exc)
    except SnapopsError as exc:  # keys, decryption, LFS transfers: typed, one line
        check = "lfs" if isinstance(exc, LfsError) else "keys"
        return report.fail(FormatError(str(exc), path=report.path, check=check))
    report.arrays = len(manifest.arrays)  # the generation's arrays, not their parts
    report.details.update(gen=manifest.header.gen, keyid=manifest.header.keyid,
                          digest=hashlib.sha256(data).hexdigest(), shards=len(manifest.shards),
                          store=manifest.header.store)
    return report


def check_fileset(source: Source, run: str, manifest: Manifest, *,
                  pointers: bool = False) -> dict[str, Entry]:
    """Exactly the listed files (extra ones named first, then missing ones), each a regular
    file of the listed size, read from the listing: nothing is opened. Returns the entries.
    ``pointers``: shards are LFS pointer files (sizes checked by :func:`check_lfs_pointers`)."""
    folder = run_folder(run)
    entries = source.entries(folder)
    listed = {f"{folder}/MANIFEST": None}
    listed.update({f"{folder}/{s.path}": None if pointers else s.size for s in manifest.shards})
    listed.update({f"{folder}/{f.path}": f.size for f in manifest.files})
    for path in sorted(set(entries) - set(listed)):
        raise FormatError("a file the MANIFEST does not list", path=path, check="fileset",
                          expected="only the MANIFEST's files under " + folder,
                          got=f"an extra {entries[path].kind}")
    for path in sorted(set(listed) - set(entries)):
        raise FormatError("a file the MANIFEST lists is missing", path=path, check="fileset",
                          expected="the file", got="nothing")
    for path, entry in sorted(entries.items()):
        if entry.kind != FILE:
            raise FormatError(f"a {entry.kind} where the MANIFEST lists a regular file",
                              path=path, check="fileset", expected="a regular file",
                              got=entry.kind)
        size = listed[path]
        if size is not None and entry.size is not None and entry.size != size:
            raise FormatError("file size differs from the MANIFEST", path=path, check="size",
                              expected=f"{size} bytes", got=f"{entry.size} bytes")
    return entries


def check_lfs_pointers(source: Source, run: str, manifest: Manifest) -> None:
    """Every shard of an LFS-store generation is a pointer naming the object its sealed
    record names (nothing is downloaded)."""
    from snapops.formats.lfs.pointer import MAX_POINTER
    from snapops.formats.lfs.source import check_pointer

    folder = run_folder(run)
    for shard in manifest.shards:
        path = f"{folder}/{shard.path}"
        if shard.object is None or shard.encoding is None:
            raise FormatError("an LFS-store shard without its stored object", path=path,
                              check="lfs", expected="object=<oid> encoding=<key|res>", got="-")
        read_pointer = getattr(source, "read_pointer", None)  # an LfsSource: the tree's file
        check_pointer(read_pointer(path) if read_pointer else source.read(path, MAX_POINTER),
                      path, shard)


def _check_shards(source: Source, run: str, manifest: Manifest, options: GenerationOptions,
                  report: Report, entries: dict[str, Entry]) -> None:
    folder = run_folder(run)
    wsums = {f.of: f for f in manifest.files if f.role == "wsum"}
    memo = options.memo if options.memo is not None else {}
    keys = {s.path: _memo_key(manifest, s, wsums.get(s.path), entries, folder)
            for s in manifest.shards}
    known = [memo[keys[s.path]] for s in manifest.shards if keys[s.path] in memo]
    fresh = [s for s in manifest.shards if keys[s.path] not in memo]
    for f in manifest.files:
        if f.of in {s.path for s in fresh}:
            _check_digest(source, f"{folder}/{f.path}", f.size, f.sha256)

    failed = threading.Event()

    def one(shard: ShardRecord) -> Report:
        if failed.is_set():      # an earlier shard failed: that failure is the report's
            raise FormatError("not checked: a shard before it failed",
                              path=f"{folder}/{shard.path}", check="shards")
        try:
            done = check_shard(source, folder, manifest, shard, wsums.get(shard.path), options)
        except BaseException:
            failed.set()
            raise
        if keys[shard.path] is not None:
            memo[keys[shard.path]] = done
        if options.on_shard is not None:
            options.on_shard(shard.path)
        return done

    if options.on_shard is not None:
        for shard in manifest.shards:
            if keys[shard.path] in memo:
                options.on_shard(shard.path)

    checked = run_all(one, fresh, min(options.workers,
                                      getattr(source, "shards_at_once", options.workers)))
    for shard_report in known + checked:
        report.raw_bytes += shard_report.raw_bytes
        report.notes += shard_report.notes
    if known:
        report.notes.append(f"{len(known)} of {len(manifest.shards)} shard(s) unchanged since "
                            "a generation verified before (same blob, record and parts): not "
                            "read again")
    report.details["shards_read"] = len(fresh)
    by_content = sum(r.details.get("proven_by") == "content" for r in checked)
    if by_content:
        report.details["shards_by_content"] = by_content
        report.notes.append(f"{by_content} of {len(manifest.shards)} shard(s) proven by their "
                            "decoded arrays' sealed BLAKE3 content digest (their files' SHA-256 "
                            "not computed)")
    report.passed("shards")


def _memo_key(manifest: Manifest, shard: ShardRecord, wsum, entries: dict[str, Entry],
              folder: str) -> tuple | None:
    """What a shard's verification depends on: its blob, its record, its parts (with their
    dtypes), its WSUM; None when the source has no blob ids (a folder can change)."""
    blob = entries.get(f"{folder}/{shard.path}")
    side = entries.get(f"{folder}/{wsum.path}") if wsum else None
    if blob is None or blob.oid is None or (wsum is not None and (side is None or not side.oid)):
        return None
    parts = tuple((a.dtype, a.stored, p) for a in manifest.arrays for p in a.parts
                  if p.shard == shard.path)
    return blob.oid, shard, parts, wsum, side.oid if side else None


def remember_verified(source: Source, run: str, memo: dict) -> int:
    """Record the shards of ``run``'s generation in ``source`` as verified in ``memo``, for a
    generation the caller already trusts (the parent commit a server accepted before), so that
    the shards a new generation carries over unchanged (same blob, same record, same parts)
    are not read again. Reads the MANIFEST and the listing only; returns how many shards."""
    try:
        _, manifest = read_manifest(source, run)
        entries = source.entries(run_folder(run))
    except FormatError:
        return 0
    folder = run_folder(run)
    wsums = {f.of: f for f in manifest.files if f.role == "wsum"}
    count = 0
    for shard in manifest.shards:
        key = _memo_key(manifest, shard, wsums.get(shard.path), entries, folder)
        if key is not None:
            memo.setdefault(key, Report(path=f"{folder}/{shard.path}", format=shard.format,
                                        raw_bytes=_part_bytes(manifest, shard.path)))
            count += 1
    return count


def _part_bytes(manifest: Manifest, shard_path: str) -> int:
    """Raw bytes of the array parts a shard holds, from the MANIFEST."""
    from snapops.formats.dtypes import numpy_dtype

    total = 0
    for array in manifest.arrays:
        for part in array.parts:
            if part.shard == shard_path:
                with contextlib.suppress(SnapopsError):
                    total += math.prod(hi - lo for lo, hi in part.box) * \
                        numpy_dtype(array.stored or array.dtype).itemsize
    return total


def _check_digest(source: Source, path: str, size: int, sha256: str) -> None:
    with source.file(path) as local:
        _check_file_digest(local, path, size, sha256)


def _check_file_digest(local: Path, path: str, size: int, sha256: str,
                       known: str | None = None) -> None:
    """``known``: the SHA-256 the source itself computed for ``local`` (not hashed again)."""
    got_size = os.path.getsize(local)
    if got_size != size:
        raise FormatError("file size differs from the MANIFEST", path=path, check="size",
                          expected=f"{size} bytes", got=f"{got_size} bytes")
    got = known or file_sha256(local)
    if got != sha256:
        raise FormatError("file bytes do not match the MANIFEST digest", path=path,
                          check="digest", expected=f"sha256={sha256}", got=f"sha256={got}")


def check_shard(source: Source, folder: str, manifest: Manifest, shard: ShardRecord, wsum,
                options: GenerationOptions) -> Report:
    """One shard against its MANIFEST entry; returns its format report (notes, sizes)."""
    from .shardcheck import check_plain_shard

    path = f"{folder}/{shard.path}"
    by_content = options.by_content is not None and not shard.path.endswith(AGE_SUFFIX)
    with source.file(path, digest=not by_content) as local:
        hashed = getattr(source, "hashed", None)    # a source that computed it (LFS restore)
        known = hashed(local) if hashed is not None else None
        if by_content and known is None:
            return _check_by_content(source, local, path, manifest, shard, wsum, folder,
                                     options)
        _check_file_digest(local, path, shard.size, shard.sha256, known)
        if not shard.path.endswith(AGE_SUFFIX):
            wsum_file = f"{folder}/{wsum.path}" if wsum else None
            with _maybe_file(source, wsum_file) as wsum_local:
                return check_plain_shard(local, path, manifest, shard, options, wsum_local)
        if shard.plain_sha256 is None:
            raise FormatError("age shard without its plaintext digest", path=path,
                              check="manifest", expected="plain_sha256=<hex64>", got="-")
        if options.identity is None:
            return Report(path=path, format="age", notes=[
                f"{path}: encrypted; checked by its digest only (give --identity to verify "
                "the content)"])
        return _check_age(source, local, path, manifest, shard, wsum, folder, options)


def _check_by_content(source: Source, local: Path, path: str, manifest: Manifest,
                      shard: ShardRecord, wsum, folder: str, options: GenerationOptions
                      ) -> Report:
    """A plain shard proven by its arrays: the format and array checks of every shard, then
    ``options.by_content`` decodes the copy and compares the arrays' BLAKE3 with the sealed
    content digest. Whatever fails or differs on the way is judged by the file's SHA-256: a
    copy that is not the sealed file fails by its digest, as without this proof (the error a
    tampered shard gets does not change), and a sealed file whose content digest was
    computed another way (say, from big-endian arrays) is proven by its SHA-256 instead."""
    from .shardcheck import check_plain_shard

    if os.path.getsize(local) != shard.size:
        _check_file_digest(local, path, shard.size, shard.sha256)     # fails: the size
    wsum_file = f"{folder}/{wsum.path}" if wsum else None
    try:
        with _maybe_file(source, wsum_file) as wsum_local:
            report = check_plain_shard(local, path, manifest, shard, options, wsum_local)
            proven = options.by_content(shard, local, wsum_local)
    except SnapopsError:
        _check_file_digest(local, path, shard.size, shard.sha256)     # not the sealed file?
        raise
    if not proven:
        _check_file_digest(local, path, shard.size, shard.sha256)
    report.details["proven_by"] = "content" if proven else "sha256"
    return report


def _maybe_file(source: Source, path: str | None):
    return source.file(path) if path else contextlib.nullcontext(None)


def _check_age(source, local: Path, path: str, manifest, shard, wsum, folder, options) -> Report:
    import tempfile

    from snapops.formats.armor import decrypt_file

    from .shardcheck import check_plain_shard

    with tempfile.TemporaryDirectory(prefix="snapops-age-") as tmp:
        plain = Path(tmp) / Path(shard.path).name.removesuffix(AGE_SUFFIX)
        decrypt_file(local, plain, options.identity)
        _check_file_digest(plain, path + " (plaintext)", shard.plain_size, shard.plain_sha256)
        wsum_plain = None
        if wsum is not None:
            wsum_plain = Path(f"{plain}.wsum")
            with source.file(f"{folder}/{wsum.path}") as armored:
                decrypt_file(armored, wsum_plain, options.identity)
        return check_plain_shard(plain, path, manifest, shard, options, wsum_plain)


def check_prev(manifest: Manifest, expect_prev: bytes | None, path: str) -> None:
    """``manifest`` follows the generation whose MANIFEST bytes are ``expect_prev`` (None: it
    must be the first); gen strictly increases, so an older generation cannot come back."""
    prev = manifest.prev
    if expect_prev is None:
        if prev.gen is not None:
            raise FormatError("the MANIFEST names a previous generation the history does not "
                              "have", path=path, line=3, check="chain",
                              expected="prev gen=- sha256=-",
                              got=f"prev gen={prev.gen} sha256={prev.sha256}")
        return
    before = parse_manifest(expect_prev, "the previous MANIFEST") \
        if expect_prev.startswith(MAGIC.encode()) else None
    digest = hashlib.sha256(expect_prev).hexdigest()
    if prev.sha256 != digest:
        raise FormatError("the MANIFEST does not chain to the generation before it (rollback, "
                          "replay or a forged history)", path=path, line=3, check="chain",
                          expected=f"prev sha256={digest}", got=f"prev sha256={prev.sha256}")
    if before is not None and not (prev.gen == before.header.gen < manifest.header.gen):
        raise FormatError("gen must increase over the previous generation", path=path, line=2,
                          check="order", expected=f"gen > {before.header.gen}",
                          got=f"gen {manifest.header.gen}")


def check_ledger_seal(source: Source, run: str, manifest: Manifest, data: bytes) -> None:
    """The run's ledger chains, and its last line seals exactly this MANIFEST."""
    path = ledger_path(run)
    raw = source.read(path, LEDGER_MAX)
    prev = last = None
    for rec in iter_lines(io.BytesIO(raw), path):
        problem = check_link(rec, prev)
        if problem is not None:
            raise problem.located(path)
        prev = last = rec
    if last is None:
        raise FormatError("the ledger is empty", path=path, check="ledger",
                          expected="a line for this generation", got="no lines")
    e, h = last.entry, manifest.header
    want = {"path": manifest_path(run), "format": "manifest",
            "sha256_all": hashlib.sha256(data).hexdigest(), "gen": h.gen, "ts": h.ts,
            "build": h.build, "keyid": h.keyid}
    for key, value in want.items():
        if getattr(e, key) != value:
            raise FormatError("the ledger's last line does not seal this MANIFEST", path=path,
                              line=last.line_no, check="ledger", expected=f"{key}={value}",
                              got=f"{key}={getattr(e, key)}")

