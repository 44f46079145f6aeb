"""The review heatmap: one labelled strip per array, one cell per row-block, coloured by the
block's relative change ||B - A|| / ||A|| on a FIXED log scale, the same for every plot:
log10 from -6 (1e-6 or less) to 0 (a change as large as the values, or more), so two reports
can be compared by eye. Unchanged blocks are light grey; blocks holding NaN or Inf values
have their own colour (red, with a legend entry), never the colour of a real change; added and
removed arrays are hatched. Names are shown in full (wrapped, the figure grows to fit).

Arrays have different block counts, so every strip is resampled to a common width: a column
shows the largest change among the blocks it covers (a single changed block never vanishes; a
non-finite block wins over any change). Matplotlib runs with the Agg backend (no display).

>>> scale_cells(np.array([0.0, 1e-9, 1e-3, 50.0, np.inf, np.nan])).tolist()
[nan, -6.0, -3.0, 0.0, 0.0, 1.0]
"""

from __future__ import annotations

import os

import numpy as np

from ._compare import ArrayDiff, DiffReport
from ._render import type_text

MAX_COLUMNS = 512
MAX_ROWS = 60
LOG_MIN, LOG_MAX = -6.0, 0.0       # the fixed colour scale: log10 of the relative change
NONFINITE = LOG_MAX + 1.0          # cell code drawn in NONFINITE_COLOUR
NONFINITE_COLOUR = "#d62728"
UNCHANGED_COLOUR = "#e6e6e6"
NAME_WRAP = 60                     # characters per label line


def scale_cells(rel: np.ndarray) -> np.ndarray:
    """Cell values on the fixed scale: log10(rel) clipped to [LOG_MIN, LOG_MAX]; NaN (drawn
    grey) where nothing changed (rel 0); NONFINITE where rel is NaN (non-finite values). An
    infinite rel (a block of zeros that changed) is a real change: the top of the scale."""
    rel = np.asarray(rel, dtype=np.float64)
    out = np.full(rel.shape, np.nan)
    bad = np.isnan(rel)
    changed = ~bad & (rel > 0)
    with np.errstate(divide="ignore"):
        out[changed] = np.clip(np.log10(rel[changed]), LOG_MIN, LOG_MAX)
    out[bad] = NONFINITE
    return out


def colour_scale():
    """(colormap, norm) of every review plot: viridis over [LOG_MIN, LOG_MAX], grey for
    unchanged cells (NaN), NONFINITE_COLOUR above the top (the NONFINITE code)."""
    import matplotlib
    from matplotlib import colors

    cmap = matplotlib.colormaps["viridis"].with_extremes(bad=UNCHANGED_COLOUR,
                                                         over=NONFINITE_COLOUR)
    return cmap, colors.Normalize(vmin=LOG_MIN, vmax=LOG_MAX)


def strip(item: ArrayDiff, columns: int) -> np.ndarray:
    """The array's per-block relative change resampled to ``columns`` (0 = unchanged, NaN =
    non-finite; each column keeps its largest change, NaN winning)."""
    rel = item.block_rel if item.block_rel is not None else np.zeros(0)
    if item.status in ("added", "removed") or rel.size == 0:
        return np.zeros(columns)
    pick = (np.arange(columns, dtype=np.int64) * rel.size) // columns
    return np.maximum.reduceat(rel, pick) if rel.size >= columns else rel[pick]


def wrap_name(name: str, width: int = NAME_WRAP) -> str:
    """The full name on lines of at most ``width`` characters (breaking after '.', '/', '_'
    where possible; never cutting anything off)."""
    if len(name) <= width:
        return name
    lines, line = [], ""
    for piece in _pieces(name):
        if line and len(line) + len(piece) > width:
            lines.append(line)
            line = ""
        while len(piece) > width:
            lines.append(piece[:width])
            piece = piece[width:]
        line += piece
    return "\n".join(lines + [line] if line else lines)


def _pieces(name: str) -> list[str]:
    out, cur = [], ""
    for ch in name:
        cur += ch
        if ch in "./_":
            out.append(cur)
            cur = ""
    return out + [cur] if cur else out


