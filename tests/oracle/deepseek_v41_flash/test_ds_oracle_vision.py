"""The oracle tower's pieces against hand computations, its loader and its taps."""
from __future__ import annotations

import json
import math

import pytest
import torch

from oracle.deepseek_v41_flash.checkpoint import load_tensors
from oracle.deepseek_v41_flash.config import ModelArgs
from oracle.deepseek_v41_flash.run import run
from oracle.deepseek_v41_flash.vision import Aligner, apply_rotary, get_vision_cos_sin
from tensordiff.pipeline.adapter import RunRequest
from tensordiff.format.capture import MemoryRecorder
from tensordiff.errors import BadInput
from tensordiff.pipeline.inputs import default_image_path
from tensordiff.models.deepseek_v41_flash.synthetic import resolve


def test_rope_tables_are_blocked_row_then_col():
    cos, sin = get_vision_cos_sin(2, 3, 8, 10000.0)
    assert cos.shape == (6, 1, 8)
    f = [10000 ** (-j / 8) for j in (0, 2, 4, 6)]
    r = 1 * 3 + 2  # patch (row 1, col 2)
    want = [1 * fj for fj in f] + [2 * fj for fj in f]
    assert torch.allclose(cos[r, 0], torch.tensor([math.cos(a) for a in want]), atol=1e-6)
    assert torch.allclose(sin[r, 0], torch.tensor([math.sin(a) for a in want]), atol=1e-6)


def test_rotary_is_rotate_half_over_the_head():
    x = torch.arange(8.0).view(1, 1, 8)  # x1 = 0..3, x2 = 4..7
    cos, sin = torch.full((1, 1, 4), 0.5), torch.full((1, 1, 4), 2.0)
    out = apply_rotary(x, cos, sin)[0, 0]
    x1, x2 = torch.arange(4.0), torch.arange(4.0, 8.0)
    assert torch.equal(out, torch.cat([x1 * 0.5 - x2 * 2.0, x2 * 0.5 + x1 * 2.0]))


def test_aligner_pads_right_bottom_and_unfolds_channel_major():
    args = ModelArgs(vision_dim=2, dim=4)
    al = Aligner(args)
    seen = {}
    al.w1.register_forward_pre_hook(lambda m, a: seen.setdefault("x", a[0]))
    n_h, n_w = 4, 5  # cells 2 x 2, pad to 6 x 6
    x = torch.arange(n_h * n_w * 2, dtype=torch.float32).view(n_h * n_w, 2)
    out = al(x, n_h, n_w)
    feats = seen["x"]
    assert out.shape == (4, 4) and feats.shape == (4, 18)
    # token 1 = cell (0, 1): patches x = 3, 4 (5 is padding); feature c * 9 + ky * 3 + kx
    t = 1
    for c in range(2):
        for ky in range(3):
            for kx in range(3):
                y, xx = ky, 3 + kx
                want = x[y * n_w + xx, c] if xx < n_w else 0.0
                assert feats[t, c * 9 + ky * 3 + kx] == want


def test_loader_names_missing_tensors(tmp_path):
    wdir = resolve("synthetic:tiny")
    with pytest.raises(BadInput, match="vision.blocks.9.attn.wqkv.weight"):
        load_tensors(wdir, ["vision.norm.weight", "vision.blocks.9.attn.wqkv.weight"])
    index = json.loads((wdir / "model.safetensors.index.json").read_text())
    got = load_tensors(wdir, ["vision.norm.weight"])
    assert list(got) == ["vision.norm.weight"] and "vision.norm.weight" in index["weight_map"]


def test_runner_taps_the_five_boundaries():
    wdir = resolve("synthetic:tiny")
    args = ModelArgs.from_dir(wdir)
    rec = MemoryRecorder()
    run(RunRequest(weights="synthetic:tiny", weights_dir=wdir, image=default_image_path()), rec)
    t = rec.tensors
    plan = ["plan.size", "plan.grid", "plan.tokens", "plan.flags"]
    assert list(t) == plan + ["patches", "rope.cos", "rope.sin", "block0", "final_norm", "aligner"]
    # the plan: 1024x701 on a 1036x714 canvas, contained to 1036x709 (round, not ceil's 710)
    assert t["plan.size"].tolist()[:6] == [1024, 701, 1036, 714, 1036, 709]
    assert t["plan.grid"].tolist() == [51, 74, 17, 25] and t["plan.tokens"].tolist() == [51 * 74, 444]
    assert t["plan.flags"].tolist() == [0, 0] and all(t[k].dtype == torch.int64 for k in plan)
    n = 51 * 74
    assert t["patches"].shape == (n, 588) and t["patches"].dtype == torch.bfloat16
    assert t["rope.cos"].shape == (n, args.vision_dim // args.vision_n_heads // 2)
    assert t["block0"].shape == (n, args.vision_dim) and t["final_norm"].shape == (n, args.vision_dim)
    assert t["aligner"].shape == (17 * 25, args.dim)
    assert rec.run["inputs"]["grid"] == [51, 74] and rec.run["inputs"]["cells"] == [17, 25]
    assert rec.run["inputs"]["span"] == 444
    # the final norm tap is vision.norm (unit RMS before its weight), not a block's norm
    w = load_tensors(wdir, ["vision.norm.weight"])["vision.norm.weight"].float()
    rms = (t["final_norm"] / w).pow(2).mean(-1).sqrt()
    assert torch.allclose(rms, torch.ones_like(rms), atol=1e-3)


def test_config_refuses_unknown_keys(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"vision_dimm": 3}))
    with pytest.raises(BadInput, match="vision_dimm"):
        ModelArgs.from_dir(tmp_path)
