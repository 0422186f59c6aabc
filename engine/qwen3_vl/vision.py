"""The Qwen3-VL vision tower: patches -> (merged embedding, three DeepStack embeddings).

    x = patch_embed(pixel_values) + pos_embed          # [N, hidden], merge order
    for each block: x += attn(LN1 x); x += mlp(LN2 x)  # 2D RoPE on q, k; full attention per image
    after blocks in deepstack_visual_indexes: deepstack_k = merger_k(x)
    aligner = merger(x)                                 # merger.norm output is `final_norm`

The tower's output is one unit: the primary embedding and the DeepStack tensors, each
[N/4, out_hidden], the same rows (merged tokens in raster order of the cell grid).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..runtime.attention import attention
from . import faults as F
from .config import VisionConfig
from .layers import activation, gelu_erf, gelu_tanh, layer_norm
from .merger import merge
from .pos_embed import interpolate_pos_embed
from .rope import vision_rope


@dataclass
class TowerOutput:
    embeds: torch.Tensor  # [N/4, out_hidden]
    deepstack: list[torch.Tensor]  # len(deepstack_visual_indexes) x [N/4, out_hidden]


class VisionTower:
    def __init__(self, cfg: VisionConfig, weights: dict[str, torch.Tensor], backend, dtype: torch.dtype,
                 fault: str | None = None):
        self.cfg, self.w, self.backend, self.dtype, self.fault = cfg, weights, backend, dtype, fault
        k = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size ** 2
        # Conv3d with kernel == stride is a matmul over flattened (c, t, py, px) columns
        self.patch_w = weights["patch_embed.proj.weight"].reshape(cfg.hidden_size, k)
        self.act = gelu_erf if fault == F.VISION_GELU_ERF else activation(cfg.hidden_act)

    @property
    def depth(self) -> int:
        """Blocks that run (the planted off-by-one skips the last)."""
        return self.cfg.depth - 1 if self.fault == F.TOWER_SKIP_LAST_BLOCK else self.cfg.depth

    @property
    def deepstack_taps(self) -> list[int]:
        """Block index whose output each DeepStack merger reads (0-based, as the config says)."""
        one_late = 1 if self.fault == F.DEEPSTACK_OFF_BY_ONE else 0
        return [i + one_late for i in self.cfg.deepstack_visual_indexes]

    def block(self, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cu: list[int]) -> torch.Tensor:
        w, b, cfg = self.w, self.backend, self.cfg
        p = f"blocks.{i}"
        n = x.shape[0]
        h = layer_norm(x, w[f"{p}.norm1.weight"], w[f"{p}.norm1.bias"])
        qkv = b.linear(h, w[f"{p}.attn.qkv.weight"], w[f"{p}.attn.qkv.bias"]).view(n, 3, cfg.num_heads, cfg.head_dim)
        q, k, v = qkv.unbind(1)  # [N, H, hd] each
        q = b.rope_rotate_half(q, cos, sin)
        k = b.rope_rotate_half(k, cos, sin)
        o = attention(q.contiguous(), k.contiguous(), v.contiguous(), scale=cfg.head_dim ** -0.5, cu_seqlens=cu)
        x = x + b.linear(o.reshape(n, -1), w[f"{p}.attn.proj.weight"], w[f"{p}.attn.proj.bias"])
        h = layer_norm(x, w[f"{p}.norm2.weight"], w[f"{p}.norm2.bias"])
        h = self.act(b.linear(h, w[f"{p}.mlp.linear_fc1.weight"], w[f"{p}.mlp.linear_fc1.bias"]))
        return x + b.linear(h, w[f"{p}.mlp.linear_fc2.weight"], w[f"{p}.mlp.linear_fc2.bias"])

    def __call__(self, pixel_values: torch.Tensor, grid_thw: tuple[int, int, int], rec) -> TowerOutput:
        cfg, w, m, fault = self.cfg, self.w, self.cfg.spatial_merge_size, self.fault
        t, gh, gw = grid_thw
        x = self.backend.patch_linear(pixel_values.to(self.dtype), self.patch_w, w["patch_embed.proj.bias"])
        pos = interpolate_pos_embed(w["pos_embed.weight"], gh, gw, t, m,
                                    align_corners=fault != F.POSEMBED_ALIGN_CORNERS_FALSE, dtype=x.dtype)
        rec.record("pos_embed", pos)
        x = x + pos
        cos, sin = vision_rope(gh, gw, t, m, cfg.head_dim, cfg.rope_theta, swap_hw=fault == F.ROPE_HW_SWAP)
        cos, sin = cos.to(x.device), sin.to(x.device)
        rec.record("rope.cos", cos)
        rec.record("rope.sin", sin)
        cu = [i * gh * gw for i in range(t + 1)]  # one attention segment per frame group
        taps_at = self.deepstack_taps
        deepstack = []
        for i in range(self.depth):
            x = self.block(i, x, cos, sin, cu)
            if i == 0:
                rec.record("block0", x)
            if i in taps_at:
                k = taps_at.index(i)
                d = merge(self.backend, w, f"deepstack_merger_list.{k}", x, m, postshuffle=True)
                if fault == F.DEEPSTACK_DROP:
                    d = torch.zeros_like(d)
                deepstack.append(d)
        taps: dict = {}
        embeds = merge(self.backend, w, "merger", x, m, postshuffle=False, taps=taps,
                       act=gelu_tanh if fault == F.MERGER_GELU_TANH else gelu_erf)
        rec.record("final_norm", taps["norm"])
        rec.record("aligner", embeds)
        for k, d in enumerate(deepstack):
            rec.record(f"deepstack.{k}", d, boundary=f"deepstack.{k}")
        return TowerOutput(embeds, deepstack)
