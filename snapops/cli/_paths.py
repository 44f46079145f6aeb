"""Output paths checked before a command does any work: a command never replaces one of its
own inputs, never writes into a folder that does not exist (found only after minutes of
work) and never replaces something that is not a regular file (a folder, a device)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from snapops.formats.errors import UsageError

STDIO = "-"


def check_output(path: str | os.PathLike, inputs: Iterable[str | os.PathLike | None] = (), *,
                 what: str = "output") -> None:
    """UsageError unless ``path`` can take a new file: its folder exists, it is not a folder
    or another non-regular file, and it is none of ``inputs`` (also through links or another
    spelling of the same path). ``-`` (stdout) always can.

    >>> check_output("state.wtxt", ["state.wtxt"])
    Traceback (most recent call last):
    ...
    snapops.formats.errors.UsageError: state.wtxt: the output would replace the input state.wtxt...
    """
    text = os.fspath(path)
    if text == STDIO:
        return
    target = Path(text)
    for source in inputs:
        if source is None or os.fspath(source) == STDIO:
            continue
        if _same_file(target, Path(source)):
            raise UsageError(f"{text}: the {what} would replace the input {os.fspath(source)}; "
                             f"choose another {what} path")
    if target.is_dir():
        raise UsageError(f"{text}: is a folder; expected a file name for the {what}")
    if target.exists() and not target.is_file():
        raise UsageError(f"{text}: not a regular file; expected a file name for the {what}")
    folder = target.parent
    if not folder.is_dir():
        raise UsageError(f"{text}: the folder {os.fspath(folder)} does not exist "
                         "(create it first)")


def check_folder(path: str | os.PathLike, *, what: str = "repository") -> None:
    """UsageError unless ``path`` is an existing folder (before ``git`` is run there, which
    would blame itself: ``cannot run git: No such file or directory``).

    >>> check_folder("/nonexistent")
    Traceback (most recent call last):
    ...
    snapops.formats.errors.UsageError: /nonexistent: the repository folder does not exist
    """
    text = os.fspath(path)
    if Path(text).is_dir():
        return
    if Path(text).exists():
        raise UsageError(f"{text}: not a folder; expected the {what} folder")
    raise UsageError(f"{text}: the {what} folder does not exist")


def check_output_folder(path: str | os.PathLike, *, what: str = "files") -> None:
    """UsageError unless ``path`` is a folder or can be made one (missing folders are
    created): no file stands at it or on the way to it."""
    text = os.fspath(path)
    target = Path(text)
    for step in (target, *target.parents):
        if step.is_dir():
            return
        if step.exists() or step.is_symlink():
            where = "" if step == target else f" ({os.fspath(step)})"
            raise UsageError(f"{text}: a file is in the way{where}; {what} are written into a "
                             "folder: choose another folder")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:                      # either is missing: compare the spelled paths
        return os.path.abspath(a) == os.path.abspath(b)
