"""The demo's numbers: what snapshotting cost the training loop, how fast generations reached
the remote, what the repository holds; printed and written as ``WORKDIR/summary.md``."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Summary:
    parameters: int
    state_bytes: int
    steps: int
    plain: list[float]
    snapping: list[float]
    stalls: list[float]
    requested: list[int]
    pushed: list[int]
    dropped: dict[int, str]
    verified: int
    failures: list[str]
    latencies: list[float]
    repo_bytes: int
    restore_problems: str
    review: list[str] = field(default_factory=list)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def latencies_from_wal(wal: Path, remote: str) -> list[float]:
    """Seconds from each generation's REQ record to its PUSHED record for ``remote``."""
    from snapops.daemon.wal import WalReader

    asked, pushed = {}, {}
    for record in WalReader(wal).read_new():
        t = float(record.fields.get("t", "nan"))
        if record.event == "REQ":
            asked.setdefault(record.gen, t)
        elif record.event == "PUSHED" and record.fields.get("remote") == remote:
            pushed.setdefault(record.gen, t)
    return [pushed[g] - asked[g] for g in sorted(pushed) if g in asked]


def fmt_mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 else f"{nbytes / 1024:.0f} KiB"


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _dropped(dropped: dict[int, str]) -> str:
    if not dropped:
        return ""
    reasons: dict[str, int] = {}
    for reason in dropped.values():
        reasons[reason] = reasons.get(reason, 0) + 1
    return "; dropped: " + ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))


def render(s: Summary) -> str:
    plain, snap = _median(s.plain), _median(s.snapping)
    overhead = (snap / plain - 1) * 100 if plain == plain and snap == snap else float("nan")
    lines = [
        "# snapops demo summary", "",
        "| what | measured |", "|---|---|",
        f"| model | {s.parameters / 1e6:.2f} M parameters, {fmt_mib(s.state_bytes)} of state per "
        "generation (f32 weights, bf16 embeddings, int64 step) |",
        f"| training steps | {s.steps} ({len(s.plain)} without and {len(s.snapping)} with "
        "snapshotting, alternating phases) |",
        f"| time per step, median | {plain:.3f} s without, {snap:.3f} s with snapshotting: "
        f"{overhead:+.1f}% |",
        f"| `request()` stall per snapshot | median {_median(s.stalls) * 1e3:.1f} ms, p99 "
        f"{percentile(s.stalls, 99) * 1e3:.1f} ms |",
        f"| generations | {len(s.requested)} requested, {len(s.pushed)} pushed, "
        f"{s.verified} verified from a fresh clone{_dropped(s.dropped)} |",
        f"| request to pushed | median {_median(s.latencies):.1f} s, max "
        f"{max(s.latencies, default=float('nan')):.1f} s |",
        f"| remote repository | {s.repo_bytes / 2**20:.1f} MiB on disk |",
        f"| restore of the newest generation | "
        f"{'every tensor equal, dtypes kept' if not s.restore_problems else 'FAILED: ' + s.restore_problems} |",
    ]
    if s.review:
        lines.append(f"| review of the last two generations | {', '.join(s.review)} |")
    lines += [f"- verification failure: {f}" for f in s.failures]
    return "\n".join(lines) + "\n"


def write_summary(path: Path, summary: Summary, out=print) -> None:
    text = render(summary)
    path.write_text(text)
    out(text)
    out(f"summary written to {path}")
