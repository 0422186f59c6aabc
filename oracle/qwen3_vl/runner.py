"""The oracle's Qwen3-VL run: transformers' processor and vision model, hooked; transformers'
get_rope_index for the positions. Nothing of transformers is re-typed here."""
from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path

import torch

from tensordiff.errors import BadInput
from tensordiff.models.qwen3_vl.options import OPTIONS

from . import config as config_mod
import oracle.qwen3_vl.model as language_mod
import oracle.qwen3_vl.vision as model_mod
from . import positions as positions_mod
from . import plan as plan_mod
from . import processor as processor_mod
from .hooks import Taps

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
ORDER = ("pos_embed", "rope.cos", "rope.sin", "block0", "final_norm", "aligner")


@contextlib.contextmanager
def _exact_fp32(dtype):
    """An fp32 oracle means fp32: cuDNN runs the Conv3d patch embedding in TF32 by default on
    NVIDIA GPUs (about 1e-3 relative, seen at `block0` on an H200), which is not the official
    semantics' precision but a backend default. Turned off for the run, then restored."""
    if dtype != torch.float32:
        yield
        return
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def run(req, rec) -> None:
    if req.weights_dir is None or req.image is None:
        raise BadInput("qwen3-vl needs a checkpoint directory and an image")
    if req.dtype not in DTYPES:
        raise BadInput(f"unsupported dtype {req.dtype!r} ({', '.join(DTYPES)})")
    if req.decode < 0:
        raise BadInput(f"decode steps must be >= 0, not {req.decode}")
    dtype = DTYPES[req.dtype]
    opts = OPTIONS.resolve(req.options)  # typed, defaults filled
    cfg = config_mod.load_config(req.weights_dir)
    limit = cfg.text_config.max_position_embeddings
    if req.decode >= limit:  # refused before any work: the prompt comes on top of the decode steps
        raise BadInput(f"--decode {req.decode} cannot fit the text model's max_position_embeddings {limit} "
                       "(prompt tokens + decode steps); ask for fewer steps")
    proc, ran = processor_mod.build(req.weights_dir, opts["processor"])
    image = processor_mod.load_image(Path(req.image))
    try:
        batch = proc(images=[image], return_tensors="pt")
    except ValueError as e:  # e.g. smart_resize's aspect-ratio limit: the user's picture, not a bug
        what = "; crop or pad the picture to a less extreme aspect ratio" if "aspect ratio" in str(e) else ""
        raise BadInput(f"the image processor refuses {req.image}: {e}{what}") from None
    pixel_values, grid_thw = batch["pixel_values"], batch["image_grid_thw"]
    for name, t in plan_mod.plan_record(proc, image, grid_thw).items():
        rec.record(name, t, boundary="plan")
    rec.record("patches", pixel_values)

    # with a prompt or decode steps the run goes on into the text model: the whole
    # Qwen3VLForConditionalGeneration is built, and its own vision tower gives the vision boundaries
    text = req.prompt is not None or req.decode > 0
    full = language_mod.build(cfg, req.weights_dir, dtype, req.device, attn=opts["attention"]) if text else None
    model = full.model.visual if text else model_mod.build(cfg, req.weights_dir, dtype, req.device,
                                                           attn=opts["attention"])
    taps = Taps(model)
    try:
        with torch.inference_mode(), _exact_fp32(dtype):
            out = model(pixel_values.to(req.device), grid_thw=grid_thw.to(req.device))
    finally:
        taps.close()
    rec.update_run(tf32=False if dtype == torch.float32 else None)
    got = taps.tensors
    for name in ORDER:
        rec.record(name, got[name])
    n_deep = len(cfg.vision_config.deepstack_visual_indexes)
    for k in range(n_deep):
        rec.record(f"deepstack.{k}", got[f"deepstack.{k}"], boundary=f"deepstack.{k}")
    assert torch.equal(got["aligner"], out.pooler_output), "merger hook and pooler_output disagree"

    ids = positions_mod.input_ids(req.prompt, grid_thw, cfg)
    if ids.shape[1] + req.decode > limit:
        raise BadInput(f"prompt of {ids.shape[1]} tokens + --decode {req.decode} steps exceeds the text model's "
                       f"max_position_embeddings {limit}")
    pos, deltas, dec = positions_mod.mrope(ids, grid_thw, cfg, req.decode)
    rec.record("positions.ids", pos.to(torch.int64))
    rec.record("positions.rope_deltas", deltas.to(torch.int64))
    if dec is not None:
        rec.record("positions.decode", dec.to(torch.int64))

    facts = {}
    if text:
        n_images = int((ids == cfg.vision_start_token_id).sum())
        with _exact_fp32(dtype):
            got, logits, steps, generated, stop = language_mod.run(
                full, cfg, ids, positions_mod.mm_token_type_ids(ids, cfg), pixel_values, grid_thw, n_images,
                req.decode, req.device)
        for name in ("embeddings", "text_rope.cos", "text_rope.sin"):
            rec.record(name, got[name])
        for L in range(cfg.text_config.num_hidden_layers):
            rec.record(f"hidden.{L}", got[f"hidden.{L}"], boundary=f"hidden.{L}")
            if f"deepstack_add.{L}" in got:
                rec.record(f"deepstack_add.{L}", got[f"deepstack_add.{L}"], boundary=f"deepstack_add.{L}")
        rec.record("logits", logits)
        for k, step in enumerate(steps, 1):
            # the token fed to step k and the logits row it is the argmax of (ties are judged on it)
            row = logits[-1:] if k == 1 else steps[k - 2][-1:]
            rec.record(f"token.step.{k}.ids", torch.tensor([[generated[k - 1]]]), boundary=f"token.step.{k}")
            rec.record(f"token.step.{k}.scores", row.float(), boundary=f"token.step.{k}")
            rec.record(f"logits.step.{k}", step, boundary=f"logits.step.{k}")
        rec.update_run(outputs={"generated": generated, "stop": stop})
        facts = {"input_ids_sha256": hashlib.sha256(ids[0].numpy().tobytes()).hexdigest()}

    t, gh, gw = (int(v) for v in grid_thw[0])
    m, patch = cfg.vision_config.spatial_merge_size, cfg.vision_config.patch_size
    # model facts only: the core writes the provenance (weights, versions, the image) itself
    inputs = {
        "resized": [gh * patch, gw * patch], "grid": [gh, gw], "cells": [gh // m, gw // m], "grid_thw": [t, gh, gw],
        "processor": ran, "processor_class": type(proc).__name__, "prompt": req.prompt,
        "tokens": int(ids.shape[1]), "decode": req.decode, **facts,
    }
    rec.update_run(inputs=inputs, attn=model.config._attn_implementation)
