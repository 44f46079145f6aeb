"""snapops.config: the TOML config schema, defaults and loader (see snapops.toml here)."""

from .loader import load_config, resolve  # noqa: F401
from .schema import Config  # noqa: F401
