"""transformers' Qwen3VLVisionModel with a checkpoint's `model.visual.*` weights."""
from __future__ import annotations

from pathlib import Path

import torch

from tensordiff.errors import BadInput

from oracle import shards

PREFIX = "model.visual."


def visual_shards(ckpt: Path) -> dict[str, str]:
    return {k: v for k, v in shards.weight_map(ckpt).items() if k.startswith(PREFIX)}


def build(cfg, ckpt: Path, dtype: torch.dtype, device: str = "cpu", attn: str = "sdpa"):
    """cfg: Qwen3VLConfig. Returns the vision model in eval mode, weights loaded strictly."""
    from transformers import Qwen3VLVisionModel

    vcfg = cfg.vision_config
    vcfg._attn_implementation = attn
    with torch.device("meta"):
        model = Qwen3VLVisionModel(vcfg)
    # the module (on meta) says which tensors it needs and their shapes; extra model.visual.*
    # tensors in the checkpoint are refused as well, as a strict load would
    expected = {PREFIX + k: tuple(v.shape) for k, v in model.state_dict().items()}
    unexpected = sorted(set(visual_shards(ckpt)) - set(expected))
    if unexpected:
        raise BadInput(f"{ckpt}: model.visual.* does not fit Qwen3VLVisionModel (unexpected {unexpected[:3]})")
    stored = shards.load(ckpt, list(expected), expected, what="the Qwen3-VL vision tower")
    state = {k[len(PREFIX):]: t.to(dtype) for k, t in stored.items()}
    model.load_state_dict(state, strict=True, assign=True)
    # non-persistent buffers (the RoPE inverse frequencies) were created on meta: rebuild them
    rot = model.rotary_pos_emb
    # (fp32, as a from_pretrained load keeps them; a model-wide .to(dtype) would round them)
    inv, _ = rot.compute_axial_rope_parameters(rot.config)
    rot.inv_freq = inv
    rot.original_inv_freq = inv.clone()
    for name, buf in model.named_buffers():
        assert buf.device.type != "meta", f"buffer {name} was not materialised"
    return model.to(device=device).eval()
