"""Loading the tower's `model.visual.*` tensors from a checkpoint directory (sharded or not)."""
from __future__ import annotations

from pathlib import Path

import torch

from ..runtime import shards
from .config import VisionConfig

PREFIX = "model.visual."


def visual_shapes(vc: VisionConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the tower reads (name without the prefix) -> the shape its config implies."""
    h, f, o, m = vc.hidden_size, vc.intermediate_size, vc.out_hidden_size, vc.spatial_merge_size
    hm = h * m * m
    out: dict[str, tuple[int, ...]] = {
        "patch_embed.proj.weight": (h, vc.in_channels, vc.temporal_patch_size, vc.patch_size, vc.patch_size),
        "patch_embed.proj.bias": (h,),
        "pos_embed.weight": (vc.num_position_embeddings, h),
    }
    for i in range(vc.depth):
        b = f"blocks.{i}."
        out.update({b + "norm1.weight": (h,), b + "norm1.bias": (h,), b + "norm2.weight": (h,), b + "norm2.bias": (h,),
                    b + "attn.qkv.weight": (3 * h, h), b + "attn.qkv.bias": (3 * h,),
                    b + "attn.proj.weight": (h, h), b + "attn.proj.bias": (h,),
                    b + "mlp.linear_fc1.weight": (f, h), b + "mlp.linear_fc1.bias": (f,),
                    b + "mlp.linear_fc2.weight": (h, f), b + "mlp.linear_fc2.bias": (h,)})
    mergers = [("merger.", h)] + [(f"deepstack_merger_list.{k}.", hm) for k in range(len(vc.deepstack_visual_indexes))]
    for pre, norm in mergers:  # the DeepStack mergers normalise after the 2x2 shuffle
        out.update({pre + "norm.weight": (norm,), pre + "norm.bias": (norm,),
                    pre + "linear_fc1.weight": (hm, hm), pre + "linear_fc1.bias": (hm,),
                    pre + "linear_fc2.weight": (o, hm), pre + "linear_fc2.bias": (o,)})
    return out


def load_visual(ckpt: Path, vc: VisionConfig, dtype: torch.dtype, device: str = "cpu") -> dict[str, torch.Tensor]:
    """{name without 'model.visual.': tensor in `dtype` on `device`}: exactly the tensors the
    config implies, each of the implied shape, or one EngineInputError."""
    want = {PREFIX + k: s for k, s in visual_shapes(vc).items()}
    stored = shards.read(ckpt, list(want), "cpu", shapes=want)
    return {k[len(PREFIX):]: t.to(device=device, dtype=dtype) for k, t in stored.items()}

