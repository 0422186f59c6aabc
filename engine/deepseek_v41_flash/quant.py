"""The released kernels' low-precision formats, in the engine's own code.

Activation fake-quantisation inside attention, as the kernels do it in place: FP8 (e4m3,
power-of-two scale per 32 channels) for the window KV, FP4 (e2m1) for the indexer's q / k
(power-of-two scales per 32) and for the compressed KV (e4m3 scales per 16). Values go to the
low-precision grid and straight back to the activation dtype.

Stored weights (below): FP8 / FP4 matrices with their block scales, the FP8 Engram table, and a
backend wrapper whose `linear` multiplies by them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from engine.deepseek_v41_flash import faults as F

FP8_MAX, FP4_MAX = 448.0, 6.0


def pow2_ceil(v: torch.Tensor) -> torch.Tensor:
    """2^ceil(log2 v) for positive normal fp32 v, from the bits: the exponent, plus one when the
    mantissa is not zero."""
    bits = v.float().contiguous().view(torch.int32)
    exp = (bits >> 23) & 0xFF
    exp = exp + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return (exp << 23).view(torch.float32)


def fp8(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    g = x.float().reshape(*x.shape[:-1], -1, block)
    amax = g.abs().amax(-1, keepdim=True).clamp_min(1e-4)
    s = pow2_ceil(amax * torch.tensor(1 / FP8_MAX, dtype=torch.float32))
    q = torch.clamp(g / s, -FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).to(torch.float32)
    return (q * s).reshape(x.shape).to(x.dtype)


def e2m1(v: torch.Tensor) -> torch.Tensor:
    """Round to the FP4 grid {0, .5, 1, 1.5, 2, 3, 4, 6} (|v| <= 6), ties to even codes: the grid
    is uniform within [0, 2), [2, 4), [4, 6] (steps .5, 1, 2), and an even code is an even multiple
    of the step there, so round-half-even per segment is the kernel's rounding."""
    a = v.abs()
    step = torch.where(a < 2, torch.full_like(a, 0.5), torch.where(a < 4, torch.ones_like(a), torch.full_like(a, 2.0)))
    r = torch.round(a / step) * step  # torch.round: half to even
    return torch.copysign(r, v)


