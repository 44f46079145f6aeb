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
from collections.abc import Iterator
from pathlib import Path

from .contract import SnapshotFormat
from .errors import ConfigError, FormatError, SnapopsError
from .iosafe import open_input, shown, user_path
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
    if not isinstance(name, str):
        raise ConfigError(f"format: expected a format name ({', '.join(HANDLER_MODULES)}), "
                          f"got {type(name).__name__}")
    try:
        module = importlib.import_module(HANDLER_MODULES[name])
    except KeyError:
        raise FormatError(f"unknown format {name!r}", expected=", ".join(HANDLER_MODULES),
                          got=name) from None
    found = getattr(module, "FORMATS", None)
    return found[name] if found else module.FORMAT


def all_handlers() -> list[SnapshotFormat]:
    return list(handlers())


def handlers() -> Iterator[SnapshotFormat]:
    """Every format in sniffing order, each module imported only when reached: detecting a
    WTXT file does not pay for importing the eight other formats (a hook or CLI start)."""
    return (handler(name) for name in HANDLER_MODULES)


def detect(path: str | os.PathLike) -> SnapshotFormat:
    """The format of ``path``: by magic bytes first, by suffix second. A path that is not a
    regular file (a FIFO, a device, a folder) or cannot be read is a FormatError (``io``)."""
    return detect_head(read_head(path), Path(user_path(path)).name)


def read_head(path: str | os.PathLike) -> bytes:
    """The first :data:`SNIFF_BYTES` of the regular file ``path`` (see ``open_input``)."""
    with open_input(path) as f:
        try:
            return f.read(SNIFF_BYTES)
        except OSError as exc:
            raise FormatError(f"cannot read: {exc.strerror}", path=shown(os.fspath(path)),
                              check="io") from exc


def detect_head(head: bytes, name: str) -> SnapshotFormat:
    """The format of a file whose first bytes are ``head`` and whose name is ``name``."""
    for h in handlers():
        if h.sniff(head):
            return h
    return handler_for_suffix(name)


def handler_for_suffix(path: str | os.PathLike) -> SnapshotFormat:
    path = user_path(path)
    name = Path(path).name.lower()
    for h in handlers():
        if any(name.endswith(s) for s in h.suffixes):
            return h
    known = sorted({s for h in all_handlers() for s in h.suffixes})
    raise FormatError("unrecognised file type (neither its first bytes nor its suffix match a "
                      "format)", path=shown(path), expected=" or ".join(known),
                      got=Path(path).suffix or "no suffix")


def names_keeping(dtype: str) -> list[str]:
    """Formats that store ``dtype`` natively (for messages that say what works).

    >>> names_keeping("bf16")
    ['aero', 'aeroset', 'fold', 'pycauset', 'safetensors', 'pt']
    """
    return [h.name for h in all_handlers() if h.capabilities.stores(dtype)]


def verify_any(path: str | os.PathLike, options=None, **fields) -> Report:
    """Verify any file, age-armored ones too (decrypted into a private temporary folder with
    ``identity``); never raises for bad content, unknown types or unreadable files (a FIFO,
    a device, a folder: ``not a regular file``); a path argument that is no path at all
    (None, bytes, a NUL inside) is a ConfigError.

    >>> verify_any("/nonexistent.wtxt").failure.check
    'io'
    """
    from .armor import is_armored
    from .contract import VerifyOptions, merge_options

    opts = merge_options(VerifyOptions, options, fields, "verify")
    name = user_path(path)
    try:
        head = read_head(name)
    except FormatError as exc:
        return Report(path=name, format="?").fail(exc)
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
