"""Render a GenerationReview: Markdown (a pull-request comment), plain text, JSON.

Every report has the same order: the Anomalies section first, then the summary table (one row
per tensor, from the two MANIFESTs' statistics, sorted by relative norm change), then, when the
weights were read, the block-level detail. The summary table is rendered from MANIFEST data
alone, so a statistics-only report and a report with the weights show the same table.
"""

from __future__ import annotations

import json
import math

from snapops.formats.errors import printable

from ._render import (
    MD_DETAIL_ARRAYS, MD_LIMIT, _array_key, _assemble, _md_blocks, fmt_cos, fmt_num, fmt_shape,
    md_cell, md_code, summary_line,
)
from .generation import Anomaly, GenerationReview, TensorRow, fmt_ratio

MARK = {"added": "+", "removed": "-", "changed": "~", "unchanged": "=", "same-stats": "~="}
KIND_LABEL = {"nan": "NaN", "inf": "Inf", "norm": "norm ratio", "cosine": "cosine",
              "dtype": "dtype", "shape": "shape", "added": "added", "removed": "removed"}
MD_ANOMALIES = 50            # anomalies listed in the comment; the rest are counted
MD_SUMMARY_ROWS = 60         # tensors in the main table; the rest go to a collapsed table
SUMMARY_HEAD = ["| | tensor | dtype | shape | norm A | norm B | ratio B/A | NaN | Inf |",
                "|:-:|---|---|---|--:|--:|--:|--:|--:|"]


def gen_text(gen: int | None) -> str:
    return "-" if gen is None else str(gen)


def headline(review: GenerationReview) -> str:
    """``13 tensors: 2 changed, 0 added, 0 removed, 11 unchanged; 0 anomalies``: with the
    weights read every tensor is settled by its bytes; from the MANIFESTs alone, tensors
    whose statistics did not change but whose shard did are counted on their own."""
    c = review.counts()
    same = (f", {c['same-stats']} with unchanged statistics (bytes not compared)"
            if c["same-stats"] else "")
    return (f"{len(review.rows)} tensors: {c['changed']} changed, {c['added']} added, "
            f"{c['removed']} removed, {c['unchanged']} unchanged{same}; "
            f"{len(review.anomalies)} anomalies")


def mode_text(review: GenerationReview) -> str:
    if review.mode == "weights":
        return "MANIFEST statistics and the weights (block-level detail below)"
    return "MANIFEST statistics only (no weights read)"


def threshold_text(review: GenerationReview) -> str:
    t = review.thresholds
    text = f"norm ratio beyond {t.ratio:g}x or below {1 / t.ratio:.3g}x"
    if review.mode == "weights":
        text += f", cosine below {t.cosine:g}"
    return text + ", any change in NaN or Inf counts, dtype or shape changes, added/removed"


# --- cells shared by text and Markdown ----------------------------------------------------------

def _pair(before, after, arrow: str) -> str:
    """``before -> after`` when both exist and differ; else the one that exists (an added or
    removed tensor has one side, and its status says which)."""
    if before == after or before is None or after is None:
        one = after if before is None else before
        return "-" if one is None else str(one)
    return f"{before}{arrow}{after}"


def _dtype(row: TensorRow, arrow: str) -> str:
    return _pair(row.a.dtype if row.a else None, row.b.dtype if row.b else None, arrow)


def _shape(row: TensorRow, arrow: str) -> str:
    a = fmt_shape(row.a.shape) if row.a else None
    b = fmt_shape(row.b.shape) if row.b else None
    return _pair(a, b, arrow)


def _count(row: TensorRow, key: str, arrow: str) -> str:
    return _pair(*row.counts(key), arrow)


def _ratio(row: TensorRow) -> str:
    ratio = row.ratio
    return "-" if ratio is None else fmt_ratio(ratio)


# --- Markdown -----------------------------------------------------------------------------------

def summary_table_md(review: GenerationReview) -> list[str]:
    """The summary table's lines (MANIFEST data only): identical in both modes."""
    return SUMMARY_HEAD + [_md_row(r) for r in review.rows]


