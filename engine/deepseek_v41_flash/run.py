"""The engine runner, and `VisionEngine`, the reusable vision path.

    run(RunRequest(weights=..., weights_dir=..., image=..., device="cuda", dtype="bfloat16"), rec)

Taps at the five boundaries are explicit `rec.record` calls guarded by `rec.enabled`, so a
`NullRecorder` costs a branch. Options (`req.options`): `attention` = a list of SDPA kernel names
to prefer on CUDA (see `engine.runtime.attention.KERNELS`).
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import torch

from .. import backend as backends
from ..errors import EngineInputError
from ..runtime import image as rimage
from . import faults as F
from . import weights as W
from .aligner import AlignerWeights, align, cell_index
from .config import Config
from .fused import GraphCache, can_compile, policy
from .preprocess import ImagePlan, patch_rows, plan_image, render
from .span import image_span
from .vision import VisionTower, prepare_tower, tower_names

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
ALIGNER = ["aligner.w1.weight", "aligner.w1.bias", "aligner.w2.weight", "aligner.w2.bias"]
MARKERS = ["image_start", "image_end", "image_newline"]


class VisionEngine:
    """Weights prepared once on `device`; then `preprocess(path)` and `encode(patches, plan)`."""

    def __init__(self, checkpoint: str | Path, *, device="cpu", dtype="float32", backend="torch",
                 fault: str | None = None, attention_prefer=None, fuse: str | None = None,
                 graphs: str | None = None):
        """fuse / graphs: 'off', 'on', 'auto' or None (the TENSORDIFF_FUSE / TENSORDIFF_GRAPHS
        environment, see `fused`); both are off on the CPU whatever is asked."""
        if dtype not in DTYPES:
            raise EngineInputError(f"dtype {dtype!r} is not supported (float32 or bfloat16)")
        self.fault = F.check(fault)
        self.device = torch.device(device)
        self.dtype = DTYPES[dtype]
        self.backend = backends.get(backend)
        self.checkpoint = Path(checkpoint)
        self.cfg = Config.load(self.checkpoint)
        t = W.read(self.checkpoint, tower_names(self.cfg) + ALIGNER + MARKERS)
        tw = prepare_tower(t, self.cfg, self.dtype, self.device, pad_nonzero=fault == "patch-pad-nonzero")
        self.tower = VisionTower(self.cfg, tw, self.backend, rope_interleaved=fault == "rope-interleaved",
                                 pad_nonzero=fault == "patch-pad-nonzero", attention_prefer=attention_prefer,
                                 fuse=(fuse or policy("FUSE", "auto")) if can_compile(self.device) else "off")
        graphs = (graphs or policy("GRAPHS", "auto")) if self.device.type == "cuda" else "off"
        # 'on' captures at a grid's first pass, 'auto' at its second (a one-shot run stays eager)
        self.graphs = None if graphs == "off" else GraphCache(None, after=0 if graphs == "on" else 1)
        cast = lambda n: t[n].to(device=self.device, dtype=self.dtype).contiguous()  # noqa: E731
        self.aligner = AlignerWeights(*(cast(n) for n in ALIGNER))
        self.markers = {n: cast(n) for n in MARKERS}

    def plan(self, width: int, height: int) -> ImagePlan:
        rounding = "ceil" if self.fault == "contain-ceil" else "round"
        return plan_image(width, height, self.cfg, contain_rounding=rounding)

    def preprocess(self, path) -> tuple[ImagePlan, torch.Tensor]:
        """Image file -> (plan, patches [N, 588] bf16 on the device)."""
        picture = rimage.open_rgb(path)
        plan = self.plan(*picture.size)
        return plan, patch_rows(render(picture, plan), self.cfg, self.device)

    def encode(self, patches: torch.Tensor, plan: ImagePlan, rec=None) -> torch.Tensor:
        """patches [N, 588] bf16 -> aligner rows [T, dim]; taps into `rec` when given and enabled."""
        taps = rec is not None and rec.enabled
        if not taps and self.graphs is not None:
            # one CUDA graph per grid and input shape: the whole tower and aligner in one launch
            self.graphs.fn = lambda p: self._encode(p, plan, None)
            return self.graphs((plan.grid, tuple(patches.shape), patches.dtype), patches)
        return self._encode(patches, plan, rec)

    def _encode(self, patches: torch.Tensor, plan: ImagePlan, rec=None) -> torch.Tensor:
        taps = rec is not None and rec.enabled
        if taps:
            rec.record("patches", patches)
        x = self.tower.forward(patches, plan.grid, rec)
        index = cell_index(*plan.grid, self.cfg.vision_downsample_ratio, x.device,
                           flat_pad=self.fault == "aligner-flat-pad")
        out = align(x, index, self.aligner, self.backend, gelu_tanh=self.fault == "gelu-tanh")
        if taps:
            rec.record("aligner", out)
        return out

    def span(self, position: int, aligned: torch.Tensor, plan: ImagePlan):
        """The overlay span (rows for the whole image span) starting at sequence `position`."""
        return image_span(position, aligned, self.markers, plan.cells)


def run(req, rec) -> None:
    if req.weights_dir is None or req.image is None:
        raise EngineInputError("the DeepSeek V4.1 Flash engine needs a weights directory and an image")
    if req.chunk is not None and req.prompt is None and req.decode == 0:
        raise EngineInputError("--chunk splits the language prefill: give a --prompt (with <image>) too")
    prefer = req.options.get("attention") if req.options else None
    t0 = time.perf_counter()
    eng = VisionEngine(req.weights_dir, device=req.device, dtype=req.dtype, backend=req.backend,
                       fault=req.fault, attention_prefer=prefer)
    t1 = time.perf_counter()
    plan, patches = eng.preprocess(req.image)
    # model facts only: the core writes the provenance (weights, versions, the image) itself
    rec.update_run(inputs={"grid": list(plan.grid), "cells": list(plan.cells), "span": plan.span},
                   backend=eng.backend.name)
    if req.taps and getattr(rec, "enabled", True):
        for name, t in plan.record().items():
            rec.record(name, t, boundary="plan")
    t2 = time.perf_counter()
    with torch.inference_mode():
        aligned = eng.encode(patches, plan, rec if req.taps else None)
    if eng.device.type == "cuda":
        torch.cuda.synchronize(eng.device)
    # the gate's time breakdown (`tensordiff gate` reads run.timings); forward includes the taps' copies
    rec.update_run(timings={"load_weights": t1 - t0, "preprocess": t2 - t1, "forward": time.perf_counter() - t2})
    if req.prompt is not None or req.decode > 0:
        from .language.run import run_language

        # the tower ran once, above; prefill asks for its rows when it first reaches the span
        facts = run_language(dataclasses.replace(req, fault=F.language(req.fault)), rec, lambda: aligned,
                             tuple(plan.cells))
        rec.update_run(outputs={"generated": facts["generated"], "stop": facts["stop"]},
                       language={"prompt_tokens": facts["prompt_tokens"], "span_start": facts["span_start"],
                                 "vision_calls": facts["vision_calls"]})
