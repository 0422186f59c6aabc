"""The engine's Qwen3-VL stages, each runnable on another producer's tensors (tensordiff's local error).

    stages = make_stages(req, run)      # run: the reference dump's run record (inputs.grid_thw)
    stages["block0"]({"patches": ..., "pos_embed": ..., "rope.cos": ..., "rope.sin": ...})

Each stage is the engine's own code (`VisionTower.embed`, `block`, `later_blocks`, `merger_norm`,
`merger_project`, `deepstack_merge`) under the request's device, dtype, backend and fault; inputs
arrive as the reference stored them and are cast as the engine holds them. The later blocks are
run once from the reference's `block0` and shared by `final_norm` and the DeepStack stages (each
DeepStack merger reads the block its index names).
`patches`, `pos_embed`, `rope` and `positions` have no upstream boundary: compared end to end.
"""
from __future__ import annotations

import torch

from .config import load_config
from .runner import load_tower, torch_dtype


def make_stages(req, run: dict) -> dict:
    dtype = torch_dtype(req.dtype)
    tower = load_tower(req, load_config(req.weights_dir))
    t, gh, gw = (int(v) for v in run["inputs"]["grid_thw"])
    cu = [i * gh * gw for i in range(t + 1)]
    trail: dict[int, torch.Tensor] = {}  # block index -> output, from the reference's block0

    def act(x: torch.Tensor) -> torch.Tensor:
        return x.to(device=req.device, dtype=dtype)

    def rope(i):
        return i["rope.cos"].to(req.device), i["rope.sin"].to(req.device)

    def blocks_from_block0(i) -> dict[int, torch.Tensor]:
        if not trail:
            x = act(i["block0"])
            trail[0] = x
            trail.update(tower.later_blocks(x, *rope(i), cu))
        return trail

    @torch.inference_mode()
    def block0(i):
        x = tower.embed(i["patches"].to(req.device)) + act(i["pos_embed"])
        return {"block0": tower.block(0, x, *rope(i), cu)}

    @torch.inference_mode()
    def final_norm(i):
        return {"final_norm": tower.merger_norm(blocks_from_block0(i)[tower.depth - 1])}

    @torch.inference_mode()
    def aligner(i):
        return {"aligner": tower.merger_project(act(i["final_norm"]))}

    def deepstack(k: int):
        @torch.inference_mode()
        def stage(i):
            x = blocks_from_block0(i).get(tower.deepstack_taps[k])
            if x is None:
                raise RuntimeError(f"DeepStack {k} reads block {tower.deepstack_taps[k]}, past the {tower.depth} "
                                   "blocks run")
            return {f"deepstack.{k}": tower.deepstack_merge(k, x)}
        return stage

    out = {"block0": block0, "final_norm": final_norm, "aligner": aligner}
    out.update({f"deepstack.{k}": deepstack(k) for k in range(len(tower.deepstack_taps))})
    return out
