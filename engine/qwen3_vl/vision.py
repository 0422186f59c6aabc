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
from ..runtime.fused import FusedBlock, GraphCache
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


@dataclass(frozen=True)
class BlockWeights:
    """One block's tensors, passed to the block as an argument (one compiled graph serves every layer)."""
    norm1_w: torch.Tensor
    norm1_b: torch.Tensor
    qkv_w: torch.Tensor  # [3D, D]
    qkv_b: torch.Tensor
    proj_w: torch.Tensor
    proj_b: torch.Tensor
    norm2_w: torch.Tensor
    norm2_b: torch.Tensor
    fc1_w: torch.Tensor
    fc1_b: torch.Tensor
    fc2_w: torch.Tensor
    fc2_b: torch.Tensor

    @classmethod
    def of(cls, w: dict[str, torch.Tensor], i: int) -> "BlockWeights":
        p = f"blocks.{i}"
        return cls(w[f"{p}.norm1.weight"], w[f"{p}.norm1.bias"], w[f"{p}.attn.qkv.weight"], w[f"{p}.attn.qkv.bias"],
                   w[f"{p}.attn.proj.weight"], w[f"{p}.attn.proj.bias"], w[f"{p}.norm2.weight"],
                   w[f"{p}.norm2.bias"], w[f"{p}.mlp.linear_fc1.weight"], w[f"{p}.mlp.linear_fc1.bias"],
                   w[f"{p}.mlp.linear_fc2.weight"], w[f"{p}.mlp.linear_fc2.bias"])


