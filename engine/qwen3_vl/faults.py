"""Planted bugs, off by default; each is a real mistake of this model's kind (see the adapter)."""
from __future__ import annotations

from ..errors import EngineInputError

MERGE_ORDER_RASTER = "merge-order-raster"  # pixel rows in raster order, not 2x2 groups
POSEMBED_ALIGN_CORNERS_FALSE = "posembed-align-corners-false"  # half-pixel centres in the table resample
ROPE_HW_SWAP = "rope-hw-swap"  # (col, row) rope positions
DEEPSTACK_DROP = "deepstack-drop"  # DeepStack features zeroed
MROPE_NO_DELTA = "mrope-no-delta"  # decode positions continue from the sequence length
VISION_GELU_ERF = "vision-gelu-erf"  # block MLPs with exact GELU instead of the tanh form
TOWER_SKIP_LAST_BLOCK = "tower-skip-last-block"  # off by one: the last block never runs
MERGER_GELU_TANH = "merger-gelu-tanh"  # the merger's exact GELU replaced by the tanh form
DEEPSTACK_OFF_BY_ONE = "deepstack-off-by-one"  # DeepStack taps read as 1-based block numbers
RESIZE_CEIL_SIDES = "resize-ceil-sides"  # smart_resize rounds both sides up to the factor

ALL = (MERGE_ORDER_RASTER, POSEMBED_ALIGN_CORNERS_FALSE, ROPE_HW_SWAP, DEEPSTACK_DROP, MROPE_NO_DELTA,
       VISION_GELU_ERF, TOWER_SKIP_LAST_BLOCK, MERGER_GELU_TANH, DEEPSTACK_OFF_BY_ONE, RESIZE_CEIL_SIDES)


def check(fault: str | None) -> str | None:
    if fault is not None and fault not in ALL:
        raise EngineInputError(f"unknown qwen3-vl fault {fault!r} (known: {', '.join(ALL)})")
    return fault
