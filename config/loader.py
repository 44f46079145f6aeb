"""Load the TOML config: defaults < file < SNAPOPS_* environment < explicit overrides."""

from __future__ import annotations

import dataclasses
import math
import os
import re
import tomllib
from pathlib import Path
from typing import Any, Mapping

from snapops.formats.errors import ConfigError, FormatError, looks_like_key_material, short_repr
from snapops.formats.iosafe import read_small_text

from .schema import FORMATS, POLICIES, STORES, Config, RemoteConfig
from .sizes import parse_size

SECTIONS = ("daemon", "client", "snapshot", "seal", "repo", "push", "cluster")
SIZE_KEYS = {"snapshot.shard_max", "snapshot.streaming_threshold", "push.batch_bytes"}
CHOICES = {"snapshot.format": FORMATS, "client.policy": POLICIES,
           "daemon.log_level": ("debug", "info", "warning", "error"),
           "daemon.log_format": ("text", "json"), "repo.delta": ("auto", "always", "never"),
           "daemon.cpu_policy": ("batch", "normal"),
           "daemon.io_class": ("best-effort", "idle", "none"), "repo.store": STORES}
MINIMUM = {"client.max_in_flight": 1, "repo.retention": 1, "snapshot.shard_max": 1,
           "push.backoff_initial": 0.0, "push.backoff_max": 0.0, "push.backoff_factor": 1.0,
           "push.jitter": 0.0, "push.timeout": 0.0, "daemon.poll_interval": 0.05,
           "push.stall_timeout": 1.0, "push.batch_bytes": 1, "repo.gc_interval": 0.0,
           "snapshot.rows_per_chunk": 0, "repo.compression": -1, "daemon.nice": 0,
           "daemon.max_attempts": 1, "daemon.retry_initial": 0.0, "daemon.retry_max": 0.0,
           "daemon.abandon_after": 0.0, "cluster.world_size": 1, "cluster.rank_timeout": 0.0,
           "repo.keyframe_every": 1}

# settings naming a file that holds a secret: their values are never repeated in a message
SECRET_FILES = {"seal.hmac_key", "seal.sign_key", "repo.lfs_token_file"}
META_TOKENS = {"snapshot.schema", "snapshot.build", "snapshot.host", "snapshot.cuda"}
MAXIMUM = {"repo.compression": 9, "daemon.nice": 19, "cluster.world_size": 1_000_000,
           "push.jitter": 1.0}
# settings that become a git ref or commit identity: no control characters (git would cut or
# mangle them), no leading '-' (read as an option)
GIT_TEXT = {"repo.branch", "repo.author_name", "repo.author_email"}


MAX_CONFIG = 1 << 20


def _read_config(p: Path) -> dict[str, Any]:
    """The config file's TOML: at most MAX_CONFIG bytes of UTF-8 in a regular file (a FIFO
    would block, /dev/zero never end). ConfigError naming the file otherwise."""
    try:
        text = read_small_text(p, MAX_CONFIG, follow=True)
    except FormatError as exc:       # "not a regular file (a FIFO)", "not UTF-8 text"...
        raise ConfigError(f"{p}: config file: {exc.message}") from None
    if text is None:
        raise ConfigError(f"{p}: config file: cannot read: No such file or directory")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: invalid TOML: {exc}") from None
    except ValueError as exc:   # int() of an integer past 4300 digits, raised through tomllib
        raise ConfigError(f"{p}: invalid TOML: {str(exc)[:80]}") from None
    except RecursionError:   # tomllib parses nested arrays and inline tables recursively
        raise ConfigError(f"{p}: invalid TOML: arrays or tables nested too deeply") from None


