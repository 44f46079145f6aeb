"""The one contract every snapshot format implements, the same way.

A format is a :class:`SnapshotFormat`: ``save(snapshot, path, options) -> WriteResult``,
``load(path, options) -> Snapshot``, ``open_lazy(path) -> ArrayMapping``,
``verify(path, options) -> Report`` and ``inspect(path) -> dict``. Its write options are a
frozen dataclass (:class:`SaveOptions` and a subclass per format); verify and load take the
one :class:`VerifyOptions`. What a format can do is declared in :class:`Capabilities`, so
callers ask the contract instead of comparing names. This base class does what every format
shares: option checking, torch/numpy coercion, dtypes a format cannot hold (see
:mod:`.dtypes`), requirements a format cannot meet (they fail closed), and the uniform
``inspect`` table.

>>> from snapops.formats.registry import handler
>>> aero = handler("aero")
>>> aero.capabilities.keeps_bf16, aero.capabilities.can_sign
(True, False)
>>> result = aero.save({"w": np.ones(3, np.float32)}, "w.aero", gen=1)
>>> result.format, result.arrays, len(result.sha256)
('aero', 1, 64)
>>> aero.verify("w.aero", require_signature=True).failure.check
'signature'
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import types
import typing
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable, ClassVar, Iterable, Mapping

import numpy as np

from .dtypes import (
    DTYPE_BOUND_KEY, DTYPE_META_KEY, DTYPES, can_hold, decode_record, dtype_name, logical_note,
    restore_logical, store_logical, view_logical,
)
from .errors import ChecksumError, DataError, FormatError, SignatureError
from .iosafe import user_path
from .limits import DeclaredLimits
from .model import ArrayMapping, Snapshot
from .options import (  # noqa: F401  (re-exported: the formats import them from here)
    GEN, META_TOKEN, UTC_TIME, WORKERS, ZSTD_LEVEL, CheckedOptions, KeyPath, Rule, TrustedKeys,
    between, valid_token, valid_ts,
)
from .report import Report

DTYPE_NOTE_KEY = "snapops_dtypes_note"
COMMON_META = ("gen", "ts", "build")
# What a reader reports about the file it read (WTXT's header: its capabilities, digests and
# chain; a restore's format and signer), not about the state: a file written from the
# snapshot has its own, so these are not carried into it.
FILE_FACTS = frozenset({"format", "caps", "root_pending", "sha256_all", "merkle_prev",
                        "merkle_this", "fastxor", "keyid", "gen_text", "audit"})


@dataclass(frozen=True)
class Capabilities:
    """What a format can do; callers ask these instead of comparing format names.

    ``native_dtypes``: dtype names (:func:`.dtypes.dtype_name`) stored as themselves; other
    numeric dtypes are stored as same-width unsigned integers plus a metadata record.
    ``integrity``: what ``verify`` detects in a file written with default options
    (``"structure"``, ``"data"``: any changed byte of array data, ``"metadata"``: names,
    dtypes and shapes).
    """

    native_dtypes: frozenset[str]
    can_sign: bool = False
    can_hmac: bool = False
    mmap: bool = False
    chunk_index: bool = False
    integrity: frozenset[str] = frozenset({"structure"})
    verify_levels: tuple[str, ...] = ("full",)
    streams_text: bool = False   # line-oriented text: verified streaming, diffed by line
    multi_file: bool = False     # the file names others beside it (verify needs the folder)
    any_dtype: bool = False      # every numpy / ml_dtypes dtype is stored as itself

    @property
    def keeps_bf16(self) -> bool:
        return self.any_dtype or "bf16" in self.native_dtypes

    def stores(self, dtype: str) -> bool:
        """True when ``dtype`` (a :func:`.dtypes.dtype_name`) is stored as itself."""
        return self.any_dtype or dtype in self.native_dtypes

    def holds(self, dtype: np.dtype) -> bool:
        """True when an array of ``dtype`` round-trips (natively or through the record)."""
        return self.any_dtype or can_hold(dtype, self.native_dtypes)

    @property
    def has_integrity(self) -> bool:
        return "data" in self.integrity


@dataclass(frozen=True)
class WriteResult:
    """What ``save`` wrote: the file's SHA-256 (computed while writing), size and counts.

    ``sha256_all``/``merkle_this`` are the format's own seal values where it has them (WTXT);
    ``details`` holds the rest of what the format reports (chunks, shards, layout...).
    """

    path: str
    format: str
    size: int
    sha256: str
    arrays: int
    raw_bytes: int
    sha256_all: str | None = None
    merkle_this: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SaveOptions(CheckedOptions):
    """Write options every format accepts: kept in the file's own metadata when given (None:
    not given). Their rules are WTXT's, so every format keeps what any other can."""

    gen: Annotated[int, GEN] | None = None
    ts: Annotated[str, UTC_TIME] | None = None
    build: Annotated[str, META_TOKEN] | None = None

    def common_meta(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in COMMON_META if getattr(self, k) is not None}


