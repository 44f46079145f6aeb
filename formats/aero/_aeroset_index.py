"""The AEROSET's JSON index (``model.aeroset.json``): where it is, its size bound, and its
parsing and validation (part paths stay inside the set's folder, sizes and shard ids are
non-negative integers, sha256 values are 64 hex digits, no shard belongs to two parts).
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import Any

from ..errors import FormatError, LimitError, UnsupportedVersionError
from . import _decode

SET_NAME = "model.aeroset.json"
INDEX_NAME = "index.aero"
MAX_SET_JSON = 64 << 20


def set_paths(path: str | os.PathLike) -> tuple[Path, Path]:
    """(the set's folder, its JSON) for a folder or a ``*.aeroset.json`` path."""
    p = Path(path)
    if p.name.endswith(".aeroset.json"):
        return p.parent, p
    return p, p / SET_NAME


def _relative(value: Any, what: str, path: str) -> str:
    """A part path must stay inside the set's folder: relative, no '..', no URL."""
    if not isinstance(value, str) or not value:
        raise FormatError(f"{what}: path must be a non-empty string", path=path, got=value)
    if "://" in value:
        raise UnsupportedVersionError(f"{what}: remote parts are not supported", path=path,
                                      got=value)
    pure = PurePosixPath(value)
    if pure.is_absolute() or ".." in pure.parts or "\\" in value or "\0" in value:
        raise FormatError(f"{what}: path leaves the AEROSET folder", path=path,
                          expected="a relative path without '..'", got=value)
    return value


def _uint(value: Any, what: str, path: str) -> int:
    if type(value) is not int or value < 0:
        raise FormatError(f"{what} must be a non-negative integer", path=path, got=value)
    return value


def _sha(value: Any, what: str, path: str) -> str:
    if not (isinstance(value, str) and len(value) == 64 and set(value) <= set("0123456789abcdef")):
        raise FormatError(f"{what}: sha256 must be 64 lowercase hex digits", path=path, got=value)
    return value


def parse_set(data: bytes, path: str) -> dict:
    """Validate ``model.aeroset.json``; returns it with parts/global_tidx normalised."""
    if len(data) > MAX_SET_JSON:
        raise LimitError("AEROSET index too large", path=path,
                         expected=f"<= {MAX_SET_JSON} bytes", got=len(data))
    doc = _decode.load_json(data, chunk=SET_NAME)
    fmt = doc.get("format") if isinstance(doc, dict) else None
    if not isinstance(fmt, dict) or fmt.get("name") != "AEROSET":
        raise FormatError("not an AEROSET index", path=path,
                          expected="format.name 'AEROSET'", got=fmt)
    if fmt.get("version") not in ([0, 1], [0, 2]):
        raise UnsupportedVersionError("unsupported AEROSET version", path=path,
                                      expected="[0, 1] or [0, 2]", got=fmt.get("version"))
    parts, gt = doc.get("parts"), doc.get("global_tidx")
    if not isinstance(parts, list) or not isinstance(gt, dict):
        raise FormatError("AEROSET index needs 'parts' (list) and 'global_tidx' (map)",
                          path=path, got=sorted(doc))
    out_parts, owner = [], {}
    for i, part in enumerate(parts):
        if not isinstance(part, dict) or not isinstance(part.get("shards"), list):
            raise FormatError(f"parts[{i}] must be a map with a 'shards' list", path=path,
                              got=part)
        rel = _relative(part.get("path"), f"parts[{i}]", path)
        shards = [_uint(s, f"parts[{i}].shards", path) for s in part["shards"]]
        for s in shards:
            if s in owner:
                raise FormatError(f"shard {s} is listed by two parts", path=path,
                                  got=(owner[s], rel))
            owner[s] = rel
        out_parts.append({"path": rel, "sha256": _sha(part.get("sha256"), rel, path),
                          "size_bytes": _uint(part.get("size_bytes"), f"{rel} size_bytes", path),
                          "shards": shards})
    index = {"path": _relative(gt.get("path"), "global_tidx", path),
             "sha256": _sha(gt.get("sha256"), "global_tidx", path),
             "size_bytes": _uint(gt.get("size_bytes"), "global_tidx size_bytes", path)}
    model = doc.get("model") if isinstance(doc.get("model"), dict) else {}
    return {"format": fmt, "model": model, "parts": out_parts, "global_tidx": index,
            "owner": owner}
