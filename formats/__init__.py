"""snapops.formats: the snapshot model, integrity helpers and one module per file format."""

from .errors import (  # noqa: F401
    ChecksumError, ConfigError, DataError, FormatError, GitError, KeyMaterialError, LimitError,
    PushError, SignatureError, SnapopsError, TruncatedError, UnsupportedVersionError,
)
from .model import Snapshot  # noqa: F401
from .report import Report  # noqa: F401
from ._alloc import tune_allocator  # noqa: F401  (for readers outside formats: hooks.review)
