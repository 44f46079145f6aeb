"""Loading plain array containers (.npz, .safetensors) into the snapshot model, without pickle."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np

from .errors import FormatError, UnsupportedVersionError
from .model import Snapshot


def load_npz(path: str | os.PathLike) -> Snapshot:
    """Load an ``.npz`` with ``allow_pickle=False``; object arrays are refused."""
    name = os.fspath(path)
    try:
        with np.load(name, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise FormatError("not a readable .npz archive", path=name, got=str(exc)) from exc
    except ValueError as exc:
        raise FormatError("npz member needs pickle (object array); refused", path=name) from exc
    return Snapshot(arrays, {"source": Path(name).name})


def load_safetensors(path: str | os.PathLike) -> Snapshot:
    """Load a ``.safetensors`` file as numpy arrays (bf16 needs a numpy dtype and is refused)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    name = os.fspath(path)
    try:
        arrays = load_file(name)
    except (SafetensorError, OSError) as exc:
        raise FormatError("not a readable .safetensors file", path=name, got=str(exc)) from exc
    except (TypeError, ValueError) as exc:
        raise UnsupportedVersionError(
            "safetensors file holds a dtype numpy cannot represent", path=name, got=str(exc)
        ) from exc
    return Snapshot(dict(arrays), {"source": Path(name).name})


def save_npz(snapshot: Snapshot, path: str | os.PathLike) -> None:
    from .atomic import atomic_write

    with atomic_write(path) as handle:
        np.savez(handle, **snapshot.arrays)


def save_safetensors(snapshot: Snapshot, path: str | os.PathLike) -> None:
    from safetensors.numpy import save

    from .atomic import atomic_write_bytes

    arrays = {k: np.ascontiguousarray(v) for k, v in snapshot.arrays.items()}
    atomic_write_bytes(path, save(arrays))
