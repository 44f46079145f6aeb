"""age encryption with ASCII armor, streaming in bounded memory, interoperable with the age CLI.

pyrage does the cryptography on the *binary* age stream; this module does the armor itself
(PEM type ``AGE ENCRYPTED FILE``, base64 in lines of exactly 64 columns, the last one up to 64,
strict canonical base64) because pyrage's own armoring measured at about half the speed
(256 MiB, best of 3, 2 busy cores: 232 vs 441 MB/s encrypt, 246 vs 414 MB/s decrypt).

Example::

    encrypt_file("state.wtxt", "state.wtxt.age", ["age1..."])
    decrypt_file("state.wtxt.age", "state.wtxt", "age.key")

Layers, each usable alone: :class:`ArmorEncoder` / :class:`ArmorDecoder` are sans-IO (bytes in,
bytes out, typed errors naming the line); ``encrypt_io`` / ``decrypt_io`` stream file objects;
``encrypt_file`` / ``decrypt_file`` add ``-`` for stdin/stdout and atomic output files.

Passphrase mode (``passphrase=``) holds the whole input in memory, because pyrage offers no
streaming passphrase API; it is bounded by ``max_passphrase_bytes`` and raises LimitError past it.

Decryption reads the age header ahead and refuses, before pyrage sees it, a header over
``MAX_HEADER_BYTES`` (64 KiB) and an scrypt work factor over ``max_work_factor`` (default
``MAX_WORK_FACTOR``, 20: 1 GiB and seconds of scrypt), as LimitError naming the offset.
"""

from __future__ import annotations

from ._codec import (
    BEGIN, BLOCK_BYTES, BYTES_PER_LINE, COLUMNS, END, LINES_PER_BLOCK, MAX_WHITESPACE, TEXT_BLOCK,
    ArmorDecoder, ArmorEncoder, is_armored,
)
from ._header import MAX_HEADER_BYTES, MAX_WORK_FACTOR
from ._keys import load_identities, load_recipients, parse_recipient
from ._stream import (
    MAX_PASSPHRASE_BYTES, Progress, decrypt_file, decrypt_io, encrypt_file, encrypt_io,
)

__all__ = [
    "BEGIN", "END", "COLUMNS", "BYTES_PER_LINE", "LINES_PER_BLOCK", "BLOCK_BYTES", "TEXT_BLOCK",
    "MAX_WHITESPACE", "MAX_PASSPHRASE_BYTES", "MAX_HEADER_BYTES", "MAX_WORK_FACTOR", "Progress",
    "ArmorEncoder", "ArmorDecoder", "is_armored",
    "parse_recipient", "load_recipients", "load_identities",
    "encrypt_io", "decrypt_io", "encrypt_file", "decrypt_file",
]
