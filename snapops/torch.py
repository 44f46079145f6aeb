"""Torch-native restore: a sealed generation as a ``state_dict`` of torch tensors.

Names are the original ones (``blocks.0.attn.in_proj_weight``) and every tensor has the dtype
and the bits it was requested with (bf16, f16, f32, f64, integers, bool), ready for
``model.load_state_dict``. torch is imported on use; without it the error says how to get it.

Example::

    import snapops.torch
    state = snapops.torch.load_state_dict("git://host/snapshots.git", "run1", gen=40,
                                          trusted_keys="keys/", hmac_key="keys/hmac.key")
    model.load_state_dict(state)
"""

from __future__ import annotations

import os
from typing import Any

from snapops.formats.errors import ConfigError
from snapops.formats.model import Snapshot

__all__ = ["load_state_dict", "to_state_dict"]


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
