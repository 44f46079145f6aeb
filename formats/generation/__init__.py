"""snapops.formats.generation: a generation as one sealed unit (MANIFEST v2, its seal, per-array
statistics). The daemon writes it; hooks, CI, ``snapops verify`` and restore read it."""

from .manifest import (  # noqa: F401
    ArrayRecord, FileRecord, Header, Manifest, Part, Prev, Seal, ShardRecord, Stats, gen_text,
    parse_manifest, valid_run,
)
from .seal import check_seal, seal_manifest  # noqa: F401
from .stats import array_stats  # noqa: F401
