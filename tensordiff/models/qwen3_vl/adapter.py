"""Qwen3-VL: the boundary contract of the vision path and image positions, its faults
(`qwen3_vl_faults`), its options (`qwen3_vl_options`), both runners.

Data flow (the contract's DAG):

           ┌─> patches ───┐
           ├─> pos_embed ─┼─> block0 ─┬─> final_norm -> aligner
    plan ──┼─> rope ──────┘           └─> deepstack.0 -> deepstack.1 -> deepstack.2
           └─> positions (M-RoPE ids of the prompt with its image span)

With a prompt or decode steps (`--prompt/--chunk/--decode`) the text model follows:

    aligner ─> embeddings ──────────┐
    positions ─> text_rope ─────────┼─> hidden.0 ─> deepstack_add.0 ─> hidden.1 ─> ... ─> hidden.(n-1) ─> logits
    deepstack.k ─> deepstack_add.k ─┘                  logits ─> token.step.1 ─> logits.step.1 ─> token.step.2 ─> ...

`token.step.K` is the token fed to decode step K beside the logits row it is the argmax of, a
top-1 choice judged for near-ties (`decode_tokens`, `tensordiff.judge.ties`).

`deepstack_add.L` (L < 3) is the stream after layer L's DeepStack residual add, so a dropped,
misplaced or wrongly deep injection is named at its layer; every `hidden.L` and `logits.step.K`
also reads `text_rope` / `positions`. A chunked prefill is recorded over the whole prompt, so the
oracle's single-shot tensors are the expectations of every chunk.

`plan` (smart_resize's size, the grid, token counts, the branch taken) feeds every boundary
computed from the grid, so a resize bug names ONE root.

Rows of the per-patch boundaries are in 2x2-merge order over run.inputs.grid ("merge"); the
aligner and DeepStack rows are merged tokens in raster order of the cell grid ("merged").
The runners are imported only when asked for (no torch at import time).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Sequence

from tensordiff.pipeline.adapter import ModelAdapter, lazy
from tensordiff.judge.contract import Boundary, Contract, TensorRule
from tensordiff.errors import BadInput
from tensordiff.format.checkpoint import INDEX
from tensordiff.judge.geometry import Rule
from tensordiff.models import decode_tokens
from tensordiff.models.qwen3_vl.faults import FAULTS
from tensordiff.models.qwen3_vl.options import OPTIONS
from tensordiff.models.qwen3_vl.synthetic import ensure

NAME = "qwen3-vl"
DEEPSTACK = re.compile(r"^deepstack\.(\d+)$")
LAYERED = re.compile(r"^(hidden|deepstack_add)\.(\d+)$")
STEP = re.compile(r"^logits\.step\.(\d+)$")

PLAN = Boundary("plan", (), "the preprocessing decisions, int64, compared exactly: plan.size [src_w, src_h, "
                "resized_w, resized_h] (smart_resize), plan.grid [t, patch_h, patch_w, cell_h, cell_w], plan.tokens "
                "[patch rows, merged tokens], plan.flags [shrunk to max_pixels, grown to min_pixels]")
BASE = (
    PLAN,
    Boundary("patches", ("plan",), "pixel_values [N, 1536] fp32: (c, t, py, px) per 16x16 patch over T=2 repeated frames, "
             "rows in 2x2-merge order", layout="merge", probes=("within-unit",)),
    Boundary("pos_embed", ("plan",), "learned 48x48 position table, bilinear (align_corners) to the patch grid, as added "
             "to the patch embedding [N, hidden], merge order", layout="merge"),
    Boundary("rope", ("plan",), "2D RoPE rope.cos / rope.sin [N, head_dim] fp32: cat(row·f, col·f) twice, merge order",
             layout="merge", probes=("unit-circle",)),
    Boundary("block0", ("patches", "pos_embed", "rope"), "output of vision block 0 [N, hidden]", layout="merge"),
    Boundary("final_norm", ("block0",), "merger.norm output [N, hidden] (per patch, before the 2x2 shuffle; "
             "there is no separate final norm)", layout="merge"),
    Boundary("aligner", ("final_norm",), "merger output [N/4, out_hidden]: LN, 2x2 shuffle, fc1, erf-GELU, fc2",
             layout="merged"),
)
POSITIONS = Boundary("positions", ("plan",), "M-RoPE ids of the prompt: positions.ids [3, S] (t, h, w), "
                     "positions.rope_deltas [1] (what decoding adds), positions.decode [3, K]", layout="plain")


def deepstack(k: int) -> Boundary:
    return Boundary(f"deepstack.{k}", ("block0",) if k == 0 else (f"deepstack.{k - 1}",),
                    f"DeepStack merger {k} output [N/4, out_hidden] (shuffle, LN(4·hidden), fc1, GELU, fc2)",
                    layout="merged")


def language_boundaries(present: Sequence[str]) -> tuple[Boundary, ...]:
    """The text model's boundaries for the names a run dumped (none without a language run)."""
    names = set(present)
    layers = sorted({int(m.group(2)) for p in names if (m := LAYERED.match(p)) and m.group(1) == "hidden"})
    steps = sorted({int(m.group(1)) for p in names if (m := STEP.match(p) or decode_tokens.TOKEN.match(p))})
    if not ({"embeddings", "text_rope", "logits"} & names or layers or steps):
        return ()
    out = [Boundary("embeddings", ("aligner",), "token embeddings after the image overlay [S, hidden]: the "
                    "merger rows replace the <|image_pad|> rows", layout="tokens"),
           Boundary("text_rope", ("positions",), "text M-RoPE text_rope.cos / text_rope.sin [S, head_dim] (shared "
                    "by every layer): interleaved t/h/w frequencies from positions.ids", layout="tokens",
                    probes=("unit-circle",))]
    prev = "embeddings"
    for L in layers:
        out.append(Boundary(f"hidden.{L}", (prev, "text_rope"), f"output of decoder layer {L} [S, hidden] "
                            "(GQA with q/k RMSNorm before RoPE, SwiGLU)", layout="tokens"))
        prev = f"hidden.{L}"
        if f"deepstack_add.{L}" in names:
            out.append(Boundary(f"deepstack_add.{L}", (prev, f"deepstack.{L}"), f"the stream after layer {L} with "
                                f"DeepStack feature {L} added on the visual rows only [S, hidden]", layout="tokens"))
            prev = f"deepstack_add.{L}"
    out.append(Boundary("logits", (prev,), "LM head logits for every prompt row [S, vocab] (final RMSNorm, then "
                        "the head; tied to the embeddings where the config says so)", layout="tokens"))
    prev = "logits"
    for k in steps:
        token = f"token.step.{k}"
        if token in names:  # the token fed to step k, a top-1 choice (`decode_tokens`)
            out.append(decode_tokens.token_boundary(k, prev))
        if f"logits.step.{k}" in names:
            out.append(Boundary(f"logits.step.{k}", ((token,) if token in names else ()) + (prev, "positions", "text_rope"),
                                f"logits after feeding generated token {k} [1, vocab] (KV cache; position "
                                "S+k-1+rope_deltas)", layout="tokens"))
            prev = f"logits.step.{k}"
    return tuple(out)


