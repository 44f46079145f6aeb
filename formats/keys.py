"""Key files: Ed25519 signing keys (PKCS#8 PEM), HMAC keys (64 hex + LF), age identities.

``snapops keys generate DIR`` writes one of each with owner-only permissions for secrets.
Secret key material is never printed or logged; errors name the file, not its content.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from cryptography.exceptions import InternalError, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .atomic import atomic_write_bytes
from .errors import FormatError, KeyMaterialError, looks_like_key_material
from .iosafe import open_input, user_path

_HMAC_HEX = re.compile(rb"[0-9a-f]{64}\n?")
MAX_KEY_FILE = 64 * 1024


def read_key_file(path: str | os.PathLike, what: str) -> bytes:
    """The bytes of a key file, refused (KeyMaterialError naming ``what``) above MAX_KEY_FILE.
    A missing path that looks like the key itself (``--hmac-key "$(cat hmac.key)"``, a
    setting holding the key) is refused without repeating it.

    >>> read_key_file("/nonexistent/hmac.key", "HMAC key")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    snapops.formats.errors.KeyMaterialError: /nonexistent/hmac.key: HMAC key: cannot read: No ...
    >>> read_key_file("0" * 64, "HMAC key")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    snapops.formats.errors.KeyMaterialError: HMAC key: looks like key material, not a path ...
    """
    if _key_given_as_path(path):
        raise KeyMaterialError(f"{what}: looks like key material, not a path (not shown): "
                               "give the path of the key file")
    p = Path(path)
    try:
        with open_input(p) as f:     # a regular file: a FIFO would block, /dev/zero not end
            data = f.read(MAX_KEY_FILE + 1)
    except FormatError as exc:
        raise KeyMaterialError(f"{p}: {what}: {exc.message}") from None
    except OSError as exc:
        raise KeyMaterialError(f"{p}: {what}: cannot read: {exc.strerror}") from exc
    if len(data) > MAX_KEY_FILE:
        raise KeyMaterialError(f"{p}: {what} file is larger than {MAX_KEY_FILE} bytes")
    return data


def _key_given_as_path(path) -> bool:
    """True for a path that names no file and looks like key material (a long odd path can
    look so too: an existing one is always a path)."""
    if not isinstance(path, (str, os.PathLike)):
        return False
    text = os.fsdecode(path)
    return looks_like_key_material(text) and not os.path.lexists(text)


def load_hmac_key(path: str | os.PathLike) -> bytes:
    """Read a 32-byte HMAC key stored as 64 lowercase hex digits and an optional LF."""
    data = read_key_file(path, "HMAC key")
    if not _HMAC_HEX.fullmatch(data):
        raise KeyMaterialError(f"{path}: expected 64 lowercase hex digits and LF (an HMAC key)")
    return bytes.fromhex(data[:64].decode("ascii"))


def load_signing_key(path: str | os.PathLike) -> Ed25519PrivateKey:
    """Read an Ed25519 private key (PKCS#8 PEM, unencrypted)."""
    data = read_key_file(path, "signing key")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm, InternalError) as exc:
        # InternalError: OpenSSL fails to set up a key whose length does not fit its
        # algorithm (an X448 OID over 32 bytes), and cryptography does not map that
        raise KeyMaterialError(f"{path}: not an unencrypted PKCS#8 PEM private key") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyMaterialError(f"{path}: expected an Ed25519 private key, got {type(key).__name__}")
    return key


def load_public_key(path: str | os.PathLike) -> Ed25519PublicKey:
    """Read an Ed25519 public key (SubjectPublicKeyInfo PEM)."""
    data = read_key_file(path, "public key")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError, UnsupportedAlgorithm, InternalError) as exc:
        raise KeyMaterialError(f"{path}: not a PEM public key") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise KeyMaterialError(f"{path}: expected an Ed25519 public key, got {type(key).__name__}")
    return key


def raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def keyid(key: Ed25519PublicKey | Ed25519PrivateKey) -> str:
    """First 8 bytes of SHA-256 over the 32-byte raw public key, as 16 hex digits."""
    if isinstance(key, Ed25519PrivateKey):
        key = key.public_key()
    return hashlib.sha256(raw_public(key)).hexdigest()[:16]


def load_trusted_keys(sources: list[str | os.PathLike]) -> dict[str, Ed25519PublicKey]:
    """Public keys from files and folders (every ``*.pub`` in a folder), indexed by keyid."""
    keys: dict[str, Ed25519PublicKey] = {}
    for source in sources:
        p = Path(source)
        if p.is_dir():
            # A key folder may also hold age.pub or ssh keys: only PEM files are signing keys.
            files = [f for f in sorted(p.glob("*.pub"))
                     if read_key_file(f, "public key").startswith(b"-----BEGIN PUBLIC KEY-----")]
            if not files:
                raise KeyMaterialError(f"{p}: folder holds no PEM *.pub signing keys")
        else:
            files = [p]
        for file in files:
            key = load_public_key(file)
            keys[keyid(key)] = key
    return keys


def generate_keys(folder: str | os.PathLike, *, overwrite: bool = False) -> dict[str, Path]:
    """Write signing.key/.pub, hmac.key, age.key/.pub into ``folder``; secrets get mode 0600."""
    import pyrage

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    names = ["signing.key", "signing.pub", "hmac.key", "age.key", "age.pub"]
    existing = [n for n in names if (out / n).exists()]
    if existing and not overwrite:
        raise KeyMaterialError(f"{out}: refusing to overwrite existing {', '.join(existing)}")
    signing = Ed25519PrivateKey.generate()
    identity = pyrage.x25519.Identity.generate()
    files = {
        "signing.key": (signing.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()), 0o600),
        "signing.pub": (signing.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo), 0o644),
        "hmac.key": (os.urandom(32).hex().encode("ascii") + b"\n", 0o600),
        "age.key": (str(identity).encode("ascii") + b"\n", 0o600),
        "age.pub": (str(identity.to_public()).encode("ascii") + b"\n", 0o644),
    }
    written = {}
    for name, (data, mode) in files.items():
        atomic_write_bytes(out / name, data, mode=mode)
        os.chmod(out / name, mode)
        written[name] = out / name
    return written


def coerce_hmac_key(value) -> bytes | None:
    """Accept raw key bytes or a path to a key file."""
    if value is None or isinstance(value, bytes):
        return value
    return load_hmac_key(value)


def coerce_signing_key(value) -> Ed25519PrivateKey | None:
    if value is None or isinstance(value, Ed25519PrivateKey):
        return value
    return load_signing_key(value)


def coerce_trusted(value) -> dict[str, Ed25519PublicKey]:
    """Accept None, a keyid->key dict, one key, or an iterable of keys, such dicts and paths
    (files or folders of .pub)."""
    if not value:
        return {}
    if isinstance(value, dict):
        return value
    if isinstance(value, Ed25519PublicKey):
        return {keyid(value): value}
    if isinstance(value, (str, os.PathLike)):
        value = [value]
    keys: dict[str, Ed25519PublicKey] = {}
    paths = []
    for item in value:
        if isinstance(item, Ed25519PublicKey):
            keys[keyid(item)] = item
        elif isinstance(item, dict):  # already loaded (keyid -> key)
            keys.update(item)
        else:
            paths.append(user_path(item, "trusted key path"))
    keys.update(load_trusted_keys(paths))
    return keys
