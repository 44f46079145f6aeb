"""Mutations of a seed file: bit flips, byte insertions and deletions, truncation, splices,
interesting integers written over header fields, and (for text formats) numbers (huge, or in
digits of other scripts), lines, non-ASCII bytes (Unicode whitespace too) and deep nesting.
Deterministic: case ``index`` of target ``target`` under run seed ``seed`` is always the same
bytes, so a finding is reproduced from three values.

>>> a = mutate(b"WTXT 1\\nmeta gen=000001\\n", seed=7, target="wtxt", index=3)
>>> a == mutate(b"WTXT 1\\nmeta gen=000001\\n", seed=7, target="wtxt", index=3)
True
"""

from __future__ import annotations

import io
import json
import random
import re
import struct
import zipfile

# values that sit on the edges of the integer types headers use
INTERESTING = (0, 1, 2, 7, 8, 15, 16, 31, 32, 63, 64, 127, 128, 255, 256, 1023, 1024, 4095,
               4096, 65535, 65536, 10**6, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**53,
               2**62, 2**63 - 1, 2**63, 2**64 - 1)
DECIMALS = (b"0", b"-1", b"1", b"999999999999999999999999", b"4294967296", b"1e400", b"nan",
            b"-0", b"00000000000000000000000000000000001", b"18446744073709551616",
            b"1000000,1000000", b"9" * 400,
            b"9" * 5000,                                  # past int()'s 4300 digits
            "\u00b2\u00b2".encode(), "\u0661\u0662".encode(), "\uff11\uff12".encode())
            # digits str.isdigit takes: int() refuses the superscript, reads the others
ODD_BYTES = (b"\x00", b"\xff", b"\xe9", b"\xc3\xa9", b"\n", b"\r\n", b" ", b"=", b",", b"[",
             b"{", b"\"", b"\\", b"%", b"\x80",
             "\u00a0".encode(), "\u2028".encode(), "\u0085".encode())   # str.split() cuts there
NESTINGS = (b"[", b'{"a":', b"{a=", b"- ", b"(")
_DIGITS = re.compile(rb"\d+")


def mutate(data: bytes, *, seed: int, target: str, index: int, text: bool = False,
           json_doc: bool = False) -> bytes:
    """One to three stacked mutations of ``data`` (text-aware ones too when ``text``, and
    ones that keep it JSON but put odd values at odd places when ``json_doc``)."""
    rng = random.Random(f"{seed}:{target}:{index}")
    out = bytearray(data)
    ops = BINARY_OPS + (TEXT_OPS if text else ()) + (JSON_OPS if json_doc else ())
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        rng.choice(ops)(out, rng)
    return bytes(out)


