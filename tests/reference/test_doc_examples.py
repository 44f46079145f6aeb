"""The worked examples of docs/formats/ are what the independent reference implementation
produces (WTXT, WSUM, DELTA v2) or what plain hashlib and the reference CRC-32C derive (ledger,
WAL): the format reference cannot drift from the bytes."""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
import pytest

from .make_vectors import VECTORS, load_inputs
from .wtxt_ref import apply_delta, crc32c, make_delta, parse_wtxt, write_wtxt

DOCS = Path(__file__).resolve().parents[2] / "docs" / "formats"
EXAMPLE = re.compile(r"<!-- example: ([a-z-]+) -->\n```text\n(.*?)```\n", re.S)
OPTIONS = dict(ts="2026-01-02T03:04:05Z", build="doc1", rows_per_chunk=2)


def examples() -> dict[str, bytes]:
    """Every ``<!-- example: NAME -->`` block of the format pages, by name."""
    found: dict[str, bytes] = {}
    for page in sorted(DOCS.glob("*.md")):
        for name, body in EXAMPLE.findall(page.read_text("utf-8")):
            assert name not in found, f"example {name} appears twice"
            found[name] = body.encode("ascii")
    return found


def doc_arrays(gen: int) -> dict[str, np.ndarray]:
    """The arrays of the WTXT example (gen 3) and of the DELTA example's target (gen 4)."""
    w = (np.arange(16, dtype=np.float32) / 4).reshape(4, 4)
    if gen == 4:
        w[3] += 1
    return {"w": w, "step": np.array(7, dtype=np.int64)}


@pytest.fixture(scope="module")
def docs() -> dict[str, bytes]:
    return examples()


@pytest.fixture(scope="module")
def sealed() -> dict[int, bytes]:
    keys = load_inputs(VECTORS)
    seal = dict(hmac_key=keys["hmac"], sign_key_pem=keys["sign"], **OPTIONS)
    gen3 = write_wtxt(doc_arrays(3), gen=3, audit='note="docs example"', **seal)
    gen4 = write_wtxt(doc_arrays(4), gen=4, merkle_prev=parse_wtxt(gen3)["root"]["merkle_this"],
                      **seal)
    return {3: gen3, 4: gen4}


def test_every_example_is_checked(docs):
    assert set(docs) == {"wtxt", "wsum-head", "wsum", "wtxt-delta", "ledger", "wal"}


def test_wtxt_example(docs, sealed):
    assert docs["wtxt"] == sealed[3]


def test_wsum_example(docs):
    keys = load_inputs(VECTORS)
    wtxt, wsum = write_wtxt(doc_arrays(3), gen=3, sign_key_pem=keys["sign"], streaming=True,
                            **OPTIONS)
    assert docs["wsum-head"] == b"".join(wtxt.splitlines(keepends=True)[:5])
    assert docs["wsum"] == wsum


def test_delta_example(docs, sealed):
    assert docs["wtxt-delta"] == make_delta(sealed[3], sealed[4])
    assert apply_delta(sealed[3], docs["wtxt-delta"]) == sealed[4]


def _ledger_line(data: bytes, path: str, prev_chain: str) -> tuple[bytes, str]:
    parsed = parse_wtxt(data)
    meta, root = parsed["meta"], parsed["root"]
    body = (f"gen={meta['gen']} ts={meta['ts']} sha256_all={root['sha256_all']} "
            f"merkle_prev={root['merkle_prev']} merkle_this={root['merkle_this']} path={path} "
            f"format=wtxt keyid={parsed['sign']['keyid']} build={meta['build']}").encode()
    chain = hashlib.sha256(bytes.fromhex(prev_chain) + body).hexdigest()
    return body + b" chain=" + chain.encode() + b"\n", chain


def test_ledger_example(docs, sealed):
    chain, lines = "0" * 64, b""
    for gen in (3, 4):
        line, chain = _ledger_line(sealed[gen], f"snapshots/doc/gen-{gen:06d}.wtxt", chain)
        lines += line
    assert docs["ledger"] == lines


def test_wal_example_crcs(docs):
    lines = docs["wal"].splitlines()
    assert len(lines) == 8
    for line in lines:
        body, crc = line.rsplit(b" crc=", 1)
        assert re.fullmatch(rb"[A-Z]+ gen=(0|[1-9][0-9]*)( [a-z_]+=[A-Za-z0-9._:/+@-]+)+", body)
        assert crc.decode() == f"{crc32c(body):08x}", line
