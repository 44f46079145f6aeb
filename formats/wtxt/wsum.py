"""WSUM 1: the one-line file that finalizes a streaming (root_pending) WTXT snapshot."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import pybase64

from ..errors import FormatError, LimitError, SignatureError
from ..iosafe import open_input
from ._grammar import Root

WSUM_RE = re.compile(
    rb"WSUM 1 sha256_all=([0-9a-f]{64}) merkle_prev=([0-9a-f]{64}) merkle_this=([0-9a-f]{64})"
    rb" sign=([A-Za-z0-9+/]*={0,2})\n")
MAX_WSUM = 1024


@dataclass(frozen=True)
class Wsum:
    sha256_all: str
    merkle_prev: str
    merkle_this: str
    signature: bytes | None
    signed: bytes

    def root(self) -> Root:
        return Root(self.sha256_all, self.merkle_prev, self.merkle_this, "")


def wsum_path(path: str | os.PathLike) -> Path:
    return Path(os.fspath(path) + ".wsum")


def parse_wsum(data: bytes, path: str = "<wsum>") -> Wsum:
    if len(data) > MAX_WSUM:
        raise LimitError(path=path, line=1, expected=f"a WSUM of at most {MAX_WSUM} bytes",
                         got=len(data))
    m = WSUM_RE.fullmatch(data)
    if not m:
        raise FormatError(path=path, line=1, check="wsum",
                          expected="WSUM 1 sha256_all= merkle_prev= merkle_this= sign=<base64> LF",
                          got=data[:100].decode("ascii", "backslashreplace"))
    sig_text = m.group(4)
    signature = None
    if sig_text:
        try:
            signature = pybase64.b64decode(sig_text, validate=True)
        except ValueError:
            signature = None
        if signature is None or len(signature) != 64 or pybase64.b64encode(signature) != sig_text:
            raise SignatureError(path=path, line=1, expected="sign=<canonical base64 of 64 bytes>",
                                 got=sig_text.decode())
    signed = data[:data.index(b" sign=")]
    return Wsum(*(g.decode() for g in m.groups()[:3]), signature, signed)


def read_wsum(path: str | os.PathLike) -> Wsum:
    p = Path(path)
    try:
        with open_input(p) as f:
            data = f.read(MAX_WSUM + 1)
    except FormatError as exc:
        raise FormatError(path=str(p), check="wsum", expected="a readable WSUM file",
                          got=exc.message) from None
    except OSError as exc:
        raise FormatError(path=str(p), check="wsum", expected="a readable WSUM file",
                          got=exc.strerror) from exc
    return parse_wsum(data, str(p))


def check_wsum_signature(wsum: Wsum, trusted: dict, require: bool, notes: list[str],
                         path: str) -> None:
    """With trusted keys the WSUM must be signed by one of them (it carries no keyid)."""
    from cryptography.exceptions import InvalidSignature

    if wsum.signature is None:
        if trusted or require:
            raise SignatureError(path=path, line=1, expected="a WSUM signature",
                                 got="sign= is empty")
        notes.append("WSUM unsigned")
        return
    if not trusted:
        if require:
            raise SignatureError(path=path, line=1, expected="trusted keys to check the WSUM",
                                 got="no trusted keys given")
        notes.append("WSUM signature not checked (no trusted key given)")
        return
    for key in trusted.values():
        try:
            key.verify(wsum.signature, wsum.signed)
            return
        except InvalidSignature:
            continue
    raise SignatureError(path=path, line=1, expected="a WSUM signature by a trusted key",
                         got="signature does not verify with any trusted key")
