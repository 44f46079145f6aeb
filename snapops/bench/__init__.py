"""``snapops bench``: throughput and memory measurements (never timed assertions in tests)."""
