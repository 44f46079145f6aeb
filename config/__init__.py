"""snapops.config: the TOML config schema, defaults and loader."""
