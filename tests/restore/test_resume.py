"""Resume training from a repository: model and AdamW state saved as one sealed generation,
committed with real git, restored into a fresh model and optimizer; the next step is the same
bit for bit as if training had never stopped."""

from __future__ import annotations

import pytest
import torch

import snapops.torch
from snapops.formats.errors import ConfigError
from snapops.formats.generation.write import GenerationSpec, seal_in_ledger, write_generation
from snapops.formats.keys import coerce_trusted, load_hmac_key
from snapops.formats.tensors import tensor_to_numpy

from ..daemon.gitserve import git

TS = "2026-01-02T03:04:05Z"


def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(11, 8), torch.nn.LayerNorm(8),
                                torch.nn.Linear(8, 11))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def step(model, opt, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 11, (4, 6), generator=g)
    loss = torch.nn.functional.cross_entropy(model(tokens).reshape(-1, 11), tokens.reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()


def test_resume_from_a_sealed_generation_continues_bit_exact(tmp_path, keydir):
    model, opt = build()
    for seed in range(3):
        step(model, opt, seed)
    state = {**model.state_dict(), **snapops.torch.optimizer_tensors(opt)}
    repo = tmp_path / "repo"
    git("init", "-q", "-b", "main", str(repo))
    spec = GenerationSpec(run="r", format="aero", build="t",
                          sign_key=keydir / "signing.key",
                          hmac_key=load_hmac_key(keydir / "hmac.key"))
    written = write_generation(repo, spec, 3, TS,
                               {k: tensor_to_numpy(v, k) for k, v in state.items()})
    seal_in_ledger(repo, "r", written)
    git("add", "-A", cwd=repo)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "gen 3", cwd=repo)

    restored = snapops.torch.load_state_dict(
        f"file://{repo}", "r", trusted_keys=coerce_trusted([keydir / "signing.pub"]),
        hmac_key=keydir / "hmac.key", require_signature=True, require_hmac=True)
    fresh, fresh_opt = build()
    fresh.load_state_dict(snapops.torch.model_part(restored))
    snapops.torch.load_optimizer(fresh_opt, restored)
    assert fresh_opt.state_dict()["state"][0]["exp_avg"].dtype == torch.float32

    step(model, opt, 3)
    step(fresh, fresh_opt, 3)
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), name


def test_optimizer_entries_that_are_not_tensors_are_refused_by_name():
    param = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([param], lr=0.1, momentum=0.9)
    opt.state[param]["momentum_buffer"] = None     # what SGD keeps before its first step
    with pytest.raises(ConfigError, match=r"optimizer state 0\.momentum_buffer is a NoneType"):
        snapops.torch.optimizer_tensors(opt)
