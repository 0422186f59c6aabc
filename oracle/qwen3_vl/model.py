"""transformers' Qwen3VLVisionModel with a checkpoint's `model.visual.*` weights."""
from __future__ import annotations

from pathlib import Path

import torch

from tensordiff.errors import BadInput
from tensordiff.shards import shard_map

PREFIX = "model.visual."


def visual_shards(ckpt: Path) -> dict[str, str]:
    return shard_map(ckpt, PREFIX)


def build(cfg, ckpt: Path, dtype: torch.dtype, device: str = "cpu", attn: str = "sdpa"):
    """cfg: Qwen3VLConfig. Returns the vision model in eval mode, weights loaded strictly."""
    from safetensors import safe_open
    from transformers import Qwen3VLVisionModel

    vcfg = cfg.vision_config
    vcfg._attn_implementation = attn
    with torch.device("meta"):
        model = Qwen3VLVisionModel(vcfg)
    state = {}
    by_file: dict[str, list[str]] = {}
    for k, f in visual_shards(ckpt).items():
        by_file.setdefault(f, []).append(k)
    for fname, keys in by_file.items():
        with safe_open(str(Path(ckpt) / fname), "pt", device="cpu") as f:
            for k in keys:
                state[k[len(PREFIX):]] = f.get_tensor(k).to(dtype)
    missing = set(model.state_dict()) - set(state)
    unexpected = set(state) - set(model.state_dict())
    if missing or unexpected:
        raise BadInput(f"{ckpt}: model.visual.* does not fit Qwen3VLVisionModel "
                       f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})")
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
