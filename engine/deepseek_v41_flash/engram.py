"""Engram in the engine: a per-sequence n-gram window, carried across chunks and decode steps.

`EngramHashState` is the only state: the compressed ids of the last `max_ngram - 1` positions,
BLOCKED for positions before the sequence and for image positions (the DEAD state), so look-back
stops at an image and no n-gram crosses it, however the sequence is cut into chunks.
`EngramLayer` turns hash ids into a gated write into the residual copies.

Fault (off by default): `engram-ngram-across-image` forgets the DEAD state: image positions enter
the window with the compressed id of `image_token_id`, so n-grams after an image reach into it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.deepseek_v41_flash.faults import ENGRAM_NGRAM_ACROSS_IMAGE

BLOCKED = -1  # before the sequence start, or an image position (DEAD)


def _prime(n: int) -> bool:
    if n < 2:
        return False
    for f in range(2, int(n ** 0.5) + 1):
        if n % f == 0:
            return False
    return True


@dataclass(frozen=True)
class EngramTables:
    """Hashing constants shared by every sequence."""

    layer_ids: tuple[int, ...]
    max_ngram: int
    n_heads: int
    primes: torch.Tensor  # [layers, max_ngram-1, heads] int64
    offsets: torch.Tensor  # [layers, (max_ngram-1)*heads] int64: each bucket range's first row
    multipliers: torch.Tensor  # [layers, max_ngram] int64, odd
    token_map: torch.Tensor  # [vocab] int64 compressed ids
    pad: int  # compressed id of the pad token

    @classmethod
    def build(cls, cfg, token_map: torch.Tensor, n_compressed: int) -> "EngramTables":
        used: set[int] = set()
        primes = []
        for _ in cfg.engram_layer_ids:
            per_layer = []
            for _ in range(cfg.engram_max_ngram_size - 1):
                heads, p = [], cfg.engram_vocab_size - 1
                for _ in range(cfg.engram_n_heads):
                    p += 1
                    while p in used or not _prime(p):
                        p += 1
                    used.add(p)
                    heads.append(p)
                per_layer.append(heads)
            primes.append(per_layer)
        pr = torch.tensor(primes, dtype=torch.int64)
        flat = pr.flatten(1)
        offsets = torch.cumsum(flat, dim=1) - flat  # exclusive prefix sum
        bound = max(1, (np.iinfo(np.int64).max // n_compressed) // 2)
        mult = [np.random.default_rng(10007 * lid).integers(0, bound, size=(cfg.engram_max_ngram_size,),
                                                            dtype=np.int64) * 2 + 1 for lid in cfg.engram_layer_ids]
        return cls(tuple(cfg.engram_layer_ids), cfg.engram_max_ngram_size, cfg.engram_n_heads, pr, offsets,
                   torch.from_numpy(np.stack(mult)), token_map, int(token_map[cfg.engram_pad_id]))


class EngramHashState:
    """One sequence's n-gram window. `hash(ids, image)` consumes the next positions in order."""

    def __init__(self, tables: EngramTables, fault: str | None = None):
        self.t = tables
        self.window = torch.full((tables.max_ngram - 1,), BLOCKED, dtype=torch.int64)  # oldest first
        self.ignore_dead = fault == ENGRAM_NGRAM_ACROSS_IMAGE

    def reset(self) -> None:
        """Forget the window (a sequence's start); only the planted decode fault calls it mid-run."""
        self.window.fill_(BLOCKED)

    def hash(self, ids: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        """ids, image: [n] -> hash rows [n, layers, (max_ngram-1)*heads] int64."""
        comp = self.t.token_map[ids]
        if not self.ignore_dead:
            comp = torch.where(image, torch.full_like(comp, BLOCKED), comp)
        w = self.window.numel()
        seq = torch.cat([self.window, comp])  # seq[w + i] is position i of this call
        n = ids.numel()
        cols, stopped = [], torch.zeros(n, dtype=torch.bool)
        for back in range(self.t.max_ngram):
            src = seq[w - back: w - back + n]
            stopped = stopped | (src == BLOCKED)
            cols.append(torch.where(stopped, torch.full_like(src, self.t.pad), src))
        self.window = seq[-w:].clone()
        tokens = torch.stack(cols, dim=1)  # [n, max_ngram], look-back 0 first
        prod = tokens.unsqueeze(1) * self.t.multipliers.unsqueeze(0)  # [n, layers, max_ngram]
        acc, out = prod[..., 0], []
        for j in range(1, self.t.max_ngram):
            acc = acc ^ prod[..., j]
            out.append(torch.remainder(acc.unsqueeze(-1), self.t.primes[:, j - 1]))  # [n, layers, heads]
        return torch.cat(out, dim=-1) + self.t.offsets


@dataclass(frozen=True)
class EngramLayer:
    table: torch.Tensor  # [rows, head_dim]
    wkv: torch.Tensor  # [D*(hc+1), cols*head_dim]
    qk: torch.Tensor  # [hc, D] fp32: q_weight * k_weight (only their product is used)
    hc: int
    dim: int
    eps: float

    def __call__(self, x: torch.Tensor, hashes: torch.Tensor, image: torch.Tensor, backend):
        """x: [n, hc, D]; hashes: [n, cols]; image: [n] bool. Returns (x', gate [n, hc] fp32)."""
        emb = self.table[hashes].reshape(hashes.shape[0], -1)
        kv = backend.linear(emb, self.wkv, None)
        key = kv[:, : self.hc * self.dim].float().view(-1, self.hc, self.dim)
        value = kv[:, self.hc * self.dim:].float()
        h = x.float()
        norm = torch.rsqrt(h.pow(2).mean(-1) + self.eps) * torch.rsqrt(key.pow(2).mean(-1) + self.eps)
        dot = (h * key * self.qk).sum(-1) * norm / self.dim ** 0.5  # [n, hc]
        root = dot.abs().clamp_min(1e-6).sqrt()
        gate = torch.sigmoid(torch.where(dot < 0, -root, root))  # a signed square root
        gate = torch.where(image.unsqueeze(-1), torch.zeros_like(gate), gate)  # image rows pass through
        return (h + gate.unsqueeze(-1) * value.unsqueeze(1)).to(x.dtype), gate
