"""Render a DiffReport: plain text (terminal), Markdown (a pull-request comment), JSON.

The Markdown stays inside what GitHub renders reliably: one pipe table, ``<details>`` blocks
with a blank line after ``<summary>`` (so the Markdown inside them renders), pipes escaped in
cells, names in code spans, and a hard cap below GitHub's 65,536-character comment limit.
"""

from __future__ import annotations

import json
import math

from snapops.formats.errors import printable

from ._compare import ArrayDiff, BlockChange, DiffReport

MD_LIMIT = 60000            # GitHub refuses comments over 65,536 characters
MD_BLOCK_ROWS = 50          # changed blocks listed per array (largest change first)
TEXT_BLOCKS = 8             # changed-block ranges shown per array in text output
STATUS_MARK = {"added": "+", "removed": "-", "changed": "~", "unchanged": "="}


def fmt_num(value: float | None, digits: int = 4) -> str:
    if value is None:
        return "-"
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == 0:
        return "0"
    if 1e-3 <= abs(value) < 1e5:
        return f"{value:.{digits}g}"
    return f"{value:.{max(digits - 1, 1)}e}"


def fmt_cos(value: float | None) -> str:
    if value is None:
        return "-"
    if math.isnan(value):
        return "nan"
    if value == 1.0:
        return "1"
    return f"{value:.6f}" if abs(1 - value) >= 1e-6 else "1 - " + fmt_num(1 - value, 2)


def fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def fmt_shape(shape) -> str:
    if shape is None:
        return "-"
    return "x".join(str(d) for d in shape) if shape else "scalar"


def type_text(item: ArrayDiff) -> str:
    a = f"{item.dtype_a} [{fmt_shape(item.shape_a)}]" if item.dtype_a else None
    b = f"{item.dtype_b} [{fmt_shape(item.shape_b)}]" if item.dtype_b else None
    if a and b and a != b:
        return f"{a} -> {b}"
    return a or b or "-"


def block_ranges(item: ArrayDiff, limit: int | None = None) -> list[str]:
    """Changed blocks as merged ranges: rows 8:16, 40:56, or flat 0:8192."""
    ranges: list[list] = []
    for c in item.changes:
        if ranges and ranges[-1][0] == c.kind and ranges[-1][2] == c.start:
            ranges[-1][2] = c.stop
        else:
            ranges.append([c.kind, c.start, c.stop])
    shown = ranges if limit is None else ranges[:limit]
    out = [f"{'rows' if k == 'rows' else 'flat'} {s}:{e}" for k, s, e in shown]
    if limit is not None and len(ranges) > limit:
        out.append(f"... {len(ranges) - limit} more ranges")
    return out


def summary_line(report: DiffReport) -> str:
    c = report.counts()
    total = c["added"] + c["removed"] + c["changed"] + c["unchanged"]
    pct = 100.0 * c["blocks_changed"] / c["blocks"] if c["blocks"] else 0.0
    return (f"{total} arrays: {c['changed']} changed, {c['added']} added, {c['removed']} removed,"
            f" {c['unchanged']} unchanged; {c['blocks_changed']} of {c['blocks']} blocks changed"
            f" ({pct:.1f}%); {c['elements_changed']} of {c['elements']} elements changed"
            f" ({fmt_bytes(c['bytes'])} compared)")


# --- text ---------------------------------------------------------------------------------------

def render_text(report: DiffReport) -> str:
    """The terminal report. Array names, metadata and labels come from untrusted files:
    control characters in them are escaped (``printable``), as in every error message."""
    lines = [f"snapops diff {printable(report.a)} ({report.format_a}) -> "
             f"{printable(report.b)} ({report.format_b})"]
    for key, x, y in report.meta_changes:
        lines.append(f"  meta {printable(key)}: {'-' if x is None else printable(x)} -> "
                     f"{'-' if y is None else printable(y)}")
    for item in report.arrays:
        lines.append(_text_array(item))
        if item.status == "changed" and item.changes:
            lines.append("      changed " + ", ".join(block_ranges(item, TEXT_BLOCKS)))
        for note in item.notes:
            lines.append(f"      note: {printable(note)}")
    lines.append("summary: " + summary_line(report))
    return "\n".join(lines) + "\n"


