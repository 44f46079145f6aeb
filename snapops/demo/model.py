"""The demo's model: a small GPT-style transformer trained with AdamW on text that ships with
Python itself (the help topics of ``pydoc_data``), so the demo needs no download.

Mixed dtypes as in practice: float32 master weights everywhere except the token and position
embeddings, which are bfloat16 parameters; the state also carries an int64 step counter.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ModelSize:
    layers: int = 10
    width: int = 512
    heads: int = 8
    context: int = 128
    batch: int = 4

    @classmethod
    def quick(cls) -> "ModelSize":
        return cls(layers=2, width=64, heads=4, context=32, batch=4)


def corpus() -> np.ndarray:
    """Bytes of Python's own help texts (~450 KB), as token ids 0..255."""
    from pydoc_data.topics import topics

    text = "\n".join(topics[key] for key in sorted(topics))
    return np.frombuffer(text.encode("utf-8"), np.uint8)


def build_model(size: ModelSize, seed: int = 0):
    """The model, its AdamW optimizer and a batch sampler over the corpus."""
    import torch

    torch.manual_seed(seed)
    model = _gpt(size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    data = torch.from_numpy(corpus().astype(np.int64))
    generator = torch.Generator().manual_seed(seed)

    def batch():
        starts = torch.randint(0, data.numel() - size.context - 1, (size.batch,),
                               generator=generator)
        rows = torch.stack([data[s:s + size.context + 1] for s in starts.tolist()])
        return rows[:, :-1], rows[:, 1:]

    return model, optimizer, batch


def train_step(model, optimizer, batch) -> float:
    import torch.nn.functional as F

    x, y = batch()
    logits = model(x)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.item()


def snapshot_state(model, step: int) -> dict:
    """What the demo snapshots: every parameter under its torch name, and the step."""
    import torch

    state = dict(model.state_dict())
    state["train.step"] = torch.tensor(step, dtype=torch.int64)
    return state


def _gpt(size: ModelSize):
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(size.width), nn.LayerNorm(size.width)
            self.attn = nn.MultiheadAttention(size.width, size.heads, batch_first=True)
            self.mlp = nn.Sequential(nn.Linear(size.width, 4 * size.width), nn.GELU(),
                                     nn.Linear(4 * size.width, size.width))

        def forward(self, x, mask):
            h = self.ln1(x)
            x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(256, size.width, dtype=torch.bfloat16)
            self.pos = nn.Embedding(size.context, size.width, dtype=torch.bfloat16)
            self.blocks = nn.ModuleList(Block() for _ in range(size.layers))
            self.lnf = nn.LayerNorm(size.width)
            self.head = nn.Linear(size.width, 256, bias=False)
            mask = torch.triu(torch.full((size.context, size.context), float("-inf")), 1)
            self.register_buffer("mask", mask, persistent=False)

        def forward(self, idx):
            t = idx.shape[1]
            x = (self.tok(idx) + self.pos(torch.arange(t))).float()
            for block in self.blocks:
                x = block(x, self.mask[:t, :t])
            return self.head(self.lnf(x))

    return GPT()


def parameter_count(model) -> int:
    return sum(p.numel() for p in model.parameters())
