"""snapops: safe, verifiable, Git-reviewable weight snapshots for ML training runs.

One front door for every format (WTXT, AERO, AEROSET, FOLD, PyCauset, FINF, npz,
safetensors, pt): the same verbs, the same typed options, numpy arrays or torch tensors of any
dtype in, the same dtypes and names out.

>>> import numpy as np, snapops
>>> result = snapops.save({"w": np.ones((4, 4), np.float32)}, "w.wtxt", gen=1, row_blocking=True)
>>> snapops.verify("w.wtxt").ok
True
>>> snapops.load("w.wtxt")["w"].shape
(4, 4)
>>> snapops.save({"w": np.ones(2)}, "w.fold", compresion="none")
Traceback (most recent call last):
snapops.formats.errors.DataError: fold writer: unknown option 'compresion' (did you mean compression?); allowed: gen, ts, build, compression, level, ecc, segment, workers, created_at
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any, Mapping


def runs_as_the_program(argv: list[str], orig_argv: list[str]) -> bool:
    """This process is the ``snapops`` program (its console script or ``python -m
    snapops``), not a script that imports the library."""
    if argv and os.path.basename(argv[0]) == "snapops":
        return True
    return "-m" in orig_argv and orig_argv[orig_argv.index("-m") + 1:][:1] == ["snapops"]


def interrupted_at_start(signum, frame) -> None:
    """SIGINT while the program is still importing (a few tenths of a second, nothing written
    yet): "interrupted" and exit 130, as during a command, not a traceback of the import.
    ``snapops.cli.main`` puts Python's own handler back before the command runs."""
    os.write(2, b"interrupted\n")
    os._exit(130)


if runs_as_the_program(sys.argv, getattr(sys, "orig_argv", [])):  # before the heavy imports
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, interrupted_at_start)

# The program runs no large BLAS work, and OpenBLAS starting a thread per core at numpy's import
# costs each process (every hook, CLI command, daemon) 0.1 CPU-s. A library import leaves the
# caller's settings alone.
if runs_as_the_program(sys.argv, getattr(sys, "orig_argv", [])) and "numpy" not in sys.modules:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from snapops.formats import errors  # noqa: F401
from snapops.formats.contract import VerifyOptions, WriteResult
from snapops.formats.errors import FormatError, SnapopsError  # noqa: F401
from snapops.formats.iosafe import user_path, write_error
from snapops.formats.model import Snapshot
from snapops.formats.report import Report

__version__ = "0.1.0"
__all__ = ["Snapshot", "Snapshotter", "Shard", "Report", "WriteResult", "VerifyOptions", "load",
           "save", "verify", "inspect", "load_generation", "latest_verified", "SnapopsError",
           "FormatError"]


def __getattr__(name: str):
    if name == "Snapshotter":  # the training-side client, imported on first use
        from snapops.daemon.client import Snapshotter

        return Snapshotter
    if name == "Shard":  # a rank's box of a global array: Shard(local, global_shape=, offsets=)
        from snapops.formats.generation.plan import Shard

        return Shard
    if name in ("load_generation", "latest_verified"):  # a generation from a repository or URL
        from snapops import restore

        return getattr(restore, name)
    raise AttributeError(f"module 'snapops' has no attribute {name!r}")


def load(path: str | os.PathLike, options: VerifyOptions | None = None,
         **fields: Any) -> Snapshot:
    """Load any supported file (detected by magic bytes, then suffix) with its dtypes and
    names; ``options``/keywords are :class:`VerifyOptions` (keys the format checks while
    reading, ``require_signature``...)."""
    from snapops.formats.registry import detect

    path = user_path(path)
    return detect(path).load(path, options, **fields)


def save(snapshot: Snapshot | Mapping[str, Any], path: str | os.PathLike, options: Any = None,
         *, format: str | None = None, **fields: Any) -> WriteResult:
    """Write ``snapshot`` (a Snapshot, or a mapping of numpy arrays / torch tensors) to
    ``path`` atomically; returns a WriteResult (size, SHA-256 of the file, counts).

    The format comes from ``format=`` or the file suffix. ``options`` is that format's options
    dataclass (``snapops.formats.fold.FoldOptions``...) or a mapping; keywords are its fields.
    ``gen``, ``ts`` and ``build`` are accepted by every format; an unknown name is an error
    that lists the allowed ones.
    """
    from snapops.formats.registry import handler, handler_for_suffix

    path = user_path(path)
    chosen = handler(format) if format is not None else handler_for_suffix(path)
    try:
        return chosen.save(snapshot, path, options, **fields)
    except OSError as exc:  # no such folder, the disk full or read-only: one line, typed
        raise write_error(path, exc) from None


def verify(path: str | os.PathLike, options: VerifyOptions | None = None,
           **fields: Any) -> Report:
    """Fully verify any supported file (age-armored too, with ``identity``); returns a Report
    (``report.ok``, ``report.failure``). A demanded seal the format does not have
    (``require_signature``, ``require_hmac``) fails closed and says what to do instead."""
    from snapops.formats.registry import verify_any

    return verify_any(user_path(path), options, **fields)


def inspect(path: str | os.PathLike) -> dict:
    """The format's description and one ``arrays`` table (name, dtype, shape, bytes)."""
    from snapops.formats.registry import detect

    path = user_path(path)
    return detect(path).inspect(path)