@dataclass(frozen=True)
class VerifyOptions(CheckedOptions):
    """What ``verify`` (and ``load``) may be given, for every format.

    A requirement a format cannot meet (``require_signature`` on a format without signatures)
    fails closed; a key a format has no use for is named in a note.
    """

    hmac_key: bytes | KeyPath | None = None
    trusted_keys: TrustedKeys = ()
    require_signature: bool = False
    require_hmac: bool = False
    wsum: KeyPath | None = None     # WTXT: the WSUM file of a streaming snapshot
    identity: KeyPath | None = None  # age identity for armored files
    level: str = "full"             # AERO also knows "control"
    workers: Annotated[int, WORKERS] | None = None
    limits: DeclaredLimits | None = None     # None: the defaults


def build_options(kind: type, values: Mapping[str, Any], what: str) -> Any:
    """``kind(**values)``, refusing unknown names with a DataError that lists the allowed ones.

    >>> build_options(VerifyOptions, {"require_sig": True}, "verify")
    Traceback (most recent call last):
    snapops.formats.errors.DataError: verify: unknown option 'require_sig' (did you mean require_signature?); allowed: hmac_key, trusted_keys, require_signature, require_hmac, wsum, identity, level, workers, limits
    """
    allowed = [f.name for f in dataclasses.fields(kind)]
    for key in values:
        if not isinstance(key, str):
            raise DataError(f"{what}: option names must be strings, got {key!r}")
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise DataError(f"{what}: unknown option {key!r}{hint}; allowed: "
                            f"{', '.join(allowed)}")
    try:
        return kind(**values)
    except DataError as exc:
        raise DataError(f"{what}: {exc}") from None


def merge_options(kind: type, options: Any, fields: Mapping[str, Any], what: str) -> Any:
    """An options object from ``options`` (an instance, a mapping or None) and keyword
    ``fields`` (which win)."""
    if options is None:
        base: dict[str, Any] = {}
    elif isinstance(options, kind):
        base = {f.name: getattr(options, f.name) for f in dataclasses.fields(kind)}
    elif isinstance(options, Mapping):
        base = dict(options)
    else:
        raise DataError(f"{what}: options must be {kind.__name__}, a mapping or None, "
                        f"got {type(options).__name__}")
    return build_options(kind, {**base, **fields}, what)


def parse_option_texts(kind: type, items: Iterable[str], what: str) -> dict[str, Any]:
    """``KEY=VALUE`` strings (CLI ``--option``) typed by the dataclass field they name.

    A field that may hold a string keeps the text as it is (``compression=none`` stays
    ``"none"``); ``none`` is None only for fields that hold no string.

    >>> from snapops.formats.fold import FoldOptions
    >>> parse_option_texts(FoldOptions, ["compression=none", "level=5", "gen=3"], "fold")
    {'compression': 'none', 'level': 5, 'gen': 3}
    """
    hints = typing.get_type_hints(kind)
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.isidentifier():
            raise DataError(f"--option {item!r}: expected KEY=VALUE, e.g. gen=3")
        if key not in hints:
            build_options(kind, {key: None}, what)      # raises, naming the allowed ones
        out[key] = _typed(text, hints[key], key, what)
    return out


def _typed(text: str, hint: Any, key: str, what: str) -> Any:
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    kinds = typing.get_args(hint) if union else (hint,)
    if str in kinds or Any in kinds:
        return text
    if type(None) in kinds and text.lower() == "none":
        return None
    for kind in kinds:
        try:
            if kind is bool:
                if text.lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
                    return text.lower() in ("true", "yes", "on", "1")
                raise ValueError(text)
            if kind in (int, float):
                return kind(text)
        except ValueError:
            continue
    names = " or ".join(getattr(k, "__name__", str(k)) for k in kinds)
    raise DataError(f"{what}: option {key}={text!r}: expected {names}")


_DEMANDS = {"signature": "a signature (--require-signature)",
            "hmac": "HMACs (--require-hmac)"}


