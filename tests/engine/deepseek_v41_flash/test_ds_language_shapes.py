"""The engine checks every language tensor's shape against the config before reading it
(`engine/deepseek_v41_flash/shapes.py`), as the oracle's modules do: a checkpoint
tensor of another shape is exit 2 naming it, from the engine route alone."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from engine.deepseek_v41_flash.config import Config
from engine.deepseek_v41_flash.model import LanguageModel
from engine.deepseek_v41_flash.shapes import language_shapes
from tensordiff.models.deepseek_v41_flash.synthetic import resolve

from cli_runner import run_cli

INDEX = "model.safetensors.index.json"


@pytest.mark.parametrize("spec", ["synthetic:tiny", "synthetic:tiny-fp8", "synthetic:tiny-fp8-converted"])
def test_every_tensor_read_has_its_implied_shape(spec):
    """The clean case: no false alarm on any official layout, and every name is covered. The
    release's int8-stored FP4 experts hold two values a byte: half the implied columns."""
    d = resolve(spec)
    cfg = Config.load(d)
    want = language_shapes(cfg, range(cfg.n_layers))
    names = LanguageModel.tensor_names(cfg)
    assert set(names) <= set(want)
    wmap = json.loads((d / INDEX).read_text())["weight_map"]
    packed = 0
    for n in names:
        with safe_open(d / wmap[n], "pt") as f:
            sl = f.get_slice(n)
            implied = want[n]
            if sl.get_dtype() == "I8":
                assert ".ffn.experts." in n and ".shared_experts." not in n, n
                implied, packed = (*implied[:-1], implied[-1] // 2), packed + 1
            assert tuple(sl.get_shape()) == implied, n
    assert (packed > 0) == (spec == "synthetic:tiny-fp8")


def test_the_released_config_is_covered():
    cfg = Config()
    want = language_shapes(cfg, (2, 20))
    assert want["layers.20.attn.indexer.wq_b.weight"] == (32 * 128, 1280)
    assert want["layers.2.attn.wo_a.weight"] == (8 * 1024, 64 * 512 // 8)
    assert set(LanguageModel.tensor_names(cfg, (2, 20))) <= set(want)


def _reshaped(src, dst, victim, make):
    shutil.copytree(src, dst)
    shard = dst / json.loads((dst / INDEX).read_text())["weight_map"][victim]
    t = load_file(str(shard))
    t[victim] = make(t[victim])
    save_file(t, str(shard))


@pytest.mark.parametrize("spec,victim,make", [
    # transposed: same element count, so nothing downstream need notice
    ("synthetic:tiny", "layers.0.attn.wo_a.weight", lambda w: w.t().contiguous()),
    ("synthetic:tiny", "layers.2.attn.indexer.wk.weight", lambda w: w[:, :16].contiguous()),
    ("synthetic:tiny", "layers.3.engram.embed.weight", lambda w: torch.cat([w, w[:1]])),
    ("synthetic:tiny", "layers.1.ffn.gate.bias_vl", lambda w: w[:-1].contiguous()),
    ("synthetic:tiny-fp8", "layers.0.attn.wq_b.scale", lambda s: s.t().contiguous()),
    ("synthetic:tiny-fp8", "layers.0.ffn.experts.3.w2.weight", lambda w: w.t().contiguous()),
    ("synthetic:tiny-fp8-converted", "layers.0.ffn.experts.3.w2.weight", lambda w: w.t().contiguous()),
])
def test_a_wrongly_shaped_tensor_is_exit_2_naming_it_on_the_engine_route(tmp_path, capsys, spec, victim, make):
    ck = tmp_path / "ck"
    _reshaped(resolve(spec), ck, victim, make)
    code, _, err = run_cli(["dump", "deepseek-v4.1-flash", "--side", "engine", "--weights", ck, "--out",
                            tmp_path / "e", "--prompt", "Look: <image>"], capsys)
    assert code == 2 and victim in err and "shape" in err and err.count("\n") == 1, err
    assert not (tmp_path / "e").exists()
