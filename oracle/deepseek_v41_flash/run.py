"""The oracle runner: official preprocessing and tower, tapped by forward hooks.

    run(RunRequest(weights="synthetic:tiny", weights_dir=..., image=...), recorder)

Boundaries (design, "Boundaries"): `patches` [N, 588] bf16 (the official patches are bf16 before
the tower whatever the tower dtype), `rope.cos` / `rope.sin` [N, rope_dim] (the tables block 0
actually received), `block0` [N, D], `final_norm` [N, D], `aligner` [T, dim]. With several
images (`req.more_images`, one `<image>` each), image K >= 1 records the same under `image.K.`
(`tensordiff.format.images`), each planned by its own size, as the official `prepare_vl_inputs` does.
"""
from __future__ import annotations

import time
import warnings
from pathlib import Path

import torch
from torch import nn

from tensordiff.errors import BadInput
from tensordiff.format.images import ImageRecorder
from tensordiff.models.deepseek_v41_flash.options import OPTIONS

from .checkpoint import default_dtype, load_into
from .config import ModelArgs
from .image_processor import load_image, num_image_tokens, plan_record
from .vision import Aligner, ViT

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

# The official 3-D SDPA call makes PyTorch warn that fused kernels need 4-D inputs; that is
# known and deliberate here (the yardstick keeps the official call), so keep it off the console.
warnings.filterwarnings("ignore", message="All fused kernels requires query, key and value to be 4 dimensional",
                        category=UserWarning)


class VisionModel(nn.Module):
    """The vision half of the official `Transformer`, under its attribute names, so that the
    state-dict keys are the checkpoint's (`vision.*`, `aligner.*`)."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.vision = ViT(args)
        self.aligner = Aligner(args)

    @torch.inference_mode()
    def encode_image(self, patches: torch.Tensor, n_vit_h: int, n_vit_w: int) -> torch.Tensor:
        return self.aligner(self.vision(patches, n_vit_h, n_vit_w), n_vit_h, n_vit_w)


def build(args: ModelArgs, checkpoint: Path, dtype: torch.dtype, device: torch.device) -> VisionModel:
    if not args.vision_enabled:
        raise BadInput(f"{checkpoint}/config.json has vision_n_layers = 0: the model has no vision tower")
    with default_dtype(dtype), torch.device("meta"):
        model = VisionModel(args)
    return load_into(model, checkpoint, device)


def tap(model: VisionModel, rec) -> list:
    """Forward hooks at the five boundaries; returns the handles."""
    vit = model.vision

    def patches_in(_module, args):
        # exact: the values are bf16 whatever dtype they were cast to for the tower
        rec.record("patches", args[0].flatten(1).to(torch.bfloat16))

    def rope_in(_module, args):
        _x, cos, sin = args
        rec.record("rope.cos", cos.squeeze(1))  # [N, 1, rd] -> [N, rd]
        rec.record("rope.sin", sin.squeeze(1))

    return [
        vit.patch_embed.register_forward_pre_hook(patches_in),
        vit.blocks[0].register_forward_pre_hook(rope_in),
        vit.blocks[0].register_forward_hook(lambda _m, _a, out: rec.record("block0", out)),
        vit.norm.register_forward_hook(lambda _m, _a, out: rec.record("final_norm", out)),
        model.aligner.register_forward_hook(lambda _m, _a, out: rec.record("aligner", out)),
    ]



def run(req, rec) -> None:
    if req.weights_dir is None or req.image is None:
        raise BadInput("the DeepSeek V4.1 Flash oracle needs a weights directory and an image")
    if req.dtype not in DTYPES:
        raise BadInput(f"dtype {req.dtype!r} is not supported (float32 or bfloat16)")
    dtype = DTYPES[req.dtype]
    device = torch.device(req.device)
    checkpoint = Path(req.weights_dir)
    args = ModelArgs.from_dir(checkpoint)
    t0 = time.perf_counter()
    model = build(args, checkpoint, dtype, device)
    t1 = time.perf_counter()

    # every image of the prompt, in order, each planned by its own size as `prepare_vl_inputs`
    # does; image k's taps are named by `tensordiff.format.images` (the first keeps the plain names)
    paths = (req.image, *req.more_images)
    loaded = [load_image(p, args) for p in paths]
    # model facts only: the core writes the provenance (weights, versions, the image) itself
    per_image = [{"grid": [g[1], g[2]], "cells": [g[3], g[4]], "span": num_image_tokens(g[3], g[4])} for g in loaded]
    rec.update_run(inputs=per_image[0])
    if len(per_image) > 1:
        rec.update_run(inputs={"images": per_image})
    t2 = time.perf_counter()
    aligned, cells = [], []
    for k, (path, (patches, n_vit_h, n_vit_w, n_llm_h, n_llm_w)) in enumerate(zip(paths, loaded)):
        irec = ImageRecorder(rec, k)
        if irec.enabled:
            for name, t in plan_record(path, args).items():
                irec.record(name, t, boundary="plan")
        handles = tap(model, irec) if irec.enabled else []
        try:
            aligned.append(model.encode_image(patches.to(device=device, dtype=dtype), n_vit_h, n_vit_w).detach())
        finally:
            for h in handles:
                h.remove()
        cells.append((n_llm_h, n_llm_w))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    # the gate's time breakdown (`tensordiff gate` reads run.timings); forward includes the taps' copies
    rec.update_run(timings={"load_weights": t1 - t0, "preprocess": t2 - t1, "forward": time.perf_counter() - t2})
    if wants_language(req):
        from .model import language_numerics, run_language

        num = language_numerics(req)
        opts = OPTIONS.resolve(req.options)
        facts = run_language(args, checkpoint, num.dtype, req.prompt, aligned, cells, req.decode, rec,
                             kernel_quant=num.kernel_quant, index_keys=opts["index_keys"], layers=opts.get("layers"))
        rec.update_run(outputs={"generated": facts["generated"], "stop": facts["stop"]},
                       language={"prompt_tokens": facts["prompt_tokens"], "span_start": facts["span_start"],
                                 **({"span_starts": facts["span_starts"]} if len(paths) > 1 else {})},
                       language_numerics=num.facts(), boundary_dtypes=num.boundary_dtypes())


def wants_language(req) -> bool:
    """The language backbone runs when the user asks for text: a prompt or decode steps."""
    return req.prompt is not None or req.decode > 0