def _md_row(row: TensorRow) -> str:
    arrow = " &rarr; "
    nan, inf = _count(row, "nan", arrow), _count(row, "inf", arrow)
    return (f"| {md_cell(MARK[row.status])} | {md_code(row.name)} | {_dtype(row, arrow)} | "
            f"{_shape(row, arrow)} | {fmt_num(row.norm_a)} | {fmt_num(row.norm_b)} | "
            f"{_ratio(row)} | {_bold_if(nan, arrow)} | {_bold_if(inf, arrow)} |")


def _bold_if(text: str, arrow: str) -> str:
    return f"**{text}**" if arrow in text else text


def md_text(text: str) -> str:
    """``md_cell`` with the ASCII arrows of the text renderings drawn as arrows."""
    return md_cell(text).replace("-&gt;", "&rarr;")


def _md_anomaly(x: Anomaly) -> str:
    return f"| {KIND_LABEL[x.kind]} | {md_code(x.name)} | {md_text(x.text)} |"


def anomalies_md(review: GenerationReview, heading: str = "####") -> list[str]:
    found = review.anomalies
    out = [f"{heading} Anomalies ({len(found)})", ""]
    if not found:
        return out + ["None: " + md_cell(threshold_text(review)) + ".", ""]
    out += ["| what | tensor | detail |", "|---|---|---|"]
    out += [_md_anomaly(x) for x in found[:MD_ANOMALIES]]
    if len(found) > MD_ANOMALIES:
        out.append(f"| | *{len(found) - MD_ANOMALIES} more* | `snapops diff --format json` "
                   "lists them all |")
    return out + [""]


def render_generation_markdown(review: GenerationReview, *, title: str | None = None,
                               heading: str = "###", limit: int = MD_LIMIT) -> str:
    """A pull-request comment for one generation: anomalies, summary, detail (capped below
    GitHub's comment limit; whole sections only)."""
    head = [f"{heading} {md_text(title or _title(review))}", "",
            f"{md_code(review.a)} &rarr; {md_code(review.b)} &middot; {mode_text(review)}", "",
            f"**{md_cell(headline(review))}**", ""]
    for note in review.notes:
        head += [f"> {md_text(note)}", ""]
    head += anomalies_md(review, heading + "#")
    table = summary_table_md(review)
    first = head + [f"{heading}# Tensors, by relative norm change", ""] + \
        table[:2 + MD_SUMMARY_ROWS]
    sections = []
    if len(review.rows) > MD_SUMMARY_ROWS:
        sections.append(["", f"<details><summary>{len(review.rows) - MD_SUMMARY_ROWS} more "
                         "tensors</summary>", ""] + SUMMARY_HEAD + table[2 + MD_SUMMARY_ROWS:]
                        + ["", "</details>"])
    if review.detail is not None:
        sections.append(_detail_md(review, heading + "#"))
        shown = [d for d in review.detail.arrays if d.changes]
        for item in sorted(shown, key=_array_key)[:MD_DETAIL_ARRAYS]:
            sections.append(_md_blocks(item))
    tail = ["", f"<sub>anomalies: {md_cell(threshold_text(review))}</sub>", ""]
    return _assemble(first, sections, tail, limit)


def _title(review: GenerationReview) -> str:
    return f"snapops review: run {review.run}, gen {gen_text(review.gen_a)} -> " \
           f"gen {gen_text(review.gen_b)}"


