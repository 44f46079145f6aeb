"""Find a file's format by its magic bytes (falling back to its suffix), or a format by name.

Each format module exposes ``FORMAT`` (or ``FORMATS``, name -> format), an instance of
:class:`~snapops.formats.contract.SnapshotFormat`; this module only knows where they live.

>>> handler("fold").capabilities.keeps_bf16
True
>>> handler_for_suffix("model.safetensors").name
'safetensors'
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

from .contract import SnapshotFormat
from .errors import FormatError, SnapopsError
from .report import Report

SNIFF_BYTES = 64

# name -> module exposing FORMAT(S); order matters for sniffing (most specific first).
HANDLER_MODULES = {
    "wtxt": "snapops.formats.wtxt",
    "aero": "snapops.formats.aero",
    "aeroset": "snapops.formats.aero",
    "fold": "snapops.formats.fold",
    "finf": "snapops.formats.finf",
    "pycauset": "snapops.formats.pycauset",
    "npz": "snapops.formats.npz",
    "safetensors": "snapops.formats.safetensors",
    "pt": "snapops.formats.pt",
}


def handler(name: str) -> SnapshotFormat:
    """The format called ``name`` (``wtxt``, ``aero``, ...)."""
    try:
        module = importlib.import_module(HANDLER_MODULES[name])
    except KeyError:
        raise FormatError(f"unknown format {name!r}", expected=", ".join(HANDLER_MODULES),
                          got=name) from None
    found = getattr(module, "FORMATS", None)
    return found[name] if found else module.FORMAT


def all_handlers() -> list[SnapshotFormat]:
    return [handler(name) for name in HANDLER_MODULES]


def detect(path: str | os.PathLike) -> SnapshotFormat:
    """The format of ``path``: by magic bytes first, by suffix second."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            head = f.read(SNIFF_BYTES)
    except OSError as exc:
        raise FormatError(f"cannot read: {exc.strerror}", path=str(p)) from exc
    return detect_head(head, p.name)


def detect_head(head: bytes, name: str) -> SnapshotFormat:
    """The format of a file whose first bytes are ``head`` and whose name is ``name``."""
    for h in all_handlers():
        if h.sniff(head):
            return h
    return handler_for_suffix(name)


def handler_for_suffix(path: str | os.PathLike) -> SnapshotFormat:
    name = Path(path).name.lower()
    for h in all_handlers():
        if any(name.endswith(s) for s in h.suffixes):
            return h
    known = sorted({s for h in all_handlers() for s in h.suffixes})
    raise FormatError("unrecognised file type (neither its first bytes nor its suffix match a "
                      "format)", path=str(path), expected=" or ".join(known),
                      got=Path(path).suffix or "no suffix")


def names_keeping(dtype: str) -> list[str]:
    """Formats that store ``dtype`` natively (for messages that say what works).

    >>> names_keeping("bf16")
    ['aero', 'aeroset', 'fold', 'pycauset', 'safetensors', 'pt']
    """
    return [h.name for h in all_handlers() if h.capabilities.stores(dtype)]


def verify_any(path: str | os.PathLike, options=None, **fields) -> Report:
    """Verify any file, age-armored ones too (decrypted into a private temporary folder with
    ``identity``); never raises for bad content, unknown types or unreadable files.

    >>> verify_any("/nonexistent.wtxt").failure.check
    'io'
    """
    from .armor import is_armored
    from .contract import VerifyOptions, merge_options

    opts = merge_options(VerifyOptions, options, fields, "verify")
    name = os.fspath(path)
    try:
        with open(name, "rb") as f:
            head = f.read(SNIFF_BYTES)
    except OSError as exc:
        return Report(path=name, format="?").fail(
            FormatError(expected="a readable file", got=exc.strerror, check="io", path=name))
    if is_armored(head):
        return _verify_armored(name, opts)
    try:
        chosen = detect_head(head, Path(name).name)
    except FormatError as exc:
        return Report(path=name, format="?").fail(exc)
    return chosen.verify(name, opts)


def _verify_armored(path: str, opts) -> Report:
    """Decrypt into a private temporary folder, verify the plain file, clean up."""
    import tempfile

    from .armor import decrypt_file

    if not opts.identity:
        return Report(path=path, format="age").fail(FormatError(
            "age-encrypted: give an identity (--identity FILE) to decrypt and verify it",
            check="keys", path=path))
    with tempfile.TemporaryDirectory(prefix="snapops-verify-") as tmp:
        plain = Path(tmp) / Path(path).name.removesuffix(".age")
        try:
            decrypt_file(path, plain, opts.identity)
        except SnapopsError as exc:
            error = exc if isinstance(exc, FormatError) else FormatError(str(exc), check="decrypt")
            return Report(path=path, format="age").fail(error)
        inner = verify_any(plain, opts)
    inner.path = path
    if inner.failure is not None:
        inner.failure.path = path
        inner.failure.args = (str(inner.failure),)
    inner.notes.append("decrypted with the age identity")
    return inner