def fp4(x: torch.Tensor, block: int, e4m3_scale: bool = False) -> torch.Tensor:
    g = x.float().reshape(*x.shape[:-1], -1, block)
    amax = g.abs().amax(-1, keepdim=True)
    if e4m3_scale:
        s = torch.clamp(amax.clamp_min(6 * 2.0 ** -9) / FP4_MAX, -FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float()
    else:
        s = pow2_ceil(amax.clamp_min(6 * 2.0 ** -126) * torch.tensor(1 / FP4_MAX, dtype=torch.float32))
    return (e2m1(torch.clamp(g / s, -FP4_MAX, FP4_MAX)) * s).reshape(x.shape).to(x.dtype)


# --------------------------------------------------------------------------- stored weight formats
#
# The released checkpoint stores the dense projections FP8 (e4m3) with a power-of-two (e8m0) scale
# per 32x32 block, the routed experts FP4 (e2m1, two per byte, the even element in the low nibble)
# with an e8m0 scale per row and 32 inputs, and the Engram table FP8 with a scale per row and 32
# columns. The engine keeps the stored bytes and expands each scale once to one value per
# (output row, 32-input block); a matmul dequantises the weight on the fly (exact: a grid value
# times a power of two) and, with the kernels' quantisation, first rounds its input to FP8 per 32
# inputs. One fp32 matmul then does what the official kernel adds up block by block.

BLOCK = 32
E4M3, E2M1_X2, E8M0 = torch.float8_e4m3fn, torch.float4_e2m1fn_x2, torch.float8_e8m0fnu
PLAIN = (torch.bfloat16, torch.float16, torch.float32)

# Projections built with the config's default Linear dtype in the official model (FP8 when
# `dtype` is fp8); `wo_a`, the indexer's `weights_proj` / `wk`, the compressor and the gate
# declare their own (bf16 / fp32) and stay plain.
DENSE = ("attn.wq_a", "attn.wq_b", "attn.wkv", "attn.wo_b", "attn.indexer.wq_b", "engram.wkv",
         "ffn.shared_experts.w1", "ffn.shared_experts.w2", "ffn.shared_experts.w3")

# Checkpoint-reading faults (off by default), each a bug a quantised reader really has.
FAULTS = (F.FP8_SCALE_IGNORED, F.FP8_SCALE_TRANSPOSED, F.FP4_NIBBLES_SWAPPED, F.ENGRAM_SCALE_IGNORED,
          F.WO_A_SCALE_DROPPED, F.WO_A_BLOCK_128, F.FP4_INT8_SIGN_EXTENDED)

# Two tensors of the released shards are stored otherwise than the official modules hold them, and
# are converted here on load, as the official loader does:
# - `layers.N.attn.wo_a.weight`: e4m3 beside an e8m0 `wo_a.scale` whose shape cuts the weight into
#   equal blocks; each value times its block's scale in fp32, rounded to bf16 (the official module
#   declares `wo_a` bf16), the scale then unused. Stored bf16 without a scale (the converted
#   layout), it is read as it is.
# - routed experts' `w1` / `w2` / `w3`: the packed FP4 bytes (two e2m1 codes a byte, the even
#   element in the low nibble) in a tensor stored as int8, the same bytes as a float4_e2m1fn_x2
#   one; the engine takes the bytes unsigned either way.
WO_A = re.compile(r"^layers\.\d+\.attn\.wo_a\.weight$")
ROUTED_EXPERT = re.compile(r"^layers\.\d+\.ffn\.experts\.\d+\.w[123]\.weight$")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def released_wo_a(t: dict, name: str, fault: str | None = None) -> torch.Tensor | None:
    """The release's FP8 `wo_a` with its block scale, as bf16; None when it is stored plain
    without a scale (the converted layout)."""
    w, sname = t[name], scale_name(name)
    if w.dtype != E4M3:
        if sname in t:
            raise _bad(name, f"stored as {dtype_name(w.dtype)} beside a block scale {sname}: expected float8_e4m3fn "
                             "with that scale (the release) or bfloat16 without one (converted)")
        return None
    if sname not in t:
        raise _bad(name, f"stored as float8_e4m3fn without its block scale {sname}: expected FP8 with that scale "
                         "(the release) or bfloat16 (converted); not cast silently")
    s = t[sname]
    if s.dtype != E8M0:
        raise _bad(sname, f"scale stored as {dtype_name(s.dtype)}, expected float8_e8m0fnu (power-of-two block scales)")
    rows, cols = w.shape
    if s.dim() != 2 or 0 in s.shape or rows % s.shape[0] or cols % s.shape[1]:
        raise _bad(sname, f"scale has shape {list(s.shape)}, which does not cut a [{rows}, {cols}] weight into "
                          "whole blocks")
    block_rows, block_cols = rows // s.shape[0], cols // s.shape[1]
    if fault == F.WO_A_BLOCK_128:  # another checkpoint family's fixed block
        block_rows = block_cols = 128
    scale = s.float().repeat_interleave(block_rows, 0)[:rows].repeat_interleave(block_cols, 1)[:, :cols]
    if fault == F.WO_A_SCALE_DROPPED:
        scale = torch.ones_like(scale)
    return (w.float() * scale).to(torch.bfloat16)


def _sign_extended(w: torch.Tensor) -> torch.Tensor:
    """The bytes a signed reader of int8-stored FP4 ends up with: the high nibble taken by an
    arithmetic shift comes out -8..-1 for a negative byte, which a `code >= 8` sign test reads
    as positive, so the odd element keeps its magnitude and loses its sign."""
    high = w.to(torch.int16) >> 4
    code = (high & 0x7) | ((high >= 8).to(torch.int16) << 3)
    return ((w.to(torch.int16) & 0xF) | (code << 4)).to(torch.uint8)


def weight_format(cfg, name: str) -> str | None:
    """"fp8", "fp4", "fp8-rows" (the Engram table) or None for a checkpoint tensor name."""
    parts = name.split(".")
    if parts[0] != "layers" or parts[-1] != "weight":
        return None
    module = ".".join(parts[2:-1])
    dense = "fp8" if cfg.dtype == "fp8" else None
    if module == "engram.embed":
        return dense and "fp8-rows"
    if module.startswith("ffn.experts."):
        return "fp4" if cfg.expert_dtype == "fp4" else dense
    return dense if module in DENSE else None


def scale_name(weight_name: str) -> str:
    return weight_name.removesuffix("weight") + "scale"


def _fp4_values(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K/2] -> fp32 [..., K]. An e2m1 code is s|ee|m: exponent field 0 is the
    subnormal m * 0.5, otherwise 2^(e-1) * (1 + m/2)."""
    nib = torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2).to(torch.int32)
    e, m = (nib >> 1) & 0x3, (nib & 0x1).float()
    mag = torch.where(e == 0, 0.5 * m, torch.exp2((e - 1).float()) * (1 + 0.5 * m))
    return torch.where(nib & 0x8 != 0, -mag, mag)


@dataclass(frozen=True)
class QuantWeight:
    """A quantised weight as stored, or a stack of them (experts): `data` e4m3 [..., out, in] or
    packed FP4 bytes uint8 [..., out, in/2]; `scale` fp32 [..., out, in/32]."""

    data: torch.Tensor
    scale: torch.Tensor
    fmt: str

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    def __getitem__(self, i) -> "QuantWeight":
        return QuantWeight(self.data[i], self.scale[i], self.fmt)

    @staticmethod
    def stack(ws: list["QuantWeight"]) -> "QuantWeight":
        return QuantWeight(torch.stack([w.data for w in ws]), torch.stack([w.scale for w in ws]), ws[0].fmt)

    def dense(self) -> torch.Tensor:
        """fp32 [..., out, in], exact."""
        values = _fp4_values(self.data) if self.fmt == "fp4" else self.data.float()
        return values * self.scale.repeat_interleave(BLOCK, dim=-1)

    def matmul(self, x: torch.Tensor, kernel_quant: bool) -> torch.Tensor:
        """x [..., in] -> [..., out] in x.dtype."""
        if kernel_quant:  # the kernel's FP8 input, then fp32 products and sums
            return torch.nn.functional.linear(fp8(x).float(), self.dense()).to(x.dtype)
        return torch.nn.functional.linear(x, self.dense().to(x.dtype))


@dataclass(frozen=True)
class QuantTable:
    """The Engram table as stored: e4m3 rows [R, dim], scales fp32 [R, dim/32]; a lookup returns
    dequantised rows in `dtype`."""

    data: torch.Tensor
    scale: torch.Tensor
    dtype: torch.dtype

    def __getitem__(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.data[ids].float() * self.scale[ids].repeat_interleave(BLOCK, dim=-1)
        return rows.to(self.dtype)


def _bad(name: str, msg: str):
    from engine.errors import EngineInputError

    return EngineInputError(f"{name}: {msg}")


def plain(t: dict, name: str, dtype, device) -> torch.Tensor:
    """A tensor stored in a float format, cast to `dtype`; a quantised one here is refused (it
    would be cast without its scale)."""
    w = t[name]
    if w.dtype not in PLAIN:
        raise _bad(name, f"stored as {dtype_name(w.dtype)}, but the config makes it a plain tensor (dtype / "
                         "expert_dtype): not cast silently")
    return w.to(device=device, dtype=dtype).contiguous()


def prepare(t: dict, name: str, fmt: str, device, fault: str | None = None):
    """The stored weight `name` and its scale, checked against `fmt`, as a QuantWeight (or the
    raw parts of the Engram table for "fp8-rows")."""
    w, sname = t[name], scale_name(name)
    want = E2M1_X2 if fmt == "fp4" else E4M3
    released = fmt == "fp4" and w.dtype == torch.int8 and ROUTED_EXPERT.match(name) is not None
    if w.dtype != want and not released:
        also = " (or int8 holding its packed bytes, as the release)" if fmt == "fp4" and ROUTED_EXPERT.match(name) else ""
        raise _bad(name, f"stored as {dtype_name(w.dtype)}, the config's dtype / expert_dtype make it "
                         f"{dtype_name(want)}{also}")
    s = t[sname]
    if s.dtype != E8M0:
        raise _bad(sname, f"scale stored as {dtype_name(s.dtype)}, expected float8_e8m0fnu (power-of-two block scales)")
    rows = w.shape[0]
    cols = w.shape[1] * (2 if fmt == "fp4" else 1)
    grid = (-(-rows // BLOCK), -(-cols // BLOCK)) if fmt == "fp8" else (rows, cols // BLOCK)
    if cols % BLOCK or tuple(s.shape) != grid:
        raise _bad(sname, f"scale has shape {list(s.shape)}, a {fmt} weight of [{rows}, {cols}] needs {list(grid)}")
    scale = s.float()
    if (fault, fmt) in ((F.FP8_SCALE_IGNORED, "fp8"), (F.ENGRAM_SCALE_IGNORED, "fp8-rows")):
        scale = torch.ones_like(scale)
    if fault == F.FP8_SCALE_TRANSPOSED and fmt == "fp8":
        scale = scale.t().reshape(grid)  # the block grid read column-major
    if fmt == "fp8":
        scale = scale.repeat_interleave(BLOCK, dim=0)[:rows]  # one row of block scales per output row
    data = w.view(torch.uint8) if fmt == "fp4" else w
    if released and fault == F.FP4_INT8_SIGN_EXTENDED:
        data = _sign_extended(w)
    if fault == F.FP4_NIBBLES_SWAPPED and fmt == "fp4":
        data = (data << 4) | (data >> 4)
    data, scale = data.to(device).contiguous(), scale.to(device).contiguous()
    return (data, scale) if fmt == "fp8-rows" else QuantWeight(data, scale, fmt)


def weight(t: dict, name: str, cfg, dtype, device, fault: str | None = None):
    """A checkpoint matrix as the engine uses it: a QuantWeight when the config stores it
    quantised, else a plain tensor in `dtype`."""
    fmt = weight_format(cfg, name)
    if fmt is None:
        converted = released_wo_a(t, name, fault) if WO_A.match(name) else None
        if converted is not None:
            return converted.to(device=device, dtype=dtype).contiguous()
        return plain(t, name, dtype, device)
    if fmt == "fp8-rows":
        return QuantTable(*prepare(t, name, fmt, device, fault), dtype)
    return prepare(t, name, fmt, device, fault)


class QuantBackend:
    """A backend whose `linear` also takes a QuantWeight; everything else is the wrapped backend's."""

    def __init__(self, inner, kernel_quant: bool):
        self.inner, self.kernel_quant = inner, kernel_quant

    def linear(self, x, w, bias):
        if isinstance(w, QuantWeight):
            if bias is not None:
                raise ValueError("a quantised projection has no bias")
            return w.matmul(x, self.kernel_quant)
        return self.inner.linear(x, w, bias)

    def __getattr__(self, name):
        return getattr(self.inner, name)
