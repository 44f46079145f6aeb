"""Reading WTXT: ``load`` (all arrays, fully checked), ``open_lazy`` (one array at a time),
``read_header`` (the first lines only, for ledgers and hooks)."""

from __future__ import annotations

import hashlib
import hmac as _hmac
import os
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

from .._alloc import decode_buffer
from ..errors import ChecksumError, FormatError, TruncatedError
from ..iosafe import open_input
from ..keys import coerce_hmac_key, coerce_trusted
from ..dtypes import DTYPE_BOUND_KEY
from ..model import ArrayMapping, Snapshot
from ._grammar import MAX_LINE
from ._parse import (
    ArrayInfo, Checks, Header, parse_stream, read_header as _read_header,
    read_sign, verify_array_mac,
)
from ._plan import body_len
from ._reader import LineReader
from .index import open_index
from .logical import check_audit_binding


@dataclass(frozen=True)
class HeaderInfo:
    """The header of a WTXT file as plain values."""

    schema: str
    gen: int
    gen_text: str
    ts: str
    build: str
    host: str
    cuda: str
    caps: tuple[str, ...]
    root_pending: bool
    sha256_all: str | None
    merkle_prev: str | None
    merkle_this: str | None
    fastxor: str | None
    keyid: str | None


def _open(path):
    return open_input(path)


def read_header(source: str | os.PathLike | BinaryIO) -> HeaderInfo:
    """Parse only the header lines of a file or an open binary stream (cheap; no content
    checks)."""
    if hasattr(source, "read"):
        return read_header_from(source)
    with _open(source) as f:
        return read_header_from(f, os.fspath(source))


def read_header_from(stream: BinaryIO, name: str = "<stream>") -> HeaderInfo:
    """``read_header`` for an open binary stream (a blob piped from git, for example); reads
    the header lines and at most 1 MiB beyond them. ``name`` locates errors.

    Example::

        with open("state.wtxt", "rb") as f:
            read_header_from(f).gen
        # -> 12
    """
    reader = LineReader(stream, max_line=MAX_LINE)
    try:
        header = _read_header(reader)
        read_sign(reader, header)
    except FormatError as exc:
        raise exc.located(name)
    return header_info(header)


def header_info(header: Header) -> HeaderInfo:
    m, r = header.meta, header.root
    return HeaderInfo(m.schema, int(m.gen), m.gen, m.ts, m.build, m.host, m.cuda,
                      tuple(header.caps), r is None, r.sha256_all if r else None,
                      r.merkle_prev if r else None, r.merkle_this if r else None,
                      r.fastxor if r else None, header.keyid)


def _array_sink(arrays: dict, size_left):
    def sink(info: ArrayInfo) -> memoryview:
        arr = info.line
        if size_left is not None and body_len(arr.nbytes) > size_left():
            raise TruncatedError(line=info.line_no, array=arr.name,
                                 expected=f"text for {arr.nbytes} bytes", got="a shorter file")
        out = decode_buffer(arr.nbytes)
        arrays[arr.name] = (out, arr)
        return memoryview(out)
    return sink


