"""snapops.torch arguments are untrusted: an optimizer state restores whole (dotted prefixes
included) or fails with a typed one-line error; nothing is silently left unrestored."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import snapops.torch
from snapops.formats.errors import DataError
from snapops.formats.model import Snapshot


def _trained():
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    return model, opt


def _fresh():
    return torch.optim.AdamW(torch.nn.Linear(2, 2).parameters())


def test_a_dotted_prefix_restores_the_whole_state():
    _, opt = _trained()
    state = {"w": torch.ones(2), **snapops.torch.optimizer_tensors(opt, prefix="opt.adam")}
    assert sorted(state)[0] == "opt.adam.0.exp_avg"
    fresh = _fresh()
    snapops.torch.load_optimizer(fresh, state, prefix="opt.adam")
    restored = fresh.state_dict()["state"]
    assert len(restored) == 2
    for index, entries in opt.state_dict()["state"].items():
        for key, value in entries.items():
            assert torch.equal(restored[index][key], value)
    assert list(snapops.torch.model_part(state, prefix="opt.adam")) == ["w"]


@pytest.mark.parametrize("prefix", ["optim", "opt.adam"])
def test_a_state_without_the_prefix_is_refused(prefix):
    _, opt = _trained()
    state = snapops.torch.optimizer_tensors(opt, prefix="other")
    with pytest.raises(DataError, match=rf"state: expected entries {prefix}\.<param index>\.<key>, "
                                        r"found none"):
        snapops.torch.load_optimizer(_fresh(), state, prefix=prefix)


def test_entries_for_parameters_the_optimizer_lacks_are_refused():
    _, opt = _trained()
    state = snapops.torch.optimizer_tensors(opt)
    state["optim.7.step"] = torch.tensor(1.0)
    with pytest.raises(DataError, match=r"'optim\.7\.step': the optimizer has no parameter 7"):
        snapops.torch.load_optimizer(_fresh(), state)


@pytest.mark.parametrize("name", ["optim.².step", "optim.01.step", "optim.x.step", "optim.0",
                                  "optim..step"])
def test_a_malformed_index_is_refused(name):
    with pytest.raises(DataError, match=r"expected optim\.<param index>\.<key> \(index in ASCII"):
        snapops.torch.load_optimizer(_fresh(), {name: torch.tensor(1.0)})


def test_a_value_that_is_no_tensor_is_refused():
    with pytest.raises(DataError, match=r"'optim\.0\.step': expected a tensor, got ndarray"):
        snapops.torch.load_optimizer(_fresh(), {"optim.0.step": np.ones(1)})


@pytest.mark.parametrize("call, says", [
    (lambda: snapops.torch.load_optimizer(_fresh(), None),
     r"state: expected a mapping of names to tensors \(a state_dict\), got NoneType"),
    (lambda: snapops.torch.load_optimizer(None, {"optim.0.step": torch.tensor(1.0)}),
     r"optimizer: expected a torch.optim.Optimizer, got NoneType"),
    (lambda: snapops.torch.model_part(None), r"state: expected a mapping of names to tensors"),
    (lambda: snapops.torch.optimizer_tensors(None),
     r"optimizer: expected a torch.optim.Optimizer, got NoneType"),
    (lambda: snapops.torch.optimizer_tensors(_trained()[1], prefix=""),
     r"prefix: expected a non-empty dotted name"),
    (lambda: snapops.torch.model_part({}, prefix="a..b"), r"prefix: expected a non-empty dotted"),
    (lambda: snapops.torch.load_optimizer(_fresh(), {}, prefix=None),
     r"prefix: expected a non-empty dotted name .*, got None"),
    (lambda: snapops.torch.to_state_dict(None),
     r"snapshot: expected a Snapshot or a mapping of names to numpy arrays, got NoneType"),
    (lambda: snapops.torch.to_state_dict({"w": [1, 2]}),
     r"snapshot entry 'w': expected a str name and a numpy array, got str and list"),
])
def test_bad_arguments_are_data_errors(call, says):
    with pytest.raises(DataError, match=says):
        call()


def test_to_state_dict_takes_a_mapping_of_arrays():
    arrays = {"w": np.arange(3, dtype=np.float32), "n": np.array(7, np.int64)}
    out = snapops.torch.to_state_dict(arrays)
    assert torch.equal(out["w"], torch.arange(3, dtype=torch.float32))
    assert out["n"].dtype == torch.int64 and int(out["n"]) == 7
    same = snapops.torch.to_state_dict(Snapshot(arrays))
    assert all(torch.equal(same[k], out[k]) for k in arrays)
