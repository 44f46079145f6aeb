"""What WTXT cannot spell itself, carried in its audit line: torch's dotted names and dtypes.

WTXT names are ``[A-Za-z0-9_]+``. A state with other names (torch's ``layer.0.weight``) is
written with the documented reversible mapping ``.`` -> ``__``, marked by ``snapops_names=dots``
in the audit line; a name the mapping does not invert cleanly (one holding ``__``, ``-``, ``/``,
non-ASCII...) is stored under a safe name and listed as ``stored=original`` (percent-encoded)
after the marker. ``load`` returns the original names. Dtypes WTXT does not define are recorded
as ``snapops_dtypes=...`` (see :mod:`snapops.formats.dtypes`).

The spec leaves the audit line outside every hash. So that a signature covers these records,
a file carrying them also lists ``snapops_audit_sha256_<hex>`` in its ``cap`` line (an
extension entry, which the spec allows and other readers ignore): the SHA-256 of the whole
audit line. The cap line is signed, so with a verified signature the names and dtypes are
bound; without one they are not, which ``load``/``verify`` say, and which fails a required
signature or HMAC (:func:`check_audit_binding`).

>>> stored, record = stored_names(["layer.0.weight", "step", "a-b"])
>>> stored, record
({'layer.0.weight': 'layer__0__weight', 'step': 'step', 'a-b': 'a_b'}, 'dots,a_b=a-b')
>>> original_names(list(stored.values()), record)
{'layer__0__weight': 'layer.0.weight', 'step': 'step', 'a_b': 'a-b'}
"""

from __future__ import annotations

import hashlib
import re
from typing import Iterable
from urllib.parse import quote, unquote

from ..dtypes import DTYPE_META_KEY
from ..errors import DataError, FormatError
from ._grammar import MAX_LINE, MAX_NAME
from ._prepare import unmap_name

NAMES_KEY = "snapops_names"
AUDIT_CAP = "snapops_audit_sha256_"
MARKER = "dots"
_NAME = re.compile(r"[A-Za-z0-9_]+")
_PAIR = re.compile(r'([A-Za-z0-9_]+)=("[ !#-~]*"|[!#-~]+)(?: |$)')
_UNSAFE = re.compile(r"[^A-Za-z0-9_]")


def map_name(name: str) -> str:
    """The documented mapping ``.`` -> ``__`` (``unmap_name`` reverses it)."""
    return name.replace(".", "__")


def _valid(name: str) -> bool:
    return bool(_NAME.fullmatch(name)) and len(name) <= MAX_NAME


def stored_names(names: Iterable[str]) -> tuple[dict[str, str], str | None]:
    """original -> stored name for every array, and the ``snapops_names`` value (None when
    every name is a WTXT name already and nothing is mapped)."""
    names = list(names)
    if all(_valid(n) and "." not in n for n in names):
        return {n: n for n in names}, None
    plain = {n: map_name(n) for n in names if _valid(map_name(n))
             and unmap_name(map_name(n)) == n}
    taken = set(plain.values())
    exceptions: dict[str, str] = {}
    for name in names:
        if name in plain:
            continue
        safe = _UNSAFE.sub("_", map_name(name))[:MAX_NAME - 10] or "_"
        if safe in taken:
            safe = f"{safe}_x{hashlib.sha256(name.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}"
        taken.add(safe)
        exceptions[name] = safe
    pairs = [MARKER] + [f"{stored}={quote(original, safe='')}"
                        for original, stored in exceptions.items()]
    return {n: plain.get(n) or exceptions[n] for n in names}, ",".join(pairs)


