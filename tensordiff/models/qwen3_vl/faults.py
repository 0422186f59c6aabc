"""Qwen3-VL: the planted engine faults, one table. Names are constants: the engine, the adapter
and the tests refer to `ROPE_HW_SWAP`, never to the string. No torch here.
"""
from __future__ import annotations

from tensordiff.pipeline.faults import CHUNK, FLOAT32, LANGUAGE, Fault, Need

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
# the language path (runs with --prompt / --decode)
MROPE_CHUNKED = "mrope-chunked"  # text M-RoPE frequencies in Qwen2-VL's chunked layout
DECODE_NO_DELTA = "decode-no-delta"  # the decoder's decode positions ignore rope_deltas
DEEPSTACK_EVERY_ROW = "deepstack-every-row"  # DeepStack added to every row, not the visual rows
DEEPSTACK_LAYER_LATE = "deepstack-layer-late"  # DeepStack feature k injected after layer k+1
QK_NORM_AFTER_ROPE = "qk-norm-after-rope"  # q / k RMSNorm after the rotation
IMAGE_CHUNK_SHIFT = "image-chunk-shift"  # a chunk starting inside the image range takes its rows one late
LOGITS_NO_FINAL_NORM = "logits-no-final-norm"  # the LM head reads the stream without the final RMSNorm

DECODE = Need("--decode >= 1 (a decode step)", lambda req: req.decode > 0)
IMAGE_CELLS = Need("an image of more than one merged cell (image rows differ across the three axes)")

FAULTS = (
    Fault(MERGE_ORDER_RASTER, "patches", "pixel rows in plain raster order instead of 2x2 merge groups",
          needs=(Need("a patch grid more than 2 patches wide"),)),
    Fault(POSEMBED_ALIGN_CORNERS_FALSE, "pos_embed", "position table resampled with half-pixel centres "
          "(align_corners=False) instead of corner-aligned", needs=(Need("a patch grid other than 48 on a side"),)),
    Fault(ROPE_HW_SWAP, "rope", "height and width swapped in the 2D RoPE positions"),
    Fault(DEEPSTACK_DROP, "deepstack.*", "DeepStack features not produced (zeroed)"),
    Fault(MROPE_NO_DELTA, "positions", "decode positions continue from the sequence length instead of "
          "rope_deltas", needs=(Need("an image of more than one merged cell (rope_deltas != 0)"),)),
    Fault(VISION_GELU_ERF, "block0", "vision block MLPs use exact GELU instead of gelu_pytorch_tanh",
          needs=(FLOAT32,)),  # the change is ~1e-3 absolute, near bf16 resolution
    Fault(TOWER_SKIP_LAST_BLOCK, "final_norm", "off by one in the block loop: the last vision block never runs"),
    Fault(MERGER_GELU_TANH, "aligner", "the merger's exact GELU replaced by the tanh approximation",
          needs=(FLOAT32,)),  # the change is ~1e-3 absolute, near bf16 resolution
    Fault(DEEPSTACK_OFF_BY_ONE, "deepstack.0", "DeepStack taps read as 1-based block numbers (one block late)"),
    Fault(RESIZE_CEIL_SIDES, "plan", "smart_resize rounds both sides UP to a multiple of patch x merge instead of "
          "to the nearest", needs=(Need("a side whose remainder modulo 32 is 1..15 (e.g. 1000 px; not the bundled "
                                        "1024x701)"),)),
)

LANGUAGE_FAULTS = (
    Fault(MROPE_CHUNKED, "text_rope", "text M-RoPE frequencies chunked (t block, h block, w block, Qwen2-VL) "
          "instead of interleaved", needs=(LANGUAGE, IMAGE_CELLS)),
    Fault(DECODE_NO_DELTA, "logits.step.1", "the decoder places decode tokens at the sequence index, ignoring "
          "rope_deltas (the positions boundary is right; the decoder does not use it)",
          needs=(DECODE, Need("an image of more than one merged cell (rope_deltas != 0)"))),
    Fault(DEEPSTACK_EVERY_ROW, "deepstack_add.0", "DeepStack features gathered by a running visual-row count and "
          "added to every row instead of the visual rows only", needs=(LANGUAGE,)),
    Fault(DEEPSTACK_LAYER_LATE, "deepstack_add.0", "DeepStack feature k injected after decoder layer k+1 (one "
          "layer too deep; nothing added after layer 0)", needs=(LANGUAGE,)),
    Fault(QK_NORM_AFTER_ROPE, "hidden.0", "q / k RMSNorm applied after the rotation instead of before",
          needs=(LANGUAGE,)),
    Fault(IMAGE_CHUNK_SHIFT, "embeddings", "a prefill chunk that starts inside the image range overlays the "
          "merger rows one row late", needs=(LANGUAGE, CHUNK, Need("a chunk boundary inside an image's pad range"))),
    Fault(LOGITS_NO_FINAL_NORM, "logits", "the LM head reads the last layer's stream without the final RMSNorm",
          needs=(LANGUAGE,)),
)
FAULTS = FAULTS + LANGUAGE_FAULTS

NAMES = tuple(f.name for f in FAULTS)
LANGUAGE_NAMES = tuple(f.name for f in LANGUAGE_FAULTS)
