"""Hyper-connections (mHC): the residual stream as `hc` parallel copies, mixed around sublayers.

From one projection of the RMS-normalised flattened stream come `pre` (collapse copies into the
sublayer input), `post` (spread the sublayer output back) and `comb` (mix the residual copies),
`comb` pushed towards doubly stochastic by Sinkhorn passes.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MixWeights:
    fn: torch.Tensor  # [(2+hc)*hc, hc*D] fp32
    base: torch.Tensor  # [(2+hc)*hc] fp32
    scale: torch.Tensor  # [3] fp32


def mixes(x: torch.Tensor, w: MixWeights, hc: int, iters: int, eps: float, norm_eps: float, backend):
    """x: [n, hc, D] -> pre [n, hc], post [n, hc], comb [n, hc(in), hc(out)], all fp32."""
    flat = x.reshape(x.shape[0], -1).float()
    inv_rms = torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + norm_eps)
    m = backend.linear(flat, w.fn, None) * inv_rms  # [n, (2+hc)*hc]
    pre = torch.sigmoid(m[:, :hc] * w.scale[0] + w.base[:hc]) + eps
    post = 2.0 * torch.sigmoid(m[:, hc:2 * hc] * w.scale[1] + w.base[hc:2 * hc])
    logits = (m[:, 2 * hc:] * w.scale[2] + w.base[2 * hc:]).view(-1, hc, hc)
    comb = torch.softmax(logits, dim=-1) + eps
    comb = comb / (comb.sum(dim=1, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(dim=2, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=1, keepdim=True) + eps)
    return pre, post, comb


def collapse(x: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """[n, hc, D] x [n, hc] -> [n, D] (fp32 sum, back to x.dtype)."""
    return torch.einsum("nc,ncd->nd", pre, x.float()).to(x.dtype)


def expand(out: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """Copy j of the new stream = post_j * out + sum_i comb_ij * residual_i; [n, hc, D] in out.dtype."""
    mixed = torch.einsum("nij,nid->njd", comb, residual.float())
    return (post.unsqueeze(-1) * out.float().unsqueeze(1) + mixed).to(out.dtype)