def pick_rows(report: DiffReport) -> tuple[list[ArrayDiff], int]:
    """Changed, added and removed arrays first, then unchanged ones, at most MAX_ROWS."""
    changed = [i for i in report.arrays if i.status != "unchanged"]
    rest = [i for i in report.arrays if i.status == "unchanged"]
    rows = (changed + rest)[:MAX_ROWS]
    return rows, len(report.arrays) - len(rows)


def plot_report(report: DiffReport, path: str | os.PathLike, *, title: str | None = None,
                dpi: int = 110) -> dict:
    """Write the heatmap PNG of a file diff to ``path``; returns {"arrays": shown, "hidden":
    n, "path": ...}.

    Example::

        plot_report(diff_paths("a.wtxt", "b.wtxt"), "diff.png")["arrays"]
        # -> 3
    """
    rows, hidden = pick_rows(report)
    columns = int(min(MAX_COLUMNS, max([i.blocks for i in rows] + [1])))
    strips = [strip(i, columns) for i in rows]
    labels = [_row_label(i) for i in rows]
    hatched = [f"{i.status} ({type_text(i)})" if i.status in ("added", "removed") else None
               for i in rows]
    c = report.counts()
    head = title or f"snapops diff: {report.a} -> {report.b}"
    subtitle = (f"{c['blocks_changed']} of {c['blocks']} row-blocks changed in {c['changed']} "
                f"array{'s' if c['changed'] != 1 else ''} ({c['added']} added, {c['removed']} "
                "removed)" + (f"; {hidden} more arrays not shown" if hidden else ""))
    draw(path, strips, labels, hatched, f"{head}\n{subtitle}",
         "position in array (row-blocks, first row left)", dpi=dpi)
    return {"path": os.fspath(path), "arrays": len(rows), "hidden": hidden, "columns": columns}


