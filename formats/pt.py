"""``.pt`` / ``.pth``: torch state_dicts, read with ``torch.load(weights_only=True)`` only.

torch is optional: it is imported when a ``.pt`` file is read or written. A file must hold a
mapping of tensors; nested mappings are flattened with ``.`` (``{"enc": {"w": t}}`` ->
``enc.w``) and any other leaf (a number, a string, a list) is refused by name. ``save`` writes
an ``OrderedDict`` in byte-wise name order through ``torch.save`` to a stream, in file order:
the same input gives the same bytes (checked across processes by the tests). ``gen``/``ts``/
``build`` and other metadata go to the state_dict's ``_metadata["@snapops"]``, which
``model.load_state_dict`` ignores. ``verify`` checks the structure and the zip's CRC-32 of
every record (accidental damage), the lazy reader that of a tensor's record before returning
it; a ``.pt`` file has no seal.

>>> import torch
>>> _ = FORMAT.save({"layer.0.weight": torch.ones(2, dtype=torch.bfloat16)}, "m.pt", gen=5)
>>> snap = FORMAT.load("m.pt")
>>> snap["layer.0.weight"].dtype.name, snap.meta["gen"]
('bfloat16', 5)
"""

from __future__ import annotations

import collections
import io
import os
import pickletools
import struct
import warnings
import zipfile
from typing import Any, Mapping

from .atomic import atomic_write_digest
from .contract import Capabilities, SnapshotFormat, VerifyOptions, WriteResult
from .dtypes import DTYPES
from .errors import FormatError
from .iosafe import open_input
from .limits import check_dims
from .model import ArrayMapping, Snapshot
from .npz import ZIP_ERRORS, first_member_name, open_zip
from .report import Report
from .tensors import is_tensor, numpy_to_tensor, tensor_to_numpy

META_KEY = "@snapops"       # no module path can be named this: load_state_dict never reads it
MAX_DEPTH = 32
MAX_PICKLE = 256 << 20      # bytes of a pickle record (tensor data lies in records of its own)
MAX_PICKLE_TEXT = 1024      # characters of a name, a GLOBAL or any other text in the pickle


def read_state(path: str) -> tuple[dict[str, Any], dict, dict | None]:
    """The flat ``name -> tensor`` mapping of a ``.pt`` file (mmapped when it is a zip), its
    snapops metadata and, for a zip, the record holding each tensor's storage (None when
    torch does not say: the file is then read whole, and torch checks the record sizes).

    Every shape is checked against the limits first (numpy cannot hold ``(0, 2**62)``, which
    torch reads). torch maps each storage as ``numel`` bytes from where its record starts and
    never compares that with the record's size (a record shorter than its storage would lend
    it the bytes of the records after it): each storage must be exactly one stored record."""
    zipped = _is_zip(path)
    check_pickles(path, zipped)
    records = _storage_records(path) if zipped else None
    obj = _torch_load(path, mmap=records is not None)
    if not isinstance(obj, Mapping):
        raise FormatError("a .pt file must hold a mapping of tensors (a state_dict)",
                          path=path, got=type(obj).__name__)
    meta = getattr(obj, "_metadata", None)
    meta = meta.get(META_KEY, {}) if isinstance(meta, Mapping) else {}
    flat: dict[str, Any] = {}
    _flatten(obj, "", flat, path, 0)
    for name, tensor in flat.items():
        check_dims(name, tuple(tensor.shape), tensor.element_size(), path=path)
    if records is not None:
        _check_mapped(flat, records, path)
    return flat, dict(meta) if isinstance(meta, Mapping) else {}, records


def _torch_load(path: str, **options: Any) -> Any:
    import torch

    with warnings.catch_warnings(record=True) as warned:   # a damaged file's warnings
        warnings.simplefilter("always")                    # become part of its error
        try:
            return torch.load(path, weights_only=True, **{"map_location": "cpu", **options})
        except FormatError:
            raise
        except OSError as exc:
            raise FormatError(f"cannot read: {exc.strerror or exc}", path=path) from exc
        except Exception as exc:  # torch's reader documents no error types for bad input
            # (seen: UnpicklingError, RuntimeError, struct.error, KeyError, EOFError...)
            said = "; ".join(str(w.message)[:100] for w in warned)
            raise FormatError("not a .pt state_dict torch can load with weights_only=True",
                              path=path, got=f"{type(exc).__name__}: {str(exc)[:200]}"
                              + (f" (torch warned: {said})" if said else "")) from exc


