"""One decoder layer of the language backbone, written once: prefill and decode (`model.Sequence`)
and the teacher-forced local-error stages (`stages.py`) all run it.

    out = layer(x, pre, attend, image, hashes)       x: [n, hc, D] stream entering the layer
        x, gate   = layer.enter(x, hashes, image)     the Engram write (Engram layers only)
        h_in, mix = layer.attn_input(x, pre)          hyper-connection mixes; collapsed, normed input [n, D]
        h         = attend(h_in)                      the attention sublayer: stateful (KV cache, shared
                                                      down the stack within a chunk), so the caller runs it
        then the residual expand, the MoE between its own mixes and the expand after it.

`pre` is the collapse that the layer's attention input uses: the FFN-side `pre` mix of the layer
before (`LayerOut.pre`), or `first_pre` for layer 0. The FFN input is collapsed with the
attention-side `pre` of the same layer, as the official stack does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from engine.deepseek_v41_flash import hyper


@dataclass(frozen=True)
class LayerOut:
    gate: torch.Tensor | None  # Engram gate [n, hc] fp32 (Engram layers), else None
    attn: torch.Tensor  # the attention sublayer's output [n, D]
    hidden: torch.Tensor  # the stream leaving the layer [n, hc, D]
    pre: torch.Tensor  # [n, hc]: the collapse the next layer's attention input uses
    route_weights: torch.Tensor  # [n, k] fp32, in the router's choice order
    route_ids: torch.Tensor  # [n, k] expert ids, in the router's choice order
    ffn_in: torch.Tensor | None = None  # the MoE's normed input [n, D] (what the router ranked: `router_scores`)

    @property
    def router_ids(self) -> torch.Tensor:
        """Ascending per row: the boundary's layout (the choice order is the kernel's business)."""
        return self.route_ids.sort(dim=-1).values

    @property
    def router_weights(self) -> torch.Tensor:
        """Aligned to `router_ids`."""
        return self.route_weights.gather(-1, self.route_ids.sort(dim=-1).indices)


def first_stream(emb: torch.Tensor, hc: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Embeddings [n, D] -> (stream [n, hc, D]: hc copies, collapse for layer 0: copy 0 only)."""
    pre = torch.zeros(emb.shape[0], hc, dtype=torch.float32, device=emb.device)
    pre[:, 0] = 1.0
    return emb.unsqueeze(1).repeat(1, hc, 1), pre


def index_ids(selection: torch.Tensor, topk: int) -> torch.Tensor:
    """An index source's choice [n, k <= topk] -> the `index.L.ids` layout: [n, topk] ascending,
    -1 padded (a short row: fewer groups visible than topk)."""
    pad = torch.full((selection.shape[0], topk - selection.shape[1]), -1, dtype=selection.dtype,
                     device=selection.device)
    return torch.cat([selection, pad], 1).sort(dim=-1).values


def selection_scores(score: torch.Tensor, groups: int) -> torch.Tensor:
    """A chunk's index scores [n, T_chunk] padded with -inf to the prompt's group count [n, groups]
    (a chunk sees only the groups completed so far), fp32, so chunks concatenate row for row: the
    `index.L.scores` layout."""
    out = torch.full((score.shape[0], groups), float("-inf"), dtype=torch.float32, device=score.device)
    out[:, :score.shape[1]] = score.float()
    return out


class Layer:
    def __init__(self, index: int, cfg, weights, attn, moe, engram, engram_column: int | None, backend):
        """weights: `model.BlockWeights`; attn: `attention.Attention`; moe: `moe.MoE`; engram: an
        `EngramLayer` with its column in the hash rows, or None."""
        self.index, self.w, self.attn, self.moe = index, weights, attn, moe
        self.engram, self.engram_column = engram, engram_column
        self.backend = backend
        self.norm_eps = cfg.norm_eps
        self.mix_args = (cfg.hc_mult, cfg.hc_sinkhorn_iters, cfg.hc_eps, cfg.norm_eps, backend)

    def enter(self, x: torch.Tensor, hashes: torch.Tensor | None, image: torch.Tensor):
        """The Engram write into the stream (x unchanged and gate None off Engram layers)."""
        if self.engram is None:
            return x, None
        return self.engram(x, hashes[:, self.engram_column], image, self.backend)

    def attn_input(self, x: torch.Tensor, pre: torch.Tensor):
        """(normed attention input [n, D], the attention-side mixes (pre, post, comb))."""
        mix = hyper.mixes(x, self.w.attn_mix, *self.mix_args)
        return self.backend.rms_norm(hyper.collapse(x, pre), self.w.attn_norm, self.norm_eps), mix

    def __call__(self, x: torch.Tensor, pre: torch.Tensor, attend: Callable[[torch.Tensor], torch.Tensor],
                 image: torch.Tensor, hashes: torch.Tensor | None, experts: torch.Tensor | None = None) -> LayerOut:
        """`experts` (local error only): expert ids [n, k] to mix instead of the router's own choice
        (the reference's, with the engine's weights for them), so `router.L.weights` and `hidden.L`
        are judged on the same experts after a near-tie flip of the router."""
        x, gate = self.enter(x, hashes, image)
        h_in, (a_pre, a_post, a_comb) = self.attn_input(x, pre)
        h = attend(h_in)
        x = hyper.expand(h, x, a_post, a_comb)
        f_pre, f_post, f_comb = hyper.mixes(x, self.w.ffn_mix, *self.mix_args)
        ffn_in = self.backend.rms_norm(hyper.collapse(x, a_pre), self.w.ffn_norm, self.norm_eps)
        forced = None if experts is None else (self.moe.weights_for(ffn_in, experts, image), experts)
        y, weights, chosen = self.moe(ffn_in, image, forced)
        return LayerOut(gate, h, hyper.expand(y, x, f_post, f_comb), f_pre, weights, chosen, ffn_in)

    def router_scores(self, out: LayerOut, image: torch.Tensor) -> torch.Tensor:
        """The key the router ranked for this layer's run `out` [n, experts] fp32 (`router.L.scores`)."""
        return self.moe.biased_scores(out.ffn_in, image)