def original_names(stored: Iterable[str], record: str | None) -> dict[str, str]:
    """stored -> original name, from the ``snapops_names`` value (identity without one)."""
    stored = list(stored)
    if record is None:
        return {n: n for n in stored}
    marker, _, rest = record.partition(",")
    if marker != MARKER:
        raise FormatError("unknown snapops_names mapping", check="names",
                          expected=MARKER, got=marker)
    exceptions = {}
    for pair in rest.split(",") if rest else []:
        key, sep, value = pair.partition("=")
        try:
            exceptions[key] = unquote(value, errors="strict")
        except UnicodeDecodeError:
            sep = ""
        if not sep or key not in stored:
            raise FormatError("snapops_names lists a name the file does not hold",
                              check="names", expected="stored=original", got=pair[:80])
    out = {n: exceptions.get(n, unmap_name(n)) for n in stored}
    if len(set(out.values())) != len(out):
        raise FormatError("snapops_names maps two arrays to one name", check="names")
    return out


def audit_pairs(audit: str | None) -> dict[str, str]:
    """``key=value`` pairs of an audit line's content (quotes removed)."""
    pairs: dict[str, str] = {}
    for match in _PAIR.finditer(audit or ""):
        value = match.group(2)
        pairs[match.group(1)] = value[1:-1] if value.startswith('"') else value
    return pairs


def compose_audit(user: str | None, names: str | None, dtypes: str | None) -> str | None:
    """The audit line content: the user's pairs, then the records (refused when the user's
    pairs already use a ``snapops_`` key or the line would be too long)."""
    if user is not None and any(k.startswith("snapops_") for k in audit_pairs(user)):
        raise DataError("audit: keys starting with snapops_ are written by snapops itself")
    parts = [p for p in (user, names and f"{NAMES_KEY}={names}",
                         dtypes and f"{DTYPE_META_KEY}={dtypes}") if p]
    text = " ".join(parts) if parts else None
    if text is not None and len(text) + len("audit \n") > MAX_LINE:
        raise DataError(f"the WTXT audit line would be {len(text)} bytes (limit {MAX_LINE}): too "
                        "many names WTXT cannot spell or dtypes it does not define; AERO, FOLD "
                        "and PyCauset keep any name and dtype as they are")
    return text


def audit_line(audit: str | None) -> bytes:
    """The audit line's bytes as the file holds them (empty when there is none)."""
    return b"" if audit is None else f"audit {audit}".encode("ascii")


def carries_records(audit: str | None) -> bool:
    """The audit line holds snapops' own records (names or dtypes the reader applies)."""
    return any(k in (NAMES_KEY, DTYPE_META_KEY) for k in audit_pairs(audit))


def audit_caps(audit: str | None) -> list[str]:
    """The cap extension entry binding ``audit`` (none when it carries no snapops records)."""
    if not carries_records(audit):
        return []
    return [AUDIT_CAP + hashlib.sha256(audit_line(audit)).hexdigest()]


def check_audit_binding(caps: list[str], audit: str | None, *, signature_verified: bool,
                        line: int | None = None) -> str | None:
    """Check the audit line against the digest the header records (FormatError if changed),
    and say why the names and dtypes it carries are not authenticated (None: they are, or it
    carries none). ``line``: the audit line's number, for messages."""
    bound = [c for c in caps if c.startswith(AUDIT_CAP)]
    if len(bound) > 1:
        raise FormatError("more than one audit digest in the cap line", check="cap", line=3)
    if bound and bound[0] != AUDIT_CAP + hashlib.sha256(audit_line(audit)).hexdigest():
        raise FormatError("the audit line is not the one the header's digest names (changed "
                          "after writing)", check="audit", line=line,
                          expected=bound[0][len(AUDIT_CAP):][:16] + "...",
                          got="no audit line" if audit is None else "another audit line")
    if not carries_records(audit) or (bound and signature_verified):
        return None
    return ("no digest of it in the header (written before snapops bound it)" if not bound
            else "no verified signature covers the header")


def unbound_records(why: str, required: str) -> FormatError:
    """The failure of a ``required`` signature or HMAC when the records are not bound."""
    return FormatError(f"array names and dtypes come from the audit line, which nothing "
                       f"authenticates here ({why}): a required {required} cannot vouch for "
                       "them; verify with the signer's trusted key, or verify the generation "
                       "(its signed MANIFEST binds names and dtypes)", check="audit")