def draw(path: str | os.PathLike, strips: list[np.ndarray], labels: list[str],
         hatched: list[str | None], title: str, xlabel: str, *, dpi: int = 110,
         bar_label: str = "relative change ||B-A|| / ||A||") -> None:
    """The one heatmap: rows of relative changes (``strip`` values), full labels, the fixed
    colour scale with its bar, and a legend for unchanged, non-finite and added/removed."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib import patches
    from matplotlib.figure import Figure

    columns = max([len(s) for s in strips] + [1])
    grid = np.vstack([scale_cells(s) for s in strips]) if strips else \
        np.full((1, columns), np.nan)
    wrapped = [wrap_name(label) for label in labels]
    label_lines = sum(max(1, w.count("\n") + 1) for w in wrapped)
    widest = max([len(line) for w in wrapped for line in w.split("\n")] + [0])
    width = 10 + max(0.0, (widest - 40) * 0.065)
    height = 2.2 + 0.22 * max(label_lines, 1) + 0.08 * max(len(strips), 1)
    fig = Figure(figsize=(width, height), dpi=dpi, layout="constrained")
    ax = fig.add_subplot()
    cmap, norm = colour_scale()
    n = max(len(strips), 1)
    image = ax.imshow(np.ma.masked_invalid(grid), aspect="auto", interpolation="nearest",
                      cmap=cmap, norm=norm, extent=(0, 1, n - 0.5, -0.5))
    ax.set_yticks(range(len(strips)))
    ax.set_yticklabels(wrapped, fontsize=7.5)
    for y, text in enumerate(hatched):
        if text is not None:
            ax.add_patch(patches.Rectangle((0, y - 0.5), 1, 1, facecolor="none", hatch="///",
                                           edgecolor="#b0b0b0", linewidth=0))
            ax.text(0.5, y, text, ha="center", va="center", fontsize=8, color="#333333",
                    bbox={"facecolor": UNCHANGED_COLOUR, "edgecolor": "none", "pad": 1})
    for y in range(len(strips) - 1):
        ax.axhline(y + 0.5, color="white", linewidth=1.0)
    ax.set_xlim(0, 1)
    ax.set_xticks([0, 0.25, 0.5, 0.75, 1.0])
    ax.set_xticklabels(["0%", "25%", "50%", "75%", "100%"], fontsize=8)
    ax.set_xlabel(xlabel, fontsize=8)
    fig.suptitle(title, fontsize=9)
    bar = fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02, extend="neither")
    ticks = np.arange(LOG_MIN, LOG_MAX + 1)
    bar.set_ticks(ticks)
    bar.set_ticklabels([f"1e{int(t)}" if t < 0 else ">= 1" for t in ticks])
    bar.set_label(f"{bar_label} (fixed log scale)", fontsize=8)
    bar.ax.tick_params(labelsize=7)
    legend = [patches.Patch(facecolor=UNCHANGED_COLOUR, label="unchanged"),
              patches.Patch(facecolor=NONFINITE_COLOUR, label="NaN / Inf values"),
              patches.Patch(facecolor="white", edgecolor="#b0b0b0", hatch="///",
                            label="added / removed")]
    fig.legend(handles=legend, loc="outside right lower", fontsize=7, frameon=False)
    fig.savefig(os.fspath(path), format="png", metadata={"Software": None})


def _row_label(item: ArrayDiff) -> str:
    if item.status in ("added", "removed"):
        return f"{item.name} ({item.status})"
    return f"{item.name} ({item.blocks_changed}/{item.blocks} blocks)"


# --- generations ----------------------------------------------------------------------------------

def generation_strip(review, row, columns: int) -> np.ndarray:
    """A tensor's cells: its blocks' relative change when the weights were read, else one
    value for the whole tensor, |norm B - norm A| / norm A from the MANIFESTs (NaN when B
    holds NaN or Inf values)."""
    detail = review.detail_of(row.name)
    if detail is not None and detail.block_rel is not None and detail.status != "unchanged":
        return strip(detail, columns)
    if review.settled(row) in ("unchanged", "added", "removed"):
        return np.zeros(columns)
    if any(after for _, after in (row.counts("nan"), row.counts("inf"))):
        return np.full(columns, np.nan)
    rel = row.rel_change
    return np.full(columns, rel if rel is not None and detail is None else 0.0)


def plot_generation(reviews, path: str | os.PathLike, *, title: str | None = None,
                    dpi: int = 110) -> dict:
    """One heatmap PNG for one or more generation reviews (a pull request may touch several
    runs): rows in each review's order (largest relative change first), at most MAX_ROWS.

    Example::

        plot_generation([review], "review.png")["rows"]
        # -> 12
    """
    reviews = list(reviews)
    weights = all(r.mode == "weights" for r in reviews)
    columns = MAX_COLUMNS if weights else 1
    if weights:
        most = max([d.blocks for r in reviews for d in r.detail.arrays] + [1])
        columns = int(min(MAX_COLUMNS, most))
    picked = [(r, row) for r in reviews for row in r.rows if r.settled(row) != "unchanged"]
    picked += [(r, row) for r in reviews for row in r.rows if r.settled(row) == "unchanged"]
    hidden = max(0, len(picked) - MAX_ROWS)
    picked = picked[:MAX_ROWS]
    prefix = len(reviews) > 1
    strips = [generation_strip(r, row, columns) for r, row in picked]
    labels = [(f"{r.run}: " if prefix else "") + row.name for r, row in picked]
    hatched = [row.status if row.status in ("added", "removed") else None for _, row in picked]
    head = title or "snapops review: " + ", ".join(
        f"run {r.run} gen {_gen(r.gen_a)} -> {_gen(r.gen_b)}" for r in reviews)
    anomalies = sum(len(r.anomalies) for r in reviews)
    sub = (f"{anomalies} anomalies; " + ("blocks of each tensor, weights read" if weights else
           "MANIFEST statistics only: one cell per tensor, |norm B - norm A| / norm A")
           + (f"; {hidden} more tensors not shown" if hidden else ""))
    draw(path, strips, labels, hatched, f"{head}\n{sub}",
         "position in tensor (row-blocks, first row left)" if weights else
         "whole tensor", dpi=dpi, bar_label="relative change ||B-A|| / ||A||" if weights else
         "relative norm change |norm B - norm A| / norm A")
    return {"path": os.fspath(path), "rows": len(picked), "hidden": hidden,
            "columns": columns}


def _gen(gen: int | None) -> str:
    return "-" if gen is None else str(gen)
