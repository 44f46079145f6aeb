"""One zstd frame decoded straight into a caller's buffer, or written with a parse of our own.

python-zstandard's decompressors return new bytes, or stream through an internal window
buffer and copy every block out of it. libzstd's one-shot ``ZSTD_decompressDCtx`` writes a
frame straight into the destination. python-zstandard also ships libzstd compiled for cffi
(``zstandard.backend_cffi``); its ``lib`` is called here, with one decompression context per
thread and the GIL released (cffi releases it around each call). An LFS-store restore of
128 MiB (gen 30: the keyframe and 4 residuals) used 0.72-0.82 CPU-s this way against
0.81-0.89 streaming (medians of 21 and of 9 alternating restores, three runs).
Where that backend cannot be imported, :func:`decode_frame_into` returns None and the caller
streams as before.

:class:`FrameWriter` writes one frame through ``ZSTD_compressStream2``, optionally with a
sequence producer in place of zstd's match finders: the residuals of the LFS store are parsed
by one in C (``formats/_kernels.c``: literals, and runs of zeros as matches), which decodes
twice as fast as zstd's own parse of their carry planes, in fewer bytes
(``formats/generation/residual.py``).

>>> import zstandard
>>> out = bytearray(5)
>>> decode_frame_into(zstandard.ZstdCompressor().compress(b"hello"), out), bytes(out)
(5, b'hello')
"""

from __future__ import annotations

import threading
from typing import BinaryIO

import zstandard

try:
    from zstandard.backend_cffi import ffi, lib
except ImportError:          # no cffi: callers stream
    ffi = lib = None

__all__ = ["FrameError", "FrameWriter", "decode_frame_into"]

_local = threading.local()
# what a sequence producer needs of libzstd (1.5.5 and later, through the cffi backend)
_PRODUCER_API = ("ZSTD_registerSequenceProducer", "ZSTD_c_validateSequences",
                 "ZSTD_c_enableSeqProducerFallback")


class FrameError(ValueError):
    """The input is not exactly one valid zstd frame that fits the output (libzstd's
    reason, or "data after the frame")."""


def decode_frame_into(src, out) -> int | None:
    """Decode ``src`` (a buffer holding exactly one zstd frame, nothing after it) into
    ``out`` (a writable buffer); the number of bytes written. libzstd never writes beyond
    ``out``: a frame that decodes to more fails. FrameError when ``src`` is not one valid
    frame that fits; None when the cffi backend is not there."""
    if lib is None:
        return None
    source = ffi.from_buffer(src)
    try:
        size = lib.ZSTD_findFrameCompressedSize(source, len(source))
        if lib.ZSTD_isError(size):
            raise FrameError(_reason(size))
        if size != len(source):
            raise FrameError(f"{len(source) - size} bytes of data after the frame")
        target = ffi.from_buffer(out, require_writable=True)
        try:
            written = lib.ZSTD_decompressDCtx(_context(), target, len(target), source,
                                              len(source))
        finally:
            ffi.release(target)       # the caller's buffer is free again (a map may close)
    finally:
        ffi.release(source)
    if lib.ZSTD_isError(written):
        raise FrameError(_reason(written))
    return written


def _new_context(kind: str):
    """A new libzstd context, ``D`` (decompression) or ``C`` (compression), freed with its
    last reference."""
    made = getattr(lib, f"ZSTD_create{kind}Ctx")()
    if made == ffi.NULL:
        raise MemoryError(f"libzstd could not make a ZSTD_{kind}Ctx")
    return ffi.gc(made, getattr(lib, f"ZSTD_free{kind}Ctx"))


def _context():
    """This thread's decompression context (each call uses it from start to end)."""
    dctx = getattr(_local, "dctx", None)
    if dctx is None:
        dctx = _local.dctx = _new_context("D")
    return dctx


def _reason(code: int) -> str:
    return ffi.string(lib.ZSTD_getErrorName(code)).decode("ascii", "replace")


