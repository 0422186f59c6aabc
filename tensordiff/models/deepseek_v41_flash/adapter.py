"""DeepSeek V4.1 Flash: the boundary contract of the vision path, its faults (`deepseek_faults`),
its options (`deepseek_options`) and both runners.

Data flow (the contract's DAG):

           ┌─> patches ──┐
    plan ──┤             ├─> block0 -> final_norm -> aligner
           └─> rope ─────┘

`plan` holds every discrete preprocessing decision (sizes, grid, pad offset, token counts), so a
resize bug names ONE root there, not its every consequence.

The runners are imported only when asked for (no torch at import: the core compare must work
without model code).
"""
from __future__ import annotations

import math

from tensordiff.pipeline.adapter import ModelAdapter, lazy
from tensordiff.judge.contract import Boundary, Contract
from tensordiff.format import images
from tensordiff.judge.geometry import Rule
import tensordiff.models.deepseek_v41_flash.faults as faults
import tensordiff.models.deepseek_v41_flash.contract as language
from tensordiff.models.deepseek_v41_flash.options import OPTIONS
from tensordiff.models.deepseek_v41_flash.synthetic import resolve

NAME = "deepseek-v4.1-flash"

CONTRACT = Contract(NAME, (
    Boundary("plan", (), "the preprocessing decisions, int64, compared exactly: plan.size [src_w, src_h, "
             "canvas_w, canvas_h, content_w, content_h, offset_x, offset_y], plan.grid [patch_h, patch_w, cell_h, "
             "cell_w], plan.tokens [patches, span], plan.flags [scaled up to min pixels, re-solved for the token "
             "budget]"),
    Boundary("patches", ("plan",), "pixel rows [N, 588] bf16, (c, y, x) per 14x14 patch, raster order over the "
             "patch grid (the logical 588 columns, never the backend's 592)", layout="grid", probes=("within-unit",)),
    Boundary("rope", ("plan",), "2D RoPE tables rope.cos / rope.sin [N, 32] fp32, blocked: 16 row angles then "
             "16 column angles per patch", layout="grid", probes=("unit-circle",)),
    Boundary("block0", ("patches", "rope"), "output of vision block 0 [N, 1024]", layout="grid"),
    Boundary("final_norm", ("block0",), "vision.norm output [N, 1024] (after all blocks)", layout="grid"),
    Boundary("aligner", ("final_norm",), "aligner output [tokens, 5120]: 3x3 cells, right/bottom zero pad, "
             "channel-major unfold, w2(gelu(w1(x)))", layout="cells"),
))


def _contain_round_ne_ceil(plan) -> bool:
    """The contained short side (Pillow's contain: h / w * W for a source wider than the canvas,
    else w / h * H) has a fraction where round and ceil disagree."""
    sw, sh, cw, ch = plan["plan.size"][:4]
    if sw * ch == sh * cw:
        return False
    exact = sh / sw * cw if sw / sh > cw / ch else sw / sh * ch
    return round(exact) != math.ceil(exact)


GEOMETRY = (
    Rule("grid-width-not-multiple-of-3", "patch grid width not a multiple of 3: the aligner's 3x3 cells pad "
         "the right edge", lambda p: p["plan.grid"][1] % 3 != 0),
    Rule("grid-height-not-multiple-of-3", "patch grid height not a multiple of 3: the 3x3 cells pad the "
         "bottom edge", lambda p: p["plan.grid"][0] % 3 != 0),
    Rule("contain-round-ne-ceil", "the contained short side rounds differently with round and ceil",
         _contain_round_ne_ceil),
    Rule("over-token-budget", "the span would exceed vision_max_n_token: the size is solved again",
         lambda p: bool(p["plan.flags"][1])),
    Rule("under-min-pixels", "under vision_min_pixels: the picture is scaled up first",
         lambda p: bool(p["plan.flags"][0])),
)


VISION_READS = ("vision.", "aligner.", "image_start", "image_end", "image_newline")


