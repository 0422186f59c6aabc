"""The language backbone's stages for tensordiff's local error: each boundary's engine code run on
the REFERENCE's tensors at its inputs (teacher forcing), so a stage's own error is told apart
from drift it inherited.

    stages = make_language_stages(req, run)   # run: the reference dump's run record
    stages["router.3.ids"](inputs) -> {"router.3.ids": ...}

What a stage of layer L takes from the reference: the residual stream entering the layer
(`hidden.(L-1)`, or `embeddings` for layer 0) and the attention outputs `attn.j` of earlier
layers. What it recomputes with the engine's own code: the Engram write of layer L, the
hyper-connection mixes, and the pre-mix the previous block's FFN hands on (it is not a boundary);
attention of layer L runs chunk by chunk (the request's `chunk`) after the engine's attention of
every earlier layer on ITS teacher-forced input, because compressed KV and the indexer's choice
are shared down the stack. `router.L.*` and `hidden.L` take the reference's `attn.L`.
Decode steps have no stage.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ... import backend as backends
from .attention import ChunkShared
from .engram import EngramHashState
from .model import LanguageModel, selection_scores
from .run import DTYPES
from .tokens import DEFAULT_PROMPT, tokenize
from . import hyper


def make_language_stages(req, run: dict, image_rows: torch.Tensor | None = None) -> dict:
    lm = LanguageModel.load(Path(req.weights_dir), dtype=DTYPES[req.dtype], backend=backends.get(req.backend),
                            fault=req.fault, device=req.device,
                            kernel_quant=bool((req.options or {}).get("kernel_quant", False)))
    cfg, be, dev = lm.cfg, lm.backend, lm.device
    opts = req.options or {}
    cells = (run.get("inputs") or {}).get("cells") or opts.get("cells")
    has_image = cells is not None and (image_rows is not None or opts.get("image_rows") is not None
                                       or (run.get("inputs") or {}).get("grid") is not None)
    ids, types = tokenize(req.prompt if req.prompt is not None else DEFAULT_PROMPT, cfg,
                          tuple(cells) if has_image else None)
    n = ids.numel()
    step = n if req.chunk is None else req.chunk
    chunks = [(lo, min(n, lo + step)) for lo in range(0, n, step)]
    image = (types >= 0).to(dev)
    hc = cfg.hc_mult
    mix_args = (hc, cfg.hc_sinkhorn_iters, cfg.hc_eps, cfg.norm_eps, be)

    hashes = None
    if lm.engram_tables is not None:  # the n-gram window, chunk by chunk as the engine carries it
        state = EngramHashState(lm.engram_tables, lm.fault)
        hashes = torch.cat([state.hash(ids[lo:hi], types[lo:hi] >= 0) for lo, hi in chunks]).to(dev)

    def act(t):
        return t.to(device=dev, dtype=lm.dtype)

    class Forced:
        """Teacher-forced quantities, memoised across the stages (their inputs are one dump's)."""

        def __init__(self):
            self.ref: dict = {}  # the reference's tensors seen so far (every stage gets the same values)
            self._stream: dict[int, tuple] = {}
            self._attn: dict[int, tuple] = {}

        def stream(self, L: int):
            """(stream entering block L after its Engram [S, hc, D], Engram gate or None)."""
            if L not in self._stream:
                if L == 0:
                    x = act(self.ref["embeddings"]).unsqueeze(1).repeat(1, hc, 1)
                else:
                    x = act(self.ref[f"hidden.{L - 1}"])
                gate = None
                if L in lm.engram:
                    x, gate = lm.engram[L](x, hashes[:, lm.engram_tables.layer_ids.index(L)], image, be)
                self._stream[L] = (x, gate)
            return self._stream[L]

        def mid(self, L: int):
            """The stream after block L's attention (the reference's attn.L), and the block's
            FFN-side pre-mix (collapse for its FFN)."""
            x = self.stream(L)[0]
            a_pre, a_post, a_comb = hyper.mixes(x, lm.blocks[L].attn_mix, *mix_args)
            return hyper.expand(act(self.ref[f"attn.{L}"]), x, a_post, a_comb), a_pre

        def pre_mix(self, L: int) -> torch.Tensor:
            """The collapse weights block L's attention uses: block L-1's FFN-side mixes."""
            if L == 0:
                pre = torch.zeros(n, hc, dtype=torch.float32, device=dev)
                pre[:, 0] = 1.0
                return pre
            x_mid, _ = self.mid(L - 1)
            return hyper.mixes(x_mid, lm.blocks[L - 1].ffn_mix, *mix_args)[0]

        def attention(self, L: int, own_choice: bool = False):
            """Engine attention of layers 0..L, each on its forced input; layer L's output [S, D]
            and (for an index source) its selection [S, k] with the scores it ranked [S, T].
            Attention attends to the REFERENCE's selections where the reference has them (so an
            engine choice that flipped on a near-tie does not count against the attention
            stage); `own_choice` runs the engine's own choices (the indexer stage itself)."""
            key = (L, own_choice)
            if key not in self._attn:
                self._attn[key] = self._attention(L, own_choice)
            return self._attn[key]

        def _attention(self, L: int, own_choice: bool):
            caches = [lm.attn[j].new_cache(lm.dtype, dev) for j in range(L + 1)]
            xs = [be.rms_norm(hyper.collapse(self.stream(j)[0], self.pre_mix(j)), lm.blocks[j].attn_norm,
                              cfg.norm_eps) for j in range(L + 1)]
            ref_sel = {} if own_choice else {j: self.ref[f"index.{j}.ids"].to(dev) for j in range(L + 1)
                                             if f"index.{j}.ids" in self.ref}
            # the candidate blocks are decided upstream (by the candidate source's scores): always
            # the reference's, so a near-tie flip there does not change what later indexers may keep
            c = cfg.candidate_source_layer
            ref_blocks = {c: self.ref[f"index.{c}.scores"]} if f"index.{c}.scores" in self.ref and c < L else {}
            outs, sels, scores = [], [], []
            for lo, hi in chunks:
                shared = ChunkShared(forced={j: t[lo:hi] for j, t in ref_sel.items()} or None,
                                     forced_scores={j: t[lo:hi] for j, t in ref_blocks.items()} or None)
                for j in range(L + 1):
                    h = lm.attn[j](xs[j][lo:hi], lo, caches[j], shared)
                outs.append(h)
                if lm.attn[L].index_source and own_choice:
                    sel = shared.selection
                    pad = torch.full((sel.shape[0], cfg.index_topk - sel.shape[1]), -1, dtype=sel.dtype,
                                     device=sel.device)
                    sels.append(torch.cat([sel, pad], 1).sort(dim=-1).values)
                    scores.append(selection_scores(shared.selection_scores, n // lm.attn[L].ratio))
            return torch.cat(outs), (torch.cat(sels) if sels else None), (torch.cat(scores) if scores else None)

        def ffn(self, L: int, own_choice: bool = True):
            """(hidden.L, router ids ascending, weights aligned, router scores). With
            `own_choice` False the engine mixes the REFERENCE's choice of experts (its own weights
            for them), so `router.L.weights` and `hidden.L` are judged on the same experts after
            a near-tie flip of the router."""
            x_mid, a_pre = self.mid(L)
            x_in = be.rms_norm(hyper.collapse(x_mid, a_pre), lm.blocks[L].ffn_norm, cfg.norm_eps)
            forced = None
            if not own_choice and f"router.{L}.ids" in self.ref:
                ref_ids = self.ref[f"router.{L}.ids"].to(dev)
                forced = (lm.moe[L].weights_for(x_in, ref_ids, image), ref_ids)
            y, weights, chosen = lm.moe[L](x_in, image, forced)
            _, f_post, f_comb = hyper.mixes(x_mid, lm.blocks[L].ffn_mix, *mix_args)
            ids_sorted, order = chosen.sort(dim=-1)
            return (hyper.expand(y, x_mid, f_post, f_comb), ids_sorted, weights.gather(-1, order),
                    lm.moe[L].biased_scores(x_in, image))

    forced = Forced()

    def stage(fn):
        def run_stage(ref):
            forced.ref.update(ref)
            return fn(forced)

        return torch.inference_mode()(run_stage)

    stages = {}

    def embeddings(f):
        rows = image_rows if image_rows is not None else f.ref.get("aligner", opts.get("image_rows"))
        seq = lm.sequence(ids, types, image=(lambda: rows) if has_image else None,
                          cells=tuple(cells) if has_image else None)
        return {"embeddings": torch.cat([seq.embed(lo, hi) for lo, hi in chunks])}

    stages["embeddings"] = stage(embeddings)
    for L in range(cfg.n_layers):
        if L in lm.engram:
            stages[f"engram.{L}"] = stage(lambda f, L=L: {f"engram.{L}.gate": f.stream(L)[1]})
        if lm.attn[L].index_source:
            stages[f"index.{L}.ids"] = stage(lambda f, L=L: {f"index.{L}.ids": f.attention(L, True)[1],
                                                             f"index.{L}.scores": f.attention(L, True)[2]})
        stages[f"attn.{L}"] = stage(lambda f, L=L: {f"attn.{L}": f.attention(L)[0]})
        stages[f"router.{L}.ids"] = stage(lambda f, L=L: {f"router.{L}.ids": f.ffn(L)[1],
                                                          f"router.{L}.scores": f.ffn(L)[3]})
        stages[f"router.{L}.weights"] = stage(lambda f, L=L: {f"router.{L}.weights": f.ffn(L, own_choice=False)[2]})
        stages[f"hidden.{L}"] = stage(lambda f, L=L: {f"hidden.{L}": f.ffn(L, own_choice=False)[0]})

    def logits(f):
        last = cfg.n_layers - 1
        x_mid, _ = f.mid(last)
        pre = hyper.mixes(x_mid, lm.blocks[last].ffn_mix, *mix_args)[0]
        final = be.rms_norm(hyper.collapse(act(f.ref[f"hidden.{last}"]), pre), lm.norm, cfg.norm_eps)
        return {"logits": be.linear(final.float(), lm.head, None)}

    stages["logits"] = stage(logits)
    return stages