def _text_array(item: ArrayDiff) -> str:
    head = f"{STATUS_MARK[item.status]} {printable(item.name)}  {type_text(item)}  {item.status}"
    if item.status in ("added", "removed") or item.blocks == 0:
        return head
    head += f"  blocks {item.blocks_changed}/{item.blocks}"
    if item.status == "unchanged":
        return head
    return (f"{head}  elements {item.elements_changed}/{item.elements}"
            f"  max|d|={fmt_num(item.max_abs)} rel_l2={fmt_num(item.rel_l2)}"
            f" cos={fmt_cos(item.cosine)}")


# --- JSON ---------------------------------------------------------------------------------------

def render_json(report: DiffReport) -> str:
    return json.dumps(report.to_dict(), indent=2, allow_nan=False) + "\n"


# --- Markdown -----------------------------------------------------------------------------------

def md_cell(text: str) -> str:
    """Text safe inside a GFM table cell (pipes escaped, no line breaks, no raw HTML, control
    characters escaped as ``printable`` does)."""
    return (printable(text).replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ")
            .replace("\n", " ").replace("<", "&lt;").replace(">", "&gt;"))


def md_code(text: str) -> str:
    """A code span for ``text`` in a table cell (backtick fences longer than any run inside;
    control characters escaped as ``printable`` does)."""
    text = printable(text).replace("\r", " ").replace("\n", " ").replace("|", "\\|")
    run = longest = 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


TABLE_HEAD = ["| | array | dtype | shape | changed blocks | changed elements | max \\|&Delta;\\| "
              "| rel. L2 | cosine |", "|:-:|---|---|---|--:|--:|--:|--:|--:|"]
MD_TABLE_ROWS = 60          # arrays in the main table; the rest go to a collapsed table
MD_DETAIL_ARRAYS = 20       # arrays whose changed blocks are listed (largest change first)


def render_markdown(report: DiffReport, *, title: str | None = None) -> str:
    """A pull-request comment: the headline, one table row per changed/added/removed array,
    then collapsed sections (metadata, changed blocks, unchanged arrays) while they fit."""
    c = report.counts()
    head = [f"### {md_cell(title or 'snapops diff')}", "",
            f"{md_code(report.a)} ({report.format_a}) &rarr; {md_code(report.b)}"
            f" ({report.format_b})", "",
            f"**{c['changed']} changed**, {c['added']} added, {c['removed']} removed, "
            f"{c['unchanged']} unchanged &middot; {c['blocks_changed']} of {c['blocks']} "
            f"row-blocks changed &middot; {c['elements_changed']} of {c['elements']} elements "
            f"changed", ""]
    shown = [i for i in report.arrays if i.status != "unchanged"]
    unchanged = [i for i in report.arrays if i.status == "unchanged"]
    table = TABLE_HEAD + [_md_row(i) for i in shown[:MD_TABLE_ROWS]]
    if not shown:
        table.append("| = | *(no array changed)* | | | | | | | |")
    sections = []
    if len(shown) > MD_TABLE_ROWS:
        sections.append(["", f"<details><summary>{len(shown) - MD_TABLE_ROWS} more changed "
                         "arrays</summary>", ""] + TABLE_HEAD
                        + [_md_row(i) for i in shown[MD_TABLE_ROWS:]] + ["", "</details>"])
    if report.meta_changes:
        meta = ["", f"<details><summary>Metadata changes ({len(report.meta_changes)})"
                "</summary>", "", "| key | before | after |", "|---|---|---|"]
        for key, x, y in report.meta_changes:
            meta.append(f"| {md_code(key)} | {md_code(x) if x is not None else '-'} | "
                        f"{md_code(y) if y is not None else '-'} |")
        sections.append(meta + ["", "</details>"])
    detailed = sorted((i for i in shown if i.changes), key=_array_key)[:MD_DETAIL_ARRAYS]
    for item in sorted(detailed, key=lambda i: report.arrays.index(i)):
        sections.append(_md_blocks(item))
    if unchanged:
        names = ", ".join(md_code(i.name) for i in unchanged)
        sections.append(["", f"<details><summary>Unchanged arrays ({len(unchanged)})</summary>",
                         "", names, "", "</details>"])
    tail = ["", f"<sub>{md_cell(summary_line(report))}</sub>", ""]
    return _assemble(head + table, sections, tail)