def load_config(path: str | os.PathLike | None = None, *, env: Mapping[str, str] | None = None,
                overrides: Mapping[str, Any] | None = None) -> Config:
    """Read ``path`` (optional), apply SNAPOPS_* variables from ``env`` and ``overrides``
    (``{"snapshot.format": "fold"}``), validate, and return a frozen Config."""
    env = os.environ if env is None else env
    data: dict[str, Any] = {}
    base = Path(".")
    if path is not None:
        p = Path(path)
        data = _read_config(p)
        base = p.resolve().parent
    for key in data:
        if key not in SECTIONS:
            raise ConfigError(f"{key}: unknown section (expected one of {', '.join(SECTIONS)})")
    merged = {s: dict(data.get(s, {})) for s in SECTIONS}
    for name, value in env.items():
        if name.startswith("SNAPOPS_") and name != "SNAPOPS_MALLOC_TUNING":
            section, _, key = name[8:].lower().partition("_")
            if section in SECTIONS and key:
                merged[section][key] = value
    for dotted, value in (overrides or {}).items():
        section, _, key = dotted.partition(".")
        merged.setdefault(section, {})[key] = value
    return build_config(merged, str(base))


def build_config(merged: dict[str, dict[str, Any]], base_dir: str) -> Config:
    defaults = Config()
    sections = {}
    for section in SECTIONS:
        cls = type(getattr(defaults, section))
        values = dict(merged.get(section, {}))
        if section == "repo":
            values["remotes"] = _remotes(values.pop("remote", values.pop("remotes", [])))
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for key in values:
            if key not in fields:
                raise ConfigError(f"{section}.{key}: unknown key (known: {', '.join(fields)})")
        parsed = {k: _coerce(f"{section}.{k}", v, getattr(getattr(defaults, section), k))
                  for k, v in values.items()}
        sections[section] = cls(**{**dataclasses.asdict(getattr(defaults, section)), **parsed}) \
            if section != "repo" else cls(**{**_shallow(getattr(defaults, section)), **parsed})
    config = Config(**sections, base_dir=base_dir)
    check_secret_files(config)
    if config.repo.store == "lfs" and config.snapshot.delta:
        raise ConfigError("snapshot.delta: DELTA files need the shards in Git; not with "
                          "repo.store = \"lfs\" (residuals are its deltas)")
    return config


def check_secret_files(config: Config) -> None:
    """Refuse a secret-file setting that holds the secret itself (``SNAPOPS_SEAL_HMAC_KEY=$(cat
    hmac.key)``), naming the setting and never the value; an existing file is always a path."""
    for dotted in sorted(SECRET_FILES):
        section, _, key = dotted.partition(".")
        value = getattr(getattr(config, section), key)
        if value and looks_like_key_material(value) and not os.path.lexists(
                resolve(config, value)):
            raise ConfigError(f"{dotted}: looks like key material, not a path (not shown): "
                              "give the path of the key file")


def _shallow(obj) -> dict:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def _remotes(value) -> tuple[RemoteConfig, ...]:
    if isinstance(value, tuple) and all(isinstance(r, RemoteConfig) for r in value):
        return value
    if isinstance(value, str):  # SNAPOPS_REPO_REMOTE="origin=url,backup=url"
        value = [dict(zip(("name", "url"), item.split("=", 1)))
                 for item in value.split(",") if item]
    if not isinstance(value, list):
        raise ConfigError("repo.remote: expected [[repo.remote]] tables with name and url")
    remotes = []
    for i, item in enumerate(value):
        if not isinstance(item, dict) or set(item) != {"name", "url"}:
            raise ConfigError(f"repo.remote[{i}]: expected exactly the keys name and url")
        if not re.fullmatch(r"[A-Za-z0-9._-]+", str(item["name"])):
            raise ConfigError(f"repo.remote[{i}].name: expected [A-Za-z0-9._-]+")
        url = str(item["url"])
        if not url or url.startswith("-") or any(ord(c) < 0x20 or c == "\x7f" for c in url):
            raise ConfigError(f"repo.remote[{i}].url: expected a git URL or path (not empty, "
                              "not starting with '-', no control characters): git would read "
                              "one starting with '-' as an option")
        remotes.append(RemoteConfig(str(item["name"]), url))
    if len({r.name for r in remotes}) != len(remotes):
        raise ConfigError("repo.remote: remote names must be unique")
    return tuple(remotes)


