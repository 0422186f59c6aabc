"""smart_resize: a hand-checked table, half-to-even rounding, the pixel budget, bad aspect ratios."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import EngineInputError
from engine.qwen3_vl.smart_resize import plan, smart_resize

REAL = dict(factor=32, min_pixels=65536, max_pixels=16777216)
TINY = dict(factor=32, min_pixels=64 * 64, max_pixels=256 * 256)

TABLE = [
    # (h, w, budget, expected (h, w), why)
    (701, 1024, REAL, (704, 1024), "701/32 = 21.9 rounds up"),
    (80, 112, TINY, (64, 128), "2.5 rounds down to even, 3.5 rounds up to even"),
    (48, 48, TINY, (64, 64), "1.5 -> 2: 64x64 meets the floor exactly"),
    (21, 27, TINY, (64, 96), "below the floor: beta = sqrt(4096/567), both sides ceiled"),
    (512, 512, TINY, (256, 256), "at the ceiling exactly"),
    (300, 451, TINY, (192, 288), "over the ceiling: beta = sqrt(135300/65536), both floored"),
    (80, 640, TINY, (64, 640), "wide: 64*640 = 40960 within budget"),
    (512, 60, TINY, (512, 64), "tall: 60/32 = 1.875 -> 2"),
    (40, 8000, TINY, (32, 3616), "over the ceiling, the short side floors to 0: kept at one factor"),
    (4000, 3000, REAL, (4000 // 32 * 32, 3008), "4000/32 = 125 exactly; 3000/32 = 93.75 -> 94"),
]


@pytest.mark.parametrize("h,w,budget,expected,why", TABLE)
def test_table(h, w, budget, expected, why):
    assert smart_resize(h, w, **budget) == expected, why


def test_plan_grid_and_cells():
    p = plan(80, 112, 16, 2, 64 * 64, 256 * 256)
    assert (p.resized_height, p.resized_width) == (64, 128)
    assert p.grid == (4, 8) and p.cells == (2, 4)


def test_aspect_over_200_is_refused():
    with pytest.raises(EngineInputError, match="aspect ratio"):
        smart_resize(10, 2001, **REAL)


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 5000), st.integers(2, 5000), st.sampled_from([REAL, TINY]))
def test_agrees_with_transformers(h, w, budget):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf

    if max(h, w) / min(h, w) > 200:
        return
    rh, rw = smart_resize(h, w, **budget)
    assert (rh, rw) == hf(h, w, **budget)
    assert rh % 32 == 0 and rw % 32 == 0