def load(path: str | os.PathLike, *, hmac_key=None, trusted_keys=None, wsum=None,
         require_signature: bool = False, require_hmac: bool = False,
         threads: int = 2, digests: bool = True) -> Snapshot:
    """Read every array under its stored name, checking everything ``verify`` checks (keys
    optional); ``meta`` holds the header values and the audit line. The format contract
    (``snapops.formats.wtxt.load``) maps names and dtypes back from the audit records.
    ``digests=False`` (the contract's ``load(verify=False)``): the SHA-256s and HMACs inside
    the file are not computed, the grammar, base64 and CRC32C checks still run; for
    a file whose own digest was checked against a sealed MANIFEST.

    Example::

        snap = load("state.wtxt", hmac_key="keys/hmac.key", require_hmac=True)
    """
    from .verify import hmac_requirement
    from .wsum import wsum_path

    name = os.fspath(path)
    checks = Checks(coerce_hmac_key(hmac_key), coerce_trusted(trusted_keys),
                    wsum_explicit=os.fspath(wsum) if wsum is not None else None,
                    wsum_default=str(wsum_path(name)), digests=digests)
    arrays: dict = {}
    with _open(path) as f:
        size = os.fstat(f.fileno()).st_size
        try:
            result = parse_stream(f, checks, sink=_array_sink(arrays, lambda: size),
                                  require_signature=require_signature, threads=threads)
            unmet = hmac_requirement(result, checks, require_hmac)
            if unmet is not None:
                raise unmet
        except FormatError as exc:
            raise exc.located(name)
    out = {key: buf.view(arr.np_dtype).reshape(arr.shape) for key, (buf, arr) in arrays.items()}
    meta = header_info(result.header).__dict__ | {"audit": result.audit, "format": "wtxt"}
    if result.records_bound:
        meta[DTYPE_BOUND_KEY] = True
    if result.root is not None:
        meta.update(sha256_all=result.root.sha256_all, merkle_prev=result.root.merkle_prev,
                    merkle_this=result.root.merkle_this)
    return Snapshot(out, meta)


class LazyWtxt(ArrayMapping):
    """Index of a WTXT file; ``lazy[name]`` decodes one array (chunk and array hashes checked,
    HMAC too with a key). The root hash needs every array: use ``verify`` for that.

    Example::

        with open_lazy("state.wtxt") as lazy:
            emb = lazy["emb"]
    """

    def __init__(self, path: str | os.PathLike, *, hmac_key=None) -> None:
        self.path = os.fspath(path)
        self.hmac_key = coerce_hmac_key(hmac_key)
        self.index = open_index(path)
        self.header = self.index.header
        self.infos: dict[str, ArrayInfo] = {a.name: a.info for a in self.index.arrays}
        self.size = self.index.size
        audit = self.index.audit
        self.audit = audit[len(b"audit "):].decode("ascii") if audit else None
        try:   # a lazy reader checks no signature, but a changed audit line is refused
            check_audit_binding(self.header.caps, self.audit, signature_verified=False)
        except FormatError as exc:
            self.index.close()
            raise exc.located(self.path) from None

    def _info(self, name: str) -> ArrayInfo:
        if self.index.buffer is None:
            raise FormatError("file is closed", path=self.path)
        if name not in self.infos:
            raise FormatError("no such array", path=self.path, array=name,
                              expected=f"one of {len(self.infos)} arrays", got=name)
        return self.infos[name]

    def spec(self, name: str) -> tuple[np.dtype, tuple[int, ...]]:
        line = self._info(name).line
        return line.np_dtype, tuple(line.shape)

    @property
    def names(self) -> list[str]:
        return list(self.infos)

    def array(self, name: str) -> np.ndarray:
        info = self._info(name)
        arr = info.line
        out = self.index.decode(name, out=decode_buffer(arr.nbytes))
        try:
            digest = hashlib.sha256(out).hexdigest()
            if digest != arr.sha256:
                raise ChecksumError(line=info.line_no, array=name, check="array_sha256",
                                    expected=f"sha256={arr.sha256}", got=digest)
            mac = None
            if self.hmac_key and not arr.unauthenticated:
                mac = _hmac.new(self.hmac_key, bytes.fromhex(arr.salt), "sha256")
                mac.update(out)
            verify_array_mac(info, Checks(self.hmac_key), self.header.meta.gen,
                             mac.hexdigest() if mac else None, [])
        except FormatError as exc:
            raise exc.located(self.path)
        return out.view(arr.np_dtype).reshape(arr.shape)

    def close(self) -> None:
        self.index.close()


def open_lazy(path: str | os.PathLike, **options) -> LazyWtxt:
    return LazyWtxt(path, **options)