def boundaries_for(present: Sequence[str]) -> tuple[Boundary, ...]:
    ks = sorted({int(m.group(1)) for p in present if (m := DEEPSTACK.match(p))} or {0, 1, 2})
    n = max(ks) + 1
    return BASE + tuple(deepstack(k) for k in range(n)) + (POSITIONS,) + language_boundaries(present)


def boundary_of(tensor: str) -> str:
    token = decode_tokens.boundary_of(tensor)
    if token:
        return token
    if DEEPSTACK.match(tensor) or LAYERED.match(tensor) or STEP.match(tensor):
        return tensor
    return tensor.split(".", 1)[0]


# The logits are a 2048-term reduction (final-norm hidden . tied embedding), RMS 45.7 with the 2B
# dimensions: in fp32 an element near zero carries the absolute error of partial sums that size,
# so atol is in units of the tensor's RMS there (`tensordiff.judge.tolerance`: a clean fp32 engine on a GPU
# has max|d| 7.2e-4, 2.2e-6 of the RMS, with 0.023% of elements beyond a fixed 1e-4 + 1e-3|a|).
# Float32 only: the bf16 numeric pass keeps its own rule.
SCALED_LOGITS = {"atol_scale": "rms"}
TOLERANCES = {"logits": {"float32": SCALED_LOGITS}, "logits.step.*": {"float32": SCALED_LOGITS}}

