"""Engine pieces of the Qwen3-VL tower against independent definitions (torch ops, hand tables)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine.qwen3_vl import preprocess as P
from engine.qwen3_vl.config import ProcessorConfig
from engine.qwen3_vl.layers import gelu_erf, gelu_tanh, layer_norm
from engine.qwen3_vl.pos_embed import interpolate_pos_embed
from engine.qwen3_vl.rope import vision_rope
from engine.runtime.spatial_merge import merge_order_coords, merge_order_index, shuffle


def test_merge_order_coords_by_hand():
    r, c = merge_order_coords(2, 4, 2)
    assert list(zip(r.tolist(), c.tolist())) == [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3), (1, 2), (1, 3)]
    assert merge_order_index(2, 4, 2).tolist() == [0, 1, 4, 5, 2, 3, 6, 7]


def test_merge_order_rejects_odd_grid():
    with pytest.raises(ValueError):
        merge_order_coords(3, 4, 2)


def test_shuffle_groups_four_rows():
    x = torch.arange(8 * 3).view(8, 3)
    assert shuffle(x, 2)[1].tolist() == list(range(12, 24))


def test_patchify_columns_and_order():
    cfg = ProcessorConfig(patch_size=2, temporal_patch_size=2, merge_size=2)
    img = torch.arange(3 * 4 * 8, dtype=torch.float32).view(3, 4, 8)
    rows = P.patchify(img, cfg)  # grid 2x4
    assert rows.shape == (8, 3 * 2 * 2 * 2)
    # row 2 in merge order is patch (1, 0); columns (c, t, py, px)
    patch = img[:, 2:4, 0:2]  # [C, 2, 2]
    expect = patch.unsqueeze(1).expand(3, 2, 2, 2).reshape(-1)
    assert torch.equal(rows[2], expect)
    raster = P.patchify(img, cfg, raster=True)
    assert torch.equal(raster[merge_order_index(2, 4, 2)], rows)
    assert not torch.equal(raster, rows)


def test_normalise_pil_and_torchvision_semantics():
    cfg = ProcessorConfig()
    img = np.arange(256, dtype=np.uint8).reshape(16, 16, 1).repeat(3, -1)
    pil = P.normalise(img, cfg, "pil")
    ref = ((img.astype(np.float64) * (1 / 255)).astype(np.float32) - np.float32(0.5)) / np.float32(0.5)
    assert np.array_equal(pil.permute(1, 2, 0).numpy(), ref)
    tv = P.normalise(img, cfg, "torchvision")
    assert torch.equal(tv, (torch.from_numpy(img).permute(2, 0, 1).float() - 127.5) / 127.5)
    assert pil.abs().max() <= 1 and tv.abs().max() <= 1


@pytest.mark.parametrize("gh,gw", [(4, 6), (16, 16), (6, 22), (48, 48), (2, 64)])
@pytest.mark.parametrize("align", [True, False])
def test_pos_embed_is_bilinear_resample_in_merge_order(gh, gw, align):
    side = 8
    g = torch.Generator().manual_seed(0)
    table = torch.randn(side * side, 5, generator=g, dtype=torch.float64)
    got = interpolate_pos_embed(table, gh, gw, 1, 2, align_corners=align, dtype=torch.float64)
    img = table.T.reshape(1, 5, side, side)
    ref = F.interpolate(img, size=(gh, gw), mode="bilinear", align_corners=align)[0]  # [5, gh, gw]
    ref = ref.reshape(5, gh * gw).T[merge_order_index(gh, gw, 2)]
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-6)


def test_rope_layout_and_swap():
    cos, sin = vision_rope(4, 6, 1, 2, head_dim=16, theta=10000.0)
    assert cos.shape == (24, 16)
    torch.testing.assert_close(cos ** 2 + sin ** 2, torch.ones_like(cos))
    # row 5 of merge order is patch (0, 3): angles cat(0·f, 3·f) twice
    f = 1.0 / 10000.0 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8)
    emb = torch.cat([0 * f, 3 * f, 0 * f, 3 * f])
    torch.testing.assert_close(cos[5], emb.cos())
    swapped, _ = vision_rope(4, 6, 1, 2, head_dim=16, theta=10000.0, swap_hw=True)
    assert not torch.equal(swapped, cos)


def test_layers_match_torch():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(7, 32, generator=g)
    w, b = torch.randn(32, generator=g), torch.randn(32, generator=g)
    torch.testing.assert_close(layer_norm(x, w, b), F.layer_norm(x, (32,), w, b, 1e-6), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gelu_tanh(x), F.gelu(x, approximate="tanh"))
    torch.testing.assert_close(gelu_erf(x), F.gelu(x))
    assert (gelu_tanh(x) - gelu_erf(x)).abs().max() > 1e-5  # the two really differ
