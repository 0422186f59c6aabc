"""The Qwen3-VL vision tower: patches -> (merged embedding, three DeepStack embeddings).

    x = patch_embed(pixel_values) + pos_embed          # [N, hidden], merge order
    for each block: x += attn(LN1 x); x += mlp(LN2 x)  # 2D RoPE on q, k; full attention per image
    after blocks in deepstack_visual_indexes: deepstack_k = merger_k(x)
    aligner = merger(x)                                 # merger.norm output is `final_norm`

The tower's output is one unit: the primary embedding and the DeepStack tensors, each
[N/4, out_hidden], the same rows (merged tokens in raster order of the cell grid).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from ..runtime.attention import attention
from ..runtime.spatial_merge import shuffle
from . import faults as F
from . import merger
from .config import VisionConfig
from .layers import activation, gelu_erf, gelu_tanh, layer_norm
from .pos_embed import interpolate_pos_embed
from .rope import vision_rope


@dataclass
class TowerOutput:
    embeds: torch.Tensor  # [N/4, out_hidden]
    deepstack: list[torch.Tensor]  # len(deepstack_visual_indexes) x [N/4, out_hidden]


class VisionTower:
    def __init__(self, cfg: VisionConfig, weights: dict[str, torch.Tensor], backend, dtype: torch.dtype,
                 fault: str | None = None, speed=None):
        """speed: a `SpeedPath` told which attention kernels ran."""
        self.cfg, self.w, self.backend, self.dtype, self.fault = cfg, weights, backend, dtype, fault
        self.speed = speed
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

    def embed(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Patch rows [N, C*T*P*P] -> [N, hidden] (the Conv3d as a matmul), before the position table."""
        return self.backend.patch_linear(pixel_values.to(self.dtype), self.patch_w, self.w["patch_embed.proj.bias"])

    def block(self, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cu: list[int]) -> torch.Tensor:
        w, b, cfg = self.w, self.backend, self.cfg
        p = f"blocks.{i}"
        n = x.shape[0]
        h = layer_norm(x, w[f"{p}.norm1.weight"], w[f"{p}.norm1.bias"])
        qkv = b.linear(h, w[f"{p}.attn.qkv.weight"], w[f"{p}.attn.qkv.bias"]).view(n, 3, cfg.num_heads, cfg.head_dim)
        q, k, v = qkv.unbind(1)  # [N, H, hd] each
        q = b.rope_rotate_half(q, cos, sin)
        k = b.rope_rotate_half(k, cos, sin)
        o = attention(q.contiguous(), k.contiguous(), v.contiguous(), scale=cfg.head_dim ** -0.5, cu_seqlens=cu,
                      log=self.speed)
        x = x + b.linear(o.reshape(n, -1), w[f"{p}.attn.proj.weight"], w[f"{p}.attn.proj.bias"])
        h = layer_norm(x, w[f"{p}.norm2.weight"], w[f"{p}.norm2.bias"])
        h = self.act(b.linear(h, w[f"{p}.mlp.linear_fc1.weight"], w[f"{p}.mlp.linear_fc1.bias"]))
        return x + b.linear(h, w[f"{p}.mlp.linear_fc2.weight"], w[f"{p}.mlp.linear_fc2.bias"])

    def later_blocks(self, x: torch.Tensor, cos, sin, cu: list[int]):
        """Blocks 1.. on block 0's output: yields (i, output of block i)."""
        for i in range(1, self.depth):
            x = self.block(i, x, cos, sin, cu)
            yield i, x

    def deepstack_merge(self, k: int, x: torch.Tensor) -> torch.Tensor:
        """DeepStack merger k on the output of the block it reads: shuffle, then norm, fc1, fc2."""
        pre = f"deepstack_merger_list.{k}"
        h = merger.norm(self.w, pre, shuffle(x, self.cfg.spatial_merge_size))
        d = merger.project(self.backend, self.w, pre, h)
        return torch.zeros_like(d) if self.fault == F.DEEPSTACK_DROP else d

    def merger_norm(self, x: torch.Tensor) -> torch.Tensor:
        """The primary merger's LayerNorm (the `final_norm` boundary), [N, hidden]."""
        return merger.norm(self.w, "merger", x)

    def merger_project(self, normed: torch.Tensor) -> torch.Tensor:
        """The primary merger after its norm: 2x2 shuffle, fc1, GELU, fc2 (the `aligner` boundary)."""
        act = gelu_tanh if self.fault == F.MERGER_GELU_TANH else gelu_erf
        return merger.project(self.backend, self.w, "merger", shuffle(normed, self.cfg.spatial_merge_size), act)

    def __call__(self, pixel_values: torch.Tensor, grid_thw: tuple[int, int, int], rec) -> TowerOutput:
        cfg, w, m, fault = self.cfg, self.w, self.cfg.spatial_merge_size, self.fault
        t, gh, gw = grid_thw
        x = self.embed(pixel_values)
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
        x = self.block(0, x, cos, sin, cu)
        rec.record("block0", x)
        deepstack = []
        for i, x in itertools.chain([(0, x)], self.later_blocks(x, cos, sin, cu)):
            if i in taps_at:
                deepstack.append(self.deepstack_merge(taps_at.index(i), x))
        normed = self.merger_norm(x)
        embeds = self.merger_project(normed)
        rec.record("final_norm", normed)
        rec.record("aligner", embeds)
        for k, d in enumerate(deepstack):
            rec.record(f"deepstack.{k}", d, boundary=f"deepstack.{k}")
        return TowerOutput(embeds, deepstack)
