"""Verifying WTXT files: every check of the spec, the first failure named precisely."""

from __future__ import annotations

import os
import re

from ..dtypes import DTYPE_BOUND_KEY
from ..errors import FormatError, SnapopsError
from ..iosafe import open_input
from ..keys import coerce_hmac_key, coerce_trusted
from ..report import Report
from ._parse import Checks, ParseResult, parse_stream
from .logical import unbound_records
from .wsum import wsum_path

CHECKS = ["grammar", "signature", "parity", "base64", "crc32c", "chunk_sha256", "array_sha256",
          "hmac", "cap", "audit", "sha256_all", "merkle", "fastxor"]


def verify_file(path: str | os.PathLike, *, hmac_key=None, trusted_keys=None,
                require_hmac: bool = False, require_signature: bool = False, wsum=None,
                threads: int = 2) -> Report:
    """Check a WTXT file fully; never raises for bad content (see ``report.failure``). The
    format contract (``snapops.formats.wtxt.verify``) calls this with its VerifyOptions.

    Example::

        report = verify_file("x.wtxt", hmac_key="hmac.key", trusted_keys=["keys/"],
                             require_signature=True)
        report.ok, report.failure
    """
    name = os.fspath(path)
    try:
        stream = open_input(name)
    except FormatError as exc:
        return Report(path=name, format="wtxt").fail(exc)
    with stream:
        return verify_stream(stream, name, hmac_key=hmac_key, trusted_keys=trusted_keys,
                             require_hmac=require_hmac, require_signature=require_signature,
                             wsum=wsum, wsum_default=str(wsum_path(name)), threads=threads)


def verify_stream(stream, name: str, *, hmac_key=None, trusted_keys=None,
                  require_hmac: bool = False, require_signature: bool = False, wsum=None,
                  wsum_default: str | None = None, threads: int = 2) -> Report:
    """``verify_file`` for an open binary stream (a file, a pipe, a decrypting reader)."""
    report = Report(path=name, format="wtxt")
    try:
        checks = Checks(coerce_hmac_key(hmac_key), coerce_trusted(trusted_keys),
                        wsum_explicit=os.fspath(wsum) if wsum is not None else None,
                        wsum_default=wsum_default)
        result = parse_stream(stream, checks, require_signature=require_signature,
                              threads=threads)
    except FormatError as exc:
        return report.fail(exc)
    except OSError as exc:
        return report.fail(FormatError(expected="a readable file", got=exc.strerror, check="io"))
    except SnapopsError as exc:  # bad key files and the like
        return report.fail(FormatError(str(exc), check="keys"))
    report.notes.extend(fold_notes(result.notes))
    report.arrays = len(result.arrays)
    report.raw_bytes = sum(a.line.nbytes for a in result.arrays)
    report.checks = list(CHECKS) + (["wsum"] if result.header.pending else [])
    report.details = {
        "gen": result.header.meta.gen, "ts": result.header.meta.ts,
        "sha256_all": result.root.sha256_all, "merkle_this": result.root.merkle_this,
        "keyid": result.header.keyid, "streaming": result.header.pending,
    } | ({DTYPE_BOUND_KEY: True} if result.records_bound else {})
    unmet = hmac_requirement(result, checks, require_hmac)
    return report.fail(unmet) if unmet is not None else report


_PER_ARRAY = re.compile(r"array (\S+): (unauthenticated \(hmac=0\)|hmac not checked \(no key "
                        r"given\))")


def fold_notes(notes: list[str]) -> list[str]:
    """One line per kind of per-array note ("3 arrays unauthenticated (hmac=0): a, b, c").

    >>> fold_notes(["unsigned: no sign line", "array a: unauthenticated (hmac=0)",
    ...             "array b: unauthenticated (hmac=0)"])
    ['unsigned: no sign line', '2 arrays unauthenticated (hmac=0): a, b']
    """
    out: list[str] = []
    groups: dict[str, list[str]] = {}
    for note in notes:
        match = _PER_ARRAY.fullmatch(note)
        if match is None:
            out.append(note)
        else:
            groups.setdefault(match.group(2), []).append(match.group(1))
    for what, names in groups.items():
        shown = ", ".join(names[:8]) + (f", ... {len(names) - 8} more" if len(names) > 8 else "")
        out.append(f"{len(names)} array{'s' if len(names) > 1 else ''} {what}: {shown}")
    return out


def hmac_requirement(result: ParseResult, checks: Checks,
                     require_hmac: bool) -> FormatError | None:
    """The failure ``require_hmac`` demands (no key, or an unauthenticated array), or None."""
    if not require_hmac:
        return None
    if checks.hmac_key is None:
        return FormatError(check="hmac", expected="an HMAC key (--hmac-key)",
                           got="no key given (--require-hmac)")
    unauth = [a.line.name for a in result.arrays if a.line.unauthenticated]
    if unauth:
        return FormatError(check="hmac", array=unauth[0], expected="authenticated arrays",
                           got="hmac=0")
    if result.audit_unbound is not None:
        return unbound_records(result.audit_unbound, "HMAC")
    return None