def unmet_requirement(title: str, caps: Capabilities, opts: VerifyOptions) -> FormatError | None:
    """The error for a demanded seal this format does not have (None when all can be met).

    >>> from snapops.formats.registry import handler
    >>> error = unmet_requirement("FOLD", handler("fold").capabilities,
    ...                           VerifyOptions(require_hmac=True))
    >>> error.check, error.message.split(":")[0]
    ('hmac', 'FOLD files carry no HMAC')
    """
    missing = [flag for flag, wanted, can in (("signature", opts.require_signature,
                                                caps.can_sign),
                                               ("hmac", opts.require_hmac, caps.can_hmac))
               if wanted and not can]
    if not missing:
        return None
    lacks = " or ".join(m if m == "signature" else "HMAC" for m in missing)
    kind = SignatureError if missing[0] == "signature" else ChecksumError
    return kind(f"{title} files carry no {lacks}: verify the generation that seals them "
                "(snapops verify REPO --run R), or write WTXT, which signs and HMACs each file",
                check=missing[0], got=f"a {title} file",
                expected=" and ".join(_DEMANDS[m] for m in missing))


def unused_notes(title: str, caps: Capabilities, opts: VerifyOptions) -> list[str]:
    """Notes for keys this format has no use for (never silently dropped)."""
    notes = []
    if opts.hmac_key is not None and not caps.can_hmac:
        notes.append(f"HMAC key not used: {title} files carry no HMAC")
    if opts.trusted_keys and not caps.can_sign:
        notes.append(f"trusted keys not used: {title} files carry no signature")
    if opts.wsum is not None and not caps.streams_text:
        notes.append("WSUM file not used: only WTXT files have one")
    return notes


class LogicalArrays(ArrayMapping):
    """A format's lazy reader seen with logical dtypes (from the ``snapops_dtypes`` record)."""

    def __init__(self, raw: ArrayMapping, meta: Mapping[str, Any], path: str) -> None:
        self.raw, self.path = raw, path
        self.names = list(raw.names)
        self.meta = dict(meta)
        record = self.meta.pop(DTYPE_META_KEY, None)
        self.logical: dict[str, str] = {}
        self.note: str | None = None
        if record:
            shells = {n: np.empty(0, raw.spec(n)[0]) for n in self.names}
            try:
                self.logical = decode_record(str(record), shells)
            except FormatError as exc:
                raw.close()
                raise exc.located(path) from None
            self.note = logical_note(self.logical)
            self.meta[DTYPE_NOTE_KEY] = self.note

    def array(self, name: str) -> np.ndarray:
        value = self.raw[name]
        if name in self.logical:
            try:
                return view_logical(value, self.logical[name], name)
            except FormatError as exc:
                raise exc.located(self.path) from None
        return value

    def spec(self, name: str) -> tuple[np.dtype, tuple[int, ...]]:
        dtype, shape = self.raw.spec(name)
        return (DTYPES[self.logical[name]] if name in self.logical else dtype), shape

    def close(self) -> None:
        self.raw.close()


