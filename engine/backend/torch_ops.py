"""Reference kernels in plain torch: the semantics every other backend is held to."""
from __future__ import annotations

import torch
import torch.nn.functional as F


class TorchBackend:
    name = "torch"

    def rms_norm(self, x, weight, eps):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return (y * weight.float()).to(x.dtype)

    def rope_rotate_half(self, x, cos, sin):
        """x*cos + rotate_half(x)*sin, written per half: [x1*c - x2*s, x2*c + x1*s]. The same
        products and sums as the whole-width form (x1*c + (-x2)*s is x1*c - x2*s exactly), bit for
        bit, without materialising cat(cos, cos), cat(sin, sin) and rotate_half(x)."""
        h = x.shape[-1] // 2
        # cos/sin: [N, hd/2] (one table for both halves) or [N, hd]; broadcast over heads at dim -2
        c, s = cos.float().unsqueeze(-2), sin.float().unsqueeze(-2)
        (c1, c2), (s1, s2) = ((c, c), (s, s)) if cos.shape[-1] == h else ((c[..., :h], c[..., h:]),
                                                                          (s[..., :h], s[..., h:]))
        xf = x.float()
        x1, x2 = xf[..., :h], xf[..., h:]
        return torch.cat([x1 * c1 - x2 * s1, x2 * c2 + x1 * s2], -1).to(x.dtype)

    def linear(self, x, weight, bias):
        return F.linear(x, weight, bias)

    def patch_linear(self, x, weight, bias):
        assert x.shape[-1] % 16 == 0 and weight.shape[-1] == x.shape[-1], "operands must be prepared (K % 16 == 0)"
        return F.linear(x, weight, bias)

    def aligner_gather(self, x, index):
        t, nine = index.shape
        c = x.shape[-1]
        zero = torch.zeros(1, c, dtype=x.dtype, device=x.device)
        src = torch.cat([x, zero], 0)  # row n*n = the zero row for padding
        idx = torch.where(index < 0, torch.full_like(index, x.shape[0]), index).long()
        g = src[idx.reshape(-1)].reshape(t, nine, c)  # [T, 9, C]
        return g.transpose(1, 2).reshape(t, c * nine)  # channel-major: c*9 + k

    def moe_route(self, logits, bias, bias_vl, image_rows, topk, route_scale):
        s = F.softplus(logits.float()).sqrt()
        b = bias.float().expand_as(s)
        if bias_vl is not None and image_rows is not None:
            b = torch.where(image_rows.view(-1, 1), bias_vl.float().view(1, -1), b)
        ids = torch.topk(s + b, topk, dim=-1).indices
        w = s.gather(-1, ids)
        w = w / (w.sum(-1, keepdim=True) + 1e-20) * route_scale
        return w, ids

    def embed_scatter(self, emb, rows, src):
        keep = rows >= 0
        emb[rows[keep].long()] = src[keep].to(emb.dtype)
        return emb
