"""Sealing a generation: the MANIFEST's last line signs (Ed25519) and authenticates (HMAC-SHA256)
every byte before it.

What the seal covers is the MANIFEST body, which in turn binds every file of the generation by
size and SHA-256, every array by name, logical dtype and shape, and the previous generation's
MANIFEST digest. So one signature check plus the file digests proves the whole generation,
whatever format its shards are in (binary formats carry no signature of their own).

>>> from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
>>> key = Ed25519PrivateKey.generate()
>>> m = seal_manifest(Manifest(Header("r", 1, "2026-01-02T03:04:05Z", "b", "aero")), key, b"k" * 32)
>>> check_seal(m, trusted_keys=key.public_key(), hmac_key=b"k" * 32, require_signature=True)
[]
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import hmac

from cryptography.exceptions import InvalidSignature

from snapops.formats.errors import ChecksumError, FormatError, SignatureError
from snapops.formats.keys import coerce_hmac_key, coerce_signing_key, coerce_trusted, keyid

from .manifest import Header, Manifest, Seal  # noqa: F401  (Header: doctest)


def seal_manifest(manifest: Manifest, sign_key=None, hmac_key=None) -> Manifest:
    """Return ``manifest`` with the signer's keyid in its header and a fresh seal line.

    ``sign_key``: an Ed25519 private key or a PEM file; ``hmac_key``: bytes or a key file.
    Deterministic: Ed25519 signatures and HMACs depend only on the key and the bytes.
    """
    sign_key = coerce_signing_key(sign_key)
    hmac_key = coerce_hmac_key(hmac_key)
    header = dataclasses.replace(manifest.header,
                                 keyid=keyid(sign_key) if sign_key is not None else None)
    sealed = dataclasses.replace(manifest, header=header, seal=Seal())
    body = sealed.body()
    signature = base64.b64encode(sign_key.sign(body)).decode("ascii") if sign_key else None
    mac = hmac.new(hmac_key, body, hashlib.sha256).hexdigest() if hmac_key else None
    sealed.seal = Seal(signature, mac)
    return sealed


def check_seal(manifest: Manifest, *, trusted_keys=None, hmac_key=None,
               require_signature: bool = False, require_hmac: bool = False,
               path: str = "MANIFEST") -> list[str]:
    """Check the seal line; raise SignatureError / ChecksumError, or return notes on what was
    not checked. Given trusted keys, a missing signature or an unknown keyid fails; given an
    HMAC key, a missing or wrong HMAC fails; ``require_*`` fail when the means are missing."""
    trusted = coerce_trusted(trusted_keys)
    hmac_key = coerce_hmac_key(hmac_key)
    body = manifest.body()
    seal, signer = manifest.seal, manifest.header.keyid
    line = len(body.split(b"\n"))  # the seal line's number
    notes: list[str] = []
    if (seal.ed25519 is None) != (signer is None):
        raise SignatureError("keyid and signature must both be present or both absent",
                             path=path, line=line, expected="keyid with a signature",
                             got=f"keyid={signer or '-'}")
    if seal.ed25519 is None:
        if trusted or require_signature:
            raise SignatureError("the MANIFEST is not signed", path=path, line=line,
                                 expected="a signature by a trusted key", got="no signature")
        notes.append("MANIFEST not signed")
    elif not trusted:
        if require_signature:
            raise SignatureError("a signature is required but no trusted keys were given",
                                 path=path, line=line, expected="--trusted-key FILE_OR_DIR",
                                 got="no trusted keys")
        notes.append(f"signature by keyid {signer} not checked (no trusted keys given)")
    else:
        _check_signature(trusted, signer, seal.ed25519, body, path, line)
    if hmac_key is None:
        if require_hmac:
            raise ChecksumError("an HMAC is required but no HMAC key was given", path=path,
                                line=line, check="hmac", expected="--hmac-key FILE",
                                got="no key")
        notes.append("MANIFEST HMAC not checked (no HMAC key given)")
    else:
        want = hmac.new(hmac_key, body, hashlib.sha256).hexdigest()
        if seal.hmac is None or not hmac.compare_digest(want, seal.hmac):
            raise ChecksumError("MANIFEST HMAC does not match", path=path, line=line,
                                check="hmac", expected="the HMAC of the MANIFEST under this key",
                                got=seal.hmac or "no HMAC")
    return notes


def _check_signature(trusted: dict, signer: str, signature: str, body: bytes, path: str,
                     line: int) -> None:
    key = trusted.get(signer)
    if key is None:
        raise SignatureError("the MANIFEST is signed by a key that is not trusted", path=path,
                             line=line, expected=f"one of keyids {', '.join(sorted(trusted))}",
                             got=signer)
    try:
        key.verify(base64.b64decode(signature, validate=True), body)
    except (InvalidSignature, binascii.Error, ValueError):
        raise SignatureError("MANIFEST signature does not verify", path=path, line=line,
                             expected=f"a valid Ed25519 signature by {signer}",
                             got="a bad signature") from None


def seal_error_hint(exc: FormatError) -> str:
    """What to do about a seal failure, for the one-line CLI message."""
    if isinstance(exc, SignatureError):
        return "check --trusted-key (a rotated key must be added to the trusted folder)"
    return "check --hmac-key"