def _storage_records(path: str) -> dict[str, tuple[zipfile.ZipInfo, int]] | None:
    """The stored record holding each tensor's storage and where its bytes start, from a
    load onto the meta device (reads no tensor data; torch notes where each storage starts);
    None when this torch does not note it."""
    obj = _torch_load(path, map_location="meta")
    if not isinstance(obj, Mapping):
        return None                     # read_state's own load says what is wrong
    flat: dict[str, Any] = {}
    _flatten(obj, "", flat, path, 0)
    extents = {}
    for name, tensor in flat.items():
        storage = tensor.untyped_storage()
        start = getattr(storage, "_checkpoint_offset", None)
        if type(start) is not int:
            return None
        extents[name] = (start, int(storage.nbytes()))
    starts = _record_starts(path)
    records = {}
    for name, (start, nbytes) in extents.items():
        info = starts.get(start)
        if info is None or info.compress_type != zipfile.ZIP_STORED or info.file_size != nbytes:
            held = "no record" if info is None else (
                f"{info.filename[:100]} of {info.file_size} bytes"
                + ("" if info.compress_type == zipfile.ZIP_STORED else ", compressed"))
            raise FormatError("tensor storage is not the record it names", path=path,
                              array=name, expected=f"a stored record of {nbytes} bytes "
                              f"starting at byte {start}", got=held)
        records[name] = (info, start)
    return records


def _check_mapped(flat: dict[str, Any], records: dict, path: str) -> None:
    """The mapped storages lie where their records start. The meta load computes where a
    storage starts from the first one (which it looks up) and the sizes of those before it,
    assuming torch's own layout; the mapped load looks every record up: on a file laid out
    otherwise the two could name different records. Every storage then sits at its record's
    start plus one common base (the map's)."""
    if set(records) != set(flat):
        raise FormatError("the file changed while it was read", path=path)
    bases = set()
    for name, tensor in flat.items():
        pointer = tensor.untyped_storage().data_ptr()
        if pointer:
            bases.add(pointer - records[name][1])
    if len(bases) > 1:
        raise FormatError("tensor storages do not lie at the records they name (a zip not "
                          "laid out as torch.save lays it out)", path=path)


def _record_starts(path: str) -> dict[int, zipfile.ZipInfo]:
    """``data offset -> member`` of a zip (where each member's bytes start, after its local
    header, as torch's reader computes it)."""
    try:
        with open_zip(path) as archive:
            infos = archive.infolist()
            starts = {}
            for info in infos:
                archive.fp.seek(info.header_offset)
                local = archive.fp.read(30)
                if len(local) < 30 or local[:4] != b"PK\x03\x04":
                    continue
                name_len, extra_len = struct.unpack("<HH", local[26:30])
                starts[info.header_offset + 30 + name_len + extra_len] = info
            return starts
    except FormatError:
        raise
    except ZIP_ERRORS as exc:
        raise damaged_zip(path, exc) from exc


def check_pickles(path: str, zipped: bool) -> None:
    """Walk the pickle opcodes before torch does (``pickletools``, which only reads them):
    FormatError for any text argument longer than ``MAX_PICKLE_TEXT``, and for a pickle
    pickletools cannot read. torch's weights_only error for a GLOBAL it refuses quotes the
    name and then searches the message with backtracking regexes: a 100,000-character name
    held ``torch.load`` for minutes (also one whose line had no newline, which torch reads to
    the end of the record and pickletools refuses)."""
    try:
        if zipped:
            with open_zip(path) as archive:
                for info in archive.infolist():
                    if info.filename.endswith(".pkl"):
                        if info.file_size > MAX_PICKLE:
                            raise FormatError("pickle record too large", path=path,
                                              got=f"{info.filename}: {info.file_size} bytes")
                        _scan_pickle(io.BytesIO(archive.read(info)), 1, path, info.filename)
        else:   # legacy: magic, protocol, system info, the state, the storage keys
            with open_input(path) as f:
                _scan_pickle(_Bounded(f), 5, path, "the file")
    except FormatError:
        raise
    except ZIP_ERRORS as exc:
        raise damaged_zip(path, exc) from exc


def damaged_zip(path: str, exc: Exception) -> FormatError:
    return FormatError("damaged zip", path=path, check="crc32",
                       expected="a zip archive Python's zipfile reads", got=str(exc))


