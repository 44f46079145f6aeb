"""zstd frames decoded straight into a caller's buffer, or written with a parse of our own.

python-zstandard's decompressors return new bytes, or stream through an internal window
buffer and copy every block out of it. libzstd's one-shot ``ZSTD_decompressDCtx`` writes a
frame straight into the destination (:func:`decode_frames_into`: each of several frames
straight into its place). python-zstandard also ships libzstd compiled for cffi
(``zstandard.backend_cffi``); its ``lib`` is called here, with one decompression context per
thread and the GIL released (cffi releases it around each call). An LFS-store restore of
128 MiB (gen 30: the keyframe and 4 residuals) used 0.72-0.82 CPU-s this way against
0.81-0.89 streaming (medians of 21 and of 9 alternating restores, three runs).
Where that backend cannot be imported, :data:`ONE_SHOT` is False and callers stream instead
(:func:`frame_sizes` and :func:`decode_frames_into` need it).

:class:`FrameWriter` writes one frame through ``ZSTD_compressStream2``, optionally with a
sequence producer in place of zstd's match finders: the residuals of the LFS store are parsed
by one in C (``formats/_kernels.c``: literals, and runs of zeros as matches), which decodes
twice as fast as zstd's own parse of their carry planes, in fewer bytes
(``formats/generation/residual.py``). ``literals=False`` stores a frame's literals raw
(no Huffman coding), for bytes where the coding saves little and decodes slowly.

>>> import zstandard
>>> out = bytearray(10)
>>> blob = zstandard.ZstdCompressor().compress(b"hello") + zstandard.ZstdCompressor().compress(
...     b"world")
>>> frame_sizes(blob)
[(14, 5), (14, 5)]
>>> decode_frames_into(blob, out), bytes(out)
(10, b'helloworld')
"""

from __future__ import annotations

import threading
from typing import BinaryIO

import zstandard

try:
    from zstandard.backend_cffi import ffi, lib
except ImportError:          # no cffi: callers stream
    ffi = lib = None
ONE_SHOT = lib is not None   # frame_sizes and decode_frames_into can run here

__all__ = ["ONE_SHOT", "FrameError", "FrameWriter", "decode_frames_into", "frame_sizes"]

_local = threading.local()
MAX_FRAMES = 16         # frames walked in one buffer at most (a hostile one is bounded)
# what a sequence producer needs of libzstd (1.5.5 and later, through the cffi backend)
_PRODUCER_API = ("ZSTD_registerSequenceProducer", "ZSTD_c_validateSequences",
                 "ZSTD_c_enableSeqProducerFallback")


class FrameError(ValueError):
    """The input is not valid zstd frames, each declaring its content size, that fit the
    output (libzstd's reason, or ours)."""


def frame_sizes(src, max_frames: int = MAX_FRAMES) -> list[tuple[int, int]]:
    """The frames of ``src`` (one or more zstd frames back to back, nothing after the last),
    each as (compressed size, declared content size), walked through their block headers
    without decoding anything. FrameError when a frame is not valid, declares no content
    size, or there are more than ``max_frames``. Needs the cffi backend (``lib``)."""
    source = ffi.from_buffer(src)
    frames: list[tuple[int, int]] = []
    at = 0
    try:
        while at < len(source) or not frames:
            if len(frames) == max_frames:
                raise FrameError(f"more than {max_frames} frames")
            size = lib.ZSTD_findFrameCompressedSize(source + at, len(source) - at)
            if lib.ZSTD_isError(size):
                raise FrameError(_reason(size))
            declared = lib.ZSTD_getFrameContentSize(source + at, size)
            if declared >= lib.ZSTD_CONTENTSIZE_ERROR:      # unknown (-1) or error (-2)
                raise FrameError(f"the frame at byte {at} declares no content size")
            frames.append((size, declared))
            at += size
    finally:
        ffi.release(source)
    return frames


def decode_frames_into(src, out, frames: list[tuple[int, int]] | None = None) -> int:
    """Decode ``src`` (zstd frames back to back, as :func:`frame_sizes` walks them, or
    ``frames`` when the caller has walked them already) into ``out`` (a writable buffer),
    each frame straight into its place; the number of bytes written. libzstd never writes
    beyond ``out``: frames that decode to more fail. FrameError when ``src`` is not such
    frames, or they do not fit. Needs the cffi backend (:data:`ONE_SHOT`)."""
    frames = frame_sizes(src) if frames is None else frames
    source = ffi.from_buffer(src)
    try:
        target = ffi.from_buffer(out, require_writable=True)
        try:
            written = at = 0
            for size, declared in frames:
                room = len(target) - written
                if at + size > len(source):
                    raise FrameError(f"frames run past the {len(source)} bytes of the input")
                if declared > room:
                    raise FrameError(f"frames decode to more than the {len(target)} bytes "
                                     "of the output")
                done = lib.ZSTD_decompressDCtx(_context(), target + written, room,
                                               source + at, size)
                if lib.ZSTD_isError(done):
                    raise FrameError(_reason(done))
                written += done
                at += size
        finally:
            ffi.release(target)       # the caller's buffer is free again (a map may close)
    finally:
        ffi.release(source)
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
    input gives the same frame. ``literals=False``: literals stored raw, not Huffman-coded
    (through the cffi backend only). A context manager; leaving it without an error ends the
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
                 producer: int | None = None, literals: bool = True) -> None:
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
        if not literals:
            _check(lib.ZSTD_CCtx_setParameter(cctx, lib.ZSTD_c_literalCompressionMode,
                                              lib.ZSTD_ps_disable))
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