class FrameWriter:
    """One zstd frame of exactly ``size`` bytes of input (declared in its header), written to
    ``out`` as it is compressed. ``producer``: the address of a C sequence producer
    (``ZSTD_sequenceProducer_F``) that parses every block in place of zstd's match finders,
    on the calling thread (libzstd runs no producer on worker threads); else, or where
    libzstd lacks that API, zstd's own parse at ``level`` on ``threads`` workers (as
    python-zstandard writes it when the cffi backend is missing). Deterministic: the same
    input gives the same frame. A context manager; leaving it without an error ends the
    frame.

    >>> import io
    >>> out = io.BytesIO()
    >>> with FrameWriter(out, 8, threads=2) as frame:
    ...     frame.write(b"noise..."[:4]); frame.write(bytes(4))
    >>> zstandard.ZstdDecompressor().decompress(out.getvalue())
    b'nois\\x00\\x00\\x00\\x00'
    """

    OUT_SIZE = 1 << 20

    def __init__(self, out: BinaryIO, size: int, *, level: int = 1, threads: int = 0,
                 producer: int | None = None) -> None:
        self.out = out
        self._stream = None
        if lib is None:
            self._stream = zstandard.ZstdCompressor(
                level=level, threads=threads, write_content_size=True).stream_writer(
                out, size=size, closefd=False)
            return
        cctx = self._cctx = _new_context("C")     # its own: a frame spans many calls
        _check(lib.ZSTD_CCtx_setParameter(cctx, lib.ZSTD_c_contentSizeFlag, 1))
        _check(lib.ZSTD_CCtx_setParameter(cctx, lib.ZSTD_c_compressionLevel, level))
        if producer is not None and all(hasattr(lib, name) for name in _PRODUCER_API):
            lib.ZSTD_registerSequenceProducer(
                cctx, ffi.NULL, ffi.cast("ZSTD_sequenceProducer_F", producer))
            # libzstd checks every parse (a few sequences per block: cheap); a parse that
            # is not valid, or a producer's error, fails the frame instead of writing it
            _check(lib.ZSTD_CCtx_setParameter(cctx, lib.ZSTD_c_validateSequences, 1))
            _check(lib.ZSTD_CCtx_setParameter(cctx, lib.ZSTD_c_enableSeqProducerFallback, 0))
        else:
            _check(lib.ZSTD_CCtx_setParameter(cctx, lib.ZSTD_c_nbWorkers, threads))
        _check(lib.ZSTD_CCtx_setPledgedSrcSize(cctx, size))
        self._buffer = bytearray(self.OUT_SIZE)
        self._in = ffi.new("ZSTD_inBuffer *")
        self._out = ffi.new("ZSTD_outBuffer *")

    def __enter__(self) -> "FrameWriter":
        return self

    def __exit__(self, kind, *_exc) -> None:
        if kind is None:
            self.close()

    def write(self, data) -> None:
        if self._stream is not None:
            self._stream.write(data)
        elif len(data):
            self._run(data, lib.ZSTD_e_continue)

    def close(self) -> None:
        """End the frame (a size other than the declared one fails here, if not before)."""
        if self._stream is not None:
            self._stream.close()
        else:
            self._run(b"", lib.ZSTD_e_end)

    def _run(self, data, mode) -> None:
        """Feed ``data`` (all of it) with ``mode``; at the end, until libzstd has nothing
        left to write."""
        source = ffi.from_buffer(data)
        target = ffi.from_buffer(self._buffer)
        try:
            self._in.src, self._in.size, self._in.pos = source, len(data), 0
            while True:
                self._out.dst, self._out.size, self._out.pos = target, len(self._buffer), 0
                left = _check(lib.ZSTD_compressStream2(self._cctx, self._out, self._in, mode))
                if self._out.pos:
                    self.out.write(memoryview(self._buffer)[:self._out.pos])
                if self._in.pos == self._in.size and (mode == lib.ZSTD_e_continue or not left):
                    return
        finally:
            ffi.release(source)
            ffi.release(target)


def _check(code: int) -> int:
    if lib.ZSTD_isError(code):
        raise FrameError(_reason(code))
    return code
