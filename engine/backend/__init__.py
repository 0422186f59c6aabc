"""The engine's one import point for kernels: `torch` reference ops or compiled `hip` kernels.

Model code calls `backend.<op>(...)` and never knows which one runs, so a kernel swaps here and
nowhere else. Every backend implements the `Backend` protocol below with the same semantics;
`torch_ops` is the reference the HIP kernels are held to.
"""
from __future__ import annotations

from typing import Protocol

import torch

from ..errors import EngineInputError


class Backend(Protocol):
    name: str

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """x: [..., D] any float dtype; fp32 math; weight [D] (fp32); returns x.dtype."""

    def rope_rotate_half(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: [..., N, H, hd] (or [N, H, hd]); cos/sin: [N, hd/2] (blocked DeepSeek table, used for
        both halves) or [N, hd] (Qwen3-VL cat(rot, rot)). out = x*cos + rotate_half(x)*sin in fp32,
        returned in x.dtype."""

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """y = x @ weight.T + bias."""

    def patch_linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """Patch projection on backend-prepared operands: x [N, Kp], weight [D, Kp], Kp % 16 == 0
        (the 588 -> 592 zero padding is done at preparation, see `pad_columns`)."""

    def aligner_gather(self, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """x: [n_h*n_w, C]; index: [T, 9] int32 source row per (token, ky*3+kx), -1 = zero pad.
        Returns [T, C*9] channel-major (feature c*9 + ky*3 + kx)."""

    def moe_route(self, logits: torch.Tensor, bias: torch.Tensor, bias_vl: torch.Tensor | None,
                  image_rows: torch.Tensor | None, topk: int, route_scale: float
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """logits: [R, E] (already / gate temperature). s = sqrt(softplus(logits)) in fp32;
        rank by s + (bias_vl if image_rows[r] else bias); weights from the UNBIASED s of the chosen
        ids, normalised (sum + 1e-20) and times route_scale. Returns (weights [R, k] fp32,
        ids [R, k] int64), ids in descending biased-score order."""

    def embed_scatter(self, emb: torch.Tensor, rows: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        """emb[rows[i]] = src[i] for rows[i] >= 0 (in place on emb, returned)."""


def pad_columns(t: torch.Tensor, multiple: int = 16) -> torch.Tensor:
    """Zero-pad the last dimension up to a multiple (backend preparation of patch operands)."""
    k = t.shape[-1]
    kp = -(-k // multiple) * multiple
    if kp == k:
        return t
    return torch.nn.functional.pad(t, (0, kp - k))


_CACHE: dict[str, Backend] = {}


def get(name: str = "torch") -> Backend:
    """The backend called `name`. `hip` on a machine without a GPU raises EngineInputError
    (exit 2 at the CLI): it never falls back silently."""
    if name in _CACHE:
        return _CACHE[name]
    if name == "torch":
        from .torch_ops import TorchBackend

        _CACHE[name] = TorchBackend()
    elif name == "hip":
        try:
            from .hip_ops import HipBackend
        except ImportError as e:  # the hip backend module lands with the kernels
            raise EngineInputError(f"backend 'hip' is not available: {e}") from None
        _CACHE[name] = HipBackend()
    else:
        raise EngineInputError(f"unknown backend {name!r} (torch or hip)")
    return _CACHE[name]