class _Bounded:
    """A file as ``pickletools`` reads it, refusing a length past its end (a 4 GiB length
    field would otherwise allocate 4 GiB) and lines longer than any name."""

    def __init__(self, f) -> None:
        self.f, self.size = f, os.fstat(f.fileno()).st_size

    def read(self, n: int) -> bytes:
        if n > self.size - self.f.tell():
            raise EOFError("a length past the end of the file")
        return self.f.read(n)

    def readline(self) -> bytes:
        return self.f.readline(2 * MAX_PICKLE_TEXT + 2)

    def tell(self) -> int:
        return self.f.tell()


def _scan_pickle(stream, count: int, path: str, where: str) -> None:
    for _ in range(count):
        try:
            for op, arg, pos in pickletools.genops(stream):
                if isinstance(arg, str) and len(arg) > MAX_PICKLE_TEXT:
                    break
            else:
                continue
        except (ValueError, EOFError, struct.error, UnicodeDecodeError) as exc:
            # fail closed: torch's own reader is laxer (a GLOBAL line without its newline
            # runs to the end of the record) and would quote what it read in its error
            raise FormatError("not a pickle a state_dict is written as", path=path,
                              got=f"{where}: {str(exc)[:120]}",
                              expected="pickle opcodes Python's pickletools reads") from exc
        raise FormatError(f"a pickle {op.name} argument of {len(arg)} characters (no "
                          "state_dict name is that long)", path=path,
                          got=f"{where} at byte {pos}",
                          expected=f"at most {MAX_PICKLE_TEXT} characters")


