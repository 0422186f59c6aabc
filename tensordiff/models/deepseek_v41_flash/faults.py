"""DeepSeek V4.1 Flash: the planted engine faults, one table. Names are constants: the engine,
the adapter and the tests refer to `CONTAIN_CEIL`, never to the string.

Each fault is a mistake this field really makes and must be caught at the boundary named here;
`needs` says what the run must do for the fault to change numbers (a need with a check refuses
a run that would never reach the bug, see `tensordiff.pipeline.faults`). No torch here.
"""
from __future__ import annotations

from tensordiff.pipeline.faults import CHUNK, FLOAT32, LANGUAGE, SEVERAL_IMAGES, Fault, Need

# the vision path (always runs)
CONTAIN_CEIL = "contain-ceil"
ROPE_INTERLEAVED = "rope-interleaved"
ALIGNER_FLAT_PAD = "aligner-flat-pad"
GELU_TANH = "gelu-tanh"
PATCH_PAD_NONZERO = "patch-pad-nonzero"
# numeric faults: about 1-5x the bf16 noise floor, caught in bf16 by the floor-relative pass
RESIDUAL_SCALE = "residual-scale"
TAIL_ROW_SCALE = "tail-row-scale"
NORM_EPS = "norm-eps"
SPLITK_BF16 = "splitk-bf16"
# the language backbone (runs with --prompt / --decode)
ROUTER_TEXT_BIAS_FOR_IMAGES = "router-text-bias-for-images"
ROUTER_BIASED_WEIGHTS = "router-biased-weights"
ENGRAM_NGRAM_ACROSS_IMAGE = "engram-ngram-across-image"
OVERLAY_CHUNK_SHIFT = "overlay-chunk-shift"
IMAGE_SPAN_UNEXPANDED = "image-span-unexpanded"
DECODE_ENGRAM_WINDOW_RESET = "decode-engram-window-reset"
# one row or one token of the language path (a tail loop, an edge position)
EMBED_LAST_ROW_SCALE = "embed-last-row-scale"
ROUTER_LAST_ROW_RENORM = "router-last-row-renorm"
DECODE_ROPE_OFF_BY_ONE = "decode-rope-off-by-one"
# reading a quantised checkpoint (synthetic:tiny-fp8 or a real one)
FP8_SCALE_IGNORED = "fp8-scale-ignored"
FP8_SCALE_TRANSPOSED = "fp8-scale-transposed"
FP4_NIBBLES_SWAPPED = "fp4-nibbles-swapped"
ENGRAM_SCALE_IGNORED = "engram-scale-ignored"
# the release's own storage, converted on load (FP8 `wo_a` + scale -> bf16, int8-stored FP4 experts)
WO_A_SCALE_DROPPED = "wo-a-scale-dropped"
WO_A_BLOCK_128 = "wo-a-block-128"
FP4_INT8_SIGN_EXTENDED = "fp4-int8-sign-extended"

VISION = (
    Fault(CONTAIN_CEIL, "plan", "contain rounds the short side with ceil instead of round",
          needs=(Need("an aspect ratio where ceil and round differ (the default 1024x701 picture has one)"),)),
    Fault(ROPE_INTERLEAVED, "rope", "2D RoPE angles interleaved (row, col, ...) instead of blocked"),
    Fault(ALIGNER_FLAT_PAD, "aligner", "zero rows appended to the flattened patches instead of a "
          "right/bottom grid pad",
          needs=(Need("a patch grid whose width is not a multiple of 3 (the default picture's is 74)"),)),
    Fault(GELU_TANH, "aligner", "tanh-approximated GELU in the aligner instead of exact erf",
          needs=(FLOAT32,)),  # the change is ~1e-4 relative, under bf16 resolution
    Fault(PATCH_PAD_NONZERO, "block0", "non-zero padding columns in the 592-wide patch projection"),
)

NUMERIC = (
    Fault(RESIDUAL_SCALE, "block0", "block 0 adds its MLP branch scaled by 1.01 (a stray scale factor)",
          needs=(Need("bfloat16: the gate's numeric pass (float32 sees it directly)"),)),
    Fault(TAIL_ROW_SCALE, "block0", "the last patch row of block 0 scaled by 1 + 2^-6 (a vector tail-loop bug)",
          needs=(Need("bfloat16: the gate's numeric pass (row-aware)"),)),
    Fault(NORM_EPS, "final_norm", "the final norm's epsilon is 1e-2 instead of 1e-6 (another model's config)",
          needs=(Need("bfloat16: the gate's numeric pass (float32 sees it directly)"),)),
    Fault(SPLITK_BF16, "aligner", "the aligner's first linear sums split-K partials in bf16 instead of fp32",
          needs=(Need("bfloat16 (in float32 the partials are rounded to bf16 too: caught directly)"),)),
)