class SnapshotFormat(ABC):
    """One snapshot format. Subclasses set the class attributes and implement the five
    ``_``-prefixed hooks; callers use the public verbs, which are the same for every format."""

    name: ClassVar[str]
    title: ClassVar[str]                 # how messages spell it: "FOLD", "WTXT"...
    suffixes: ClassVar[tuple[str, ...]]
    capabilities: ClassVar[Capabilities]
    options_type: ClassVar[type] = SaveOptions
    dtype_record_limit: ClassVar[int | None] = None
    # True when ``_load`` checks everything ``verify`` checks (no second pass needed)
    load_verifies: ClassVar[bool] = False

    def sniff(self, head: bytes) -> bool:
        """True when ``head`` (the first bytes of a file) is this format's magic."""
        return False

    # -- the contract ------------------------------------------------------------------------

    def options(self, options: Any = None, **fields: Any) -> Any:
        """This format's write options from an instance/mapping and keywords (checked)."""
        return merge_options(self.options_type, options, fields, f"{self.name} writer")

    def save(self, snapshot: Snapshot | Mapping[str, Any], path: str | os.PathLike,
             options: Any = None, **fields: Any) -> WriteResult:
        """Write ``snapshot`` to ``path`` atomically; see the format's options class."""
        name = user_path(path)
        opts = self.options(options, **fields)
        return self._save(self.stored_snapshot(snapshot, opts), name, opts)

    def stored_snapshot(self, snapshot: Snapshot | Mapping[str, Any], opts: Any) -> Snapshot:
        """What ``_save`` writes: arrays of native dtypes (others as same-width unsigned
        integers) and meta with gen/ts/build and the ``snapops_dtypes`` record (not the
        ``FILE_FACTS`` of a file the snapshot was read from)."""
        snap = Snapshot.coerce(snapshot)
        caps = self.capabilities
        stored, record = (dict(snap.arrays), None) if caps.any_dtype else store_logical(
            snap.arrays, caps.native_dtypes, self.title, self.dtype_record_limit)
        meta = {k: v for k, v in snap.meta.items()
                if k not in (DTYPE_META_KEY, DTYPE_NOTE_KEY) and k not in FILE_FACTS}
        meta.update(opts.common_meta())
        try:        # gen/ts/build a snapshot carries (a loaded file's) obey the options' rules
            SaveOptions(**{k: meta[k] for k in COMMON_META if k in meta})
        except DataError as exc:
            raise DataError(f"{self.name}: snapshot meta {exc}") from None
        if record:
            meta[DTYPE_META_KEY] = record
        return Snapshot(stored, meta)

    def load(self, path: str | os.PathLike, options: Any = None, *, verify: bool = True,
             **fields: Any) -> Snapshot:
        """Every array with its logical dtype, or the first failed check: with ``verify``
        (the default) every check ``verify`` makes holds before anything is returned, so a
        corrupt file is never converted or trained on (a demanded seal the format cannot have
        fails closed)."""
        path = user_path(path)
        opts = merge_options(VerifyOptions, options, fields, f"{self.name} load")
        self._check_level(opts, "load")
        error = unmet_requirement(self.title, self.capabilities, opts)
        if error is not None:
            raise error.located(path)
        snap = (self._load if verify else self._decode)(path, opts)
        if verify and not self.load_verifies:
            report = self.verify(path, opts)
            if report.failure is not None:
                raise report.failure
        record = snap.meta.pop(DTYPE_META_KEY, None)
        # only a format that can sign can have a verified signature behind the record
        bound = snap.meta.pop(DTYPE_BOUND_KEY, False) is True and self.capabilities.can_sign
        try:
            arrays, note = restore_logical(snap.arrays, str(record) if record else None,
                                           bound=bound)
        except FormatError as exc:
            raise exc.located(path) from None
        if note:
            snap.meta[DTYPE_NOTE_KEY] = note
        return Snapshot(arrays, snap.meta)

    def _check_level(self, opts: VerifyOptions, verb: str) -> None:
        if opts.level not in self.capabilities.verify_levels:
            raise DataError(f"{self.name} {verb}: level must be one of "
                            f"{', '.join(self.capabilities.verify_levels)}, got {opts.level!r}")

    def open_lazy(self, path: str | os.PathLike) -> LogicalArrays:
        """An ArrayMapping reading one array at a time (``names``, ``[name]``, ``meta``)."""
        name = user_path(path)
        raw, meta = self._open(name)
        return LogicalArrays(raw, meta, name)

    def verify(self, path: str | os.PathLike, options: Any = None, **fields: Any) -> Report:
        """Every check the format allows; never raises for bad content (``report.failure``)."""
        name = user_path(path)
        opts = merge_options(VerifyOptions, options, fields, f"{self.name} verify")
        self._check_level(opts, "verify")
        error = unmet_requirement(self.title, self.capabilities, opts)
        if error is not None:
            return Report(path=name, format=self.name).fail(error)
        report = self._verify(name, opts)
        report.notes.extend(unused_notes(self.title, self.capabilities, opts))
        if report.ok:
            self._note_logical(name, report)
        return report

    def inspect(self, path: str | os.PathLike) -> dict:
        """The format's own description plus one ``arrays`` table (name, dtype, shape,
        bytes, and the format's own columns) with dtypes spelled one way, and ``notes``.
        A file whose arrays cannot be opened keeps the format's own rows and says why."""
        name = user_path(path)
        info = self._inspect(name)
        info.setdefault("format", self.name)
        info.setdefault("path", name)
        notes = list(info.get("notes", []))
        try:
            lazy = self.open_lazy(name)
        except FormatError as exc:
            notes.append(f"arrays not readable: {exc}")
            info["notes"] = notes
            return info
        with lazy:
            info["arrays"] = inspect_rows(lazy, info.get("arrays", []))
            notes += [lazy.note] if lazy.note else []
        info["notes"] = notes
        return info

    def result(self, path: str, snapshot: Snapshot, size: int, sha256: str,
               details: Mapping[str, Any] | None = None) -> WriteResult:
        """The WriteResult of writing ``snapshot`` (as stored) to ``path``."""
        return WriteResult(path=path, format=self.name, size=size, sha256=sha256,
                           arrays=len(snapshot), raw_bytes=snapshot.nbytes,
                           details=dict(details or {}))

    def checked(self, path: str, run: Callable[[], tuple[int, int]], checks: Iterable[str],
                note: str | None = None) -> Report:
        """A Report from ``run`` (returns arrays and raw bytes, raises FormatError), naming
        ``checks`` as passed and adding ``note``."""
        report = Report(path=path, format=self.name)
        try:
            report.arrays, report.raw_bytes = run()
        except FormatError as exc:
            return report.fail(exc)
        for check in checks:
            report.passed(check)
        report.notes.extend([note] if note else [])
        return report

    def _note_logical(self, path: str, report: Report) -> None:
        try:
            with self.open_lazy(path) as lazy:
                if lazy.note:
                    report.notes.append(logical_note(lazy.logical, bound=True)
                                        if report.details.get(DTYPE_BOUND_KEY) is True
                                        and self.capabilities.can_sign
                                        else lazy.note)
        except FormatError as exc:
            report.fail(exc)

    # -- what each format provides -----------------------------------------------------------

    @abstractmethod
    def _save(self, snapshot: Snapshot, path: str, options: Any) -> WriteResult:
        """Write arrays of native dtypes and ``snapshot.meta`` (which carries gen/ts/build
        and the dtype record) to ``path``."""

    def _decode(self, path: str, options: VerifyOptions) -> Snapshot:
        """What ``load(verify=False)`` reads: ``_load``, unless the format can leave out the
        checks ``verify`` makes (a reader's own structural checks always run)."""
        return self._load(path, options)

    @abstractmethod
    def _load(self, path: str, options: VerifyOptions) -> Snapshot:
        """The stored arrays and the file's metadata (with the dtype record if any)."""

    @abstractmethod
    def _open(self, path: str) -> tuple[ArrayMapping, dict]:
        """A lazy reader of the stored arrays and the file's metadata."""

    @abstractmethod
    def _verify(self, path: str, options: VerifyOptions) -> Report:
        """The format's checks."""

    @abstractmethod
    def _inspect(self, path: str) -> dict:
        """The format's own description (header, chunks...); ``arrays`` rows are merged into
        the uniform table by name."""


