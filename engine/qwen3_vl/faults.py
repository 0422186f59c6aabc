"""Planted bugs, off by default; each is a real mistake of this model's kind (see the adapter)."""
from __future__ import annotations

from ..errors import EngineInputError

MERGE_ORDER_RASTER = "merge-order-raster"  # pixel rows in raster order, not 2x2 groups
POSEMBED_ALIGN_CORNERS_FALSE = "posembed-align-corners-false"  # half-pixel centres in the table resample
ROPE_HW_SWAP = "rope-hw-swap"  # (col, row) rope positions
DEEPSTACK_DROP = "deepstack-drop"  # DeepStack features zeroed
MROPE_NO_DELTA = "mrope-no-delta"  # decode positions continue from the sequence length

ALL = (MERGE_ORDER_RASTER, POSEMBED_ALIGN_CORNERS_FALSE, ROPE_HW_SWAP, DEEPSTACK_DROP, MROPE_NO_DELTA)


def check(fault: str | None) -> str | None:
    if fault is not None and fault not in ALL:
        raise EngineInputError(f"unknown qwen3-vl fault {fault!r} (known: {', '.join(ALL)})")
    return fault
