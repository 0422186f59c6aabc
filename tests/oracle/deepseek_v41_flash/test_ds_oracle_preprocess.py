"""The oracle's preprocessing against hand-computed plans and a position-coded picture."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from oracle.deepseek_v41_flash.config import ModelArgs
from oracle.deepseek_v41_flash.image_processor import (IMAGE, IMAGE_END, IMAGE_NEW_LINE, IMAGE_START, load_image,
                                                       num_image_tokens, plan_image_grid, image_token_types)

ARGS = ModelArgs()

# (width, height) -> (best_w, best_h, grid_h, grid_w, cells_h, cells_w, span), worked by hand:
# 1024x701: ceil(1024/14)=74 -> 1036, ceil(701/14)=51 -> 714; ceil(51/3)=17, ceil(74/3)=25; 17*26+2.
# 512x512: 262144 < 544^2 -> x1.0625 = 544 -> 39*14 = 546; 13x13 cells; 13*14+2 = 184.
# 20x14: x sqrt(295936/280) = 32.51 -> 650x455 -> 658x462 (47x33 patches) -> 11x16 -> 189.
# 2000x1400: 143x100 patches would cost 34*49+2 > 1024; solve: r = 0.7, w_tok = 37.71, h_tok = 26.40,
#   beta = min(37*42/2000, 26*42/1400) = 0.777 -> 1078x1554 px -> 77x111 -> 26x37 -> 990.
# 50000x40: w_tok = 1130, h_tok = 0.90 < 1: one row, (1024-3)*42 = 42882 wide -> 1x1021 -> 1024.
# 40x50000: w_tok < 1: one column, (1024-2)//2*42 = 21462 tall -> 511x1 -> 1024.
TABLE = {
    (1024, 701): (1036, 714, 51, 74, 17, 25, 444),
    (512, 512): (546, 546, 39, 39, 13, 13, 184),
    (20, 14): (658, 462, 33, 47, 11, 16, 189),
    (2000, 1400): (1554, 1078, 77, 111, 26, 37, 990),
    (50000, 40): (42882, 42, 3, 3063, 1, 1021, 1024),
    (40, 50000): (42, 21462, 1533, 3, 511, 1, 1024),
    (3000, 90): (3150, 98, 7, 225, 3, 75, 230),
}


@pytest.mark.parametrize("size", list(TABLE))
def test_plan_table(size):
    bw, bh, gh, gw, ch, cw, span = TABLE[size]
    n_llm_h, n_llm_w, best_h, best_w = plan_image_grid(*size, ARGS)
    assert (best_w, best_h) == (bw, bh)
    assert (best_h // 14, best_w // 14) == (gh, gw)
    assert (n_llm_h, n_llm_w) == (ch, cw)
    assert num_image_tokens(n_llm_h, n_llm_w) == span <= ARGS.vision_max_n_token


def test_token_types_layout():
    t = image_token_types(2, 3).tolist()
    assert t == [IMAGE_START, IMAGE, IMAGE, IMAGE, IMAGE_NEW_LINE, IMAGE, IMAGE, IMAGE, IMAGE_NEW_LINE, IMAGE_END]
    assert len(t) == num_image_tokens(2, 3)


def test_patches_are_bf16_raster_cyx(tmp_path):
    # a picture already on whole patches and over min_pixels: no resize; each pixel encodes (y, x, c)
    h, w = 42 * 14, 43 * 14
    y, x = np.mgrid[0:h, 0:w]
    pic = np.stack([(y * 7 + x) % 256, (x * 3) % 256, (y * 5) % 256], -1).astype(np.uint8)
    Image.fromarray(pic).save(tmp_path / "p.png")
    patches, gh, gw, ch, cw = load_image(tmp_path / "p.png", ARGS)
    assert (gh, gw, ch, cw) == (42, 43, 14, 15)
    assert patches.dtype == torch.bfloat16 and patches.shape == (42 * 43, 3, 14, 14)
    expect = ((torch.from_numpy(pic).float() / 255 - 0.5) / 0.5).to(torch.bfloat16)  # [H, W, 3]
    r = 5 * gw + 7  # patch (5, 7)
    assert torch.equal(patches[r], expect[5 * 14:6 * 14, 7 * 14:8 * 14].permute(2, 0, 1))


def test_pad_is_gray_127_centred(tmp_path):
    # 1024x701 of white: rows 709 tall, pasted at round(2.5) = 2 (halves to even) in 714
    Image.fromarray(np.full((701, 1024, 3), 255, np.uint8)).save(tmp_path / "w.png")
    patches, gh, gw, _, _ = load_image(tmp_path / "w.png", ARGS)
    img = patches.view(gh, gw, 3, 14, 14).permute(2, 0, 3, 1, 4).reshape(3, gh * 14, gw * 14).float()
    gray = (127 / 255 - 0.5) / 0.5
    col = img[0, :, 500]
    assert torch.allclose(col[:2], torch.tensor(gray).to(torch.bfloat16).float())
    assert torch.all(col[2:711] == 1.0) and torch.allclose(col[711:], torch.tensor(gray).to(torch.bfloat16).float())


def test_alpha_is_dropped_not_composited(tmp_path):
    rgba = np.zeros((600, 600, 4), np.uint8)
    rgba[..., 0] = 200
    rgba[..., 3] = 0  # fully transparent: composited over anything would not stay red
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a.png")
    patches, *_ = load_image(tmp_path / "a.png", ARGS)
    assert torch.allclose(patches[0, 0].float(), torch.tensor((200 / 255 - 0.5) / 0.5).to(torch.bfloat16).float())
