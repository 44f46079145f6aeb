"""The front door: ``snapops.save/load/verify/inspect`` and the CLI take the same typed options
for every format, and say what works when something does not."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
import torch

import snapops
from snapops.cli import main
from snapops.config.loader import load_config
from snapops.formats.errors import ConfigError, DataError, SignatureError
from snapops.formats.registry import HANDLER_MODULES, handler
from snapops.formats.tensors import numpy_to_tensor

TS = "2026-01-02T03:04:05Z"
FORMATS = sorted(HANDLER_MODULES)


def target(tmp_path, name: str):
    if name == "aeroset":
        return tmp_path / "set" / "model.aeroset.json"
    return tmp_path / f"state{handler(name).suffixes[0]}"


def torch_state() -> dict:
    return {"layer.0.weight": torch.randn(3, 4).to(torch.bfloat16),
            "layer.0.bias": torch.randn(4), "emb.weight": torch.randn(5, 2).to(torch.float16),
            "step": torch.tensor(40, dtype=torch.int64), "mask": torch.tensor([True, False])}


@pytest.mark.parametrize("name", FORMATS)
def test_save_load_verify_inspect_through_the_front_door(tmp_path, name):
    state = torch_state()
    result = snapops.save(state, target(tmp_path, name), gen=1, ts=TS, build="b7")
    assert isinstance(result, snapops.WriteResult) and result.format == name
    assert result.arrays == len(state) and len(result.sha256) == 64
    back = snapops.load(result.path)
    for key, tensor in state.items():
        again = numpy_to_tensor(back[key])
        assert again.dtype == tensor.dtype and torch.equal(again, tensor), key
    assert str(back.meta["gen"]) == "1" and back.meta["build"] == "b7"
    report = snapops.verify(result.path)
    assert report.ok, report.failure
    info = snapops.inspect(result.path)
    dtypes = {row["name"]: row["dtype"] for row in info["arrays"]}
    assert dtypes == {"layer.0.weight": "bf16", "layer.0.bias": "f32", "emb.weight": "f16",
                      "step": "i64", "mask": "bool"}


@pytest.mark.parametrize("name", FORMATS)
def test_unknown_options_name_the_allowed_ones(tmp_path, name):
    with pytest.raises(DataError, match=r"unknown option 'bild' \(did you mean build\?\); "
                                        r"allowed: gen, ts, build"):
        snapops.save({"w": np.ones(2)}, target(tmp_path, name), bild="b1")
    path = snapops.save({"w": np.ones(2)}, target(tmp_path, name)).path
    with pytest.raises(DataError, match=r"allowed: hmac_key, trusted_keys, require_signature"):
        snapops.verify(path, require_sig=True)


@pytest.mark.parametrize("name", [n for n in FORMATS if not handler(n).capabilities.can_sign])
def test_demanded_seals_fail_closed_and_say_what_to_do(tmp_path, name):
    path = snapops.save({"w": np.ones(2)}, target(tmp_path, name)).path
    title = handler(name).title
    report = snapops.verify(path, require_signature=True, require_hmac=True)
    assert not report.ok
    assert f"{title} files carry no signature or HMAC" in str(report.failure)
    assert "snapops verify REPO --run R" in str(report.failure)
    with pytest.raises(SignatureError, match="carry no signature"):
        snapops.load(path, require_signature=True)


def test_torch_bf16_state_dict_to_aero_with_gen(tmp_path):
    sd = {"w": torch.ones(3, dtype=torch.bfloat16, device="cpu")}
    snapops.save(sd, tmp_path / "x.aero", gen=1)
    back = snapops.load(tmp_path / "x.aero")
    assert back["w"].dtype == ml_dtypes.bfloat16 and back.meta["gen"] == 1


FLOAT8 = ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
          "float8_e8m0fnu"]


@pytest.mark.parametrize("name", FORMATS)
def test_every_torch_float8_comes_back_with_its_dtype_and_all_256_bit_patterns(tmp_path, name):
    bits = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    state = {f"scale.{kind}": bits.view(getattr(torch, kind)) for kind in FLOAT8}
    back = snapops.load(snapops.save(state, target(tmp_path, name)).path)
    for key, tensor in state.items():
        restored = numpy_to_tensor(back[key])
        assert restored.dtype == tensor.dtype, key
        assert torch.equal(restored.view(torch.uint8), bits), key


def test_options_object_and_keywords_are_one_way(tmp_path):
    from snapops.formats.fold import FoldOptions

    options = FoldOptions(compression="none", ecc="rs(16)", gen=3)
    first = snapops.save({"w": np.arange(9.0)}, tmp_path / "a.fold", options)
    second = snapops.save({"w": np.arange(9.0)}, tmp_path / "b.fold", compression="none",
                          ecc="rs(16)", gen=3)
    assert first.sha256 == second.sha256
    with pytest.raises(DataError, match="options must be FoldOptions"):
        snapops.save({"w": np.ones(2)}, tmp_path / "c.fold", options=42)


def test_cli_option_values_are_typed_by_the_field(tmp_path, capsys):
    np.savez(tmp_path / "s.npz", w=np.arange(12.0))
    assert main(["convert", str(tmp_path / "s.npz"), str(tmp_path / "s.fold"),
                 "--option", "compression=none", "--option", "level=5", "--gen", "4"]) == 0
    assert "sha256=" in capsys.readouterr().out
    assert snapops.load(tmp_path / "s.fold").meta["gen"] == 4
    assert main(["convert", str(tmp_path / "s.npz"), str(tmp_path / "t.fold"),
                 "--option", "level=high"]) == 2
    assert "level='high': expected int" in capsys.readouterr().err
    assert main(["convert", str(tmp_path / "s.npz"), str(tmp_path / "u.fold"),
                 "--row-blocking"]) == 2
    assert "unknown option 'row_blocking'" in capsys.readouterr().err


def test_cli_verify_fails_closed_for_formats_without_seals(tmp_path, capsys):
    snapops.save({"w": np.ones(2)}, tmp_path / "x.fold")
    assert main(["verify", str(tmp_path / "x.fold"), "--require-signature",
                 "--require-hmac"]) == 1
    err = capsys.readouterr().err
    assert "FOLD files carry no signature or HMAC" in err and "Traceback" not in err


def test_cli_convert_inspect_verify_pt(tmp_path, capsys):
    torch.save({"enc": {"w": torch.ones(2, 2, dtype=torch.bfloat16)}, "b": torch.zeros(3)},
               tmp_path / "m.pt")
    assert main(["convert", str(tmp_path / "m.pt"), str(tmp_path / "m.wtxt"), "--ts", TS]) == 0
    assert main(["convert", str(tmp_path / "m.wtxt"), str(tmp_path / "back.pt")]) == 0
    back = torch.load(tmp_path / "back.pt", weights_only=True)
    assert back["enc.w"].dtype == torch.bfloat16 and torch.equal(back["enc.w"],
                                                                 torch.ones(2, 2).bfloat16())
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "back.pt")]) == 0
    out = capsys.readouterr().out
    assert "enc.w: bf16 [2x2]" in out and "b: f32 [3]" in out
    assert main(["inspect", str(tmp_path / "m.wtxt"), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["arrays"]
    assert {r["name"]: r["dtype"] for r in rows} == {"b": "f32", "enc.w": "bf16"}
    assert main(["verify", str(tmp_path / "back.pt")]) == 0
    assert "no seal" in capsys.readouterr().out


def test_pt_with_non_tensor_leaves_is_refused_by_name(tmp_path, capsys):
    torch.save({"w": torch.ones(2), "epoch": 3}, tmp_path / "ckpt.pt")
    assert main(["inspect", str(tmp_path / "ckpt.pt")]) == 2
    err = capsys.readouterr().err
    assert "array epoch" in err and "not a tensor" in err


def test_bf16_safetensors_through_npz_and_back(tmp_path):
    state = {"w": np.arange(6, dtype=np.float32).astype(ml_dtypes.bfloat16),
             "h": np.ones(3, np.float16)}
    snapops.save(state, tmp_path / "a.safetensors")
    assert main(["convert", str(tmp_path / "a.safetensors"), str(tmp_path / "a.npz")]) == 0
    assert main(["convert", str(tmp_path / "a.npz"), str(tmp_path / "b.safetensors")]) == 0
    back = snapops.load(tmp_path / "b.safetensors")
    for key, array in state.items():
        assert back[key].dtype == array.dtype and back[key].tobytes() == array.tobytes()
    from safetensors.torch import load_file

    assert load_file(tmp_path / "b.safetensors")["w"].dtype == torch.bfloat16


def test_config_and_cli_read_sizes_the_same_way(tmp_path):
    from snapops.cli._common import parse_size

    config = load_config(overrides={"snapshot.shard_max": "32M"}, env={})
    assert config.snapshot.shard_max == parse_size("32M") == 32_000_000
    assert load_config(overrides={"snapshot.shard_max": "32MiB"}, env={}).snapshot.shard_max \
        == 32 << 20
    with pytest.raises(ConfigError, match=r"shard_max: not a size: .32 parsecs. \(try 32MiB"):
        load_config(overrides={"snapshot.shard_max": "32 parsecs"}, env={})
    with pytest.raises(ConfigError, match=r"shard_max: not a size: .\u0663\u0662MiB."):
        load_config(overrides={"snapshot.shard_max": "\u0663\u0662MiB"}, env={})  # not 32 MiB
