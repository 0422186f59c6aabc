"""Latent sparse attention with a KV cache, one chunk of positions at a time.

A chunk is any run of consecutive positions: a prefill chunk or one decode token, the same code.
Per layer the cache holds the post-RoPE window KV of every position so far (a query sees the
last `window_size` of them, itself included). Layers with `compress_ratio` r > 0 also attend to
compressed positions: a KV-source layer pools each completed group of r tokens into one latent
(an incomplete group waits in `pending` across chunks and decode steps), an index-source layer
scores the visible latents and keeps the best `index_topk` per query; the layers after a source
reuse its latents and its choice. A group becomes visible to a query once the query has passed
the group's last token. With `kernel_quant` the KV and the indexer's q / k go through the
kernels' FP8 / FP4 activation quantisation (`quant`); it is off by default, as in the oracle.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.deepseek_v41_flash import quant
import engine.deepseek_v41_flash.language_rope as rope


INDEX_TIES = "earlier"  # the stated tie rule: among equal index scores the earlier position is kept


def _best_first(score: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores sorted best first, EXACT ties in position order (earlier first). Index scores tie
    often (ReLU'd to exactly 0), and a top-k that leaves tie order open keeps different positions
    for different chunkings."""
    return torch.sort(score, dim=-1, descending=True, stable=True)


@dataclass(frozen=True)
class AttnWeights:
    sink: torch.Tensor  # [H] fp32
    wq_a: torch.Tensor
    q_norm: torch.Tensor
    wq_b: torch.Tensor
    wkv: torch.Tensor
    kv_norm: torch.Tensor
    wo_a: torch.Tensor  # [G*r, H*hd/G]
    wo_b: torch.Tensor
    # compressor (KV-source layers)
    c_wkv: torch.Tensor | None = None
    c_wgate: torch.Tensor | None = None  # ratio > 1 only; with c_wkv fp32 then
    c_norm: torch.Tensor | None = None
    # indexer (index-source layers); wk / k_norm on KV-source layers only
    i_wq_b: torch.Tensor | None = None
    i_weights: torch.Tensor | None = None
    i_wk: torch.Tensor | None = None
    i_k_norm: torch.Tensor | None = None


@dataclass
class LayerCache:
    window_kv: torch.Tensor  # [max_seq, hd]: post-RoPE KV of every position written so far
    latents: list = field(default_factory=list)  # post-RoPE compressed KV, one [hd] per group
    index_k: list = field(default_factory=list)  # index keys, one [ihd] per group
    pending_kv: torch.Tensor | None = None  # [m < r, hd] fp32 of the group still filling
    pending_score: torch.Tensor | None = None


@dataclass
class ChunkShared:
    """Handed down the stack within one chunk: the latest KV source's cache, index-key owner's
    cache, and index source's selection.

    `decoding` (a decode step under index_keys=official): an owner hands its keys down only on a
    step that completes one of its groups; otherwise `key_cache` stays what the sequence carried
    in, the last owner that did (maybe a later layer, an earlier step), as the official decode
    reads them through its one shared reference."""

    kv_cache: LayerCache | None = None
    key_cache: LayerCache | None = None
    decoding: bool = False
    selection: torch.Tensor | None = None  # [n, k] group ids, -1 = none
    selection_scores: torch.Tensor | None = None  # [n, T] the key the selection ranked (-inf: not eligible)
    candidates: torch.Tensor | None = None  # [n, T] bool: blocks the candidate source kept
    # local error only: layer -> [n, k] selection to attend to instead of the layer's own (the
    # reference's choice, so a stage after a near-tie flip is judged on the same positions)
    forced: dict | None = None
    # local error only: candidate source layer -> [n, T] the reference's scores, so the layers after
    # it keep the reference's candidate blocks (a near-tie flip there changes the eligible set)
    forced_scores: dict | None = None


