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
from typing import Any

from snapops.formats.errors import ConfigError
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


def to_state_dict(snapshot: Snapshot) -> dict[str, Any]:
    """The snapshot's arrays as torch tensors of the same dtypes and bits (sharing memory
    where the array allows it)."""
    _torch()
    from snapops.formats.tensors import numpy_to_tensor

    return {name: numpy_to_tensor(array) for name, array in snapshot.arrays.items()}


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
    out = {}
    for index, entries in optimizer.state_dict()["state"].items():
        for key, value in entries.items():
            if not torch.is_tensor(value):
                raise ConfigError(f"optimizer state {index}.{key} is a {type(value).__name__}, "
                                  "not a tensor: only tensors are snapshotted")
            out[f"{prefix}.{index}.{key}"] = value
    return out


def load_optimizer(optimizer, state: dict[str, Any], prefix: str = OPTIM_PREFIX) -> None:
    """Put the tensors :func:`optimizer_tensors` named back into ``optimizer`` (its own
    param_groups are kept)."""
    per: dict[int, dict[str, Any]] = {}
    for name, tensor in state.items():
        head, _, rest = name.partition(".")
        index, _, key = rest.partition(".")
        if head != prefix:
            continue
        if not index.isdigit() or not key:
            raise ConfigError(f"{name}: expected {prefix}.<param index>.<key>")
        per.setdefault(int(index), {})[key] = tensor
    optimizer.load_state_dict({"state": per,
                               "param_groups": optimizer.state_dict()["param_groups"]})


def model_part(state: dict[str, Any], prefix: str = OPTIM_PREFIX) -> dict[str, Any]:
    """``state`` without the optimizer's entries: what ``model.load_state_dict`` takes."""
    return {name: t for name, t in state.items() if not name.startswith(prefix + ".")}
