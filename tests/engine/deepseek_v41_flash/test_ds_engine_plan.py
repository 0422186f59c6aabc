"""The engine's preprocessing plan against hand-computed cases, and the pixel pipeline."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from engine.deepseek_v41_flash.config import Config
from engine.deepseek_v41_flash.image_processor import patch_rows, plan_image, render
from engine.runtime import sizing

CFG = Config()

# (width, height) -> (canvas w, h), (content w, h), (offset x, y), grid, cells, span; by hand:
# 1024x701 is wider than 1036/714, so the height is round(701/1024*1036) = round(709.2) = 709,
#   centred at round((714-709)/2) = round(2.5) = 2 (halves go to even).
# 512x512 scales to 544 -> 546: same aspect as the canvas, no pad.
# 451x300 (chelsea): x1.4789 -> 666x443 -> 672x448; contain: taller than 672/448 = 1.5? 451/300 = 1.503
#   is wider -> height round(300/451*672) = round(447.0) = 447, offset round(0.5) = 0.
# 2000x1400: budget solve -> 1554x1078: 2000/1400 = 1.4286 < 1554/1078 = 1.4416 -> width
#   round(2000/1400*1078) = 1540, offset x round(7.0) = 7.
TABLE = {
    (1024, 701): ((1036, 714), (1036, 709), (0, 2), (51, 74), (17, 25), 444),
    (512, 512): ((546, 546), (546, 546), (0, 0), (39, 39), (13, 13), 184),
    (451, 300): ((672, 448), (672, 447), (0, 0), (32, 48), (11, 16), 189),
    (2000, 1400): ((1554, 1078), (1540, 1078), (7, 0), (77, 111), (26, 37), 990),
    (50000, 40): ((42882, 42), (42882, 34), (0, 4), (3, 3063), (1, 1021), 1024),
    (40, 50000): ((42, 21462), (17, 21462), (12, 0), (1533, 3), (511, 1), 1024),
}

SOLVED = {(2000, 1400), (50000, 40), (40, 50000)}  # the budget forced a second sizing


@pytest.mark.parametrize("size", list(TABLE))
def test_plan_table(size):
    target, content, offset, grid, cells, span = TABLE[size]
    plan = plan_image(*size, CFG)
    assert (plan.target, plan.content, plan.offset, plan.grid, plan.cells, plan.span) == \
        (target, content, offset, grid, cells, span)
    assert plan.budget_solved == (size in SOLVED)


def test_contain_ceil_changes_the_default_picture_plan():
    assert plan_image(1024, 701, CFG, contain_rounding="ceil").content == (1036, 710)
    assert plan_image(1024, 701, CFG).content == (1036, 709)


def test_sizing_helpers():
    assert sizing.centre_offset(714, 709) == 2 and sizing.centre_offset(714, 707) == 4  # 2.5 -> 2, 3.5 -> 4
    assert sizing.upscale_to_min_pixels(20, 14, 295936) == (650, 455)
    assert sizing.upscale_to_min_pixels(1000, 1000, 295936) == (1000, 1000)
    assert sizing.contain_size(100, 100, 50, 70) == (50, 50)
    assert sizing.ceil_to(701, 14) == 714 and sizing.floor_to(1134.0, 14) == 1134


def test_render_and_patch_rows_match_a_float_pipeline():
    rng = np.random.default_rng(0)
    pic = Image.fromarray(rng.integers(0, 256, (701, 1024, 3), dtype=np.uint8))
    plan = plan_image(1024, 701, CFG)
    px = render(pic, plan)
    assert px.shape == (714, 1036, 3) and (px[:2] == 127).all() and (px[711:] == 127).all()
    rows = patch_rows(px, CFG)
    x = ((torch.from_numpy(px.astype(np.float32)).permute(2, 0, 1) / 255 - 0.5) / 0.5).to(torch.bfloat16)
    want = x.reshape(3, 51, 14, 74, 14).permute(1, 3, 0, 2, 4).reshape(51 * 74, 588)
    assert rows.dtype == torch.bfloat16 and torch.equal(rows, want)