# the first MoE layer (0) and the first Engram layer (1, in the released and tiny configs)
LANGUAGE_FAULTS = (
    Fault(ROUTER_TEXT_BIAS_FOR_IMAGES, "router.0.ids",
          "image-span rows ranked with the text `bias` instead of `bias_vl`",
          needs=(LANGUAGE, Need("an image in the prompt"))),
    Fault(ROUTER_BIASED_WEIGHTS, "router.0.weights",
          "mixture weights taken from the biased scores (score + bias) instead of the raw scores",
          needs=(LANGUAGE,)),
    Fault(ENGRAM_NGRAM_ACROSS_IMAGE, "engram.1",
          "image positions not cached as DEAD, so the n-grams after an image reach into it",
          needs=(LANGUAGE, Need("text right after the image span and a layer with Engram"))),
    Fault(OVERLAY_CHUNK_SHIFT, "embeddings",
          "chunked prefill overlays the image span at its absolute offset inside every chunk",
          needs=(LANGUAGE, CHUNK,
                 Need("a chunk smaller than the span's start + length, so a chunk boundary cuts or precedes it"))),
    Fault(IMAGE_SPAN_UNEXPANDED, "embeddings",
          "a later image's span overlaid where its tag sits in the unexpanded prompt (the earlier spans' "
          "lengths not added)",
          needs=(LANGUAGE, SEVERAL_IMAGES)),
    # decode only: the prefill and the first step are right, so the error starts at step 2 and
    # only a decode step's own local error sees it behind a prefill flip's cascade
    Fault(DECODE_ENGRAM_WINDOW_RESET, "logits.step.2",
          "every decode step after the first starts the Engram n-gram window afresh (state not carried "
          "across steps)",
          needs=(LANGUAGE, Need("--decode 2 or more and a layer with Engram", lambda req: req.decode >= 2))),
    # one row or one token: in bf16 a few times the floor of that row at most, so a tensor-wide
    # statistic does not see them; the semantic pass (float32) does, and the row-aware numeric one
    Fault(EMBED_LAST_ROW_SCALE, "embeddings",
          "the prompt's last token's embedding row scaled by 1 + 2^-5 (the gather's tail row written twice, "
          "summed)", needs=(LANGUAGE,)),
    Fault(ROUTER_LAST_ROW_RENORM, "router.0.weights",
          "the prompt's last token's mixture weights normalised over its first k-1 experts (the normalising "
          "sum's tail loop stops one short)", needs=(LANGUAGE,)),
    Fault(DECODE_ROPE_OFF_BY_ONE, "logits.step.2",
          "decode step 2 rotates its query and window key at its position + 1 (one token's position off by one)",
          needs=(LANGUAGE, Need("--decode 2 or more", lambda req: req.decode >= 2))),
    # checkpoint reading: layer 0's attention projections are the first FP8 GEMMs; the first FP8
    # matrix of more than one block row and column in the tiny configs is the Engram `wkv`;
    # layer 0's routed experts the first FP4 ones
    Fault(FP8_SCALE_IGNORED, "attn.0", "FP8 weights read without their block scales",
          needs=(LANGUAGE, Need("a quantised checkpoint (--weights synthetic:tiny-fp8)"))),
    Fault(FP8_SCALE_TRANSPOSED, "engram.1", "the 32x32 block-scale grid of FP8 weights read column-major",
          needs=(LANGUAGE, Need("a quantised checkpoint with an FP8 matrix of several block rows and columns "
                                "(synthetic:tiny-fp8)"))),
    Fault(FP4_NIBBLES_SWAPPED, "hidden.0", "FP4 expert weights unpacked with the high nibble as the even element",
          needs=(LANGUAGE, Need("FP4 routed experts (--weights synthetic:tiny-fp8)"))),
    Fault(ENGRAM_SCALE_IGNORED, "engram.1", "FP8 Engram table rows read without their scales",
          needs=(LANGUAGE, Need("an FP8 Engram table (--weights synthetic:tiny-fp8)"))),
    # the release's storage: layer 0's `wo_a` is its first FP8 weight read with a block scale of
    # its own shape (in synthetic:tiny-fp8 two block columns with different scales); its routed
    # experts the first int8-stored FP4 bytes
    Fault(WO_A_SCALE_DROPPED, "attn.0", "the release's FP8 wo_a cast to bf16 without its block scale",
          needs=(LANGUAGE, Need("wo_a stored FP8 with its scale, as the release (--weights synthetic:tiny-fp8)"))),
    Fault(WO_A_BLOCK_128, "attn.0", "the release's FP8 wo_a dequantised with 128x128 blocks (another "
          "checkpoint family's block size) instead of the blocks its scale's shape gives",
          needs=(LANGUAGE, Need("wo_a stored FP8 with a scale of several block columns, as the release "
                                "(--weights synthetic:tiny-fp8)"))),
    Fault(FP4_INT8_SIGN_EXTENDED, "hidden.0", "int8-stored FP4 expert bytes unpacked as signed: the high nibble "
          "sign-extends and every odd element's sign is lost",
          needs=(LANGUAGE, Need("routed experts stored as int8, as the release (--weights synthetic:tiny-fp8)"))),
)

FAULTS = VISION + NUMERIC + LANGUAGE_FAULTS
VISION_NAMES = tuple(f.name for f in VISION + NUMERIC)
NUMERIC_NAMES = tuple(f.name for f in NUMERIC)
LANGUAGE_NAMES = tuple(f.name for f in LANGUAGE_FAULTS)
