"""The engine's Qwen3-VL stages, each runnable on another producer's tensors (tensordiff's local error).

    stages = make_stages(req, run)      # run: the reference dump's run record (inputs.grid_thw)
    stages["block0"]({"patches": ..., "pos_embed": ..., "rope.cos": ..., "rope.sin": ...})

Each stage is the engine's own code (`VisionTower.block`, `merge`, `shuffle`) under the request's
device, dtype, backend and fault; inputs arrive as the reference stored them and are cast as the
engine holds them. The later blocks are run once from the reference's `block0` and shared by
`final_norm` and the DeepStack stages (each DeepStack merger reads the block its index names).
`patches`, `pos_embed`, `rope` and `positions` have no upstream boundary: compared end to end.
"""
from __future__ import annotations

import torch

from .. import backend as backends
from ..runtime.spatial_merge import shuffle
from . import faults as F
from .config import load_config
from .layers import gelu_erf, gelu_tanh
from .merger import merge
from .runner import torch_dtype
from .vision import VisionTower
from .weights import load_visual


def make_stages(req, run: dict) -> dict:
    fault = F.check(req.fault)
    dtype = torch_dtype(req.dtype)
    backend = backends.get(req.backend)
    cfg = load_config(req.weights_dir)
    vc = cfg.vision
    w = load_visual(req.weights_dir, vc, dtype, req.device)
    tower = VisionTower(vc, w, backend, dtype, fault)
    t, gh, gw = (int(v) for v in run["inputs"]["grid_thw"])
    m = vc.spatial_merge_size
    cu = [i * gh * gw for i in range(t + 1)]
    depth, taps_at = tower.depth, tower.deepstack_taps
    trail: dict[int, torch.Tensor] = {}  # block index -> output, from the reference's block0

    def act(x: torch.Tensor) -> torch.Tensor:
        return x.to(device=req.device, dtype=dtype)

    def rope(i):
        return i["rope.cos"].to(req.device), i["rope.sin"].to(req.device)

    def blocks_from_block0(i) -> dict[int, torch.Tensor]:
        if not trail:
            x = act(i["block0"])
            cos, sin = rope(i)
            trail[0] = x
            for j in range(1, depth):
                x = tower.block(j, x, cos, sin, cu)
                trail[j] = x
        return trail

    @torch.inference_mode()
    def block0(i):
        x = backend.patch_linear(act(i["patches"]), tower.patch_w, w["patch_embed.proj.bias"])
        x = x + act(i["pos_embed"])
        return {"block0": tower.block(0, x, *rope(i), cu)}

    @torch.inference_mode()
    def final_norm(i):
        x = blocks_from_block0(i)[depth - 1]
        taps: dict = {}
        merge(backend, w, "merger", x, m, postshuffle=False, taps=taps)
        return {"final_norm": taps["norm"]}

    @torch.inference_mode()
    def aligner(i):
        # the merger after its norm: 2x2 shuffle, fc1, GELU, fc2 (merge() from the normed rows)
        h = shuffle(act(i["final_norm"]), m)
        gelu = gelu_tanh if fault == F.MERGER_GELU_TANH else gelu_erf
        h = gelu(backend.linear(h, w["merger.linear_fc1.weight"], w["merger.linear_fc1.bias"]))
        return {"aligner": backend.linear(h, w["merger.linear_fc2.weight"], w["merger.linear_fc2.bias"])}

    def deepstack(k: int):
        @torch.inference_mode()
        def stage(i):
            x = blocks_from_block0(i).get(taps_at[k])
            if x is None:
                raise RuntimeError(f"DeepStack {k} reads block {taps_at[k]}, past the {depth} blocks run")
            d = merge(backend, w, f"deepstack_merger_list.{k}", x, m, postshuffle=True)
            return {f"deepstack.{k}": torch.zeros_like(d) if fault == F.DEEPSTACK_DROP else d}
        return stage

    out = {"block0": block0, "final_norm": final_norm, "aligner": aligner}
    out.update({f"deepstack.{k}": deepstack(k) for k in range(len(taps_at))})
    return out
