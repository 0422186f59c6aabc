"""The Qwen3-VL text decoder as an engine: weights prepared once, layers run on any row range.

    per layer: x += o(attn(rope(q_norm(q(n1 x))), rope(k_norm(k(n1 x))), v(n1 x)))   n1 = RMSNorm
               x += down(silu(gate(n2 x)) * up(n2 x))
    logits = head(norm(x))           head = the embedding table when the embeddings are tied

Attention is grouped-query (each KV head serves num_heads / num_kv_heads query heads), causal,
against a per-layer KV cache that grows by whatever rows a call brings (a prefill chunk, one
decode token). The q / k RMSNorm is over head_dim, per head, BEFORE the rotation (the planted
fault `qk-norm-after-rope` swaps them: the norm's weight does not commute with the rotation).
Kernels go through the backend (`rms_norm`, `rope_rotate_half`, `linear`); the score/softmax is
the engine's own fp32 einsum.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import faults as F
from .config import TextConfig
from .weights import read_cast

PREFIX = "model.language_model."


def text_shapes(tc: TextConfig, tied: bool) -> dict[str, tuple[int, ...]]:
    """Every tensor the decoder reads (full checkpoint name) -> the shape its config implies."""
    d, f, hd = tc.hidden_size, tc.intermediate_size, tc.head_dim
    nq, nkv = tc.num_attention_heads, tc.num_key_value_heads
    out = {PREFIX + "embed_tokens.weight": (tc.vocab_size, d), PREFIX + "norm.weight": (d,)}
    for i in range(tc.num_hidden_layers):
        p = f"{PREFIX}layers.{i}."
        out.update({p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                    p + "self_attn.q_proj.weight": (nq * hd, d), p + "self_attn.k_proj.weight": (nkv * hd, d),
                    p + "self_attn.v_proj.weight": (nkv * hd, d), p + "self_attn.o_proj.weight": (d, nq * hd),
                    p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
                    p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d),
                    p + "mlp.down_proj.weight": (d, f)})
    if not tied:
        out["lm_head.weight"] = (tc.vocab_size, d)
    return out


@dataclass
class KVCache:
    """Keys (rotated) and values per layer, [kv_heads, T, head_dim], appended call by call."""

    k: dict[int, torch.Tensor] = field(default_factory=dict)
    v: dict[int, torch.Tensor] = field(default_factory=dict)

    def extend(self, i: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if i in self.k:
            self.k[i] = torch.cat([self.k[i], k], 1)
            self.v[i] = torch.cat([self.v[i], v], 1)
        else:
            self.k[i], self.v[i] = k, v
        return self.k[i], self.v[i]

    def length(self) -> int:
        return int(next(iter(self.k.values())).shape[1]) if self.k else 0


class Decoder:
    def __init__(self, tc: TextConfig, tied: bool, w: dict[str, torch.Tensor], backend, dtype: torch.dtype,
                 fault: str | None = None):
        self.cfg, self.backend, self.dtype, self.fault = tc, backend, dtype, fault
        self.w = {k[len(PREFIX):] if k.startswith(PREFIX) else k: v for k, v in w.items()}
        self.embed = self.w["embed_tokens.weight"]
        self.head = self.embed if tied else self.w["lm_head.weight"]

    @classmethod
    def load(cls, ckpt: Path, tc: TextConfig, tied: bool, backend, dtype: torch.dtype, device="cpu",
             fault: str | None = None) -> "Decoder":
        want = text_shapes(tc, tied)
        return cls(tc, tied, read_cast(ckpt, want, dtype, device), backend, dtype, fault)

    def _norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return self.backend.rms_norm(x, self.w[name], self.cfg.rms_norm_eps)

    def attention(self, i: int, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, start: int,
                  cache: KVCache) -> torch.Tensor:
        """h [n, D] (normed rows at positions start..start+n-1) -> attention output [n, D]."""
        c, b, p = self.cfg, self.backend, f"layers.{i}.self_attn."
        n, hd = h.shape[0], c.head_dim
        q = b.linear(h, self.w[p + "q_proj.weight"], None).view(n, c.num_attention_heads, hd)
        k = b.linear(h, self.w[p + "k_proj.weight"], None).view(n, c.num_key_value_heads, hd)
        v = b.linear(h, self.w[p + "v_proj.weight"], None).view(n, c.num_key_value_heads, hd)
        if self.fault == F.QK_NORM_AFTER_ROPE:
            q = self._norm(b.rope_rotate_half(q, cos, sin), p + "q_norm.weight")
            k = self._norm(b.rope_rotate_half(k, cos, sin), p + "k_norm.weight")
        else:
            q = b.rope_rotate_half(self._norm(q, p + "q_norm.weight"), cos, sin)
            k = b.rope_rotate_half(self._norm(k, p + "k_norm.weight"), cos, sin)
        keys, values = cache.extend(i, k.transpose(0, 1), v.transpose(0, 1))  # [kv, T, hd]
        groups = c.num_attention_heads // c.num_key_value_heads
        qf = q.float().transpose(0, 1).reshape(c.num_key_value_heads, groups * n, hd)
        scores = torch.einsum("gqd,gkd->gqk", qf, keys.float()) * hd ** -0.5  # [kv, groups*n, T]
        t = keys.shape[1]
        qpos = torch.arange(start, start + n, device=h.device).repeat(groups)  # row r of a group -> its position
        causal = torch.arange(t, device=h.device)[None, :] <= qpos[:, None]
        scores = scores.masked_fill(~causal, float("-inf"))
        o = torch.einsum("gqk,gkd->gqd", scores.softmax(-1), values.float())  # [kv, groups*n, hd]
        o = o.reshape(c.num_attention_heads, n, hd).transpose(0, 1).reshape(n, -1).to(h.dtype)
        return b.linear(o, self.w[p + "o_proj.weight"], None)

    def mlp(self, i: int, h: torch.Tensor) -> torch.Tensor:
        b, p = self.backend, f"layers.{i}.mlp."
        gate = b.linear(h, self.w[p + "gate_proj.weight"], None)
        up = b.linear(h, self.w[p + "up_proj.weight"], None)
        return b.linear(torch.nn.functional.silu(gate) * up, self.w[p + "down_proj.weight"], None)

    def layer(self, i: int, x: torch.Tensor, cos, sin, start: int, cache: KVCache) -> torch.Tensor:
        p = f"layers.{i}."
        x = x + self.attention(i, self._norm(x, p + "input_layernorm.weight"), cos, sin, start, cache)
        return x + self.mlp(i, self._norm(x, p + "post_attention_layernorm.weight"))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """[n, D] leaving the last layer -> [n, vocab] (the final RMSNorm, then the head)."""
        h = x if self.fault == F.LOGITS_NO_FINAL_NORM else self._norm(x, "norm.weight")
        return self.backend.linear(h, self.head, None)
