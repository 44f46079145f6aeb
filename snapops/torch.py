"""Torch-native restore: a sealed generation as a ``state_dict`` of torch tensors.

Names are the original ones (``blocks.0.attn.in_proj_weight``) and every tensor has the dtype
and the bits it was requested with (bf16, f16, f32, f64, integers, bool), ready for
``model.load_state_dict``. torch is imported on use; without it the error says how to get it.

An optimizer's tensors (AdamW's ``step``, ``exp_avg``, ``exp_avg_sq`` per parameter) travel
in the same generation under flat names (``optim.<param index>.<key>``):
:func:`optimizer_tensors` gives them for ``Snapshotter.request``, :func:`load_optimizer` puts
them back (the hyperparameters come from the code that builds the optimizer).

Example::

    import snapops.torch
    snap.request({**model.state_dict(), **snapops.torch.optimizer_tensors(opt)}, gen=step)
    ...
    state = snapops.torch.load_state_dict("git://host/snapshots.git", "run1", gen=40,
                                          trusted_keys="keys/", hmac_key="keys/hmac.key")
    snapops.torch.load_optimizer(opt, state)
    model.load_state_dict(snapops.torch.model_part(state))
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from snapops.formats.errors import ConfigError, DataError
from snapops.formats.model import Snapshot

__all__ = ["load_optimizer", "load_state_dict", "model_part", "optimizer_tensors",
           "to_state_dict"]

OPTIM_PREFIX = "optim"


def _torch():
    try:
        import torch
    except ImportError:
        raise ConfigError("snapops.torch needs PyTorch: pip install torch (or use "
                          "snapops.load_generation for numpy arrays)") from None
    return torch


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _prefix(prefix) -> str:
    """A dotted name: non-empty parts, no control characters (``optim``, ``opt.adam``)."""
    if not isinstance(prefix, str) or not prefix or any(not part for part in prefix.split(".")) \
            or not prefix.isprintable():
        raise DataError(f"prefix: expected a non-empty dotted name like 'optim' or 'opt.adam', "
                        f"got {_short(prefix)}")
    return prefix


def _mapping(state, what: str) -> Mapping:
    if not isinstance(state, Mapping):
        raise DataError(f"{what}: expected a mapping of names to tensors (a state_dict), got "
                        f"{type(state).__name__}")
    return state


def _optimizer(optimizer):
    if not (callable(getattr(optimizer, "state_dict", None)) and
            callable(getattr(optimizer, "load_state_dict", None))):
        raise DataError(f"optimizer: expected a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    return optimizer


def to_state_dict(snapshot: Snapshot | Mapping[str, np.ndarray]) -> dict[str, Any]:
    """The snapshot's arrays (a Snapshot, or a mapping of names to numpy arrays) as torch
    tensors of the same dtypes and bits (sharing memory where the array allows it)."""
    _torch()
    from snapops.formats.tensors import numpy_to_tensor

    arrays = snapshot.arrays if isinstance(snapshot, Snapshot) else snapshot
    if not isinstance(arrays, Mapping):
        raise DataError(f"snapshot: expected a Snapshot or a mapping of names to numpy arrays, "
                        f"got {type(snapshot).__name__}")
    out = {}
    for name, array in arrays.items():
        if not isinstance(name, str) or not isinstance(array, np.ndarray):
            raise DataError(f"snapshot entry {_short(name)}: expected a str name and a numpy "
                            f"array, got {type(name).__name__} and {type(array).__name__}")
        out[name] = numpy_to_tensor(array)
    return out


def load_state_dict(repo_or_url: str | os.PathLike, run: str, *, gen: int | None = None,
                    rev: str | None = None, verify: bool = True,
                    **options: Any) -> dict[str, Any]:
    """:func:`snapops.restore.load_generation` as ``name -> torch.Tensor`` (CPU tensors; move
    them with ``model.load_state_dict``, which copies into the model's own devices)."""
    _torch()
    from snapops.restore import load_generation

    return to_state_dict(load_generation(repo_or_url, run, gen=gen, rev=rev, verify=verify,
                                         **options))


def optimizer_tensors(optimizer, prefix: str = OPTIM_PREFIX) -> dict[str, Any]:
    """The optimizer's per-parameter tensor state as ``<prefix>.<param index>.<key>``;
    entries that are not tensors are refused by name (nothing is dropped silently)."""
    torch = _torch()
    prefix = _prefix(prefix)
    out = {}
    for index, entries in _optimizer(optimizer).state_dict()["state"].items():
        for key, value in entries.items():
            if not torch.is_tensor(value):
                raise ConfigError(f"optimizer state {index}.{key} is a {type(value).__name__}, "
                                  "not a tensor: only tensors are snapshotted")
            out[f"{prefix}.{index}.{key}"] = value
    return out


def load_optimizer(optimizer, state: Mapping[str, Any], prefix: str = OPTIM_PREFIX) -> None:
    """Put the tensors :func:`optimizer_tensors` named back into ``optimizer`` (its own
    param_groups are kept). DataError if ``state`` holds no ``<prefix>.`` entry, a malformed
    one, or one for a parameter index the optimizer does not have."""
    torch = _torch()
    prefix = _prefix(prefix)
    state = _mapping(state, "state")
    current = _optimizer(optimizer).state_dict()
    params = {i for group in current["param_groups"] for i in group["params"]}
    per: dict[int, dict[str, Any]] = {}
    for name, tensor in state.items():
        if not isinstance(name, str) or not name.startswith(prefix + "."):
            continue
        index, _, key = name[len(prefix) + 1:].partition(".")
        if not (index.isascii() and index.isdigit() and len(index) <= 18 and
                index == str(int(index))) or not key:
            raise DataError(f"{_short(name)}: expected {prefix}.<param index>.<key> (index in "
                            "ASCII digits without leading zeros)")
        if not torch.is_tensor(tensor):
            raise DataError(f"{_short(name)}: expected a tensor, got {type(tensor).__name__}")
        if int(index) not in params:
            raise DataError(f"{_short(name)}: the optimizer has no parameter {index} (expected "
                            f"an index below {len(params)}: the state of another optimizer?)")
        per.setdefault(int(index), {})[key] = tensor
    if not per:
        raise DataError(f"state: expected entries {prefix}.<param index>.<key>, found none "
                        f"(prefix {prefix!r} among {len(state)} entries)")
    optimizer.load_state_dict({"state": per, "param_groups": current["param_groups"]})


def model_part(state: Mapping[str, Any], prefix: str = OPTIM_PREFIX) -> dict[str, Any]:
    """``state`` without the optimizer's entries: what ``model.load_state_dict`` takes."""
    prefix = _prefix(prefix)
    return {name: t for name, t in _mapping(state, "state").items()
            if not (isinstance(name, str) and name.startswith(prefix + "."))}