class Attention:
    def __init__(self, layer_id: int, cfg, w: AttnWeights, backend, kernel_quant: bool = False):
        self.cfg, self.w, self.backend = cfg, w, backend
        self.layer_id = layer_id
        self.kernel_quant = kernel_quant
        self.H, self.hd, self.rd = cfg.n_heads, cfg.head_dim, cfg.rope_head_dim
        self.window = cfg.window_size
        self.ratio = cfg.compress_ratios[layer_id]
        self.kv_source = layer_id in cfg.kv_source_layers
        self.index_source = layer_id in cfg.index_source_layers
        self.owns_keys = self.index_source and self.kv_source
        self._tables: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.candidate_source = layer_id == cfg.candidate_source_layer
        self.candidate_user = 0 <= cfg.candidate_source_layer < layer_id
        if self.ratio:
            self.rope_args = (self.rd, cfg.max_seq_len, cfg.original_seq_len, float(cfg.compress_rope_theta),
                              float(cfg.rope_factor), cfg.beta_fast, cfg.beta_slow)
        else:
            self.rope_args = (self.rd, cfg.max_seq_len, 0, float(cfg.rope_theta), float(cfg.rope_factor),
                              cfg.beta_fast, cfg.beta_slow)

    def _fp4(self, x: torch.Tensor, block: int, e4m3_scale: bool = False) -> torch.Tensor:
        return quant.fp4(x, block, e4m3_scale) if self.kernel_quant else x

    def _rope(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos / sin [max_seq_len, rd/2] on `device`, built once per device."""
        key = str(device)
        if key not in self._tables:
            self._tables[key] = tuple(t.to(device) for t in rope.table(*self.rope_args))
        return self._tables[key]

    def new_cache(self, dtype, device) -> LayerCache:
        return LayerCache(torch.zeros(self.cfg.max_seq_len, self.hd, dtype=dtype, device=device))

    def _norm(self, x, weight):
        return self.backend.rms_norm(x, weight, self.cfg.norm_eps)

    def _compress(self, x: torch.Tensor, start: int, cache: LayerCache, cos, sin) -> int:
        """Append this chunk to the pending group(s); pool every completed group into a latent
        (and an index key when this layer's indexer owns them). Returns the number of groups."""
        r, w = self.ratio, self.w
        if r == 1:  # one token per group: a plain projection, in the activation dtype
            new = self._norm(self.backend.linear(x, w.c_wkv, None), w.c_norm)
            first = start
        else:
            xf = x.float()
            kv = self.backend.linear(xf, w.c_wkv, None)
            score = self.backend.linear(xf, w.c_wgate, None)
            if cache.pending_kv is not None:
                kv = torch.cat([cache.pending_kv, kv])
                score = torch.cat([cache.pending_score, score])
            first = start - (0 if cache.pending_kv is None else cache.pending_kv.shape[0])
            full = kv.shape[0] // r * r
            cache.pending_kv = kv[full:] if full < kv.shape[0] else None
            cache.pending_score = score[full:] if full < kv.shape[0] else None
            if full == 0:
                return len(cache.latents)
            kv_g = kv[:full].view(-1, r, self.hd)
            p = torch.softmax(score[:full].view(-1, r, self.hd), dim=1)
            new = self._norm((kv_g * p).sum(1).to(x.dtype), w.c_norm)
        # a latent stands for its group's first token: group j rotates at position j * r
        pos = torch.arange(first, first + new.shape[0] * r, r, device=x.device)
        if self.owns_keys:
            k = self._norm(self.backend.linear(new, w.i_wk, None), w.i_k_norm)
            cache.index_k.extend(self._fp4(rope.rotate_pairs(k, self.rd, cos[pos], sin[pos]), 32).unbind(0))
        latent = rope.rotate_pairs(new, self.rd, cos[pos], sin[pos])
        cache.latents.extend(self._fp4(latent, 16, e4m3_scale=True).unbind(0))
        return len(cache.latents)

    def _blocks(self, score: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
        """Level one of the two-level selection: per query the `candidate_topk_blocks` blocks of
        `candidate_block_size` groups with the best single score, the block of the query's newest
        group always among them; a block with nothing visible is never kept. [n, T] bool."""
        bs, n, t = self.cfg.candidate_block_size, score.shape[0], score.shape[1]
        n_blocks = -(-t // bs)
        dev = score.device
        full = torch.full((n, n_blocks * bs), float("-inf"), device=dev)
        full[:, :t] = score
        best = full.view(n, n_blocks, bs).max(dim=-1).values
        newest = (seen - 1).clamp_min(-1) // bs  # -1: nothing visible yet, nothing pinned
        rows = torch.arange(n, device=dev)[newest >= 0]
        best[rows, newest[newest >= 0]] = float("inf")
        kb = min(self.cfg.candidate_topk_blocks, n_blocks)
        values, order = _best_first(best)
        keep = torch.zeros(n, n_blocks, dtype=torch.bool, device=dev)
        keep.scatter_(1, order[:, :kb], values[:, :kb] > float("-inf"))
        return keep.repeat_interleave(bs, dim=1)[:, :t]

    def _select(self, x, qr, start: int, n_groups: int, keys: LayerCache, cos, sin,
                shared: "ChunkShared") -> torch.Tensor:
        """[n, k] ids of the visible groups each query keeps (-1 pads a short row)."""
        w, n = self.w, x.shape[0]
        ih, ihd = self.cfg.index_n_heads, self.cfg.index_head_dim
        q = self.backend.linear(qr, w.i_wq_b, None).view(n, ih, ihd)
        q = self._fp4(rope.rotate_pairs(q, self.rd, cos[start:start + n], sin[start:start + n]), 32)
        k = torch.stack(keys.index_k[:n_groups])  # [T, ihd]
        if k.shape[0] < n_groups:  # an owner with fewer groups (decode, official keys): its cache is zeros there
            k = torch.cat([k, k.new_zeros(n_groups - k.shape[0], k.shape[1])])
        head_w = self.backend.linear(x, w.i_weights, None) * (ihd ** -0.5 * ih ** -0.5)  # [n, ih]
        score = torch.einsum("nhd,td->nht", q, k).relu()
        score = (score * head_w.unsqueeze(-1)).sum(1)  # [n, T]
        seen = (torch.arange(start, start + n, device=x.device) + 1) // self.ratio  # groups visible to each query
        visible = torch.arange(n_groups, device=x.device).unsqueeze(0) < seen.unsqueeze(1)
        score = score.masked_fill(~visible, float("-inf"))
        if self.candidate_source:
            ref = (shared.forced_scores or {}).get(self.layer_id)
            # in fp32 as recorded: rounding the reference's scores to a bf16 run's dtype would make new ties
            key = score if ref is None else ref[:, :score.shape[1]].to(device=score.device, dtype=torch.float32)
            shared.candidates = self._blocks(key, seen)
        elif self.candidate_user:
            score = score.masked_fill(~shared.candidates, float("-inf"))
        shared.selection_scores = score  # recorded as `index.L.scores` (the tie rule reads it)
        k_keep = min(self.cfg.index_topk, n_groups)
        order = _best_first(score)[1][:, :k_keep]
        # A pick is dropped only when the query cannot see it yet, NOT when its score is -inf:
        # with fewer candidates than index_topk the top-k runs into the -inf scores, and the
        # visible non-candidate groups it reaches there (the earliest first, as exact ties go)
        # stay selected, as they do officially.
        return torch.where(order < seen.unsqueeze(1), order, torch.full_like(order, -1))

    def __call__(self, x: torch.Tensor, start: int, cache: LayerCache, shared: ChunkShared) -> torch.Tensor:
        """x: [n, D] normalised attention input for positions start .. start+n-1 -> [n, D]."""
        w, n, H, hd, rd = self.w, x.shape[0], self.H, self.hd, self.rd
        cos, sin = self._rope(x.device)
        cq, sq = cos[start:start + n], sin[start:start + n]
        qr = self._norm(self.backend.linear(x, w.wq_a, None), w.q_norm)
        q = rope.rotate_pairs(self.backend.linear(qr, w.wq_b, None).view(n, H, hd), rd, cq, sq)
        kv = rope.rotate_pairs(self._norm(self.backend.linear(x, w.wkv, None), w.kv_norm), rd, cq, sq)
        if self.kernel_quant:
            kv = quant.fp8(kv)  # the window K = V is kept FP8 (post-RoPE, the whole vector)
        cache.window_kv[start:start + n] = kv
        lo = max(0, start - self.window + 1)
        keys = cache.window_kv[lo:start + n]  # [m, hd]
        qpos = torch.arange(start, start + n, device=x.device).unsqueeze(1)
        kpos = torch.arange(lo, start + n, device=x.device).unsqueeze(0)
        in_window = (kpos <= qpos) & (kpos > qpos - self.window)  # [n, m]
        scores = torch.einsum("nhd,md->nhm", q.float(), keys.float()) * hd ** -0.5
        scores = scores.masked_fill(~in_window.unsqueeze(1), float("-inf"))
        values = keys.float().unsqueeze(0).expand(n, -1, -1)  # [n, m, hd]
        if self.ratio:
            if self.kv_source:
                before = len(cache.latents)
                self._compress(x, start, cache, cos, sin)
                shared.kv_cache = cache
                if self.owns_keys and (len(cache.latents) > before or not shared.decoding):
                    shared.key_cache = cache
            n_groups = (start + n) // self.ratio
            if self.index_source:
                if n_groups == 0:
                    shared.selection = torch.full((n, 0), -1, dtype=torch.long, device=x.device)
                    shared.selection_scores = torch.full((n, 0), float("-inf"), device=x.device)
                else:
                    shared.selection = self._select(x, qr, start, n_groups, shared.key_cache, cos, sin, shared)
                    if shared.forced is not None and self.layer_id in shared.forced:
                        shared.selection = shared.forced[self.layer_id]
            sel = shared.selection
            if sel.shape[1]:
                lat = torch.stack(shared.kv_cache.latents[:n_groups]).float()  # [T, hd]
                picked = lat[sel.clamp_min(0)]  # [n, k, hd]
                c_scores = torch.einsum("nhd,nkd->nhk", q.float(), picked) * hd ** -0.5
                c_scores = c_scores.masked_fill((sel < 0).unsqueeze(1), float("-inf"))
                scores = torch.cat([scores, c_scores], dim=-1)
                values = torch.cat([values, picked], dim=1)
        # exp against the row max (the sink is not part of it), rounded to the activation dtype
        # before P·V as the kernel does; the fp32 denominator also takes exp(sink - max), so the
        # sink only takes mass. (The kernel's max is a running one over blocks of 64 positions:
        # identical whenever a row selects <= 64, within a bf16 ulp beyond.)
        top = scores.amax(-1, keepdim=True).clamp_min(-1e30)
        p = torch.exp(scores - top)
        denom = p.sum(-1) + torch.exp(w.sink.float().view(1, H) - top.squeeze(-1))
        o = torch.einsum("nhm,nmd->nhd", p.to(x.dtype).float(), values) / denom.unsqueeze(-1)
        o = o.to(x.dtype)
        o = rope.rotate_pairs(o, rd, cq, sq, inverse=True)  # undo the query's rotation
        G, r = self.cfg.o_groups, self.cfg.o_lora_rank
        og = o.reshape(n, G, -1).transpose(0, 1)  # [G, n, H*hd/G]
        low = torch.bmm(og, w.wo_a.view(G, r, -1).transpose(1, 2))  # [G, n, r]
        return self.backend.linear(low.transpose(0, 1).reshape(n, G * r), w.wo_b, None)
