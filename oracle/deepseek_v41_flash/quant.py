"""The official kernels' low-precision formats, as `inference/model.py` and its `kernel.py` use them.

Stored weights (the released checkpoint, `Linear` built from the config's `dtype` / `expert_dtype`):
- FP8: float8_e4m3fn `[out, in]` with a float8_e8m0fnu (power-of-two) `scale` per 32x32 block,
  `[ceil(out/32), ceil(in/32)]`;
- FP4 (routed experts): float4_e2m1fn_x2 `[out, in/2]` (the even element in the low nibble) with
  a float8_e8m0fnu `scale` per row and 32 inputs, `[out, in/32]`;
- the Engram table: float8_e4m3fn `[rows, head_dim]` with a float8_e8m0fnu `scale` per row and 32
  columns, dequantised row by row on lookup.

Computation: a quantised `Linear` first quantises its input to FP8 (`act_quant`: a power-of-two
scale per 32 inputs, e4m3 values), then the block-scaled GEMM: for each 32-wide K block, the fp32
product of the low-precision values times both scales, added in K order in fp32; the result in
the activation dtype. Activations inside attention are rounded in place: the window KV to FP8
(`act_quant(..., inplace=True)`), the indexer's q / k to FP4 with power-of-two scales per 32,
the compressed KV to FP4 with e4m3 scales per 16 (`fp4_act_quant`).

`kernel` off is the semantic mode: weights dequantised exactly (e4m3 / e2m1 values times a power
of two are exact in bf16 and fp32) and used in plain matmuls, no activation rounding.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

FP8_MAX, FP4_MAX = 448.0, 6.0
BLOCK = 32  # the official fp8_block_size / fp4_block_size
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
FP8, FP4, SCALE = torch.float8_e4m3fn, torch.float4_e2m1fn_x2, torch.float8_e8m0fnu


def _pow2_ceil(v: torch.Tensor) -> torch.Tensor:
    """2^ceil(log2(v)) for v > 0, exactly (the kernels' power-of-two `ue8m0` scales)."""
    m, e = torch.frexp(v)  # v = m * 2^e, m in [0.5, 1)
    return torch.ldexp(torch.ones_like(v), torch.where(m == 0.5, e - 1, e))


def _to_e4m3(v: torch.Tensor) -> torch.Tensor:
    """fp32 -> e4m3, nearest even, saturating at +-448 as the kernels' satfinite casts."""
    return v.clamp(-FP8_MAX, FP8_MAX).to(FP8)


def act_quant(x: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 activation quantisation: (values e4m3 [..., K], power-of-two scales fp32 [..., K/block])."""
    g = x.float().unflatten(-1, (-1, block))
    amax = g.abs().amax(-1).clamp_min(1e-4)
    scale = _pow2_ceil(amax * torch.tensor(1.0 / FP8_MAX, dtype=torch.float32))
    return _to_e4m3(g / scale.unsqueeze(-1)).flatten(-2), scale


def fp8_round_trip(x: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """`act_quant(..., inplace=True)`: values to the FP8 grid and back, in x.dtype."""
    q, scale = act_quant(x, block)
    return (q.float().unflatten(-1, (-1, block)) * scale.unsqueeze(-1)).flatten(-2).to(x.dtype)


def _e2m1(v: torch.Tensor) -> torch.Tensor:
    """Nearest FP4 (E2M1) value, ties to the even code; v already within [-6, 6]."""
    grid = E2M1.to(v.device)
    dist = (v.abs().unsqueeze(-1) - grid).abs().double()  # fp32 distances, exact in fp64
    # a tie goes to the even code: the odd codes' distances get a nudge far below any fp32 gap
    pick = (dist + (torch.arange(8, device=v.device) % 2) * 1e-12).argmin(-1)
    return torch.copysign(grid[pick], v)


def fp4_round_trip(x: torch.Tensor, block: int, e4m3_scale: bool = False) -> torch.Tensor:
    """`fp4_act_quant(..., inplace=True)`: power-of-two scales per `block` for the indexer,
    e4m3-rounded amax/6 scales (block 16) for compressed KV."""
    g = x.float().unflatten(-1, (-1, block))
    amax = g.abs().amax(-1, keepdim=True)
    if e4m3_scale:
        scale = _to_e4m3(amax.clamp_min(6 * 2.0**-9) / FP4_MAX).float()
    else:
        scale = _pow2_ceil(amax.clamp_min(6 * 2.0**-126) * torch.tensor(1.0 / FP4_MAX, dtype=torch.float32))
    v = (g / scale).clamp(-FP4_MAX, FP4_MAX)
    return (_e2m1(v) * scale).flatten(-2).to(x.dtype)


def _fp4_value(codes: torch.Tensor) -> torch.Tensor:
    """4-bit e2m1 codes -> fp32: bit 3 the sign, bits 2..0 the magnitude's index in E2M1."""
    mag = E2M1[codes & 0x7]
    return torch.where(codes >= 8, -mag, mag)


# The two values of every byte, even element (low nibble) first: unpacking is one lookup a byte
# (a released layer's routed experts are 13.6G values).
_BYTE = torch.arange(256)
FP4_PAIRS = torch.stack([_fp4_value(_BYTE & 0x0F), _fp4_value(_BYTE >> 4)], dim=-1)


def unpack_fp4(w: torch.Tensor) -> torch.Tensor:
    """float4_e2m1fn_x2 [..., K/2] -> fp32 [..., K]: low nibble the even element, bit 3 the sign."""
    return FP4_PAIRS.to(w.device)[w.view(torch.uint8).long()].flatten(-2)


def weight_values(weight: torch.Tensor) -> torch.Tensor:
    """The stored low-precision values as fp32 [out, in] (no scale)."""
    return unpack_fp4(weight) if weight.dtype == FP4 else weight.float()


def row_scales(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The weight scale per (output row, K block) fp32 [out, in/32]: an FP8 block scale covers 32 rows."""
    s = scale.float()
    if weight.dtype == FP8:
        s = s.repeat_interleave(BLOCK, dim=0)[: weight.size(0)]
    return s


def dequantise(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp32 [out, in], exact: each value times its block's power of two."""
    values = weight_values(weight).unflatten(-1, (-1, BLOCK))
    return (values * row_scales(weight, scale).unsqueeze(-1)).flatten(-2)


def block_scaled_gemm(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The kernels' fp8 / fp4 GEMM: x quantised to FP8 per 32; for each K block the fp32 product
    of the values times the activation and weight scales, accumulated in K order. fp32 [..., out]."""
    q, a_s = act_quant(x)
    a = q.float().reshape(-1, q.size(-1))
    a_s = a_s.reshape(a.size(0), -1)
    w, w_s = weight_values(weight), row_scales(weight, scale)
    acc = torch.zeros(a.size(0), w.size(0), dtype=torch.float32, device=x.device)
    for k in range(a.size(1) // BLOCK):
        cols = slice(k * BLOCK, (k + 1) * BLOCK)
        acc += (a[:, cols] @ w[:, cols].T) * a_s[:, k:k + 1] * w_s[:, k].unsqueeze(0)
    return acc.view(*x.shape[:-1], w.size(0))


class QuantLinear(nn.Module):
    """A bias-free Linear whose `weight` is stored FP8 or FP4 with its `scale` (the official
    parameter names, so the state-dict keys are the checkpoint's `<module>.weight` / `.scale`)."""

    def __init__(self, dim_in: int, dim_out: int, fmt: str):
        super().__init__()
        if fmt == "fp4":
            self.weight = nn.Parameter(torch.empty(dim_out, dim_in // 2, dtype=FP4), requires_grad=False)
            self.scale = nn.Parameter(torch.empty(dim_out, dim_in // BLOCK, dtype=SCALE), requires_grad=False)
        else:
            self.weight = nn.Parameter(torch.empty(dim_out, dim_in, dtype=FP8), requires_grad=False)
            self.scale = nn.Parameter(torch.empty(-(-dim_out // BLOCK), -(-dim_in // BLOCK), dtype=SCALE),
                                      requires_grad=False)
        self.kernel = True  # set by the model: the kernels' GEMM (True) or exact dequantised weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel:
            return block_scaled_gemm(x, self.weight, self.scale).to(x.dtype)
        return F.linear(x, dequantise(self.weight, self.scale).to(x.dtype))


class Fp8Table(nn.Module):
    """The Engram table as stored: e4m3 rows, a power-of-two scale per row and 32 columns; rows
    are dequantised on lookup (fp32 product, then the activation dtype)."""

    def __init__(self, rows: int, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(rows, dim, dtype=FP8), requires_grad=False)
        self.scale = nn.Parameter(torch.empty(rows, dim // BLOCK, dtype=SCALE), requires_grad=False)
        self.dtype = torch.float32  # set by the model: the activation dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        values, scales = self.weight[ids].float(), self.scale[ids].float()
        return (values.unflatten(-1, (-1, BLOCK)) * scales.unsqueeze(-1)).flatten(-2).to(self.dtype)


def set_kernel(model: nn.Module, kernel: bool, dtype: torch.dtype) -> None:
    """Every quantised module of `model` computes with the kernels' rounding or exactly."""
    for m in model.modules():
        if isinstance(m, QuantLinear):
            m.kernel = kernel
        elif isinstance(m, Fp8Table):
            m.dtype = dtype