def _detail_md(review: GenerationReview, heading: str) -> list[str]:
    changed = sorted((d for d in review.detail.arrays if d.status != "unchanged"),
                     key=_array_key)
    out = ["", f"{heading} Weights, by relative L2 change", "",
           md_cell(summary_line(review.detail)), "",
           "| tensor | changed blocks | changed elements | max \\|&Delta;\\| | rel. L2 "
           "\\|\\|B-A\\|\\|/\\|\\|A\\|\\| | cosine |", "|---|--:|--:|--:|--:|--:|"]
    for d in changed:
        if d.status in ("added", "removed"):
            out.append(f"| {md_code(d.name)} | *{d.status}* | | | | |")
            continue
        out.append(f"| {md_code(d.name)} | {d.blocks_changed} / {d.blocks} | "
                   f"{d.elements_changed} / {d.elements} | {fmt_num(d.max_abs)} | "
                   f"{fmt_num(d.rel_l2)} | {fmt_cos(d.cosine)} |")
    if not changed:
        out.append("| *(no tensor changed)* | | | | | |")
    return out


# --- text ---------------------------------------------------------------------------------------

def render_generation_text(review: GenerationReview) -> str:
    """The terminal report; tensor names come from untrusted MANIFESTs and shards, so control
    characters in them are escaped (``printable``), as in every error message."""
    lines = [printable(_title(review)), f"  {printable(review.a)} -> {printable(review.b)}",
             f"  {mode_text(review)}", f"  {headline(review)}"]
    lines += [f"  note: {printable(n)}" for n in review.notes]
    lines.append(f"anomalies ({len(review.anomalies)}):")
    for x in review.anomalies:
        lines.append(f"  ! {KIND_LABEL[x.kind]:10s} {printable(x.name)}: {printable(x.text)}")
    if not review.anomalies:
        lines.append("  none")
    lines.append("tensors, by relative norm change:")
    lines += summary_table_text(review)
    if review.detail is not None:
        lines.append("weights: " + summary_line(review.detail))
        for d in sorted(review.detail.arrays, key=_array_key):
            if d.status in ("changed",):
                lines.append(f"  ~ {printable(d.name)}  blocks {d.blocks_changed}/{d.blocks}"
                             f"  elements {d.elements_changed}/{d.elements}"
                             f"  max|d|={fmt_num(d.max_abs)} rel_l2={fmt_num(d.rel_l2)}"
                             f" cos={fmt_cos(d.cosine)}")
    return "\n".join(lines) + "\n"


def summary_table_text(review: GenerationReview) -> list[str]:
    out = []
    for row in review.rows:
        out.append(f"  {MARK[row.status]:2s} {printable(row.name)}  {_dtype(row, '->')} "
                   f"[{_shape(row, '->')}]  norm {fmt_num(row.norm_a)} -> {fmt_num(row.norm_b)}"
                   f" (x{_ratio(row)})  nan {_count(row, 'nan', '->')}  inf "
                   f"{_count(row, 'inf', '->')}")
    return out


# --- JSON ---------------------------------------------------------------------------------------

def generation_dict(review: GenerationReview) -> dict:
    return {"run": review.run, "a": review.a, "b": review.b, "gen_a": review.gen_a,
            "gen_b": review.gen_b, "mode": review.mode, "counts": review.counts(),
            "thresholds": {"ratio": review.thresholds.ratio,
                           "cosine": review.thresholds.cosine},
            "notes": review.notes,
            "anomalies": [{"kind": x.kind, "name": x.name, "text": x.text}
                          for x in review.anomalies],
            "tensors": [_row_dict(r, review.settled(r)) for r in review.rows],
            "detail": None if review.detail is None else review.detail.to_dict()}


def _row_dict(row: TensorRow, settled: str) -> dict:
    """``status`` from the MANIFESTs (the table's mark), ``settled`` by the weights when read."""
    def side(record):
        if record is None:
            return None
        s = record.stats
        return {"dtype": record.dtype, "shape": list(record.shape),
                "stats": None if s is None else {k: _num(getattr(s, k)) for k in
                                                 ("norm", "min", "max", "mean", "nan", "inf")}}
    return {"name": row.name, "status": row.status, "settled": settled, "a": side(row.a),
            "b": side(row.b),
            "ratio": _num(row.ratio), "rel_change": _num(row.rel_change)}


def _num(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def render_generation_json(review: GenerationReview) -> str:
    return json.dumps(generation_dict(review), indent=2, allow_nan=False) + "\n"
