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
from . import faults as FT
from . import fused
from .config import Config
from .rope import rope_tables

NORM_EPS = 1e-6
PAD_MULTIPLE = 16
# Numeric faults (`faults.NUMERIC`): each changes numbers by about the bf16 noise floor, the size of
# error that a tensor-wide tolerance cannot see and a floor-relative verdict must.
RESIDUAL_SCALE = 1.01  # `residual-scale`: block 0's MLP branch added with a stray 1.01 factor
TAIL_ROW_SCALE = 1 + 2.0 ** -6  # `tail-row-scale`: the last patch row of block 0 scaled (a tail-loop bug)
FAULT_NORM_EPS = 1e-2  # `norm-eps`: the final norm's epsilon taken from another model's config


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


class VisionBlock:
    """One pre-norm block on the residual stream x: [N, D], written once, as the pieces that the
    compiled route (`fused.compiled`) hands to torch.compile unchanged:

        q, k, v = attn_in(x)      rms_norm -> qkv GEMM + bias -> rope on q and k together
        o = attend(q, k, v)       the runtime's SDPA call: never compiled (kernel order, fallback)
        x = out(x, o)             attn_residual (wo GEMM + bias + x) -> rms_norm -> ffn_residual
    """

    def __init__(self, cfg: Config, backend, attend, numeric: str | None = None, first: BlockWeights | None = None):
        """numeric: a numeric fault (`faults.NUMERIC`) planted in block `first` (block 0)."""
        self.nh, self.hd = cfg.vision_n_heads, cfg.vision_head_dim
        self.backend = backend
        self.attend = attend
        self.numeric, self.first = numeric, first

    def __call__(self, x: torch.Tensor, blk: BlockWeights, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q, k, v = self.attn_in(x, blk, cos, sin)
        out = self.out(x, self.attend(q, k, v), blk)
        if self.numeric == FT.TAIL_ROW_SCALE and blk is self.first:
            out = torch.cat([out[:-1], out[-1:] * TAIL_ROW_SCALE])
        return out

    def attn_in(self, x, blk: BlockWeights, cos, sin) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[N, D] -> q, k, v [N, H, hd] (views of the one qkv GEMM's output)."""
        be, n, nh, hd = self.backend, x.shape[0], self.nh, self.hd
        h = be.rms_norm(x, blk.norm1, NORM_EPS)
        qkv = be.linear(h, blk.wqkv, blk.bqkv).view(n, 3, nh, hd)
        # q and k rotate together: [N, 2, H, hd] -> [N, 2H, hd] is a view
        qk = be.rope_rotate_half(qkv[:, :2].reshape(n, 2 * nh, hd), cos, sin)
        return qk[:, :nh], qk[:, nh:], qkv[:, 2]

    def out(self, x, o, blk: BlockWeights) -> torch.Tensor:
        """The rest of the block after attention's output o: [N, H, hd]."""
        x = self.attn_residual(x, o, blk)
        return self.ffn_residual(x, self.backend.rms_norm(x, blk.norm2, NORM_EPS), blk)

    def attn_residual(self, x, o, blk: BlockWeights) -> torch.Tensor:
        return x + self.backend.linear(o.reshape(x.shape[0], self.nh * self.hd), blk.wo, blk.bo)

    def ffn_residual(self, x, h, blk: BlockWeights) -> torch.Tensor:
        """x + w2(silu(gate) * up), h: the normed stream."""
        gate, up = self.backend.linear(h, blk.w1, None).chunk(2, dim=-1)
        mlp = self.backend.linear(F.silu(gate) * up, blk.w2, None)
        if self.numeric == FT.RESIDUAL_SCALE and blk is self.first:
            mlp = mlp * RESIDUAL_SCALE
        return x + mlp


class VisionTower:
    def __init__(self, cfg: Config, weights: TowerWeights, backend, *, rope_interleaved: bool = False,
                 pad_nonzero: bool = False, attention_prefer=None, fuse: str = "off", speed=None,
                 numeric: str | None = None):
        """fuse: 'off', 'on' or 'auto' (from the second forward on): the block through its
        compiled pieces (`fused.FusedBlock`), CUDA only (the caller decides: the `fuse` option).
        speed: a `SpeedPath` told which attention kernels ran. numeric: one of the numeric faults
        (`faults.NUMERIC`) or None; it keeps the eager block (the compiled one carries no faults)."""
        self.cfg = cfg
        self.w = weights
        self.backend = backend
        self.rope_interleaved = rope_interleaved
        self.pad_nonzero = pad_nonzero
        self.attention_prefer = attention_prefer
        self.numeric = numeric
        self.fuse = "off" if numeric else fuse
        self.speed = speed
        self.passes = 0
        self.block = VisionBlock(cfg, backend, self.attend, numeric=numeric, first=weights.blocks[0])  # eager
        self._fused = None
        self.ran = "eager"  # the block the last forward ran: 'eager' or 'compiled'

    def eager_at(self, n: int) -> bool:
        """Whether this tower's n-th forward (from 1) runs the eager `block`."""
        return self.fuse == "off" or (self.fuse == "auto" and n < 2)

    def block_fn(self):
        """The block this forward runs: the eager `block`, or the compiled one once due."""
        self.passes += 1
        if self.eager_at(self.passes):
            return self.block
        if self._fused is None:
            self._fused = fused.FusedBlock(self.block)
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
        x = block(x, self.w.blocks[0], cos, sin)
        if taps:
            rec.record("block0", x)
        x = self.later_blocks(x, cos, sin, block)
        self.ran = "compiled" if block is self._fused and block.ok else "eager"
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

    def later_blocks(self, x: torch.Tensor, cos, sin, block) -> torch.Tensor:
        """Blocks 1.. on the output of block 0."""
        for blk in self.w.blocks[1:]:
            x = block(x, blk, cos, sin)
        return x

    def attend(self, q, k, v) -> torch.Tensor:
        return attention(q, k, v, prefer=self.attention_prefer, log=self.speed)

    def norm(self, x: torch.Tensor) -> torch.Tensor:
        return self.backend.rms_norm(x, self.w.norm, FAULT_NORM_EPS if self.numeric == FT.NORM_EPS else NORM_EPS)