def _reads(req) -> tuple[str, ...] | None:
    """What a run reads from the checkpoint: the tower, the aligner and the image markers; with a
    prompt or decode steps, the language backbone too: with `--layers`, the embedding, final
    norm, head and those layers only (a 48-shard download is not hashed whole for one layer),
    else everything."""
    if req.prompt is None and not req.decode:
        return VISION_READS
    ids = _layer_ids(req.options.get("layers"))
    if ids is None:
        return None
    return VISION_READS + ("embed.", "norm.", "head.") + tuple(f"layers.{i}." for i in ids)


def _layer_ids(spec) -> tuple[int, ...] | None:
    """The ids of a `--layers` spec ("0-2", "0,2"), or None for every layer (no spec, or one the
    runners will refuse anyway)."""
    if spec in (None, ""):
        return None
    ids: set[int] = set()
    for piece in str(spec).split(","):
        first, dash, last = piece.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            return None
        ids.update(range(int(first), int(last if dash else first) + 1))
    return tuple(sorted(ids))


def _weights(spec: str):
    return resolve(spec)


# With a prompt (`--prompt/--chunk/--decode`), the language backbone's per-layer boundaries follow
# the aligner: embeddings, engram.L, router.L.ids/weights, hidden.L, logits, logits.step.K.
# Several images per prompt (`tensordiff.format.images`): image K >= 1 has its own copy of the vision
# boundaries under `image.K.` (same DAG, layout plain: run.inputs.grid / cells are the first
# image's), and every image's aligner feeds `embeddings`.
VISION = CONTRACT.boundaries


def _image_boundaries(k: int) -> tuple[Boundary, ...]:
    pre = images.prefix(k)
    return tuple(Boundary(pre + b.name, tuple(pre + i for i in b.inputs), f"image {k}: {b.meaning}",
                          probes=b.probes) for b in VISION)


def _resolve(present) -> tuple[Boundary, ...]:
    ks = sorted({k for k, rest in map(images.split, present) if k})
    extra = tuple(b for k in ks for b in _image_boundaries(k))
    aligners = ("aligner",) + tuple(images.prefix(k) + "aligner" for k in ks)
    return VISION + extra + language.language_boundaries(present, aligners)


def _boundary_of(name: str) -> str:
    k, rest = images.split(name)
    return images.prefix(k) + language.boundary_of(rest)


CONTRACT = Contract(NAME, CONTRACT.boundaries, rules=language.RULES, resolver=_resolve, boundary_of=_boundary_of,
                    tolerances=language.TOLERANCES, scores_source=language.scores_source)

ADAPTER = ModelAdapter(
    name=NAME,
    contract=CONTRACT,
    faults=faults.FAULTS,
    options=OPTIONS,
    oracle=lazy("oracle.deepseek_v41_flash.run:run"),
    engine=lazy("engine.deepseek_v41_flash.run:run"),
    weights=_weights,
    weight_prefixes=_reads,
    sources=("oracle.deepseek_v41_flash", "tensordiff.models.deepseek_v41_flash.adapter",
             "tensordiff.models.deepseek_v41_flash.contract"),
    stages=lazy("engine.deepseek_v41_flash.stages:make_stages"),
    geometry=GEOMETRY,
    multi_image=True,
    # the fp32 reference of the language half: semantic numerics (fp32, exact dequantised weights,
    # no kernel rounding); `official` would run it in bf16 with FP8/FP4 rounding
    exact_options=(("language_numerics", "semantic"), ("kernel_quant", False)),
    # the official code builds the whole model, vision tower included, in bf16 (the language
    # kernels' FP8 / FP4 rounding on top: `language_numerics` official, the bf16 default)
    official_dtype=lambda _spec: "bfloat16",
    checkpoint=lazy("tensordiff.models.deepseek_v41_flash.checkpoint:describe"),
    description="DeepSeek V4.1 Flash: preprocessing, 32-layer ViT with 2D RoPE, 3x3 aligner; with a prompt, the language backbone",
)
