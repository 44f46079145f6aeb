"""Regenerate the WTXT test vectors with the independent reference implementation.

    python -m tests.reference.make_vectors OUTDIR [--inputs DIR]

Reads the inputs (``g1.npz``, ``g2.npz`` and the test keys) from DIR (default: the committed
``tests/vectors/wtxt``), copies them into OUTDIR and writes every derived vector beside them with
``wtxt_ref`` only (no snapops code): ``g1-plain.wtxt``, ``g1-sealed.wtxt``, ``g2-sealed.wtxt``,
``g1-to-g2.wtxtdelta``, ``g2-stream.wtxt`` and ``g2-stream.wtxt.wsum``. OUTDIR then holds a
complete vector set; ``tests/reference/test_reference_vectors.py`` checks that it equals the
committed one byte for byte. How each file is made: ``tests/vectors/wtxt/README.md``.

>>> build_vectors(load_inputs(VECTORS))["g1-plain.wtxt"][:6]
b'WTXT 1'
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import numpy as np

from .wtxt_ref import make_delta, parse_wtxt, write_wtxt

VECTORS = Path(__file__).resolve().parents[1] / "vectors" / "wtxt"
INPUTS = ("g1.npz", "g2.npz", "test-hmac.key", "test-signing.key", "test-signing.pub")
COMMON = dict(schema="weights/v1", ts="2026-01-02T03:04:05Z", build="vec1", host="cpu",
              cuda="off")


def load_inputs(folder: Path) -> dict:
    """The two states and the test keys found in ``folder``."""
    def arrays(name: str) -> dict[str, np.ndarray]:
        with np.load(folder / name, allow_pickle=False) as z:
            return {key: z[key] for key in z.files}

    return {"g1": arrays("g1.npz"), "g2": arrays("g2.npz"),
            "hmac": bytes.fromhex((folder / "test-hmac.key").read_text("ascii").strip()),
            "sign": (folder / "test-signing.key").read_bytes(),
            "pub": (folder / "test-signing.pub").read_bytes()}


def sealed(inputs: dict, gen: int, **extra) -> bytes:
    """g<gen> row-blocked, with the HMAC key, the signing key and an audit note."""
    return write_wtxt(inputs[f"g{gen}"], gen=gen, row_blocking=True, hmac_key=inputs["hmac"],
                      sign_key_pem=inputs["sign"], audit=f'note="vector g{gen}"', **COMMON,
                      **extra)


def build_vectors(inputs: dict) -> dict[str, bytes]:
    """Every derived vector, by file name."""
    g1_sealed = sealed(inputs, 1)
    g1_merkle = parse_wtxt(g1_sealed)["root"]["merkle_this"]
    g2_sealed = sealed(inputs, 2, merkle_prev=g1_merkle)
    stream, wsum = write_wtxt(inputs["g2"], gen=2, streaming=True, sign_key_pem=inputs["sign"],
                              rows_per_chunk=4, merkle_prev=g1_merkle, **COMMON)
    return {"g1-plain.wtxt": write_wtxt(inputs["g1"], gen=1, **COMMON),
            "g1-sealed.wtxt": g1_sealed,
            "g2-sealed.wtxt": g2_sealed,
            "g1-to-g2.wtxtdelta": make_delta(g1_sealed, g2_sealed),
            "g2-stream.wtxt": stream,
            "g2-stream.wtxt.wsum": wsum}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.reference.make_vectors",
        description="Regenerate the WTXT test vectors with the reference implementation.",
        epilog="example: python -m tests.reference.make_vectors /tmp/vectors && "
               "diff -r -x README.md /tmp/vectors tests/vectors/wtxt")
    parser.add_argument("outdir", type=Path, help="folder to write the vectors into")
    parser.add_argument("--inputs", type=Path, default=VECTORS,
                        help="folder holding g1.npz, g2.npz and the test keys "
                             "(default: tests/vectors/wtxt)")
    args = parser.parse_args(argv)
    try:
        inputs = load_inputs(args.inputs)
        vectors = build_vectors(inputs)
        args.outdir.mkdir(parents=True, exist_ok=True)
        for name in INPUTS:
            if (args.inputs / name).resolve() != (args.outdir / name).resolve():
                shutil.copyfile(args.inputs / name, args.outdir / name)
        for name, data in vectors.items():
            (args.outdir / name).write_bytes(data)
    except (OSError, ValueError) as exc:
        print(f"make_vectors: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {len(INPUTS) + len(vectors)} files to {args.outdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