def inspect_rows(lazy: LogicalArrays, format_rows: Iterable[Mapping[str, Any]]) -> list[dict]:
    """One row per array: name, logical dtype, shape, bytes (and ``stored_as`` when the dtype
    comes from the record), then the format's own columns for that name."""
    extras = {row["name"]: row for row in format_rows}
    table = []
    for name in lazy.names:
        dtype, shape = lazy.spec(name)
        row = {"name": name, "dtype": dtype_name(dtype), "shape": list(shape),
               "bytes": int(np.prod(shape, dtype=np.int64)) * dtype.itemsize}
        if name in lazy.logical:
            row["stored_as"] = dtype_name(lazy.raw.spec(name)[0])
        row.update({k: v for k, v in extras.get(name, {}).items()
                    if k not in ("name", "dtype", "shape", "bytes", "nbytes")})
        table.append(row)
    return table


def render_inspect(info: Mapping[str, Any]) -> str:
    """The text form of ``inspect`` for every format (``snapops inspect``).

    >>> print(render_inspect({"format": "npz", "path": "a.npz", "header": {"arrays": 1},
    ...                       "arrays": [{"name": "w", "dtype": "f32", "shape": [2, 3],
    ...                                   "bytes": 24}], "notes": []}))
    a.npz: npz
      arrays: 1
      w: f32 [2x3] bytes=24
    """
    lines = [f"{info.get('path')}: {info.get('format')}"]
    header = info.get("header") or {}
    lines += [f"  {key}: {value}" for key, value in header.items()]
    for row in info.get("arrays", []):
        extras = " ".join(f"{k}={v}" for k, v in row.items() if k not in ("name", "dtype",
                                                                           "shape"))
        shape = "x".join(str(d) for d in row.get("shape", [])) or "scalar"
        lines.append(f"  {row['name']}: {row.get('dtype')} [{shape}]"
                     + (f" {extras}" if extras else ""))
    lines += [f"  note: {note}" for note in info.get("notes", [])]
    return "\n".join(lines)
