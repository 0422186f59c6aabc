"""Engram: hashed n-gram lookups written into the residual stream (official `engram.py`).

A position is hashed with the tokens before it as 2- .. `max_ngram_size`-grams over a
compressed vocabulary, each n-gram size split over `n_heads` heads with prime-sized bucket ranges.
Image-span positions are DEAD: look-back stops at them (the slot takes the pad token), so no
n-gram crosses an image, and the gate is shut on them so their embeddings pass through.

The oracle hashes a whole sequence at once (it never runs chunked); the engine carries the
same window across chunks and decode steps.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from .checkpoint import table
from .quant import Fp8Table, QuantLinear

DEAD = -1


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    f = 3
    while f * f <= n:
        if n % f == 0:
            return False
        f += 2
    return True


def next_unused_prime(start: int, seen: set[int]) -> int:
    """Smallest prime above `start` not handed out yet (the bucket ranges must be disjoint)."""
    n = start + 1
    while n in seen or not _is_prime(n):
        n += 1
    return n


def hash_multipliers(layer_ids: tuple[int, ...], max_ngram_size: int, compressed_vocab: int) -> torch.Tensor:
    """[n_engram_layers, max_ngram_size] odd int64 multipliers from a per-layer numpy RNG,
    bounded so `token * multiplier` cannot overflow int64."""
    bound = max(1, (np.iinfo(np.int64).max // compressed_vocab) // 2)
    rows = [np.random.default_rng(10007 * lid).integers(0, bound, size=(max_ngram_size,), dtype=np.int64) * 2 + 1
            for lid in layer_ids]
    return torch.from_numpy(np.stack(rows))


@dataclass(frozen=True)
class EngramLayout:
    max_ngram_size: int
    layer_ids: tuple[int, ...]
    num_embeddings: tuple[int, ...]
    primes: tuple[tuple[tuple[int, ...], ...], ...]  # [layer][n-gram size - 2][head]
    n_heads: int
    head_dim: int

    @property
    def n_hash_cols(self) -> int:
        return (self.max_ngram_size - 1) * self.n_heads

    @classmethod
    def from_args(cls, args) -> "EngramLayout | None":
        if not args.engram_layer_ids:
            return None
        seen: set[int] = set()
        primes = []
        for _ in args.engram_layer_ids:
            per_size = []
            for _ in range(args.engram_max_ngram_size - 1):
                cur, heads = args.engram_vocab_size - 1, []
                for _ in range(args.engram_n_heads):
                    cur = next_unused_prime(cur, seen)
                    seen.add(cur)
                    heads.append(cur)
                per_size.append(tuple(heads))
            primes.append(tuple(per_size))
        return cls(args.engram_max_ngram_size, tuple(args.engram_layer_ids), tuple(args.engram_num_embeddings),
                   tuple(primes), args.engram_n_heads, args.engram_head_dim)


class NgramHasher:
    """Hash ids of the n-grams ending at each position of one whole sequence."""

    def __init__(self, layout: EngramLayout, token_map: torch.Tensor, pad_id: int, compressed_vocab: int):
        self.layout = layout
        self.token_map = token_map.long()
        self.pad = int(self.token_map[pad_id])
        flat = [[p for per_size in layer for p in per_size] for layer in layout.primes]
        self.offsets = torch.tensor(np.array([np.cumsum([0, *sizes[:-1]]) for sizes in flat]), dtype=torch.int64)
        self.primes = torch.tensor(layout.primes, dtype=torch.int64)  # [layers, n-1, heads]
        self.multipliers = hash_multipliers(layout.layer_ids, layout.max_ngram_size, compressed_vocab)

    def __call__(self, input_ids: torch.Tensor, token_mask: torch.Tensor | None) -> torch.Tensor:
        """input_ids: [B, L]; token_mask: [B, L] False on image positions.
        Returns [B, L, n_engram_layers, n_hash_cols] int64."""
        compressed = self.token_map[input_ids]
        if token_mask is not None:
            compressed = torch.where(token_mask, compressed, DEAD)
        b, n = compressed.shape
        pos = torch.arange(n).expand(b, n)
        blocked = torch.zeros(b, n, dtype=torch.bool)
        cols = []
        for shift in range(self.layout.max_ngram_size):
            src = compressed.gather(1, (pos - shift).clamp_min(0))
            # once look-back meets the start or a DEAD slot, every older slot is padding too
            blocked = blocked | (pos < shift) | (src == DEAD)
            cols.append(torch.where(blocked, self.pad, src))
        tokens = torch.stack(cols, -1)  # [B, L, max_ngram]
        products = tokens.unsqueeze(2) * self.multipliers  # [B, L, layers, max_ngram]
        rolling, hashes = products[..., 0], []
        for i in range(1, self.layout.max_ngram_size):
            rolling = torch.bitwise_xor(rolling, products[..., i])  # the (i+1)-gram hash
            hashes.append(rolling.unsqueeze(-1) % self.primes[:, i - 1])
        return torch.cat(hashes, -1) + self.offsets


class Engram(nn.Module):
    """Gated n-gram memory at one layer. The table is FP8 with a scale per row and 32 columns
    when the config's dtype is fp8 (the release); a bf16 config's table is plain."""

    def __init__(self, args, layer_id: int, layout: EngramLayout):
        super().__init__()
        self.layer_id = layer_id
        self.layer_hash_index = layout.layer_ids.index(layer_id)
        self.dim, self.hc_mult, self.eps = args.dim, args.hc_mult, args.norm_eps
        self.clamp_value = 1e-6
        rows = layout.num_embeddings[self.layer_hash_index]
        fp8 = args.dtype == "fp8"
        self.embed = Fp8Table(rows, layout.head_dim) if fp8 else table(rows, layout.head_dim)
        n_in, n_out = layout.n_hash_cols * layout.head_dim, args.dim * (args.hc_mult + 1)
        self.wkv = QuantLinear(n_in, n_out, "fp8") if fp8 else nn.Linear(n_in, n_out, bias=False)
        self.q_weight = nn.Parameter(torch.ones(args.hc_mult, args.dim))
        self.k_weight = nn.Parameter(torch.ones(args.hc_mult, args.dim))

    def forward(self, x: torch.Tensor, hash_ids: torch.Tensor, token_mask: torch.Tensor | None):
        """x: [B, L, hc, dim]; hash_ids: [B, L, n_hash_cols]. Returns (x', gate [B, L, hc] fp32)."""
        kv = self.wkv(self.embed(hash_ids).flatten(-2))
        key, value = kv.split([self.hc_mult * self.dim, self.dim], dim=-1)
        key = key.float().unflatten(-1, (self.hc_mult, self.dim))
        w = self.q_weight.float() * self.k_weight.float()
        h = x.float()
        # one statistic per (token, hc copy) over dim, for the stream and for the key
        rstd = torch.rsqrt(h.square().mean(-1) + self.eps) * torch.rsqrt(key.square().mean(-1) + self.eps)
        dot = (h * w * key).sum(-1) * rstd * self.dim**-0.5
        gate = torch.sigmoid(torch.copysign(dot.abs().clamp_min(self.clamp_value).sqrt(), dot))
        if token_mask is not None:
            gate = gate.masked_fill(~token_mask.unsqueeze(-1), 0)
        out = (h + gate.unsqueeze(-1) * value.float().unsqueeze(-2)).to(x.dtype)
        return out, gate
