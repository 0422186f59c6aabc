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

from tensordiff.format import images

from . import faults as F
from .run import engine_for


def make_stages(req, run: dict) -> dict:
    eng = engine_for(req)
    stages = {}
    # one set of vision stages per image, under its names (`tensordiff.format.images`), on its own grid
    for k, facts in enumerate((run["inputs"].get("images") or [run["inputs"]])):
        stages.update(_vision_stages(eng, tuple(int(v) for v in facts["grid"]), images.prefix(k),
                                     replays_run=eng.tower.eager_at(k + 1)))
    if req.prompt is not None or req.decode > 0:  # the run went on into the language backbone
        from engine.deepseek_v41_flash.language_stages import make_language_stages

        stages.update(make_language_stages(dataclasses.replace(req, fault=F.language(req.fault)), run))
    return stages


def _vision_stages(eng, grid: tuple[int, int], pre: str, replays_run: bool) -> dict:
    """replays_run: the run encoded this image with the eager block these stages run (its k-th
    forward of a fresh engine: `VisionTower.eager_at`), so on the run's own tensors they give the
    run's own outputs, bit for bit (tensordiff.pipeline.local_error skips them then)."""
    tower = eng.tower

    def act(t: torch.Tensor) -> torch.Tensor:  # the residual stream's dtype, on the device
        return t.to(device=eng.device, dtype=eng.dtype)

    def rope(i) -> tuple[torch.Tensor, torch.Tensor]:  # the tables stay fp32, as the engine keeps them
        return i[pre + "rope.cos"].to(eng.device, torch.float32), i[pre + "rope.sin"].to(eng.device, torch.float32)

    @torch.inference_mode()
    def block0(i):
        x = tower.embed(i[pre + "patches"].to(eng.device))
        return {pre + "block0": tower.block(x, tower.w.blocks[0], *rope(i))}

    @torch.inference_mode()
    def final_norm(i):
        return {pre + "final_norm": tower.norm(tower.later_blocks(act(i[pre + "block0"]), *rope(i), tower.block))}

    @torch.inference_mode()
    def aligner(i):
        return {pre + "aligner": eng.align(act(i[pre + "final_norm"]), grid)}

    for stage in (block0, final_norm, aligner):
        stage.replays_run = replays_run
    return {pre + "block0": block0, pre + "final_norm": final_norm, pre + "aligner": aligner}
