"""One review per generation: two MANIFESTs of a run compared tensor by tensor, anomalies first.

The summary is computed from the statistics the daemon sealed into each MANIFEST at save time
(norm, min, max, mean, NaN and Inf counts per array, over the global array with its original
name and logical dtype), so it is the same whether or not the weights are at hand: a CI job on
a clone without the shards (LFS pointers, a shallow or filtered fetch) gets the same table as
one with them, in milliseconds. When both generations' shards are present (and ``manifest_only``
is not asked), the weights are read through :func:`~snapops.formats.generation.load.assemble`
(parts joined, logical dtypes) and compared block by block with the file review's comparator:
that adds relative L2 change, cosine and changed row-blocks per tensor, and cosine anomalies.

Example::

    with open_git_side(Git("."), "run1/gen-000001", "run1", tmp) as a, \\
            open_git_side(Git("."), "run1/gen-000002", "run1", tmp2) as b:
        review = review_generations(a, b)
    [x.kind for x in review.anomalies]
    # -> ['nan', 'inf', 'norm']
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Iterator

from snapops.formats.errors import ConfigError, FormatError, SnapopsError
from snapops.formats.iosafe import open_input
from snapops.formats.generation.manifest import (
    MAX_BYTES, ArrayRecord, Manifest, parse_manifest, valid_run,
)
from snapops.formats.generation.source import (
    DEFAULT_MAX_BLOB, FILE, FolderSource, GitTreeSource, Source,
)
from snapops.formats.generation.verify import AGE_SUFFIX, manifest_path, read_manifest, run_folder

from ._compare import ArrayDiff, DiffReport, diff_snapshots

DEFAULT_RATIO = 10.0         # norm ratio beyond 10x or below 1/10x is an anomaly
DEFAULT_COSINE = 0.9         # cosine(A, B) below this is an anomaly (weights read)
MAX_WEIGHT_BYTES = 16 << 30   # both generations' arrays, held at once for the block detail
ANOMALY_ORDER = ("nan", "inf", "norm", "cosine", "dtype", "shape", "added", "removed")


@dataclass(frozen=True)
class Thresholds:
    ratio: float = DEFAULT_RATIO
    cosine: float = DEFAULT_COSINE

    def __post_init__(self) -> None:
        if not (math.isfinite(self.ratio) and self.ratio > 1):
            raise ConfigError(f"norm ratio threshold must be a number above 1, got {self.ratio}")
        if not (math.isfinite(self.cosine) and -1 <= self.cosine <= 1):
            raise ConfigError(f"cosine threshold must lie in [-1, 1], got {self.cosine}")


@dataclass
class Side:
    """One generation to compare: its MANIFEST (None: the run has no generation there) and,
    when the shards can be read, the source holding them."""

    label: str
    run: str
    manifest: Manifest | None
    source: Source | None = None
    missing: str | None = None       # why the weights cannot be read (None: they can)


@dataclass
class TensorRow:
    """One tensor of the summary: everything here comes from the two MANIFESTs."""

    name: str
    status: str                      # added, removed, changed, unchanged, same-stats
    a: ArrayRecord | None
    b: ArrayRecord | None

    @property
    def norm_a(self) -> float | None:
        return _stat(self.a, "norm")

    @property
    def norm_b(self) -> float | None:
        return _stat(self.b, "norm")

    @property
    def ratio(self) -> float | None:
        """norm B / norm A (inf when A's norm is 0 and B's is not)."""
        a, b = self.norm_a, self.norm_b
        if a is None or b is None:
            return None
        if a == 0:
            return 1.0 if b == 0 else math.inf
        return b / a

    @property
    def rel_change(self) -> float | None:
        """|norm B - norm A| / norm A, the sort key (added/removed: inf; no stats: None)."""
        if self.status in ("added", "removed"):
            return math.inf
        ratio = self.ratio
        return None if ratio is None else abs(ratio - 1)

    def counts(self, key: str) -> tuple[int | None, int | None]:
        return _stat(self.a, key), _stat(self.b, key)


@dataclass(frozen=True)
class Anomaly:
    kind: str                        # one of ANOMALY_ORDER
    name: str
    text: str
    size: float = 0.0                # orders anomalies of one kind (largest first)


@dataclass
class GenerationReview:
    run: str
    a: str
    b: str
    gen_a: int | None
    gen_b: int | None
    mode: str                        # "manifest" (statistics only) or "weights"
    rows: list[TensorRow]
    anomalies: list[Anomaly]
    thresholds: Thresholds
    detail: DiffReport | None = None
    notes: list[str] = field(default_factory=list)
    _by_name: tuple | None = field(default=None, repr=False, compare=False)

    def counts(self) -> dict[str, int]:
        """Tensors per settled status (see :meth:`settled`); ``same-stats`` is left only
        when the weights were not read."""
        out = {k: 0 for k in ("changed", "added", "removed", "unchanged", "same-stats")}
        for row in self.rows:
            out[self.settled(row)] += 1
        return out

    @property
    def changed(self) -> bool:
        """Something differs, or may (equal statistics, weights not read)."""
        return any(self.settled(row) != "unchanged" for row in self.rows)

    def settled(self, row: TensorRow) -> str:
        """``row.status`` (from the MANIFESTs alone, as the summary table shows it), with a
        tensor whose statistics did not change settled by its weights when they were read:
        ``unchanged`` when its bytes are equal, else ``changed``."""
        detail = self.detail_of(row.name) if row.status == "same-stats" else None
        if detail is None:
            return row.status
        return "unchanged" if detail.status == "unchanged" else "changed"

    def detail_of(self, name: str) -> ArrayDiff | None:
        if self.detail is None:
            return None
        if self._by_name is None or self._by_name[0] is not self.detail:
            self._by_name = (self.detail, {d.name: d for d in self.detail.arrays})
        return self._by_name[1].get(name)


def _stat(record: ArrayRecord | None, key: str):
    if record is None or record.stats is None:
        return None
    return getattr(record.stats, key)


# --- opening the two sides ----------------------------------------------------------------------

def _side(source: Source, run: str, label: str) -> Side:
    """The generation of ``run`` in ``source``: its MANIFEST, and whether every shard it lists
    is there as itself (same size; not an LFS pointer, not encrypted, not left unfetched)."""
    entries = source.entries(run_folder(run))
    if manifest_path(run) not in entries:
        return Side(label, run, None, None, "no generation of this run")
    data, manifest = read_manifest(source, run)
    check_stats(manifest, data, manifest_path(run))
    return Side(label, run, manifest, source, _why_absent(manifest, entries, run))


def _why_absent(manifest: Manifest, entries: dict, run: str) -> str | None:
    folder = run_folder(run)
    for shard in manifest.shards:
        entry = entries.get(f"{folder}/{shard.path}")
        if entry is None or entry.kind != FILE:
            return f"shard {shard.path} is not in the tree"
        if entry.size != shard.size:
            return (f"shard {shard.path} is not the sealed file ({entry.size} bytes, sealed "
                    f"{shard.size}: an LFS pointer?)")
        if shard.path.endswith(AGE_SUFFIX):
            return f"shard {shard.path} is age-encrypted"
    return None


@contextlib.contextmanager
def open_git_side(git, rev: str, run: str, scratch: str | os.PathLike | None = None,
                  label: str | None = None, max_blob: int = DEFAULT_MAX_BLOB
                  ) -> Iterator[Side]:
    """The generation of ``run`` at revision ``rev`` of the repository ``git`` runs in; shard
    blobs (at most ``max_blob`` bytes each) are copied into a private scratch folder only if
    the weights are read."""
    if not valid_run(run):
        raise ConfigError(f"{run!r} is not a run name ([A-Za-z0-9][A-Za-z0-9_.-]*)")
    commit = git.resolve(f"{rev}^{{commit}}") if not rev.startswith("-") else None
    if commit is None:
        raise ConfigError(f"{rev}: not a commit in {git.cwd}")
    with contextlib.ExitStack() as stack:
        if scratch is None:
            scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="snapops-review-"))
        source = GitTreeSource(git, commit, scratch, max_blob=max_blob)
        yield _side(source, run, label or f"{rev} ({commit[:12]})")


def folder_side(root: str | os.PathLike, run: str, label: str | None = None) -> Side:
    """The generation of ``run`` in a work tree or folder holding ``snapshots/<run>/``."""
    return _side(FolderSource(root), run, label or os.fspath(Path(root) / run_folder(run)))


def manifest_file_side(path: str | os.PathLike) -> Side:
    """A MANIFEST file on its own (statistics only), wherever it lies."""
    try:
        with open_input(path) as f:
            data = f.read(MAX_BYTES + 1)
    except FormatError as exc:
        raise ConfigError(str(exc)) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    manifest = parse_manifest(data, os.fspath(path))
    check_stats(manifest, data, os.fspath(path))
    return Side(os.fspath(path), manifest.header.run, manifest, None,
                "a MANIFEST given on its own")


def locate(path: str | os.PathLike) -> tuple[str, str] | None:
    """(root, run) when ``path`` is ``ROOT/snapshots/<run>`` or its MANIFEST."""
    p = Path(os.path.normpath(os.path.abspath(path)))
    if p.name == "MANIFEST":
        p = p.parent
    if p.parent.name == "snapshots" and valid_run(p.name):
        return os.fspath(p.parent.parent), p.name
    return None


def path_side(path: str | os.PathLike) -> Side:
    """A generation folder ``snapshots/<run>``, its MANIFEST, or a MANIFEST lying elsewhere."""
    found = locate(path)
    if found is not None and os.path.exists(Path(found[0]) / manifest_path(found[1])):
        return folder_side(found[0], found[1], label=os.fspath(path))
    if os.path.isfile(path) and Path(path).name == "MANIFEST":
        return manifest_file_side(path)
    raise ConfigError(f"{path}: not a generation (give snapshots/<run>, or a MANIFEST)")


# --- hostile statistics ------------------------------------------------------------------------

def check_stats(manifest: Manifest, data: bytes, path: str) -> None:
    """Refuse statistics the daemon cannot have written (they are read as numbers and drawn):
    a NaN or negative norm, infinite extremes, min above max, more NaN/Inf than elements.
    The error names the array line."""
    lines = data.split(b"\n")
    line_of = {}
    for no, text in enumerate(lines, start=1):
        if text.startswith(b"array "):
            line_of[len(line_of)] = no
    for index, record in enumerate(manifest.arrays):
        problem = _bad_stats(record)
        if problem:
            raise FormatError(f"array {record.name}: statistics that cannot be", path=path,
                              line=line_of.get(index), check="stats", expected=problem[0],
                              got=problem[1])


def _bad_stats(record: ArrayRecord) -> tuple[str, str] | None:
    s = record.stats
    if s is None:
        return None
    elements = math.prod(record.shape)
    if math.isnan(s.norm) or s.norm < 0:
        return "a norm >= 0", f"norm={s.norm}"
    if s.nan + s.inf > elements:
        return f"at most {elements} NaN and Inf values", f"nan={s.nan} inf={s.inf}"
    extremes = (s.min, s.max)
    if any(math.isinf(v) for v in extremes):
        return "finite min and max (they are over the finite values)", f"min={s.min} max={s.max}"
    if any(math.isnan(v) for v in extremes + (s.mean,)):
        if not all(math.isnan(v) for v in extremes + (s.mean,)) or s.norm != 0 \
                or s.nan + s.inf != elements:
            return ("min, max and mean all nan only when no value is finite",
                    f"min={s.min} max={s.max} mean={s.mean} nan={s.nan} inf={s.inf}")
    elif s.min > s.max:
        return "min <= max", f"min={s.min} max={s.max}"
    return None


# --- the review ---------------------------------------------------------------------------------

def review_generations(a: Side, b: Side, *, thresholds: Thresholds = Thresholds(),
                       manifest_only: bool | str = False, threads: int = 2,
                       max_weight_bytes: int = MAX_WEIGHT_BYTES) -> GenerationReview:
    """Compare the generations ``a`` and ``b`` (see module docstring). ``manifest_only``:
    True, or the reason to read no weights (said in the report's notes); weights larger
    than ``max_weight_bytes`` together (both generations are held at once) are not read."""
    if a.manifest is None and b.manifest is None:
        raise ConfigError(f"run {b.run}: no generation at {a.label} nor at {b.label}")
    rows = summary_rows(a.manifest, b.manifest)
    review = GenerationReview(b.run if b.manifest else a.run, a.label, b.label,
                              _gen(a.manifest), _gen(b.manifest), "manifest", rows, [],
                              thresholds)
    if a.run != b.run:
        review.notes.append(f"comparing different runs: {a.run} and {b.run}")
    why = _why_no_weights(a, b, manifest_only, max_weight_bytes)
    if why is None:
        try:
            review.detail = weight_detail(a, b, threads)
            review.mode = "weights"
        except SnapopsError as exc:
            why = f"the weights could not be read ({exc})"
    if why is not None:
        review.notes.append(f"MANIFEST statistics only: {why}")
    review.anomalies = find_anomalies(review)
    return review


def _gen(manifest: Manifest | None) -> int | None:
    return None if manifest is None else manifest.header.gen


def _why_no_weights(a: Side, b: Side, manifest_only: bool | str, limit: int) -> str | None:
    if manifest_only:
        return manifest_only if isinstance(manifest_only, str) else "asked for (--manifest-only)"
    for side in (a, b):
        if side.manifest is not None and side.missing is not None:
            return f"{side.label}: {side.missing}"
    total = sum(_raw_bytes(s.manifest) for s in (a, b))
    if total > limit:
        return (f"the two generations hold {total} bytes of weights, more than the "
                f"{limit} a review holds in memory")
    return None


def _raw_bytes(manifest: Manifest | None) -> int:
    """The arrays' bytes as the MANIFEST declares them (unknown dtypes counted as 16 bytes)."""
    from snapops.formats.dtypes import numpy_dtype

    if manifest is None:
        return 0
    total = 0
    for record in manifest.arrays:
        dtype = numpy_dtype(record.dtype)
        total += math.prod(record.shape) * (dtype.itemsize if dtype is not None else 16)
    return total


def summary_rows(a: Manifest | None, b: Manifest | None) -> list[TensorRow]:
    """One row per tensor of either MANIFEST, sorted by relative norm change (largest first;
    added and removed tensors first, tensors without statistics last), then by name."""
    ra = {r.name: r for r in a.arrays} if a else {}
    rb = {r.name: r for r in b.arrays} if b else {}
    rows = []
    for name in set(ra) | set(rb):
        x, y = ra.get(name), rb.get(name)
        rows.append(TensorRow(name, _status(a, b, x, y), x, y))
    return sorted(rows, key=_row_key)


def _row_key(row: TensorRow):
    rel = row.rel_change
    return (rel is None, -(rel or 0.0), row.name.encode("utf-8", "surrogatepass"))


def _status(a: Manifest | None, b: Manifest | None, x: ArrayRecord | None,
            y: ArrayRecord | None) -> str:
    if x is None or y is None:
        return "added" if x is None else "removed"
    if x.dtype != y.dtype or x.shape != y.shape:
        return "changed"
    if math.prod(x.shape) == 0 or _same_content(a, b, x, y):
        return "unchanged"       # no elements at all, or the same sealed bytes
    if _same_stats(x.stats, y.stats):
        return "same-stats"      # equal to 9 digits: the bytes may still differ
    return "changed"


def _same_stats(x, y) -> bool:
    """Equal statistics, NaN equal to NaN (min, max and mean of a tensor holding no finite
    value are NaN in both MANIFESTs)."""
    if x is None or y is None:
        return False
    return all(_same_number(getattr(x, f.name), getattr(y, f.name)) for f in fields(x))


def _same_number(x, y) -> bool:
    return x == y or (isinstance(x, float) and isinstance(y, float)
                      and math.isnan(x) and math.isnan(y))


def _same_content(a: Manifest, b: Manifest, x: ArrayRecord, y: ArrayRecord) -> bool:
    """Both records place the tensor in the same parts of shards with the same sealed content
    digest (BLAKE3 over the shard's arrays): the bytes are equal without reading them."""
    if x.parts != y.parts:
        return False
    for part in x.parts:
        sa, sb = a.shard(part.shard), b.shard(part.shard)
        if sa is None or sb is None or sa.content != sb.content:
            return False
    return True


def weight_detail(a: Side, b: Side, threads: int = 2) -> DiffReport:
    """Block-level comparison of the two generations' weights (parts joined, logical dtypes)."""
    from snapops.formats.generation.load import assemble

    from ._sources import arrays_source

    arrays = []
    for side in (a, b):
        if side.manifest is None:
            arrays.append({})
        else:
            arrays.append(assemble(side.source, side.run, side.manifest))
    fmt_a = a.manifest.header.format if a.manifest else b.manifest.header.format
    fmt_b = b.manifest.header.format if b.manifest else fmt_a
    return diff_snapshots(arrays_source(fmt_a, arrays[0]), arrays_source(fmt_b, arrays[1]),
                          a_label=a.label, b_label=b.label, threads=threads)


def find_anomalies(review: GenerationReview) -> list[Anomaly]:
    """What a reviewer must see first, in ANOMALY_ORDER, the largest of each kind first."""
    found: list[Anomaly] = []
    t = review.thresholds
    for row in review.rows:
        found += _count_anomalies(row)
        if row.status in ("added", "removed"):
            record = row.b if row.status == "added" else row.a
            found.append(Anomaly(row.status, row.name,
                                 f"{row.status}: {record.dtype} [{fmt_shape(record.shape)}]"))
            continue
        ratio = row.ratio
        if ratio is not None and _floating(row.b.dtype) and \
                (ratio > t.ratio or ratio < 1 / t.ratio):
            found.append(Anomaly("norm", row.name, f"norm x{fmt_ratio(ratio)} "
                                 f"({fmt_float(row.norm_a)} -> {fmt_float(row.norm_b)})",
                                 abs(math.log(ratio)) if 0 < ratio < math.inf else math.inf))
        if row.a.dtype != row.b.dtype:
            found.append(Anomaly("dtype", row.name, f"dtype {row.a.dtype} -> {row.b.dtype}"))
        if row.a.shape != row.b.shape:
            found.append(Anomaly("shape", row.name, f"shape {fmt_shape(row.a.shape)} -> "
                                 f"{fmt_shape(row.b.shape)}"))
        detail = review.detail_of(row.name)
        cos = detail.cosine if detail is not None else None
        if cos is not None and not math.isnan(cos) and cos < t.cosine:
            found.append(Anomaly("cosine", row.name, f"cosine {cos:.4f}", 1 - cos))
    return sorted(found, key=lambda x: (ANOMALY_ORDER.index(x.kind), -x.size,
                                        x.name.encode("utf-8", "surrogatepass")))


def _floating(dtype: str) -> bool:
    """Weights, not counters or ids: a step going from 1 to 100 is no anomaly."""
    return dtype.startswith(("f", "bf"))


def _count_anomalies(row: TensorRow) -> list[Anomaly]:
    out = []
    for key, label in (("nan", "NaN"), ("inf", "Inf")):
        before, after = row.counts(key)
        before = before or 0
        if after is not None and after != before:
            out.append(Anomaly(key, row.name, f"{label} count {before} -> {after}",
                               abs(after - before)))
    return out


# --- number spelling shared by the renderers ----------------------------------------------------

def fmt_float(value: float | None) -> str:
    from ._render import fmt_num

    return fmt_num(value)


def fmt_ratio(value: float) -> str:
    if math.isinf(value):
        return "inf"
    return f"{value:.3g}"


def fmt_shape(shape) -> str:
    from ._render import fmt_shape as shape_text

    return shape_text(shape)