def _flatten(obj: Mapping, prefix: str, out: dict, path: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise FormatError("state_dict nests too deeply", path=path, got=prefix)
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if not isinstance(key, str):
            raise FormatError("state_dict keys must be strings", path=path, got=repr(key))
        if isinstance(value, Mapping):
            _flatten(value, name + ".", out, path, depth + 1)
        elif is_tensor(value):
            if name in out:
                raise FormatError("two entries flatten to one name", path=path, array=name)
            out[name] = value
        else:
            raise FormatError("state_dict entry is not a tensor (refused: only tensors and "
                              "nested mappings of tensors are read)", path=path, array=name,
                              got=type(value).__name__)


class PtArrays(ArrayMapping):
    """The tensors of a ``.pt`` file (mapped, converted to numpy one at a time). With
    ``check_crc`` (the lazy reader) the record of a tensor's storage is checked against its
    CRC-32 before the tensor is returned, as ``load`` (which verifies the whole file) does."""

    def __init__(self, path: str, check_crc: bool = False) -> None:
        self.path = path
        self.tensors, self.meta, self.records = read_state(path)
        self.names = sorted(self.tensors)
        self.check_crc = check_crc
        self._checked: set[int | None] = set()     # header offsets of records found intact

    def array(self, name: str):
        tensor = self.tensors.get(name)
        if tensor is None:
            raise FormatError("no such array", path=self.path, array=name,
                              expected="one of " + ", ".join(self.names[:8]), got=name)
        if self.check_crc:
            self._check_record(name)
        return tensor_to_numpy(tensor, name)

    def spec(self, name: str):
        tensor = self.tensors.get(name)
        if tensor is None:
            raise FormatError("no such array", path=self.path, array=name,
                              expected="one of " + ", ".join(self.names[:8]), got=name)
        import torch

        return tensor_to_numpy(torch.empty(0, dtype=tensor.dtype), name).dtype, \
            tuple(int(d) for d in tensor.shape)

    def _check_record(self, name: str) -> None:
        if self.records is None:        # legacy file (no CRC), or records unknown: all of them
            if None not in self._checked:
                _check_crcs(self.path, array=name)
                self._checked.add(None)
            return
        offset = self.records[name][0].header_offset
        if offset not in self._checked:
            _check_crcs(self.path, {offset}, name)
            self._checked.add(offset)


class Pt(SnapshotFormat):
    name = "pt"
    title = "pt"
    suffixes = (".pt", ".pth")
    capabilities = Capabilities(
        native_dtypes=frozenset(DTYPES),
        integrity=frozenset({"structure", "data"}))

    def sniff(self, head: bytes) -> bool:
        first = first_member_name(head)          # torch.save's zip: <name>/data.pkl first
        return first is not None and first.endswith("/data.pkl")

    def _save(self, snapshot: Snapshot, path: str, options: Any) -> WriteResult:
        import torch

        state = collections.OrderedDict(
            (name, numpy_to_tensor(snapshot.arrays[name])) for name in snapshot.sorted_names())
        state._metadata = {META_KEY: dict(snapshot.meta)}    # type: ignore[attr-defined]
        with atomic_write_digest(path) as out:
            sink = _RaisingSink(out)
            try:
                torch.save(state, sink)
            except Exception as failure:
                sink.reraise(failure)
                raise
            sink.reraise()      # torch's writer may also go on after a failed write
        return self.result(path, snapshot, out.size, out.hexdigest())

    def _load(self, path: str, options: VerifyOptions) -> Snapshot:
        arrays = PtArrays(path)
        return Snapshot({n: arrays.array(n).copy() for n in arrays.names}, arrays.meta)

    def _open(self, path: str) -> tuple[ArrayMapping, dict]:
        arrays = PtArrays(path, check_crc=True)
        return arrays, dict(arrays.meta)

    def _verify(self, path: str, options: VerifyOptions) -> Report:
        def check() -> tuple[int, int]:
            arrays = PtArrays(path)
            _check_crcs(path)
            return len(arrays.names), sum(int(t.nbytes) for t in arrays.tensors.values())

        return self.checked(path, check, ("structure", "crc32"),
                            ".pt files carry no seal: the zip's CRC-32 finds accidental damage, "
                            "not tampering")

    def _inspect(self, path: str) -> dict:
        arrays = PtArrays(path)
        return {"meta": dict(arrays.meta), "header": {"tensors": len(arrays.names),
                                                      "zip": _is_zip(path)}}


class _RaisingSink:
    """The file ``torch.save`` writes to, keeping what its ``write`` raised. torch's C++ zip
    writer catches an exception from ``write`` and fails later with a RuntimeError of its own
    ("unexpected pos"): a Ctrl-C or a full disk would come out as that. :meth:`reraise`
    raises the first kept exception itself (KeyboardInterrupt, OSError...)."""

    def __init__(self, out) -> None:
        self.out = out
        self.raised: BaseException | None = None

    def write(self, data) -> int:
        try:
            return self.out.write(data)
        except BaseException as exc:
            if self.raised is None:
                self.raised = exc
            raise

    def flush(self) -> None:
        if self.raised is None:
            self.out.flush()

    def reraise(self, failure: BaseException | None = None) -> None:
        """Raise what ``write`` kept; or, when torch's ``failure`` came from an exception
        raised before ``write`` could keep it (a Ctrl-C handled as Python enters it), the
        KeyboardInterrupt or OSError torch's RuntimeError names as its context."""
        if self.raised is not None:
            raised, self.raised = self.raised, None
            raise raised
        context = failure.__context__ if failure is not None else None
        if isinstance(context, (KeyboardInterrupt, OSError)):
            raise context


def _is_zip(path: str) -> bool:
    """``path`` is a regular file (FormatError otherwise: a FIFO would block torch and
    zipfile, a device would never end) holding a zip archive."""
    with open_input(path) as f:
        try:
            return zipfile.is_zipfile(f)
        except ZIP_ERRORS:      # it has a zip's end record, which zipfile then refuses
            return True


def _check_crcs(path: str, only: set[int] | None = None, array: str | None = None) -> None:
    """FormatError (``crc32``) for a record whose bytes do not match the zip's CRC-32: every
    record, or those whose local header starts at an offset in ``only`` (the storage of
    ``array``)."""
    if not _is_zip(path):
        return
    try:
        with open_zip(path) as archive:
            if only is None:
                bad = archive.testzip()
            else:
                bad = next((info.filename for info in archive.infolist()
                            if info.header_offset in only and not _intact(archive, info)), None)
    except FormatError:
        raise
    except ZIP_ERRORS as exc:    # zipfile's own kinds (an unsupported version, say)
        raise damaged_zip(path, exc) from exc
    if bad is not None:
        raise FormatError(f"a record does not match its CRC-32 ({bad[:100]})", path=path,
                          array=array, check="crc32")


def _intact(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> bool:
    """The record's bytes match its CRC-32 (read as ``testzip`` reads every record)."""
    try:
        with archive.open(info) as record:
            while record.read(1 << 20):
                pass
    except zipfile.BadZipFile:
        return False
    return True


FORMAT = Pt()
