"""Planted bugs, off by default; each is a real mistake of this model's kind. The one table of
names, boundaries and needs is `tensordiff.models.qwen3_vl.faults`; the engine compares
`fault == F.ROPE_HW_SWAP`, never a string."""
from __future__ import annotations

from tensordiff.models.qwen3_vl.faults import (
    DECODE_NO_DELTA, DEEPSTACK_DROP, DEEPSTACK_EVERY_ROW, DEEPSTACK_LAYER_LATE, DEEPSTACK_OFF_BY_ONE,
    IMAGE_CHUNK_SHIFT, LOGITS_NO_FINAL_NORM, MERGE_ORDER_RASTER, MERGER_GELU_TANH, MROPE_CHUNKED,
    MROPE_NO_DELTA, NAMES, POSEMBED_ALIGN_CORNERS_FALSE, QK_NORM_AFTER_ROPE, RESIZE_CEIL_SIDES,
    ROPE_HW_SWAP, TOWER_SKIP_LAST_BLOCK, VISION_GELU_ERF,
)

from ..errors import EngineInputError

ALL = NAMES


def check(fault: str | None) -> str | None:
    if fault is not None and fault not in ALL:
        raise EngineInputError(f"unknown qwen3-vl fault {fault!r} (known: {', '.join(ALL)})")
    return fault
