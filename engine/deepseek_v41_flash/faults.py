"""Named bugs the engine can carry on purpose (all off by default).

Each is a mistake this field really makes; the one table of names, boundaries and needs is
`tensordiff.models.deepseek_v41_flash.faults` (what `tensordiff faults` lists). The engine compares
`fault == F.ROPE_INTERLEAVED`, never a string.
"""
from __future__ import annotations

from tensordiff.models.deepseek_v41_flash.faults import (  # noqa: F401 (the engine's names)
    DECODE_ROPE_OFF_BY_ONE, EMBED_LAST_ROW_SCALE, ROUTER_LAST_ROW_RENORM,
    ALIGNER_FLAT_PAD, CONTAIN_CEIL, DECODE_ENGRAM_WINDOW_RESET, IMAGE_SPAN_UNEXPANDED,
    ENGRAM_NGRAM_ACROSS_IMAGE, ENGRAM_SCALE_IGNORED, FP4_INT8_SIGN_EXTENDED, FP4_NIBBLES_SWAPPED, FP8_SCALE_IGNORED,
    FP8_SCALE_TRANSPOSED, GELU_TANH, LANGUAGE_NAMES, NORM_EPS, NUMERIC_NAMES, RESIDUAL_SCALE, SPLITK_BF16,
    TAIL_ROW_SCALE, OVERLAY_CHUNK_SHIFT, PATCH_PAD_NONZERO, ROPE_INTERLEAVED, ROUTER_BIASED_WEIGHTS,
    ROUTER_TEXT_BIAS_FOR_IMAGES, VISION_NAMES, WO_A_BLOCK_128, WO_A_SCALE_DROPPED,
)

from ..errors import EngineInputError

# The vision engine's own faults and the language backbone's (`language/`): one `--fault`
# reaches the right half and an unknown name is still refused.
VISION = VISION_NAMES  # the numeric faults included
# Numeric faults: each moves numbers by about one to five times the bf16 noise floor, so only a
# floor-relative verdict (tensordiff.judge.floor, the gate's numeric pass) sees them in bf16.
NUMERIC = NUMERIC_NAMES
LANGUAGE = LANGUAGE_NAMES


def check(fault: str | None) -> str | None:
    """The vision engine's fault (None when the fault belongs to the language backbone)."""
    if fault is not None and fault not in VISION and fault not in LANGUAGE:
        known = ", ".join((*VISION, *LANGUAGE))
        raise EngineInputError(f"unknown fault {fault!r} for deepseek-v4.1-flash (known: {known})")
    return fault if fault in VISION else None


def language(fault: str | None) -> str | None:
    """The language backbone's fault, or None."""
    return fault if fault in LANGUAGE else None