def _array_key(item: ArrayDiff):
    rel = item.rel_l2 if item.rel_l2 is not None and not math.isnan(item.rel_l2) else math.inf
    return (-rel, item.name)


def _assemble(first: list[str], sections: list[list[str]], tail: list[str],
              limit: int = MD_LIMIT) -> str:
    """Join what fits below ``limit``: whole sections only, in order; the main table is cut
    row by row if even it is too long."""
    budget = limit - len("\n".join(tail)) - 200
    out = "\n".join(first)
    if len(out) > budget:
        out = out[:out.rfind("\n|", 0, budget)]
    skipped = 0
    for section in sections:
        text = "\n".join(section)
        if len(out) + 1 + len(text) <= budget:
            out += "\n" + text
        else:
            skipped += 1
    if skipped or len("\n".join(first)) > budget:
        out += ("\n\n*(some sections left out to fit a comment; `snapops diff --format json` "
                "has everything)*")
    return out + "\n" + "\n".join(tail)


def _md_row(item: ArrayDiff) -> str:
    mark = {"added": "+", "removed": "&minus;", "changed": "~", "unchanged": "="}[item.status]
    dtype = item.dtype_a or item.dtype_b
    if item.dtype_changed:
        dtype = f"{item.dtype_a} &rarr; {item.dtype_b}"
    shape = fmt_shape(item.shape_a if item.shape_a is not None else item.shape_b)
    if item.shape_changed:
        shape = f"{fmt_shape(item.shape_a)} &rarr; {fmt_shape(item.shape_b)}"
    if item.status in ("added", "removed"):
        return f"| {mark} | {md_code(item.name)} | {dtype} | {shape} | *{item.status}* | | | | |"
    return (f"| {mark} | {md_code(item.name)} | {dtype} | {shape} | {item.blocks_changed} / "
            f"{item.blocks} | {item.elements_changed} / {item.elements} | "
            f"{fmt_num(item.max_abs)} | {fmt_num(item.rel_l2)} | {fmt_cos(item.cosine)} |")


def _md_blocks(item: ArrayDiff) -> list[str]:
    largest = sorted(item.changes, key=_change_key)[:MD_BLOCK_ROWS]
    out = ["", f"<details><summary>{md_cell(item.name)}: {item.blocks_changed} changed "
           f"block{'s' if item.blocks_changed != 1 else ''}"
           + (f" (largest {len(largest)} shown)" if len(largest) < len(item.changes) else "")
           + "</summary>", "",
           "| block | range | changed elements | max \\|&Delta;\\| | rel. change |",
           "|--:|---|--:|--:|--:|"]
    for c in largest:
        where = (f"rows {c.start}:{c.stop}" if c.kind == "rows" else f"flat {c.start}:{c.stop}")
        out.append(f"| {c.index} | {where} | {c.elements} | {fmt_num(c.max_abs)} | "
                   f"{fmt_num(c.rel)} |")
    out += ["", "Changed ranges: " + md_cell(", ".join(block_ranges(item, 40))), "",
            "</details>"]
    return out


def _change_key(c: BlockChange):
    rel = c.rel if c.rel is not None and not math.isnan(c.rel) else -1.0
    return (-rel, c.index)