def _coerce(key: str, value: Any, default: Any) -> Any:
    if key == "repo.remotes":
        return value
    try:
        value = _typed(key, value, default)
    except ConfigError as exc:                    # parse_size says what is wrong with a size
        raise ConfigError(f"{key}: {exc}") from None
    except (TypeError, ValueError, OverflowError):
        got = type(value).__name__ if key in SECRET_FILES else short_repr(value)
        raise ConfigError(f"{key}: expected {type(default).__name__}, got {got}") from None
    if key in CHOICES and value not in CHOICES[key]:
        raise ConfigError(f"{key}: expected one of {', '.join(CHOICES[key])}, got {value!r}")
    if key in MINIMUM and value < MINIMUM[key]:
        raise ConfigError(f"{key}: expected >= {MINIMUM[key]}, got {value!r}")
    if key in MAXIMUM and value > MAXIMUM[key]:
        raise ConfigError(f"{key}: expected <= {MAXIMUM[key]}, got {value!r}")
    if key in GIT_TEXT and (not value or value.startswith("-") or not value.isprintable()):
        raise ConfigError(f"{key}: expected text not starting with '-', without control "
                          f"characters, got {short_repr(value)}")
    if key == "repo.branch" and not _branch_name(value):
        raise ConfigError(f"repo.branch: expected a git branch name ([A-Za-z0-9._/-], no '..', "
                          f"'//', leading or trailing '/' or '.lock'), got {short_repr(value)}")
    if key == "snapshot.run":
        from snapops.formats.generation import valid_run     # the rule restore and tags apply

        if not valid_run(value):
            raise ConfigError(f"snapshot.run: expected a run name ([A-Za-z0-9][A-Za-z0-9_.-]*, "
                              f"no '..'; it is a folder and a tag prefix), got "
                              f"{short_repr(value)}")
    if key == "seal.age_recipients":
        from snapops.formats.armor import parse_recipient
        from snapops.formats.errors import KeyMaterialError

        for i, text in enumerate(value):
            try:
                parse_recipient(text)
            except KeyMaterialError as exc:
                raise ConfigError(f"seal.age_recipients[{i}]: {exc}") from None
    if key in META_TOKENS:
        from snapops.formats.contract import META_TOKEN     # the rule every format applies

        if not META_TOKEN.test(value):
            raise ConfigError(f"{key}: expected {META_TOKEN.expected}, got {value[:80]!r}")
    return value


def _branch_name(name: str) -> bool:
    """A safe subset of ``git check-ref-format --branch``."""
    return (re.fullmatch(r"[A-Za-z0-9._/-]+", name) is not None and ".." not in name
            and "//" not in name and not name.startswith("/") and not name.endswith(("/", "."))
            and not name.endswith(".lock") and "/." not in name and not name.startswith("."))


def _fail():
    raise ValueError


def _typed(key: str, value: Any, default: Any) -> Any:
    """``value`` as the type of ``default`` (sizes parsed); TypeError/ValueError if it is not."""
    if key in SIZE_KEYS:
        return parse_size(value)
    if isinstance(value, bool) and not isinstance(default, bool):
        _fail()
    if isinstance(default, bool):
        return _bool(value)
    if isinstance(default, int):
        return int(value)
    if isinstance(default, float):
        value = float(value)
        if not math.isfinite(value):     # TOML's inf and nan: no timeout or delay means that
            _fail()
        return value
    if isinstance(default, tuple):
        value = tuple(value.split(",")) if isinstance(value, str) else tuple(value)
        if not all(isinstance(v, str) for v in value):
            _fail()
        return value
    if not isinstance(value, str):
        _fail()
    return value


def _bool(value) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on",
                                                    "0", "false", "no", "off"):
        return value.lower() in ("1", "true", "yes", "on")
    raise ValueError


def resolve(config: Config, path: str) -> Path:
    """A config path made absolute against the config file's folder."""
    p = Path(os.path.expanduser(path))
    return p if p.is_absolute() else Path(config.base_dir) / p
