"""The oracle taps transformers' Qwen3-VL where the contract says, and loads weights strictly."""
import importlib.util
import json
import shutil

import pytest
import torch

from oracle.qwen3_vl import config as C
import oracle.qwen3_vl.vision as M
from oracle.qwen3_vl import positions as POS
from oracle.qwen3_vl import processor as PR
from oracle.qwen3_vl.hooks import Taps
from tensordiff.errors import BadInput
from tensordiff.models.qwen3_vl.synthetic import ensure


@pytest.fixture(scope="module")
def tiny():
    ckpt = ensure("tiny")
    return ckpt, C.load_config(ckpt)


def pixels(gh=4, gw=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(gh * gw, 1536, generator=g) * 2 - 1, torch.tensor([[1, gh, gw]])


def test_taps_are_what_transformers_computes(tiny):
    ckpt, cfg = tiny
    model = M.build(cfg, ckpt, torch.float32)
    seen = {}
    h1 = model.patch_embed.register_forward_hook(lambda m, i, o: seen.__setitem__("patch", o))
    h2 = model.blocks[0].register_forward_pre_hook(lambda m, a, kw: seen.__setitem__("block_in", a[0]), with_kwargs=True)
    taps = Taps(model)
    px, grid = pixels()
    with torch.inference_mode():
        out = model(px, grid_thw=grid)
    taps.close()
    h1.remove(), h2.remove()
    t = taps.tensors
    assert torch.equal(seen["patch"] + t["pos_embed"], seen["block_in"])  # exactly the addend
    assert torch.equal(t["aligner"], out.pooler_output)
    for k, d in enumerate(out.deepstack_features):
        assert torch.equal(t[f"deepstack.{k}"], d)
    assert t["final_norm"].shape == (24, 64) and t["rope.cos"].shape == (24, 16)
    assert not model.blocks[0]._forward_hooks and not model.patch_embed._forward_hooks
    assert not torch.overrides._get_current_function_mode_stack()


def test_rope_buffers_stay_fp32_in_bf16(tiny):
    ckpt, cfg = tiny
    model = M.build(cfg, ckpt, torch.bfloat16)
    assert model.rotary_pos_emb.inv_freq.dtype == torch.float32
    assert model.blocks[0].attn.qkv.weight.dtype == torch.bfloat16


def test_missing_tensor_is_refused(tiny, tmp_path):
    from safetensors.torch import load_file, save_file

    ckpt, cfg = tiny
    bad = tmp_path / "ckpt"
    shutil.copytree(ckpt, bad)
    index = json.loads((bad / "model.safetensors.index.json").read_text())
    shard = bad / next(iter(index["weight_map"].values()))
    tensors = load_file(str(shard))
    del tensors["model.visual.blocks.1.norm2.bias"]
    save_file(tensors, str(shard))
    del index["weight_map"]["model.visual.blocks.1.norm2.bias"]
    (bad / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(BadInput, match="missing"):
        M.build(C.load_config(bad), bad, torch.float32)


def test_processor_choice_is_recorded(tiny):
    ckpt, _ = tiny
    proc, ran = PR.build(ckpt, "pil")
    assert ran == "pil" and type(proc).__name__ == "Qwen2VLImageProcessorPil"
    if importlib.util.find_spec("torchvision") is None:
        assert PR.available() == "pil"
        with pytest.raises(BadInput, match="torchvision"):
            PR.build(ckpt, "torchvision")
    else:
        _, ran = PR.build(ckpt, "torchvision")
        assert ran == "torchvision"


def test_positions_from_get_rope_index_by_hand(tiny):
    _, cfg = tiny
    grid = torch.tensor([[1, 4, 6]])
    ids = POS.input_ids("ab<image>c", grid, cfg)
    pos, deltas, dec = POS.mrope(ids, grid, cfg, decode=2)
    assert pos.tolist() == [[0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7],
                            [0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7],
                            [0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7]]
    assert deltas.tolist() == [-3]
    assert dec.tolist() == [[8, 9]] * 3


def test_config_that_is_not_qwen3vl_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(BadInput):
        C.load_config(tmp_path)