def mutate_member(data: bytes, *, seed: int, target: str, index: int) -> bytes:
    """Mutate one member of the zip ``data`` and zip it again with correct CRCs, so readers
    get past the archive's integrity data to the member's own parser (npy headers, torch's
    pickle); JSON and pickle members get the text mutations too."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        members = [(info, archive.read(info)) for info in archive.infolist()]
    victim = random.Random(f"{seed}:{target}:{index}:member").randrange(len(members))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        for i, (info, body) in enumerate(members):
            if i == victim:
                body = mutate(body, seed=seed, target=target, index=index,
                              text=info.filename.endswith((".json", ".pkl")),
                              json_doc=info.filename.endswith(".json"))
            archive.writestr(info, body)
    return out.getvalue()


def _at(out: bytearray, rng: random.Random, room: int = 1) -> int:
    """An offset, biased towards the start where headers live."""
    limit = max(len(out) - room, 0)
    if limit == 0:
        return 0
    if rng.random() < 0.5:
        return rng.randrange(min(limit, 256))
    return rng.randrange(limit)


def flip_bits(out: bytearray, rng: random.Random) -> None:
    for _ in range(rng.choice((1, 1, 2, 4))):
        if out:
            out[_at(out, rng)] ^= 1 << rng.randrange(8)


def set_byte(out: bytearray, rng: random.Random) -> None:
    if out:
        out[_at(out, rng)] = rng.choice((0, 0xFF, 0x7F, 0x80, rng.randrange(256)))


def insert_bytes(out: bytearray, rng: random.Random) -> None:
    at = _at(out, rng, 0)
    out[at:at] = rng.choice((bytes(rng.randrange(256) for _ in range(rng.randrange(1, 17))),
                             rng.choice(ODD_BYTES)))


def delete_bytes(out: bytearray, rng: random.Random) -> None:
    if out:
        at = _at(out, rng)
        del out[at:at + rng.choice((1, 2, 4, 8, rng.randrange(1, 512)))]


def truncate(out: bytearray, rng: random.Random) -> None:
    del out[rng.randrange(len(out) + 1):]


def splice(out: bytearray, rng: random.Random) -> None:
    """Copy a range of the file over (or into) another place: a duplicated header, a
    repeated record, a chunk moved."""
    if len(out) < 2:
        return
    start = rng.randrange(len(out))
    piece = bytes(out[start:start + rng.randrange(1, 256)])
    at = _at(out, rng)
    if rng.random() < 0.5:
        out[at:at + len(piece)] = piece
    else:
        out[at:at] = piece


def interesting_int(out: bytearray, rng: random.Random) -> None:
    """An edge value written over 1, 2, 4 or 8 bytes, either byte order."""
    width = rng.choice((1, 2, 4, 8))
    value = rng.choice(INTERESTING) % (1 << (8 * width))
    if rng.random() < 0.3:
        value = (1 << (8 * width)) - 1 - value
    packed = value.to_bytes(width, rng.choice(("little", "big")))
    at = _at(out, rng, width)
    if rng.random() < 0.5 and len(out) >= 8:   # aligned, as header fields are
        at -= at % width
    out[at:at + width] = packed


def float_field(out: bytearray, rng: random.Random) -> None:
    at = _at(out, rng, 8)
    out[at:at + 8] = struct.pack("<d", rng.choice((float("nan"), float("inf"), -1.0, 1e308)))


def number_text(out: bytearray, rng: random.Random) -> None:
    """Replace a decimal number in a text header with an edge case."""
    found = list(_DIGITS.finditer(bytes(out[:1 << 16])))
    if found:
        m = rng.choice(found)
        out[m.start():m.end()] = rng.choice(DECIMALS)


def line_edit(out: bytearray, rng: random.Random) -> None:
    """Delete, duplicate or swap whole lines."""
    lines = bytes(out).split(b"\n")
    if len(lines) < 2:
        return
    i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
    choice = rng.randrange(3)
    if choice == 0:
        del lines[i]
    elif choice == 1:
        lines.insert(j, lines[i])
    else:
        lines[i], lines[j] = lines[j], lines[i]
    out[:] = b"\n".join(lines)


def odd_byte_in_line(out: bytearray, rng: random.Random) -> None:
    at = _at(out, rng, 0)
    out[at:at] = rng.choice(ODD_BYTES)


def nesting(out: bytearray, rng: random.Random) -> None:
    """Open a thousand or a hundred thousand brackets at once: recursive parsers (JSON,
    TOML, YAML) stop with RecursionError, not with their own error."""
    at = _at(out, rng, 0)
    out[at:at] = rng.choice(NESTINGS) * rng.choice((1000, 100_000))


def _odd_value(rng: random.Random):
    return rng.choice((None, True, 0, -1, 1.5, 2**64, "", "x" * 5000, "\u0000", [], {}, [[]],
                       {"": None}, [1] * 1000, ["a" * 64], json.loads("[" * 200 + "]" * 200)))


def json_value(out: bytearray, rng: random.Random) -> None:
    """Replace one value (or drop one key) anywhere in a JSON document, which stays valid
    JSON: the reader's checks of types and shapes get the input, not the JSON parser."""
    try:
        doc = json.loads(bytes(out))
    except (ValueError, RecursionError):     # not JSON, or nested deeper than json parses
        return
    nodes, stack = [], [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            nodes += [(node, k) for k in node]
            stack += list(node.values())
        elif isinstance(node, list):
            nodes += [(node, i) for i in range(len(node))]
            stack += node
    if not nodes:
        return
    parent, key = rng.choice(nodes)
    if isinstance(parent, dict) and rng.random() < 0.25:
        del parent[key]
    else:
        parent[key] = _odd_value(rng)
    try:
        out[:] = json.dumps(doc).encode()
    except RecursionError:
        pass


BINARY_OPS = (flip_bits, flip_bits, set_byte, insert_bytes, delete_bytes, truncate, splice,
              interesting_int, interesting_int, float_field)
TEXT_OPS = (number_text, number_text, line_edit, odd_byte_in_line, nesting)
JSON_OPS = (json_value, json_value, json_value, json_value)
