"""The vision tower as an engine runs it: weights prepared once, one pass per image.

Preparation: the patch projection's input width is padded 588 -> 592 (a multiple of 16, what
tensor-core GEMMs want) with zero weight columns, and the patch rows get zero columns to match,
so the padding changes no number; the `patches` boundary still shows the logical 588 columns.
`wqkv` stays fused: one GEMM gives q, k and v, split by views.

Per block (x: [N, D] residual stream in the run dtype, bf16 on GPU):
    h = rms_norm(x) -> qkv = h @ wqkv.T + b -> rope on q and k together -> 4-D SDPA -> wo
    x += ...; h = rms_norm(x) -> w1 -> silu(gate) * up -> w2; x += ...
Nothing leaves the device and nothing waits on it (no .item(), no host copies) unless a tap
records a tensor.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..backend import pad_columns
from ..runtime.attention import attention
from .config import Config
from .rope import rope_tables

NORM_EPS = 1e-6
PAD_MULTIPLE = 16


@dataclass
class BlockWeights:
    norm1: torch.Tensor  # [D] fp32
    wqkv: torch.Tensor  # [3D, D]
    bqkv: torch.Tensor  # [3D]
    wo: torch.Tensor  # [D, D]
    bo: torch.Tensor
    norm2: torch.Tensor  # [D] fp32
    w1: torch.Tensor  # [2I, D]: gate rows then up rows
    w2: torch.Tensor  # [D, I]


@dataclass
class TowerWeights:
    patch_w: torch.Tensor  # [D, Kp] (Kp = 592, zero columns past 588)
    patch_b: torch.Tensor  # [D]
    blocks: list[BlockWeights]
    norm: torch.Tensor  # [D] fp32


def tower_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    """Every tensor the tower reads -> the shape its config implies (w1 holds both SwiGLU halves)."""
    d, f = cfg.vision_dim, cfg.vision_inter_dim
    out = {"vision.patch_embed.proj.weight": (d, cfg.patch_features), "vision.patch_embed.proj.bias": (d,)}
    for i in range(cfg.vision_n_layers):
        b = f"vision.blocks.{i}"
        out.update({f"{b}.norm1.weight": (d,), f"{b}.attn.wqkv.weight": (3 * d, d), f"{b}.attn.wqkv.bias": (3 * d,),
                    f"{b}.attn.wo.weight": (d, d), f"{b}.attn.wo.bias": (d,), f"{b}.norm2.weight": (d,),
                    f"{b}.mlp.w1.weight": (2 * f, d), f"{b}.mlp.w2.weight": (d, f)})
    out["vision.norm.weight"] = (d,)
    return out


def tower_names(cfg: Config) -> list[str]:
    return list(tower_shapes(cfg))


def prepare_tower(t: dict[str, torch.Tensor], cfg: Config, dtype: torch.dtype, device,
                  pad_nonzero: bool = False) -> TowerWeights:
    """Checkpoint tensors -> run-ready weights (dtype, device, padded patch projection).

    pad_nonzero=True is the fault `patch-pad-nonzero`: the weight's padding columns repeat its
    first columns instead of being zero.
    """
    def w(name, dt=dtype):
        return t[name].to(device=device, dtype=dt).contiguous()

    patch_w = w("vision.patch_embed.proj.weight")
    k = patch_w.shape[1]
    padded = pad_columns(patch_w, PAD_MULTIPLE)
    if pad_nonzero and padded.shape[1] > k:
        padded[:, k:] = patch_w[:, : padded.shape[1] - k]
    blocks = []
    for i in range(cfg.vision_n_layers):
        b = f"vision.blocks.{i}"
        blocks.append(BlockWeights(
            norm1=w(f"{b}.norm1.weight", torch.float32), wqkv=w(f"{b}.attn.wqkv.weight"),
            bqkv=w(f"{b}.attn.wqkv.bias"), wo=w(f"{b}.attn.wo.weight"), bo=w(f"{b}.attn.wo.bias"),
            norm2=w(f"{b}.norm2.weight", torch.float32), w1=w(f"{b}.mlp.w1.weight"), w2=w(f"{b}.mlp.w2.weight")))
    return TowerWeights(patch_w=padded.contiguous(), patch_b=w("vision.patch_embed.proj.bias"), blocks=blocks,
                        norm=w("vision.norm.weight", torch.float32))


def pad_patch_rows(rows: torch.Tensor, width: int, nonzero: bool = False) -> torch.Tensor:
    """[N, 588] -> [N, width]: zero columns (or, under the fault, ones)."""
    k = rows.shape[1]
    if width == k:
        return rows
    out = rows.new_zeros(rows.shape[0], width) if not nonzero else rows.new_ones(rows.shape[0], width)
    out[:, :k] = rows
    return out


class VisionTower:
    def __init__(self, cfg: Config, weights: TowerWeights, backend, *, rope_interleaved: bool = False,
                 pad_nonzero: bool = False, attention_prefer=None, fuse: str = "off"):
        """fuse: 'off', 'on' or 'auto' (from the second forward on): the compiled block of
        `fused.FusedBlock`, CUDA only (the caller decides; see `fused.policy`)."""
        self.cfg = cfg
        self.w = weights
        self.backend = backend
        self.rope_interleaved = rope_interleaved
        self.pad_nonzero = pad_nonzero
        self.attention_prefer = attention_prefer
        self.fuse = fuse
        self.passes = 0
        self._fused = None

    def block_fn(self):
        """The block this forward runs: the eager `block`, or the compiled one once due."""
        self.passes += 1
        if self.fuse == "off" or (self.fuse == "auto" and self.passes < 2):
            return self.block
        if self._fused is None:
            from .fused import FusedBlock

            self._fused = FusedBlock(self)
        return self._fused

    def rope(self, grid: tuple[int, int], device) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_tables(grid[0], grid[1], self.cfg.vision_rope_dim, self.cfg.vision_rope_theta, device,
                           interleaved=self.rope_interleaved)

    def forward(self, patches: torch.Tensor, grid: tuple[int, int], rec=None) -> torch.Tensor:
        """patches: [N, 588] bf16 -> final-norm features [N, D] in the weights' dtype."""
        taps = rec is not None and rec.enabled
        x = self.embed(patches)  # [N, D]
        cos, sin = self.rope(grid, x.device)  # [N, rd] fp32
        if taps:
            rec.record("rope.cos", cos)
            rec.record("rope.sin", sin)
        block = self.block_fn()
        for i, blk in enumerate(self.w.blocks):
            x = block(x, blk, cos, sin)
            if taps and i == 0:
                rec.record("block0", x)
        x = self.norm(x)
        if taps:
            rec.record("final_norm", x)
        return x

    # The pieces of `forward`, also run one by one on the oracle's tensors (local error, `stages.py`).

    def embed(self, patches: torch.Tensor) -> torch.Tensor:
        """patches: [N, 588] -> [N, D] in the weights' dtype (through the 592-wide padded GEMM)."""
        w = self.w
        x = pad_patch_rows(patches.to(w.patch_w.dtype), w.patch_w.shape[1], self.pad_nonzero)  # [N, 592]
        return self.backend.patch_linear(x, w.patch_w, w.patch_b)

    def block(self, x: torch.Tensor, blk: BlockWeights, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """One pre-norm block on the residual stream x: [N, D]."""
        be = self.backend
        n = x.shape[0]
        nh, hd = self.cfg.vision_n_heads, self.cfg.vision_head_dim
        h = be.rms_norm(x, blk.norm1, NORM_EPS)
        qkv = be.linear(h, blk.wqkv, blk.bqkv).view(n, 3, nh, hd)
        # q and k rotate together: [N, 2, H, hd] -> [N, 2H, hd] is a view
        qk = be.rope_rotate_half(qkv[:, :2].reshape(n, 2 * nh, hd), cos, sin)
        o = self.attend(qk[:, :nh], qk[:, nh:], qkv[:, 2])  # [N, H, hd]
        x = x + be.linear(o.reshape(n, nh * hd), blk.wo, blk.bo)
        h = be.rms_norm(x, blk.norm2, NORM_EPS)
        gate, up = be.linear(h, blk.w1, None).chunk(2, dim=-1)
        return x + be.linear(F.silu(gate) * up, blk.w2, None)

    def attend(self, q, k, v) -> torch.Tensor:
        return attention(q, k, v, prefer=self.attention_prefer)

    def norm(self, x: torch.Tensor) -> torch.Tensor:
        return self.backend.rms_norm(x, self.w.norm, NORM_EPS)
