"""Relative URIs of exploded form, and the rule that none may leave the tree file's folder.

A source URI is a relative path of plain segments (letters, digits, ``. _ ~ + -``): no scheme,
no leading ``/``, no ``.``/``..`` segment, no backslash, query, fragment or percent escape. The
resolved path (symlinks followed) must still lie inside the folder.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import FormatError

_SEGMENT = re.compile(r"[A-Za-z0-9._~+-]+")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
EXPECTED = "a relative URI inside the tree file's folder"


def _refuse(message: str, uri: object, line: int | None) -> FormatError:
    return FormatError(message, line=line, expected=EXPECTED, got=uri, check="uri")


def check_uri(uri: object, line: int | None = None) -> str:
    """``uri`` when it is a plain relative path; a FormatError (check ``uri``) otherwise."""
    if not isinstance(uri, str) or not uri:
        raise _refuse("source URI must be a non-empty string", uri, line)
    if _SCHEME.match(uri) or uri.startswith(("/", "\\")):
        raise _refuse("absolute URI refused", uri, line)
    segments = uri.split("/")
    for segment in segments:
        if segment in (".", ".."):
            raise _refuse("URI leaves the folder", uri, line)
        if not _SEGMENT.fullmatch(segment):
            raise _refuse("URI segment with characters outside [A-Za-z0-9._~+-]", uri, line)
    return uri


def resolve_uri(uri: object, folder: str | os.PathLike, line: int | None = None) -> Path:
    """The file ``uri`` names, relative to ``folder``; refused if it resolves outside it."""
    check_uri(uri, line)
    root = os.path.realpath(folder)
    target = os.path.realpath(os.path.join(root, uri))
    if os.path.commonpath([root, target]) != root or target == root:
        raise _refuse("URI resolves outside the folder (symlink?)", uri, line)
    return Path(target)
