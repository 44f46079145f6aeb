"""Open any supported file by its magic bytes (falling back to its suffix).

Each format module exposes a ``HANDLER``; this module only knows where they live.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .errors import FormatError
from .model import Snapshot
from .report import Report

SNIFF_BYTES = 64


@dataclass(frozen=True)
class FormatHandler:
    name: str
    suffixes: tuple[str, ...]
    sniff: Callable[[bytes], bool]
    load: Callable[..., Snapshot]
    save: Callable[..., Any] | None = None
    verify: Callable[..., Report] | None = None
    inspect: Callable[..., dict] | None = None


# name -> module exposing HANDLER; order matters for sniffing (most specific first).
HANDLER_MODULES = {
    "wtxt": "snapops.formats.wtxt",
    "aero": "snapops.formats.aero",
    "aeroset": "snapops.formats.aero",
    "fold": "snapops.formats.fold",
    "finf": "snapops.formats.finf",
    "pycauset": "snapops.formats.pycauset",
    "npz": "snapops.formats.plain",
    "safetensors": "snapops.formats.plain",
}


def handler(name: str) -> FormatHandler:
    try:
        module = importlib.import_module(HANDLER_MODULES[name])
    except KeyError:
        raise FormatError(f"unknown format {name!r}", expected=", ".join(HANDLER_MODULES)) from None
    found = getattr(module, "HANDLERS", None)
    if found:
        return found[name]
    return module.HANDLER


def all_handlers() -> list[FormatHandler]:
    return [handler(name) for name in HANDLER_MODULES]


def detect(path: str | os.PathLike) -> FormatHandler:
    """The handler for ``path``: by magic bytes first, by suffix second."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            head = f.read(SNIFF_BYTES)
    except OSError as exc:
        raise FormatError(f"cannot read: {exc.strerror}", path=str(p)) from exc
    for h in all_handlers():
        if h.sniff(head):
            return h
    return handler_for_suffix(p)


def handler_for_suffix(path: str | os.PathLike) -> FormatHandler:
    name = Path(path).name.lower()
    for h in all_handlers():
        if any(name.endswith(s) for s in h.suffixes):
            return h
    known = sorted({s for h in all_handlers() for s in h.suffixes})
    raise FormatError("unrecognised file type (neither its first bytes nor its suffix match a "
                      "format)", path=str(path), expected=" or ".join(known),
                      got=Path(path).suffix or "no suffix")
