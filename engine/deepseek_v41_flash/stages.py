"""The engine's stages, each runnable on another producer's tensors (tensordiff's local error).

    stages = make_stages(req, run)        # run: the reference dump's run record (inputs.grid)
    stages["block0"]({"patches": ..., "rope.cos": ..., "rope.sin": ...}) -> {"block0": ...}

Each stage is the engine's own code (`VisionTower.embed/block/later_blocks/norm`, `VisionEngine.align`) under
the request's device, dtype, backend and fault; inputs arrive as the reference stored them (on
the CPU, any dtype) and are cast here as the engine would hold them. `patches` and `rope` have no
upstream boundary: their stage is the whole path from the image, already compared end to end.
"""
from __future__ import annotations

import dataclasses

import torch

from . import faults as F
from .run import engine_for


def make_stages(req, run: dict) -> dict:
    eng = engine_for(req)
    grid = tuple(int(v) for v in run["inputs"]["grid"])
    tower = eng.tower

    def act(t: torch.Tensor) -> torch.Tensor:  # the residual stream's dtype, on the device
        return t.to(device=eng.device, dtype=eng.dtype)

    def rope(i) -> tuple[torch.Tensor, torch.Tensor]:  # the tables stay fp32, as the engine keeps them
        return i["rope.cos"].to(eng.device, torch.float32), i["rope.sin"].to(eng.device, torch.float32)

    @torch.inference_mode()
    def block0(i):
        x = tower.embed(i["patches"].to(eng.device))
        return {"block0": tower.block(x, tower.w.blocks[0], *rope(i))}

    @torch.inference_mode()
    def final_norm(i):
        return {"final_norm": tower.norm(tower.later_blocks(act(i["block0"]), *rope(i), tower.block))}

    @torch.inference_mode()
    def aligner(i):
        return {"aligner": eng.align(act(i["final_norm"]), grid)}

    stages = {"block0": block0, "final_norm": final_norm, "aligner": aligner}
    if req.prompt is not None or req.decode > 0:  # the run went on into the language backbone
        from .language.stages import make_language_stages

        stages.update(make_language_stages(dataclasses.replace(req, fault=F.language(req.fault)), run))
    return stages
