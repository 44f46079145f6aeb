"""One zstd frame decoded straight into a caller's buffer.

python-zstandard's decompressors return new bytes, or stream through an internal window
buffer and copy every block out of it. libzstd's one-shot ``ZSTD_decompressDCtx`` writes a
frame straight into the destination. python-zstandard also ships libzstd compiled for cffi
(``zstandard.backend_cffi``); its ``lib`` is called here, with one decompression context per
thread and the GIL released (cffi releases it around each call). An LFS-store restore of
128 MiB (gen 30: the keyframe and 4 residuals) used 0.72-0.82 CPU-s this way against
0.81-0.89 streaming (medians of 21 and of 9 alternating restores, three runs).
Where that backend cannot be imported, :func:`decode_frame_into` returns None and the caller
streams as before.

>>> import zstandard
>>> out = bytearray(5)
>>> decode_frame_into(zstandard.ZstdCompressor().compress(b"hello"), out), bytes(out)
(5, b'hello')
"""

from __future__ import annotations

import threading

try:
    from zstandard.backend_cffi import ffi, lib
except ImportError:          # no cffi: callers stream
    ffi = lib = None

__all__ = ["FrameError", "decode_frame_into"]

_local = threading.local()


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


def _context():
    dctx = getattr(_local, "dctx", None)
    if dctx is None:
        made = lib.ZSTD_createDCtx()
        if made == ffi.NULL:
            raise MemoryError("libzstd could not make a decompression context")
        dctx = _local.dctx = ffi.gc(made, lib.ZSTD_freeDCtx)
    return dctx


def _reason(code: int) -> str:
    return ffi.string(lib.ZSTD_getErrorName(code)).decode("ascii", "replace")