class QwenBlock:
    """One pre-norm block on the residual stream x: [N, hidden], written as the pieces that the
    compiled route (`engine.runtime.fused.FusedBlock`) hands to torch.compile unchanged:

        q, k, v = attn_in(x)      LayerNorm -> qkv GEMM + bias -> 2D RoPE (rotate_half) on q and k
        o = attend(q, k, v)       the runtime's attention over the tower's segments: never compiled
        x = out(x, o)             attn_residual (proj + x) -> ffn_residual (LayerNorm, fc1, act, fc2 + x)
    """

    def __init__(self, cfg: VisionConfig, backend, attend, act):
        self.nh, self.hd = cfg.num_heads, cfg.head_dim
        self.backend, self.attend, self.act = backend, attend, act

    def __call__(self, x: torch.Tensor, blk: BlockWeights, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q, k, v = self.attn_in(x, blk, cos, sin)
        return self.out(x, self.attend(q, k, v), blk)

    def attn_in(self, x, blk: BlockWeights, cos, sin):
        """[N, hidden] -> q, k, v: [N, H, hd], each contiguous (the layout the attention call views)."""
        b, n = self.backend, x.shape[0]
        h = layer_norm(x, blk.norm1_w, blk.norm1_b)
        qkv = b.linear(h, blk.qkv_w, blk.qkv_b).view(n, 3, self.nh, self.hd)
        q, k, v = qkv.unbind(1)
        return b.rope_rotate_half(q, cos, sin).contiguous(), b.rope_rotate_half(k, cos, sin).contiguous(), \
            v.contiguous()

    def out(self, x, o, blk: BlockWeights) -> torch.Tensor:
        """The rest of the block after attention's output o: [N, H, hd]."""
        return self.ffn_residual(self.attn_residual(x, o, blk), blk)

    def attn_residual(self, x, o, blk: BlockWeights) -> torch.Tensor:
        return x + self.backend.linear(o.reshape(x.shape[0], -1), blk.proj_w, blk.proj_b)

    def ffn_residual(self, x, blk: BlockWeights) -> torch.Tensor:
        """x + fc2(act(fc1(LN2(x)))). The LayerNorm is plain torch, no backend kernel, so on
        another backend it is compiled with this glue (DeepSeek's RMSNorm is a kernel: outside)."""
        b = self.backend
        h = layer_norm(x, blk.norm2_w, blk.norm2_b)
        return x + b.linear(self.act(b.linear(h, blk.fc1_w, blk.fc1_b)), blk.fc2_w, blk.fc2_b)


class _NoTaps:
    """The recorder of a pass without taps (a CUDA graph's capture records nothing)."""
    enabled = False

    def record(self, *args, **kwargs) -> None:
        pass


class VisionTower:
    def __init__(self, cfg: VisionConfig, weights: dict[str, torch.Tensor], backend, dtype: torch.dtype,
                 fault: str | None = None, speed=None, fuse: str = "off", graphs: str = "off",
                 attention_prefer=None):
        """speed: a `SpeedPath` told which attention kernels ran. fuse / graphs: 'off', 'on' or
        'auto', as the caller resolved them for the device (the CUDA speed paths, `engine.runtime.fused`):
        fuse 'on' runs the compiled block from the first pass, 'auto' from the second; graphs
        'on' captures a grid's whole untapped pass at its first pass, 'auto' at its second, and
        replays it after. A tapped pass (a recorder that is enabled) never runs a graph."""
        self.cfg, self.w, self.backend, self.dtype, self.fault = cfg, weights, backend, dtype, fault
        self.speed = speed
        self.attention_prefer = attention_prefer
        k = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size ** 2
        # Conv3d with kernel == stride is a matmul over flattened (c, t, py, px) columns
        self.patch_w = weights["patch_embed.proj.weight"].reshape(cfg.hidden_size, k)
        self.act = gelu_erf if fault == F.VISION_GELU_ERF else activation(cfg.hidden_act)
        self.blocks = [BlockWeights.of(weights, i) for i in range(cfg.depth)]
        self.eager = QwenBlock(cfg, backend, self.attend, self.act)
        self.fuse, self.passes, self._fused = fuse, 0, None
        self._block = self.eager  # the route `block` runs: the eager block until a pass picks the compiled one
        self._cu: list[int] | None = None  # the attention segments of the pass in progress
        self.graphs = None if graphs == "off" else GraphCache(None, after=0 if graphs == "on" else 1)
        self._tables: dict = {}  # grid_thw -> (pos, cos, sin) on the device, for the graph route
        self.ran = "eager"  # the block the last pass ran: 'eager' or 'compiled'

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

    def attend(self, q, k, v) -> torch.Tensor:
        return attention(q, k, v, scale=self.cfg.head_dim ** -0.5, cu_seqlens=self._cu, prefer=self.attention_prefer,
                         log=self.speed)

    def block(self, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cu: list[int]) -> torch.Tensor:
        self._cu = cu
        return self._block(x, self.blocks[i], cos, sin)

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

    def tables(self, grid_thw: tuple[int, int, int], device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The grid's position rows and RoPE tables on the device: pos [N, hidden], cos, sin [N, hd]."""
        cfg, w, m, fault = self.cfg, self.w, self.cfg.spatial_merge_size, self.fault
        t, gh, gw = grid_thw
        pos = interpolate_pos_embed(w["pos_embed.weight"], gh, gw, t, m,
                                    align_corners=fault != F.POSEMBED_ALIGN_CORNERS_FALSE, dtype=self.dtype)
        cos, sin = vision_rope(gh, gw, t, m, cfg.head_dim, cfg.rope_theta, swap_hw=fault == F.ROPE_HW_SWAP)
        return pos.to(device), cos.to(device), sin.to(device)

    def _route(self):
        """The block this pass runs: the eager one, or the compiled one once due (`fuse`)."""
        self.passes += 1
        if self.fuse == "off" or (self.fuse == "auto" and self.passes < 2):
            return self.eager
        if self._fused is None:
            self._fused = FusedBlock(self.eager)
        return self._fused

    def __call__(self, pixel_values: torch.Tensor, grid_thw: tuple[int, int, int], rec) -> TowerOutput:
        grid_thw = tuple(int(v) for v in grid_thw)
        self._block = self._route()
        try:
            if self.graphs is not None and not getattr(rec, "enabled", True):
                # one CUDA graph per grid and input shape: the whole untapped pass in one launch
                if grid_thw not in self._tables:
                    self._tables[grid_thw] = self.tables(grid_thw, pixel_values.device)
                tables = self._tables[grid_thw]
                self.graphs.fn = lambda p: self._pass(p, grid_thw, _NoTaps(), tables)
                out = self.graphs((grid_thw, tuple(pixel_values.shape), pixel_values.dtype), pixel_values)
            else:
                out = self._pass(pixel_values, grid_thw, rec, self.tables(grid_thw, pixel_values.device))
        finally:
            fz = self._fused
            self.ran = "compiled" if self._block is fz and fz is not None and fz.ok else "eager"
            self._block = self.eager  # the stages (local error) run the eager block
        return TowerOutput(out[0], list(out[1:]))

    def _pass(self, pixel_values, grid_thw, rec, tables) -> tuple[torch.Tensor, ...]:
        """One pass -> (embeds, *deepstack), recording the boundaries into `rec`."""
        t, gh, gw = grid_thw
        pos, cos, sin = tables
        x = self.embed(pixel_values)
        rec.record("pos_embed", pos)
        x = x + pos
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
        return (embeds, *deepstack)
