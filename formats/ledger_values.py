"""What a ledger entry is checked against: the sealing values its snapshot file carries.

One dispatch (:func:`check_values`) for the ledger verifier (files in a work tree, read
through :class:`snapops.formats.generation.source.FolderSource`: regular files only, no
symlink followed; the hooks check whole generations through the generation verifier):
a ``manifest`` entry is compared with the MANIFEST it names, a ``wtxt`` entry with the WTXT
header (or the WSUM of a streaming file); other formats carry no sealing values and are only
checked for existence.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from snapops.formats.errors import FormatError, LedgerError

if TYPE_CHECKING:
    from .ledger import LedgerLine


def wtxt_values(source, rel: str) -> dict[str, str | None]:
    """The ledger-relevant values of the WTXT snapshot ``rel``: from its header, and for a
    ``root_pending`` (streaming) file from the WSUM beside it."""
    from snapops.formats.wtxt import read_header
    from snapops.formats.wtxt.wsum import MAX_WSUM, parse_wsum

    with source.open(rel) as stream:
        try:
            header = read_header(stream)
        except FormatError as exc:
            raise exc.located(rel) from None
    values = {"gen": header.gen_text, "ts": header.ts, "build": header.build,
              "keyid": header.keyid, "sha256_all": header.sha256_all,
              "merkle_prev": header.merkle_prev, "merkle_this": header.merkle_this}
    if header.root_pending:
        side = source.read_present(rel + ".wsum", MAX_WSUM + 1)
        if side is None:
            raise FormatError("root_pending file without its WSUM", path=rel, check="wsum",
                              expected=f"{rel}.wsum beside it", got="no such file")
        wsum = parse_wsum(side, rel + ".wsum")
        values.update(sha256_all=wsum.sha256_all, merkle_prev=wsum.merkle_prev,
                      merkle_this=wsum.merkle_this)
    return values


def _manifest_entry_values(source, rec: LedgerLine) -> dict[str, str | None]:
    data = source.read_present(rec.entry.path, MAX_MANIFEST + 1)
    if data is None:
        raise FormatError("no such file", path=rec.entry.path, check="missing")
    return manifest_values(data, rec, rec.entry.path)


# ledger entry format -> reader of the values its snapshot carries; other formats carry none
SEALING_READERS = {
    "manifest": _manifest_entry_values,
    "wtxt": lambda source, rec: wtxt_values(source, rec.entry.path),
}


def check_values(rec: LedgerLine, source, where: str,
                 notes: list[str] | None = None) -> LedgerError | None:
    """Compare the snapshot an entry names (read through ``source``: a work tree or a Git
    tree) with the entry; the one dispatch behind ``Ledger.verify`` and the hooks."""
    e, n = rec.entry, rec.line_no
    reader = SEALING_READERS.get(e.format)
    if reader is None:
        if notes is not None:
            notes.append(f"line {n}: {e.format} files are only checked for existence")
        return None
    try:
        values = reader(source, rec)
    except FormatError as exc:
        return LedgerError(f"snapshot {e.path} cannot be read: {exc}", line=n, check="file")
    return compare_entry(rec, values, where)


_COMPARED = ("gen", "ts", "build", "sha256_all", "merkle_prev", "merkle_this", "keyid")


MAX_MANIFEST = 64 << 20


def manifest_values(data: bytes, rec: LedgerLine, path: str) -> dict[str, str | None]:
    """Sealing values of a generation MANIFEST (``format=manifest``): gen, ts, build and the
    signer's keyid from its header, SHA-256 of its exact bytes as sha256_all; the merkle values
    live only in the ledger line."""
    from snapops.formats.generation import gen_text, parse_manifest

    header = parse_manifest(data, path).header
    e = rec.entry
    return {"gen": gen_text(header.gen), "ts": header.ts, "build": header.build,
            "sha256_all": hashlib.sha256(data).hexdigest(), "merkle_prev": e.merkle_prev,
            "merkle_this": e.merkle_this, "keyid": header.keyid}


def compare_entry(rec: LedgerLine, values: dict, where: str) -> LedgerError | None:
    """The first sealing value (gen, ts, build, sha256_all, merkle_*, keyid) in which a
    snapshot header (``values``) differs from its ledger entry, as a LedgerError."""
    e = rec.entry
    ours = e.to_dict() | {"gen": e.gen_text}
    for key in _COMPARED:
        if values[key] != ours[key]:
            return LedgerError(f"snapshot {e.path} does not match its entry", line=rec.line_no,
                               check="file", expected=f"{key}={ours[key] or '-'}",
                               got=f"{key}={values[key] or '-'} {where}")
    return None