CONTRACT = Contract(NAME, boundaries_for(()),
                    rules=(TensorRule("positions.*", "exact"), TensorRule("plan.*", "exact")) + decode_tokens.RULES,
                    resolver=boundaries_for, boundary_of=boundary_of, tolerances=TOLERANCES,
                    scores_source=decode_tokens.scores_source)

def _side_round_ne_ceil(plan) -> bool:
    """A source side rounds to a different multiple of patch x merge with round and ceil (and no
    pixel limit rescales it afterwards)."""
    sw, sh, rw, _ = plan["plan.size"]
    factor = rw // plan["plan.grid"][4]
    if any(plan["plan.flags"]):
        return False
    return any(round(v / factor) != -(-v // factor) for v in (sw, sh))


GEOMETRY = (
    Rule("qwen-max-pixels", "smart_resize shrinks the picture to max_pixels", lambda p: bool(p["plan.flags"][0])),
    Rule("qwen-min-pixels", "smart_resize grows the picture to min_pixels", lambda p: bool(p["plan.flags"][1])),
    Rule("qwen-side-round-ne-ceil", "a side where rounding to the 32-px factor differs from ceil, unclamped",
         _side_round_ne_ceil),
)


def _weights(spec: str) -> Path:
    if spec.startswith("synthetic:"):
        return ensure(spec.split(":", 1)[1])
    try:
        p = Path(spec).expanduser()
    except RuntimeError:  # ~name of no user on this machine
        raise BadInput(f"weights {spec!r}: {spec.split('/')[0]} is no user's home directory on this machine") from None
    if not p.is_dir():
        raise BadInput(f"weights {spec!r} is neither synthetic:<tiny|full|full-2b> nor a checkpoint directory")
    for name in ("config.json", "preprocessor_config.json"):
        if (p / name).is_dir():
            raise BadInput(f"checkpoint {p}: {name} is a directory, not a JSON file")
        if not (p / name).is_file():
            raise BadInput(f"checkpoint {p} has no {name}")
        try:  # what either side reads first: readable, and a JSON object (each side checks its values)
            body = json.loads((p / name).read_bytes())
        except OSError as e:
            raise BadInput(f"cannot read {p / name}: {e.strerror}") from None
        except ValueError as e:
            raise BadInput(f"{p / name} is not valid JSON ({e})") from None
        if not isinstance(body, dict):
            raise BadInput(f"{p / name} must hold a JSON object")
    if not ((p / INDEX).is_file() or (p / "model.safetensors").is_file()):
        raise BadInput(f"checkpoint {p} has neither {INDEX} nor model.safetensors")

    return p


def declared_dtype(spec: str) -> str:
    """The dtype the checkpoint's config.json declares for the model (`dtype`, or the older
    `torch_dtype`; the text model's when the top level has none): what transformers computes
    in when it loads the checkpoint as declared, and what a run with no --dtype runs."""
    path = _weights(spec) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise BadInput(f"{path}: not readable as JSON ({e})") from None
    for where in (cfg, cfg.get("text_config") or {}):
        for key in ("dtype", "torch_dtype"):
            if isinstance(where, dict) and isinstance(where.get(key), str):
                return where[key]
    raise BadInput(f"{path} declares no dtype (dtype or torch_dtype): give --dtype")


ADAPTER = ModelAdapter(
    name=NAME,
    contract=CONTRACT,
    faults=FAULTS,
    options=OPTIONS,
    oracle=lazy("oracle.qwen3_vl.runner:run"),
    engine=lazy("engine.qwen3_vl.runner:run"),
    weights=_weights,
    official_dtype=declared_dtype,
    # the vision tower only, unless a prompt or decode steps take the run into the text model
    weight_prefixes=lambda req: ("model.visual.",) if req.prompt is None and not req.decode else None,
    sources=("oracle.qwen3_vl", "tensordiff.models.qwen3_vl.adapter", "tensordiff.format.taps"),  # taps: the oracle is hooked through it
    stages=lazy("engine.qwen3_vl.stages:make_stages"),
    geometry=GEOMETRY,
    description="Qwen3-VL vision path (smart_resize, merge-order patches, interpolated position table, 2D RoPE, "
                "ViT, merger, DeepStack) and the M-RoPE positions of the image span; with a prompt, the text decoder "
                "(image overlay, DeepStack injection, interleaved M-RoPE, chunked prefill, decode); oracle = transformers",
)
