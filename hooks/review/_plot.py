"""The review heatmap: one labelled strip per array, one cell per row-block, coloured by the
block's relative change ||B - A|| / ||A|| on a log scale; unchanged blocks are light grey.

Arrays have different block counts, so every strip is resampled to a common width: a column
shows the largest change among the blocks it covers (a single changed block never vanishes).
Matplotlib runs with the Agg backend (no display needed).
"""

from __future__ import annotations

import os

import numpy as np

from ._compare import ArrayDiff, DiffReport
from ._render import type_text

MAX_COLUMNS = 512
MAX_ROWS = 60


def strip(item: ArrayDiff, columns: int) -> np.ndarray:
    """The array's per-block relative change resampled to ``columns`` (NaN = unchanged).

    Downsampling keeps each column's largest change; infinite or NaN changes (a block of A
    that was all zeros, NaN values) show at the top of the scale."""
    rel = item.block_rel if item.block_rel is not None else np.zeros(0)
    if item.status in ("added", "removed") or rel.size == 0:
        return np.full(columns, np.nan)
    finite = rel[np.isfinite(rel)]
    top = max(float(finite.max()) if finite.size else 0.0, 1.0)
    values = np.where(np.isfinite(rel), rel, top)
    pick = (np.arange(columns, dtype=np.int64) * rel.size) // columns
    col = np.maximum.reduceat(values, pick) if rel.size >= columns else values[pick]
    return np.where(col > 0, col, np.nan)


def pick_rows(report: DiffReport) -> tuple[list[ArrayDiff], int]:
    """Changed, added and removed arrays first, then unchanged ones, at most MAX_ROWS."""
    changed = [i for i in report.arrays if i.status != "unchanged"]
    rest = [i for i in report.arrays if i.status == "unchanged"]
    rows = (changed + rest)[:MAX_ROWS]
    return rows, len(report.arrays) - len(rows)


def plot_report(report: DiffReport, path: str | os.PathLike, *, title: str | None = None,
                dpi: int = 110) -> dict:
    """Write the heatmap PNG to ``path``; returns {"arrays": shown, "hidden": n, "path": ...}.

    Example::

        plot_report(diff_paths("a.wtxt", "b.wtxt"), "diff.png")["arrays"]
        # -> 3
    """
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib import colors, patches
    from matplotlib.figure import Figure

    rows, hidden = pick_rows(report)
    grid, columns, (vmin, vmax) = _grid(rows)

    height = 1.5 + 0.3 * max(len(rows), 1)
    fig = Figure(figsize=(10, height), dpi=dpi, layout="constrained")
    ax = fig.add_subplot()
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#e6e6e6")
    masked = np.ma.masked_invalid(grid)
    image = ax.imshow(masked, aspect="auto", interpolation="nearest", cmap=cmap,
                      norm=colors.LogNorm(vmin=vmin, vmax=vmax),
                      extent=(0, 1, len(rows) - 0.5 if rows else 0.5, -0.5))
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([_row_label(i) for i in rows], fontsize=8)
    _mark_added_removed(ax, rows, patches)
    for y in range(len(rows) - 1):
        ax.axhline(y + 0.5, color="white", linewidth=1.0)
    ax.set_xlim(0, 1)
    ax.set_xticks([0, 0.25, 0.5, 0.75, 1.0])
    ax.set_xticklabels(["0%", "25%", "50%", "75%", "100%"], fontsize=8)
    ax.set_xlabel("position in array (row-blocks, first row left); grey: unchanged",
                  fontsize=8)
    c = report.counts()
    head = title or f"snapops diff: {report.a} -> {report.b}"
    fig.suptitle(f"{head}\n{c['blocks_changed']} of {c['blocks']} row-blocks changed in "
                 f"{c['changed']} array{'s' if c['changed'] != 1 else ''} ({c['added']} added,"
                 f" {c['removed']} removed)"
                 + (f"; {hidden} more arrays not shown" if hidden else ""), fontsize=9)
    bar = fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
    bar.set_label("relative change per block  ||B-A|| / ||A||", fontsize=8)
    bar.ax.tick_params(labelsize=7, which="both")
    fig.savefig(os.fspath(path), format="png", metadata={"Software": None})
    return {"path": os.fspath(path), "arrays": len(rows), "hidden": hidden, "columns": columns}


def _grid(rows: list[ArrayDiff]) -> tuple[np.ndarray, int, tuple[float, float]]:
    """The strips of ``rows`` as one grid, its column count and the colour range."""
    most = max([i.blocks for i in rows] + [1])
    columns = int(min(MAX_COLUMNS, max(most, 1)))
    grid = np.vstack([strip(i, columns) for i in rows]) if rows else np.full((1, columns), np.nan)
    positive = grid[np.isfinite(grid) & (grid > 0)]
    vmax = float(positive.max()) if positive.size else 1.0
    vmin = float(positive.min()) if positive.size else vmax / 10
    if vmin >= vmax:
        vmin = vmax / 10
    return grid, columns, (vmin, vmax)


def _mark_added_removed(ax, rows: list[ArrayDiff], patches) -> None:
    for y, item in enumerate(rows):
        if item.status in ("added", "removed"):
            ax.add_patch(patches.Rectangle((0, y - 0.5), 1, 1, facecolor="none", hatch="///",
                                           edgecolor="#b0b0b0", linewidth=0))
            ax.text(0.5, y, f"{item.status} ({type_text(item)})", ha="center", va="center",
                    fontsize=8, color="#333333",
                    bbox={"facecolor": "#e6e6e6", "edgecolor": "none", "pad": 1})


def _row_label(item: ArrayDiff) -> str:
    name = item.name if len(item.name) <= 32 else "..." + item.name[-29:]
    if item.status in ("added", "removed"):
        return f"{name} ({item.status})"
    return f"{name} ({item.blocks_changed}/{item.blocks} blocks)"
