"""The DeepSeek V4.1 Flash language backbone, in plain PyTorch (official `model.py` semantics).

embed (+ image-span overwrite) -> `hc_mult` residual copies -> per layer: Engram (some layers),
then a Block (hyper-connection mixes around latent sparse attention and a dual-bias MoE) ->
collapse -> final norm -> LM head. Module and parameter names are the checkpoint's.

Numerics (`language_numerics`): by default what the official code computes, its only mode:
bf16 activations with the kernels' quantisation (`quant`): quantised weights read as stored
(FP8 dense layers and Engram table with block scales, FP4 routed experts) and used through the
block-scaled FP8 GEMM, the window KV rounded to FP8, the indexer's q / k and the compressed KV to
FP4. `-o language_numerics=semantic` is the labelled semantic mode: the run's dtype (float32 by
default), weights dequantised exactly, no activation rounding (`kernel_quant` overrides the
rounding either way). Between two independent fp32 routes (~1e-7 apart) a value on a rounding
midpoint flips by a whole FP8/FP4 step on one side only, so the semantic mode is where an fp32
comparison is tight; the official mode is the yardstick for a bf16 engine.
Also modelled: the attention kernel's online softmax over blocks of 64 selected positions with
its rounding of the probabilities to the activation dtype before P·V.
Not modelled: the DSpark draft layers (`mtp.*`). Only single-shot prefill (start_pos 0) exists
here: decode is checked by full recomputation, and the engine's chunked prefill against slices
of this result.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from tensordiff.errors import BadInput
from tensordiff.models.deepseek_v41_flash.options import OPTIONS

from .checkpoint import default_dtype, load_into, table
from .engram import Engram, EngramLayout, NgramHasher
from .image_processor import IMAGE, IMAGE_END, IMAGE_NEW_LINE, IMAGE_START, TEXT, num_image_tokens
from .quant import QuantLinear, fp4_round_trip, fp8_round_trip, set_kernel
from .tokens import DEFAULT_PROMPT, build_prompt, compressed_token_map


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + self.eps)
        return (self.weight * xf).to(x.dtype)


def linear(dim_in: int, dim_out: int, dtype: torch.dtype | None = None, fmt: str | None = None) -> nn.Module:
    """A bias-free projection: plain (the activation dtype, or `dtype`), or stored FP8 / FP4 with
    its scale when `fmt` is "fp8" / "fp4"."""
    if fmt is not None:
        return QuantLinear(dim_in, dim_out, fmt)
    return nn.Linear(dim_in, dim_out, bias=False, dtype=dtype)


def dense_format(args) -> str | None:
    """The storage of the Linears the official code builds with the default dtype."""
    return "fp8" if args.dtype == "fp8" else None


def expert_format(args) -> str | None:
    return "fp4" if args.expert_dtype == "fp4" else dense_format(args)


@lru_cache(8)
def rotary_table(dim: int, seqlen: int, original_seq_len: int, base: float, factor: float,
                 beta_fast: int, beta_slow: int) -> torch.Tensor:
    """[seqlen, dim/2] complex rotations; YaRN when original_seq_len > 0 (wavelengths that fit the
    training context keep their frequency, long ones are divided by `factor`, a linear ramp
    between `beta_fast` and `beta_slow` rotations)."""
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    if original_seq_len > 0:
        def dim_for(rotations: float) -> float:
            return dim * math.log(original_seq_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low = max(math.floor(dim_for(beta_fast)), 0)
        high = min(math.ceil(dim_for(beta_slow)), dim - 1)
        ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / max(high - low, 1e-3)).clamp(0, 1)
        freqs = freqs / factor * ramp + freqs * (1 - ramp)
    angles = torch.outer(torch.arange(seqlen, dtype=torch.float32), freqs)
    return torch.polar(torch.ones_like(angles), angles)


def rotate(x: torch.Tensor, freqs: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """Adjacent pairs of the last dim as complex numbers, times `freqs` [S, d/2] (conjugated when
    `inverse`). x: [B, S, d] or [B, S, H, d]; returns a new tensor in x.dtype."""
    xc = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)).contiguous())
    f = freqs.conj() if inverse else freqs
    f = f.view(1, xc.size(1), xc.size(-1)) if xc.ndim == 3 else f.view(1, xc.size(1), 1, xc.size(-1))
    return torch.view_as_real(xc * f).flatten(-2).to(x.dtype)


def rotate_tail(x: torch.Tensor, rd: int, freqs: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """RoPE on the last `rd` channels only (the rest is the no-position part of the head)."""
    return torch.cat([x[..., :-rd], rotate(x[..., -rd:], freqs, inverse)], -1)


def window_indices(seqlen: int, window: int) -> torch.Tensor:
    """[S, min(S, window)] the raw positions each query sees; -1 before the sequence start."""
    end = torch.arange(seqlen).unsqueeze(1)
    idx = (end - window + 1).clamp(0) + torch.arange(min(seqlen, window))
    return torch.where(idx > end, -1, idx)


ATTN_BLOCK = 64  # the kernel walks the selected positions 64 at a time


def sparse_attention(q: torch.Tensor, kv: torch.Tensor, sink: torch.Tensor, idx: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """One shared KV head (K = V) over gathered positions, plus an attention sink, as the
    kernel computes it: an online softmax over blocks of 64 selected positions, the
    probabilities rounded to the activation dtype (bf16 in the release) against the RUNNING max
    before P·V, the denominator in fp32; the sink adds exp(sink - max) to the denominator only.

    q: [B, S, H, d]; kv: [B, N, d]; sink: [H] fp32; idx: [B, S, K] (-1 = nothing)."""
    bsz, s_len, h, d = q.shape
    b = torch.arange(bsz).view(-1, 1, 1)
    qf = q.float()
    acc = torch.zeros(bsz, s_len, h, d)
    denom = torch.zeros(bsz, s_len, h)
    m = torch.full((bsz, s_len, h), -1e30)  # finite: a row with nothing selected gives 0, not NaN
    for t in range(0, idx.size(-1), ATTN_BLOCK):
        blk = idx[..., t:t + ATTN_BLOCK]
        valid = blk >= 0
        g = kv.float()[b, blk.clamp_min(0).long()] * valid.unsqueeze(-1)  # [B, S, k, d]
        sc = torch.where(valid.unsqueeze(2), torch.einsum("bshd,bskd->bshk", qf, g), -torch.inf) * scale
        m_new = torch.maximum(m, sc.amax(-1))
        shrink = torch.exp(m - m_new)
        p = torch.exp(sc - m_new.unsqueeze(-1))
        denom = denom * shrink + p.sum(-1)
        acc = acc * shrink.unsqueeze(-1) + torch.einsum("bshk,bskd->bshd", p.to(q.dtype).float(), g)
        m = m_new
    denom = denom + torch.exp(sink.float() - m)
    return (acc / denom.unsqueeze(-1)).to(q.dtype)


@dataclass
class SharedAttention:
    """What source layers hand down the stack: compressed KV and index keys from
    `kv_source_layers`, the selected positions from `index_source_layers`."""

    compress_kv: torch.Tensor | None = None
    index_k: torch.Tensor | None = None
    topk_idxs: torch.Tensor | None = None
    topk_scores: torch.Tensor | None = None  # [B, S, T] the key the indexer's top-k ranked (recorded)
    candidates: torch.Tensor | None = None  # [B, S, T] bool, from `candidate_source_layer`
    kernel_quant: bool = False  # the kernels' FP8 / FP4 activation round trips (see the module doc)
    decode_keys: "DecodeKeys | None" = None  # the official decode rule for index keys, when asked for

    def fp8(self, x: torch.Tensor) -> torch.Tensor:
        return fp8_round_trip(x) if self.kernel_quant else x

    def fp4(self, x: torch.Tensor, block: int, e4m3_scale: bool = False) -> torch.Tensor:
        return fp4_round_trip(x, block, e4m3_scale) if self.kernel_quant else x


@dataclass
class DecodeKeys:
    """Which index keys a decode step's indexer reads, officially.

    The official code keeps ONE reference, `shared_attn.index_k`, that an index-key owner (a KV
    source with an indexer) re-points to its own key cache whenever it publishes, and every
    indexer reads through it. In prefill every owner publishes, so an indexer reads its own keys
    or those of the last owner before it. In decode an owner of ratio r publishes only on the
    steps that complete one of its groups, so on the other steps its indexer (and the indexers
    after it) read the keys of the last owner that did publish, possibly a LATER layer in an
    earlier step, sliced with the reader's own ratio: their first (pos + 1) // r entries,
    zeros past what that owner has filled. A property of the official code, not a choice here;
    `index_keys=own` instead lets every decode step read the prefill rule's keys.

    This oracle decodes by full recomputation, so a decode row p is one row of a longer pass:
    the owner's keys come from this pass when it runs before the reader, else from the previous
    pass (a group's keys depend only on positions before p, so they are the same numbers).
    """

    prompt_len: int  # rows >= prompt_len are decode steps
    owners: tuple[tuple[int, int], ...]  # (layer id, ratio) of every index-key owner, in layer order
    previous: dict = None  # owner layer -> its keys [B, T, ihd] as the previous pass published them
    current: dict = None  # the same, this pass

    def __post_init__(self):
        self.previous = dict(self.previous or {})
        self.current = {}

    def _published(self, ratio: int, step: int) -> bool:
        if step < self.prompt_len:  # the prefill pass: a group is complete once the prompt holds one
            return self.prompt_len >= ratio
        return (step + 1) % ratio == 0

    def source(self, layer: int, pos: int) -> tuple[torch.Tensor, int]:
        """(keys of the owner that `layer` reads at decode position `pos`, groups it has filled)."""
        step, before = pos, layer  # owners run in layer order; at `pos` only those up to `layer` ran yet
        while step >= self.prompt_len - 1:
            done = [(o, r) for o, r in self.owners if o <= before and self._published(r, step)]
            if done:
                o, r = done[-1]
                filled = (step + 1) // r if step >= self.prompt_len else self.prompt_len // r
                keys = self.current[o] if step == pos and o <= layer else self.previous[o]
                return keys, filled
            if step < self.prompt_len:
                break
            step, before = step - 1, 1 << 30  # an earlier step: every owner ran in it
        raise BadInput(f"layer {layer} reads index keys at position {pos} before any owner published them")

    def keys(self, layer: int, pos: int, width: int) -> torch.Tensor:
        """[B, width, ihd]: what `index_k[:, :width]` holds for `layer` at decode position `pos`."""
        keys, filled = self.source(layer, pos)
        out = torch.zeros(keys.size(0), width, keys.size(-1), dtype=keys.dtype)
        n = min(width, filled, keys.size(1))
        out[:, :n] = keys[:, :n]
        return out


class Compressor(nn.Module):
    """Pools each group of `ratio` tokens into one KV latent with a per-channel softmax gate.
    Returns the latent BEFORE RoPE (the indexer needs it unrotated), or None with no full group."""

    def __init__(self, args, layer_id: int, dtype: torch.dtype):
        super().__init__()
        self.ratio = args.compress_ratios[layer_id]
        self.norm = RMSNorm(args.head_dim, args.norm_eps)
        # ratio 1 is a plain projection in the activation dtype; pooling runs in fp32
        wdt = torch.float32 if self.ratio > 1 else dtype
        self.wkv = linear(args.dim, args.head_dim, wdt)
        if self.ratio > 1:
            self.wgate = linear(args.dim, args.head_dim, torch.float32)

    def forward(self, x: torch.Tensor) -> torch.Tensor | None:
        if self.ratio == 1:
            return self.norm(self.wkv(x))
        b, s, _ = x.shape
        if s < self.ratio:
            return None
        cut = s - s % self.ratio  # a trailing partial group waits (for decode, which we do not run)
        xf = x.float()[:, :cut]
        kv = self.wkv(xf).unflatten(1, (-1, self.ratio))
        score = self.wgate(xf).unflatten(1, (-1, self.ratio))
        pooled = (kv * score.softmax(dim=2)).sum(dim=2)
        return self.norm(pooled.to(x.dtype))


class Indexer(nn.Module):
    """Scores compressed positions for each query and keeps the best `index_topk` of those the
    query can already see (a group becomes visible once the query has passed its last token)."""

    def __init__(self, args, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.owns_k = layer_id in args.kv_source_layers
        self.ratio = args.compress_ratios[layer_id]
        self.n_heads, self.head_dim = args.index_n_heads, args.index_head_dim
        self.rd = args.rope_head_dim
        self.topk = args.index_topk
        # two-level top-k: the candidate source publishes its best blocks, later indexers keep
        # their own choice inside them
        self.is_candidate_source = layer_id == args.candidate_source_layer
        self.uses_candidates = 0 <= args.candidate_source_layer < layer_id
        self.candidate_topk_blocks, self.candidate_block_size = args.candidate_topk_blocks, args.candidate_block_size
        self.wq_b = linear(args.q_lora_rank, self.n_heads * self.head_dim, fmt=dense_format(args))
        self.weights_proj = linear(args.dim, self.n_heads)
        if self.owns_k:
            self.wk = linear(args.head_dim, self.head_dim)
            self.k_norm = RMSNorm(self.head_dim, args.norm_eps)

    def forward(self, x, qr, latent, freqs, shared: SharedAttention, offset: int) -> torch.Tensor:
        b, s, _ = x.shape
        ratio = self.ratio
        if self.owns_k and latent is not None:
            k = self.k_norm(self.wk(latent))
            # a latent stands for the first token of its group: group j rotates at j * ratio
            k = rotate_tail(k, self.rd, freqs[: s - s % ratio : ratio])
            shared.index_k = shared.fp4(k, 32)
            if shared.decode_keys is not None:
                shared.decode_keys.current[self.layer_id] = shared.index_k
        q = self.wq_b(qr).unflatten(-1, (self.n_heads, self.head_dim))
        q = shared.fp4(rotate_tail(q, self.rd, freqs[:s]), 32)
        w = self.weights_proj(x) * (self.head_dim**-0.5 * self.n_heads**-0.5)
        score = torch.einsum("bshd,btd->bsht", q, shared.index_k[:, : s // ratio])
        score = (score.relu() * w.unsqueeze(-1)).sum(dim=2)  # [B, S, T]
        dk = shared.decode_keys
        for p in range(dk.prompt_len if dk is not None else s, s):  # decode rows: the official keys
            keys = dk.keys(self.layer_id, p, s // ratio)
            row = torch.einsum("bhd,btd->bht", q[:, p], keys)
            score[:, p] = (row.relu() * w[:, p].unsqueeze(-1)).sum(dim=1)
        visible = (torch.arange(1, s + 1) // ratio).unsqueeze(-1)  # [S, 1]
        score = score.masked_fill(torch.arange(s // ratio) >= visible, -torch.inf)
        if self.is_candidate_source:
            shared.candidates = candidate_blocks(score, visible, self.candidate_topk_blocks, self.candidate_block_size)
        elif self.uses_candidates:
            score = score.masked_fill(~shared.candidates, -torch.inf)
        shared.topk_scores = score
        k = min(self.topk, s // ratio)
        idx = top_k_earliest(score, k).indices.sort(dim=-1).values
        return torch.where(idx < visible, idx + offset, -1)


# Official `topk(..., sorted=False)` leaves the order among EXACT ties to the implementation
# (torch on the CPU was seen keeping the later position). Both sides here break them one stated way:
INDEX_TIES = "earlier"  # among equal scores the earlier position is kept


def top_k_earliest(score: torch.Tensor, k: int):
    """torch.topk with a defined order among EXACT ties: the earlier position wins. Ties are
    common here (the ReLU'd index score is exactly 0 wherever every positively weighted head's dot
    is negative), and torch.topk leaves their order open, so without a rule two correct
    implementations keep different positions."""
    order = torch.sort(score, dim=-1, descending=True, stable=True)
    return torch.return_types.topk((order.values[..., :k], order.indices[..., :k]))


def candidate_blocks(score: torch.Tensor, visible: torch.Tensor, topk_blocks: int, block: int) -> torch.Tensor:
    """Level one of the two-level top-k. score: [..., T] with unreachable positions at -inf;
    visible: positions each query reaches (broadcasts over score's leading dims). Blocks of
    `block` positions are scored by their best position; the block holding the query's newest
    position is always kept (it may be partly filled); the best `topk_blocks` are kept, never a
    block with nothing reachable. Returns a bool mask shaped like `score`."""
    width = score.size(-1)
    padded = F.pad(score, (0, -width % block), value=-torch.inf)
    best = padded.unflatten(-1, (-1, block)).amax(-1)  # [..., n_blocks]
    n_blocks = best.size(-1)
    newest = (visible - 1) // block
    best = best.masked_fill(torch.arange(n_blocks) == newest, torch.inf)
    top = top_k_earliest(best, min(topk_blocks, n_blocks))
    keep = torch.zeros_like(best, dtype=torch.bool).scatter(-1, top.indices, top.values > -torch.inf)
    return keep.repeat_interleave(block, dim=-1)[..., :width]


class Attention(nn.Module):
    """Latent MQA: low-rank q, one shared `head_dim` KV head (K = V), RoPE on the last
    `rope_head_dim` channels (undone on the output), an attention sink per head; a sliding
    window of raw KV plus, with compress_ratio > 0, top-k compressed positions; the output
    projection is low-rank and grouped (`wo_a` block-diagonal over `o_groups`)."""

    def __init__(self, layer_id: int, args, dtype: torch.dtype):
        super().__init__()
        self.n_heads, self.head_dim, self.rd = args.n_heads, args.head_dim, args.rope_head_dim
        self.n_groups, self.o_lora_rank = args.o_groups, args.o_lora_rank
        self.window = args.window_size
        self.ratio = args.compress_ratios[layer_id]
        self.scale = self.head_dim**-0.5
        self.attn_sink = nn.Parameter(torch.zeros(self.n_heads, dtype=torch.float32))
        fmt = dense_format(args)
        self.wq_a = linear(args.dim, args.q_lora_rank, fmt=fmt)
        self.q_norm = RMSNorm(args.q_lora_rank, args.norm_eps)
        self.wq_b = linear(args.q_lora_rank, self.n_heads * self.head_dim, fmt=fmt)
        self.wkv = linear(args.dim, self.head_dim, fmt=fmt)
        self.kv_norm = RMSNorm(self.head_dim, args.norm_eps)
        # wo_a is bf16 in the release (used as a grouped einsum, never through the FP8 GEMM)
        self.wo_a = linear(self.n_heads * self.head_dim // self.n_groups, self.n_groups * self.o_lora_rank)
        self.wo_b = linear(self.n_groups * self.o_lora_rank, args.dim, fmt=fmt)
        self.is_kv_source = layer_id in args.kv_source_layers
        self.is_index_source = layer_id in args.index_source_layers
        self.compressor = Compressor(args, layer_id, dtype) if self.is_kv_source else None
        self.indexer = Indexer(args, layer_id) if self.is_index_source else None
        if self.ratio:
            orig, theta = args.original_seq_len, args.compress_rope_theta
        else:  # window-only layers: base theta, no YaRN
            orig, theta = 0, args.rope_theta
        self._rope = (self.rd, args.max_seq_len, orig, theta, args.rope_factor, args.beta_fast, args.beta_slow)

    @property
    def freqs(self) -> torch.Tensor:  # [max_seq_len, rd/2] complex, built on first use (not on meta)
        return rotary_table(*self._rope)

    def forward(self, x: torch.Tensor, shared: SharedAttention) -> torch.Tensor:
        b, s, _ = x.shape
        if s > self.freqs.size(0):
            raise ValueError(f"sequence of {s} exceeds max_seq_len {self.freqs.size(0)}")
        freqs = self.freqs[:s]
        qr = self.q_norm(self.wq_a(x))
        q = rotate_tail(self.wq_b(qr).unflatten(-1, (self.n_heads, self.head_dim)), self.rd, freqs)
        # K = V stays FP8-quantised over the whole post-RoPE vector
        kv = shared.fp8(rotate_tail(self.kv_norm(self.wkv(x)), self.rd, freqs))  # [B, S, hd]
        idx = window_indices(s, self.window).unsqueeze(0).expand(b, -1, -1)
        if self.ratio:
            n_comp = s // self.ratio
            latent = self.compressor(x) if self.is_kv_source else None
            if self.is_index_source:
                if n_comp == 0:
                    shared.topk_idxs = torch.empty(b, s, 0, dtype=torch.long)
                    shared.topk_scores = torch.empty(b, s, 0)
                else:
                    shared.topk_idxs = self.indexer(x, qr, latent, self.freqs, shared, offset=s)
            if latent is not None:
                group_freqs = self.freqs[: s - s % self.ratio : self.ratio]
                shared.compress_kv = shared.fp4(rotate_tail(latent, self.rd, group_freqs), 16, e4m3_scale=True)
            if n_comp:
                kv = torch.cat([kv, shared.compress_kv[:, :n_comp]], dim=1)
            idx = torch.cat([idx, shared.topk_idxs], dim=-1)
        o = sparse_attention(q, kv, self.attn_sink, idx, self.scale)
        o = rotate_tail(o, self.rd, freqs, inverse=True)
        o = o.view(b, s, self.n_groups, -1)
        wo_a = self.wo_a.weight.view(self.n_groups, self.o_lora_rank, -1)
        o = torch.einsum("bsgd,grd->bsgr", o, wo_a)
        return self.wo_b(o.flatten(2))


class Gate(nn.Module):
    """The dual-bias router: `bias` for text rows, `bias_vl` for image-span rows (token_types >= 0,
    so START / NEWLINE / END too). Biases rank experts only; the weights come from the unbiased
    scores, normalised over the chosen k and times `route_scale`."""

    def __init__(self, args):
        super().__init__()
        self.topk = args.n_activated_experts
        self.score_func = args.score_func
        self.gate_temp = args.gate_temp
        self.norm_topk_prob = args.norm_topk_prob
        self.route_scale = args.route_scale
        self.weight = nn.Parameter(torch.empty(args.n_routed_experts, args.dim))
        self.bias = nn.Parameter(torch.zeros(args.n_routed_experts, dtype=torch.float32))
        self.bias_vl = (nn.Parameter(torch.zeros(args.n_routed_experts, dtype=torch.float32))
                        if args.vision_enabled else None)

    def forward(self, x: torch.Tensor, image_mask: torch.Tensor | None = None):
        """x: [n, dim]; image_mask: [n] bool. Returns (weights [n, k] fp32, indices [n, k])."""
        scores = F.linear(x.float(), self.weight.float()) / self.gate_temp
        if self.score_func == "softmax":
            scores = scores.softmax(dim=-1)
        elif self.score_func == "sigmoid":
            scores = scores.sigmoid()
        else:
            scores = F.softplus(scores).sqrt()
        bias = self.bias
        if image_mask is not None and self.bias_vl is not None:
            bias = torch.where(image_mask.unsqueeze(-1), self.bias_vl, bias)
        # the ranking key, kept for the recorder (`router.L.scores`): a differing choice is then
        # judged against the reference's own margin between the experts involved
        self.biased = scores + bias
        indices = self.biased.topk(self.topk, dim=-1).indices
        weights = scores.gather(1, indices)
        if self.norm_topk_prob and self.topk > 1:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * self.route_scale, indices


class Expert(nn.Module):
    """SwiGLU with the training clamps: up on both sides, gate from above."""

    def __init__(self, dim: int, inter_dim: int, swiglu_limit: float, fmt: str | None):
        super().__init__()
        self.w1 = linear(dim, inter_dim, fmt=fmt)
        self.w2 = linear(inter_dim, dim, fmt=fmt)
        self.w3 = linear(dim, inter_dim, fmt=fmt)
        self.limit = swiglu_limit

    def forward(self, x: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
        gate, up = self.w1(x).float(), self.w3(x).float()
        if self.limit > 0:
            up = up.clamp(-self.limit, self.limit)
            gate = gate.clamp(max=self.limit)
        h = F.silu(gate) * up
        if weights is not None:
            h = weights * h
        return self.w2(h.to(x.dtype))


class MoE(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.dim = args.dim
        self.n_routed_experts = args.n_routed_experts
        self.gate = Gate(args)
        self.experts = nn.ModuleList(Expert(args.dim, args.moe_inter_dim, args.swiglu_limit, expert_format(args))
                                     for _ in range(args.n_routed_experts))
        assert args.n_shared_experts == 1
        self.shared_experts = Expert(args.dim, args.moe_inter_dim, args.swiglu_limit, dense_format(args))

    def forward(self, x: torch.Tensor, image_mask: torch.Tensor | None = None) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, self.dim)
        weights, indices = self.gate(x, None if image_mask is None else image_mask.flatten())
        y = torch.zeros_like(x, dtype=torch.float32)
        for i in range(self.n_routed_experts):
            rows, slot = torch.where(indices == i)
            if rows.numel():
                y[rows] += self.experts[i](x[rows], weights[rows, slot, None])
        y += self.shared_experts(x)
        return y.type_as(x).view(shape)


def hc_split_sinkhorn(mixes, hc_scale, hc_base, hc: int, iters: int, eps: float):
    """mixes [..., (2+hc)*hc] -> pre [..., hc] (sigmoid + eps), post [..., hc] (2·sigmoid),
    comb [..., hc, hc]: row softmax + eps, a column normalisation, then iters-1 row/column passes."""
    m, sc, base = mixes.float(), hc_scale.float(), hc_base.float()
    pre = torch.sigmoid(m[..., :hc] * sc[0] + base[:hc]) + eps
    post = 2 * torch.sigmoid(m[..., hc:2 * hc] * sc[1] + base[hc:2 * hc])
    comb = (m[..., 2 * hc:] * sc[2] + base[2 * hc:]).unflatten(-1, (hc, hc))
    comb = torch.exp(comb - comb.amax(-1, keepdim=True))
    comb = comb / comb.sum(-1, keepdim=True) + eps
    comb = comb / (comb.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + eps)
        comb = comb / (comb.sum(-2, keepdim=True) + eps)
    return pre, post, comb


class Block(nn.Module):
    """Attention and MoE between hyper-connection mixes over `hc_mult` residual copies. Each
    sublayer's `hc_mixes` yields the pre-mix of the NEXT sublayer: attention collapses with the
    mix the previous block's FFN produced, the FFN with the one this attention produced."""

    def __init__(self, layer_id: int, args, dtype: torch.dtype, layout: EngramLayout | None):
        super().__init__()
        self.layer_id = layer_id
        self.norm_eps = args.norm_eps
        self.attn = Attention(layer_id, args, dtype)
        self.ffn = MoE(args)
        self.engram = Engram(args, layer_id, layout) if layout is not None and layer_id in layout.layer_ids else None
        self.attn_norm = RMSNorm(args.dim, args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.hc_mult, self.hc_iters, self.hc_eps = args.hc_mult, args.hc_sinkhorn_iters, args.hc_eps
        mix, width = (2 + args.hc_mult) * args.hc_mult, args.hc_mult * args.dim
        f32 = torch.float32
        self.hc_attn_fn = nn.Parameter(torch.zeros(mix, width, dtype=f32))
        self.hc_ffn_fn = nn.Parameter(torch.zeros(mix, width, dtype=f32))
        self.hc_attn_base = nn.Parameter(torch.zeros(mix, dtype=f32))
        self.hc_ffn_base = nn.Parameter(torch.zeros(mix, dtype=f32))
        self.hc_attn_scale = nn.Parameter(torch.zeros(3, dtype=f32))
        self.hc_ffn_scale = nn.Parameter(torch.zeros(3, dtype=f32))

    def hc_mixes(self, x, fn, scale, base):
        """x: [B, S, hc, d]; one RMS statistic over the flattened hc*d stream per token."""
        xf = x.flatten(2).float()
        mixes = F.linear(xf, fn) * torch.rsqrt(xf.square().mean(-1, keepdim=True) + self.norm_eps)
        return hc_split_sinkhorn(mixes, scale, base, self.hc_mult, self.hc_iters, self.hc_eps)

    @staticmethod
    def hc_pre(x, pre):  # [B, S, hc, d] x [B, S, hc] -> [B, S, d]
        return (pre.unsqueeze(-1) * x.float()).sum(dim=2).to(x.dtype)

    @staticmethod
    def hc_post(x, residual, post, comb):  # -> [B, S, hc, d]; copy j = post_j·x + sum_i comb_ij·res_i
        y = post.unsqueeze(-1) * x.unsqueeze(-2) + (comb.unsqueeze(-1) * residual.unsqueeze(-2)).sum(dim=2)
        return y.type_as(x)

    def forward(self, x, pre_mix, image_mask, shared: SharedAttention):
        residual = x
        attn_pre, attn_post, attn_comb = self.hc_mixes(x, self.hc_attn_fn, self.hc_attn_scale, self.hc_attn_base)
        h = self.attn(self.attn_norm(self.hc_pre(x, pre_mix)), shared)
        x = self.hc_post(h, residual, attn_post, attn_comb)
        residual = x
        ffn_pre, ffn_post, ffn_comb = self.hc_mixes(x, self.hc_ffn_fn, self.hc_ffn_scale, self.hc_ffn_base)
        h = self.ffn(self.ffn_norm(self.hc_pre(x, attn_pre)), image_mask)
        return self.hc_post(h, residual, ffn_post, ffn_comb), ffn_pre


class Head(nn.Module):
    def __init__(self, vocab_size: int, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, dim, dtype=torch.float32))  # fp32 logits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.float(), self.weight)


@dataclass(frozen=True)
class ImageSpan:
    start: int  # first position of the span in the sequence
    types: torch.Tensor  # [span] token types (IMAGE_START .. IMAGE_END)
    rows: torch.Tensor  # [n_llm_h * n_llm_w, dim] aligner output, reading order


class LanguageModel(nn.Module):
    """The official `Transformer` minus vision and draft layers, attribute names kept so the
    state-dict keys are the checkpoint's (`embed.*`, `layers.N.*`, `norm.*`, `head.*`,
    `image_start` / `image_end` / `image_newline`)."""

    def __init__(self, args, dtype: torch.dtype, kernel_quant: bool = False, layers: tuple[int, ...] | None = None):
        super().__init__()
        self.args = args
        self.kernel_quant = kernel_quant
        self.hc_mult = args.hc_mult
        self.layout = EngramLayout.from_args(args)
        self.hasher: NgramHasher | None = None  # set by `build`: it holds tables, not parameters
        self.embed = table(args.vocab_size, args.dim)
        # keyed by layer id ("3" -> `layers.3.*`, the checkpoint's names), so a subset (`subset`)
        # holds, and reads, only its own layers
        ids = range(args.n_layers) if layers is None else layers
        self.layers = nn.ModuleDict({str(i): Block(i, args, dtype, self.layout) for i in ids})
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.head = Head(args.vocab_size, args.dim)
        if args.vision_enabled:
            self.image_start = nn.Parameter(torch.empty(args.dim))
            self.image_end = nn.Parameter(torch.empty(args.dim))
            self.image_newline = nn.Parameter(torch.empty(args.dim))

    def embed_tokens(self, input_ids: torch.Tensor, images: list[ImageSpan]) -> torch.Tensor:
        """input_ids [1, S] -> [1, S, dim]: the lookup, then every image span overwritten."""
        h = self.embed(input_ids)
        for img in images:
            span = h[0, img.start: img.start + img.types.numel()]
            span[img.types == IMAGE_START] = self.image_start.to(h.dtype)
            span[img.types == IMAGE_END] = self.image_end.to(h.dtype)
            span[img.types == IMAGE_NEW_LINE] = self.image_newline.to(h.dtype)
            span[img.types == IMAGE] = img.rows.to(h.dtype)
        return h

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, token_types: torch.Tensor | None = None,
                images: list[ImageSpan] = (), rec=None, decode_keys: DecodeKeys | None = None) -> torch.Tensor:
        """input_ids, token_types: [1, S]. Returns full logits [1, S, vocab] fp32. `rec` records
        the language boundaries (see `record_*` names in the module docstring of the contract)."""
        image_mask = None if token_types is None else token_types >= 0
        engram_mask = None if image_mask is None else ~image_mask
        hashes = self.hasher(input_ids, engram_mask) if self.hasher is not None else None
        h = self.embed_tokens(input_ids, list(images))
        if rec is not None:
            rec.record("embeddings", h[0])
        h = h.unsqueeze(2).repeat(1, 1, self.hc_mult, 1)
        pre_mix = torch.zeros(*h.shape[:3], dtype=torch.float32)
        pre_mix[..., 0] = 1.0  # the first block collapses onto copy 0
        shared = SharedAttention(kernel_quant=self.kernel_quant, decode_keys=decode_keys)
        for i, layer in ((int(k), v) for k, v in self.layers.items()):
            if layer.engram is not None:
                h, gate = layer.engram(h, hashes[:, :, layer.engram.layer_hash_index], engram_mask)
                if rec is not None:
                    rec.record(f"engram.{i}.gate", gate[0], boundary=f"engram.{i}")
            h, pre_mix = layer(h, pre_mix, image_mask, shared)
            if rec is not None and layer.attn.is_index_source:
                rec.record(f"index.{i}.ids", index_record(shared.topk_idxs[0], h.size(1), self.args.index_topk),
                           boundary=f"index.{i}.ids")
                rec.record(f"index.{i}.scores", shared.topk_scores[0].float(), boundary=f"index.{i}.ids")
            if rec is not None:
                rec.record(f"hidden.{i}", h[0], boundary=f"hidden.{i}")
        h = Block.hc_pre(h, pre_mix)
        return self.head(self.norm(h))


def index_record(idx: torch.Tensor, offset: int, width: int) -> torch.Tensor:
    """The indexer's choice as dumped: compressed-group ids per query [S, index_topk], ascending,
    -1 where fewer were visible (the kv-concat offset removed, padded to a fixed width)."""
    ids = torch.where(idx >= 0, idx - offset, -1).long()
    if ids.size(-1) < width:
        ids = F.pad(ids, (0, width - ids.size(-1)), value=-1)
    return ids.sort(dim=-1).values


def tap(model: LanguageModel, rec) -> list:
    """Forward hooks for the per-layer boundaries inside a block: the attention output and the
    router's choice (ids ascending per row, weights aligned to them)."""
    handles = []
    for i, layer in ((int(k), v) for k, v in model.layers.items()):
        def attn_out(_m, _a, out, i=i):
            rec.record(f"attn.{i}", out[0], boundary=f"attn.{i}")

        def routed(gate, _a, out, i=i):
            weights, ids = out
            ids_sorted, order = ids.sort(dim=-1)
            rec.record(f"router.{i}.ids", ids_sorted, boundary=f"router.{i}.ids")
            rec.record(f"router.{i}.weights", weights.gather(-1, order), boundary=f"router.{i}.weights")
            rec.record(f"router.{i}.scores", gate.biased, boundary=f"router.{i}.ids")

        handles.append(layer.attn.register_forward_hook(attn_out))
        handles.append(layer.ffn.gate.register_forward_hook(routed))
    return handles


def build(args, checkpoint: Path, dtype: torch.dtype, kernel_quant: bool = False,
          layers: tuple[int, ...] | None = None) -> LanguageModel:
    """The language model with the checkpoint's tensors, each cast to its parameter's dtype
    (the activation dtype, or fp32 where the official module declares fp32)."""
    token_map, n_compressed = compressed_token_map(args.vocab_size)
    layout = EngramLayout.from_args(args)
    if layout is not None and n_compressed != args.engram_compressed_vocab_size:
        raise BadInput(f"{checkpoint}: engram_compressed_vocab_size is {args.engram_compressed_vocab_size} but the "
                       f"tokenizer compresses to {n_compressed}: every Engram hash would differ")
    with default_dtype(dtype), torch.device("meta"):
        model = LanguageModel(args, dtype, kernel_quant, layers)
    load_into(model, checkpoint)
    set_kernel(model, kernel_quant, dtype)
    if layout is not None:
        model.hasher = NgramHasher(layout, token_map, args.engram_pad_id, n_compressed)
    return model


def generate(model: LanguageModel, input_ids: torch.Tensor, token_types: torch.Tensor,
             images: list[ImageSpan], steps: int, rec, index_keys: str = "official") -> dict:
    """Prompt forward with every boundary recorded, then `steps` greedy decode steps, each a FULL
    recomputation over prompt + generated tokens (the yardstick for the engine's KV cache).
    With index_keys=official the decode rows read the index keys the official code's decode
    steps read (`DecodeKeys`). A generated image token ends generation: it is never fed back."""
    owners = tuple((int(i), model.args.compress_ratios[int(i)]) for i, layer in model.layers.items()
                   if layer.attn.indexer is not None and layer.attn.indexer.owns_k)
    official = index_keys == "official"
    keys = DecodeKeys(input_ids.numel(), owners) if official else None
    handles = tap(model, rec)
    try:
        logits = model(input_ids[None], token_types[None], images, rec, decode_keys=keys)
    finally:
        for h in handles:
            h.remove()
    rec.record("logits", logits[0])
    image_id = model.args.image_token_id
    tokens, stop = [int(logits[0, -1].argmax())], "steps"
    ids, types = input_ids, token_types
    for k in range(1, steps + 1):
        if tokens[-1] == image_id:
            stop = "image-token"
            break
        # the token fed to step k, and the logits row it is the argmax of (what a tie is judged on)
        rec.record(f"token.step.{k}.ids", torch.tensor([[tokens[-1]]]), boundary=f"token.step.{k}")
        rec.record(f"token.step.{k}.scores", logits[0, -1:].float(), boundary=f"token.step.{k}")
        ids = torch.cat([ids, torch.tensor([tokens[-1]])])
        types = torch.cat([types, torch.tensor([TEXT])])
        keys = DecodeKeys(input_ids.numel(), owners, previous=keys.current) if official else None
        logits = model(ids[None], types[None], images, decode_keys=keys)
        rec.record(f"logits.step.{k}", logits[0, -1:], boundary=f"logits.step.{k}")
        tokens.append(int(logits[0, -1].argmax()))
    else:
        if tokens[-1] == image_id:
            stop = "image-token"
    return {"generated": tokens, "stop": stop}


NUMERICS = ("official", "semantic")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Numerics:
    mode: str  # "official" or "semantic"
    dtype: torch.dtype
    kernel_quant: bool

    def facts(self) -> dict:
        """As recorded in the manifest (`run.language_numerics`)."""
        return {"mode": self.mode, "dtype": str(self.dtype).removeprefix("torch."), "kernel_quant": self.kernel_quant}

    def boundary_dtypes(self) -> dict:
        """The language boundaries' compute dtype, for the comparator (`run.boundary_dtypes`):
        the vision half may run in another."""
        return dict.fromkeys(LANGUAGE_BOUNDARIES, self.facts()["dtype"])


# every language boundary, as fnmatch patterns
LANGUAGE_BOUNDARIES = ("embeddings", "engram.*", "index.*", "attn.*", "router.*", "hidden.*", "logits*")


def language_numerics(req) -> Numerics:
    """The language half's numerics from the request: `official` (default) = bf16 with the
    kernels' quantisation whatever dtype the vision half runs in; `semantic` = the run's dtype,
    exact weights, no rounding. `-o kernel_quant=...` overrides the rounding in either mode."""
    opts = OPTIONS.resolve(req.options)  # typed: a hand-built request may hold the user's strings
    mode = opts["language_numerics"]
    if mode not in NUMERICS:
        raise BadInput(f"language_numerics must be official or semantic (got {mode!r})")
    if req.dtype not in DTYPES:
        raise BadInput(f"dtype {req.dtype!r} is not supported (float32 or bfloat16)")
    dtype = torch.bfloat16 if mode == "official" else DTYPES[req.dtype]
    kq = opts["kernel_quant"]  # None: the mode's own rounding
    return Numerics(mode, dtype, mode == "official" if kq is None else kq)


def run_language(args, checkpoint: Path, dtype: torch.dtype, prompt: str | None, image_rows,
                 cells, decode: int, rec, kernel_quant: bool = False,
                 index_keys: str = "official", layers: str | None = None) -> dict:
    """The language half of an oracle run: tokenise, overlay each image span with its aligner
    rows, prefill once, decode `decode` steps by recomputation. `image_rows` is one image's
    aligner output [n_llm_h * n_llm_w, dim] with its `cells` (n_llm_h, n_llm_w), or a list of
    them with a list of cells, one per `<image>` in prompt order; None for a text-only prompt.
    Runs on the CPU (the yardstick, not the fast path). Returns the run facts to merge into `inputs`."""
    from .subset import layer_ids

    running = layer_ids(layers, args)
    model = build(args, Path(checkpoint), dtype, kernel_quant, running)
    rows = [] if image_rows is None else list(image_rows) if isinstance(image_rows, (list, tuple)) else [image_rows]
    grids = [] if image_rows is None else list(cells) if isinstance(image_rows, (list, tuple)) else [cells]
    ids, types, starts = build_prompt(prompt if prompt is not None else DEFAULT_PROMPT, args, grids or None)
    if ids.numel() + decode > args.max_seq_len:
        raise BadInput(f"prompt of {ids.numel()} tokens + {decode} decode steps exceeds max_seq_len {args.max_seq_len}")
    images = []
    for start, r, grid in zip(starts, rows, grids):
        n = num_image_tokens(*grid)
        # the language oracle runs on the CPU whatever device the tower used
        images.append(ImageSpan(start, types[start:start + n], r.detach().to("cpu")))
    start = starts[0] if starts else None
    out = generate(model, ids, types, images, decode, rec, index_keys)
    # the rules where the official code leaves a choice or has a quirk, stated in every dump
    rec.update_run(semantics={"index_ties": INDEX_TIES, "index_keys": index_keys},
                   layers=list(running) if len(running) < args.n_layers else None)
    return {"prompt_tokens": int(ids.numel()), "span_start": start, "span_starts": starts, **out}


def run(req, rec) -> None:
    """A language-only oracle run; the image rows stand in for the tower's aligner output
    (`req.options["image_rows"]` [cells_h*cells_w, dim], `req.options["cells"]`)."""
    import hashlib

    from .config import ModelArgs

    if req.weights_dir is None:
        raise BadInput("the DeepSeek V4.1 Flash language oracle needs a weights directory")
    num = language_numerics(req)
    opts = OPTIONS.resolve(req.options)  # typed, defaults filled (a hand-built request may hold strings)
    rows, cells = opts.get("image_rows"), opts.get("cells")
    args = ModelArgs.from_dir(req.weights_dir)
    facts = run_language(args, Path(req.weights_dir), num.dtype, req.prompt, rows,
                         tuple(cells) if cells is not None else None, req.decode, rec,
                         kernel_quant=num.kernel_quant, index_keys=opts["index_keys"], layers=opts.get("layers"))
    ids, _, _ = build_prompt(req.prompt if req.prompt is not None else DEFAULT_PROMPT, args,
                             tuple(cells) if rows is not None else None)
    rec.update_run(inputs={"language": {"prompt": req.prompt if req.prompt is not None else DEFAULT_PROMPT,
                                        "prompt_tokens": facts["prompt_tokens"],
                                        "input_ids_sha256": hashlib.sha256(ids.numpy().tobytes()).hexdigest(),
                                        "span_start": facts["span_start"]}},
                   outputs={"generated": facts["generated"], "stop": facts["stop"]},
                   language_numerics=num.facts(), boundary_dtypes=num.boundary_dtypes())
