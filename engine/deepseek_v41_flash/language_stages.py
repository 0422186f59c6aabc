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
After a near-tie flip the stages after a choice are judged on the REFERENCE's choice: attention
attends to the reference's `index.j.ids`, later indexers keep the candidate blocks of the
reference's `index.c.scores` (c the candidate source), and `router.L.weights` / `hidden.L` mix
the reference's experts (the engine's weights for them); the choice stages themselves
(`index.L.ids`, `router.L.ids`) run the engine's own choice and record the scores it ranked.
A layer subset (`layers=2-5`) chains the same way: the first layer of the subset enters from the
embeddings, each later one from the reference's stream of the layer before it in the subset.
A decode step `logits.step.K` is the engine's own decode step (`Sequence.step`) on a cache the
engine filled teacher-forced (each layer's attention on the reference's stream, attending to the
reference's selections, so a benign prefill flip does not reach it), fed the reference's token
(the argmax of the reference's previous logits); steps before K are the engine's own steps on the
reference's tokens, so a decode-only bug is that step's own error even behind a prefill flip.
"""
from __future__ import annotations

import dataclasses

import torch

from tensordiff.format import images

from engine.deepseek_v41_flash.attention import ChunkShared, LayerCache
from engine.deepseek_v41_flash.engram import EngramHashState
from engine.deepseek_v41_flash.layer import LayerOut, first_stream, index_ids, selection_scores
from engine.deepseek_v41_flash.language_run import language_model
from engine.deepseek_v41_flash.tokens import DEFAULT_PROMPT, tokenize


class TeacherForced:
    """Teacher-forced quantities of one reference dump, memoised across the stages (every stage
    is handed the same reference values; `ref` gathers them as the stages run)."""

    def __init__(self, lm, image: torch.Tensor, hashes: torch.Tensor | None, chunks: list[tuple[int, int]],
                 sequence=None):
        """`sequence()`: a fresh engine `Sequence` of the prompt with its Engram window carried
        through the prompt (what a decode step continues from)."""
        self.lm, self.image, self.hashes, self.chunks = lm, image, hashes, chunks
        self.ref: dict = {}
        self._layer: dict[tuple[int, bool], LayerOut] = {}
        self._attn: dict[tuple[int, bool], tuple] = {}
        self._chains: dict[bool, _Chain] = {}
        order = list(lm.stack)  # the layers that run, in stack order (a subset skips the others)
        self.before = {L: (order[i - 1] if i else None) for i, L in enumerate(order)}
        self.last = order[-1]
        self._sequence, self._decoding, self._steps = sequence, None, {}

    def act(self, t: torch.Tensor) -> torch.Tensor:
        """A reference tensor as the engine holds activations (its device and dtype)."""
        return t.to(device=self.lm.device, dtype=self.lm.dtype)

    def stream(self, L: int) -> torch.Tensor:
        """The reference's stream entering layer L [S, hc, D]."""
        if self.before[L] is None:
            return first_stream(self.act(self.ref["embeddings"]), self.lm.cfg.hc_mult)[0]
        return self.act(self.ref[f"hidden.{self.before[L]}"])

    def entering(self, L: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(stream entering layer L, the collapse its attention input uses: the FFN-side pre mix
        of the layer before run on the reference's inputs; not a boundary)."""
        if self.before[L] is None:
            return first_stream(self.act(self.ref["embeddings"]), self.lm.cfg.hc_mult)
        return self.stream(L), self.layer(self.before[L]).pre

    def layer(self, L: int, own_choice: bool = False) -> LayerOut:
        """Layer L on the reference's inputs, the reference's `attn.L` standing in for its
        attention sublayer; its MoE mixes the reference's experts (`router.L.ids`) unless
        `own_choice` (the router stage itself) or the reference has none."""
        key = (L, own_choice or f"router.{L}.ids" not in self.ref)
        if key not in self._layer:
            attn = self.act(self.ref[f"attn.{L}"])
            experts = None if key[1] else self.ref[f"router.{L}.ids"].to(self.lm.device)
            self._layer[key] = self.lm.stack[L](*self.entering(L), lambda h_in: attn, self.image, self.hashes,
                                                experts)
        return self._layer[key]

    def router(self, L: int) -> dict:
        """The router stage: the engine's own choice of experts and the scores it ranked."""
        o = self.layer(L, own_choice=True)
        return {f"router.{L}.ids": o.router_ids, f"router.{L}.scores": self.lm.stack[L].router_scores(o, self.image)}

    def engram_gate(self, L: int) -> torch.Tensor:
        return self.lm.stack[L].enter(self.stream(L), self.hashes, self.image)[1]

    def attention(self, L: int, own_choice: bool = False) -> tuple:
        """Engine attention of layers 0..L, each on its forced input, chunk by chunk; layer L's
        output [S, D] and (for an index source, with `own_choice`) its `index.L.ids` with the
        scores it ranked (`index.L.scores`). Attention attends to the REFERENCE's selections where
        the reference has them (an engine choice that flipped on a near-tie does not count against
        the attention stage); `own_choice` runs the engine's own choices (the indexer stage).

        The layers below L run once for all the stages (`_Chain`, linear in the depth), not again
        for every L; the numbers are `_attention(L, own_choice)`'s, bit for bit."""
        key = (L, own_choice)
        if key not in self._attn:
            chain = self._chains.get(own_choice)
            if chain is None:
                chain = self._chains[own_choice] = _Chain(self, own_choice)
            stale = chain.stale(L)
            if stale is not None:  # the reference's forcing changed there: run it again from that layer
                chain.rewind(stale)
            self._attn[key] = chain.upto(L)
        return self._attn[key]

    def _attention(self, L: int, own_choice: bool, state: dict | None = None):
        """`state`, when given, receives the caches each layer filled and the index-key owner the
        last chunk left published (what a decode step continues from)."""
        lm = self.lm
        layers = [layer for j, layer in lm.stack.items() if j <= L]
        caches = [layer.attn.new_cache(lm.dtype, lm.device) for layer in layers]
        xs = []
        for layer in layers:
            x, pre = self.entering(layer.index)
            xs.append(layer.attn_input(layer.enter(x, self.hashes, self.image)[0], pre)[0])
        ref_sel = {} if own_choice else {j.index: self.ref[f"index.{j.index}.ids"].to(lm.device) for j in layers
                                         if f"index.{j.index}.ids" in self.ref}
        # the candidate blocks are decided upstream (by the candidate source's scores): always the
        # reference's, so a near-tie flip there does not change what later indexers may keep
        c = lm.cfg.candidate_source_layer
        ref_blocks = {c: self.ref[f"index.{c}.scores"]} if f"index.{c}.scores" in self.ref and c < L else {}
        n = self.chunks[-1][1] if self.chunks else 0
        outs, sels, scores = [], [], []
        for lo, hi in self.chunks:
            shared = ChunkShared(forced={j: t[lo:hi] for j, t in ref_sel.items()} or None,
                                 forced_scores={j: t[lo:hi] for j, t in ref_blocks.items()} or None)
            for layer, x, cache in zip(layers, xs, caches):
                h = layer.attn(x[lo:hi], lo, cache, shared)
            outs.append(h)
            if layers[-1].attn.index_source and own_choice:
                sels.append(index_ids(shared.selection, lm.cfg.index_topk))
                scores.append(selection_scores(shared.selection_scores, n // layers[-1].attn.ratio))
        if state is not None:
            state.update(caches={layer.index: cache for layer, cache in zip(layers, caches)},
                         key_owner=shared.key_cache if self.chunks else None)
        return torch.cat(outs), (torch.cat(sels) if sels else None), (torch.cat(scores) if scores else None)

    def step(self, k: int) -> torch.Tensor:
        """`logits.step.k` [1, vocab]: the engine's decode step k on the teacher-forced cache and
        the reference's tokens (see the module doc). Steps run in order, each once."""
        if self._decoding is None:
            caches, owner = self._prefilled()
            seq = self._sequence()
            seq.caches.update(caches)
            seq.pos, seq.key_owner = self.chunks[-1][1] if self.chunks else 0, owner
            self._decoding = seq
        for j in range(len(self._steps) + 1, k + 1):
            prev = self.ref["logits"] if j == 1 else self.ref[f"logits.step.{j - 1}"]
            self._steps[j] = self._decoding.step(int(prev[-1].argmax()), j)
        return self._steps[k]


    def _prefilled(self) -> tuple[dict, object]:
        """(layer -> its KV cache after the prompt, the index-key owner the last chunk left
        published), every layer's attention on the reference's streams: what a decode step
        continues from. Taken from the attention stages' chain when it ran every layer as
        `_attention(last)` would (copies: a decode step writes into its caches), else run."""
        chain = self._chains.get(False)
        if chain is None or any(L not in chain.out for L in self.lm.stack) or chain.stale(self.last) is not None:
            state: dict = {}
            self._attention(self.last, False, state)
            return state["caches"], state["key_owner"]
        own = {j: _copy(c) for j, c in chain.caches.items()}
        published = chain.shared[-1].key_cache if self.chunks else None
        return own, (None if published is None else own[chain.snapshot_of[id(published)]])


def _copy(c: LayerCache) -> LayerCache:
    """A layer's cache its own: a decode step writes into the window and appends to the lists."""
    return dataclasses.replace(c, window_kv=c.window_kv.clone(), latents=list(c.latents), index_k=list(c.index_k),
                               pending_kv=None if c.pending_kv is None else c.pending_kv.clone(),
                               pending_score=None if c.pending_score is None else c.pending_score.clone())


class _Chain:
    """`TeacherForced._attention` run down the stack one layer at a time, each layer over every
    chunk, keeping what a later layer reads: per chunk the `ChunkShared` the layers so far left
    (with the source caches as they stood after that chunk) and each layer's output. Layer L's
    numbers are the chunk-by-chunk run of layers 0..L's: every layer gets the same inputs in the
    same order of its own chunks, and a later layer only reads a source's latents and index keys
    as far as that chunk had written them (the snapshots below)."""

    def __init__(self, forced: "TeacherForced", own_choice: bool):
        self.f, self.own = forced, own_choice
        self.shared = [ChunkShared() for _ in forced.chunks]
        self.done: list[int] = []  # the layers run, in stack order
        self.seen: dict[int, tuple] = {}  # layer -> the reference tensors present when it ran (`_forcing`)
        self.caches: dict = {}
        self.out: dict[int, tuple] = {}
        self.marks: dict[int, list[ChunkShared]] = {}  # layer -> the chunks' state before it ran
        self.snapshot_of: dict[int, int] = {}  # id(a snapshot it published) -> the layer whose cache it is

    def _forcing(self, j: int) -> tuple[bool, bool, bool]:
        """Which reference tensors steer layer j's attention: its forced selection, the router
        choice the layer before mixes (its `pre`), the candidate source's scores."""
        f, c = self.f, self.f.lm.cfg.candidate_source_layer
        return (not self.own and f"index.{j}.ids" in f.ref,
                f.before[j] is not None and f"router.{f.before[j]}.ids" in f.ref,
                j == c and f"index.{c}.scores" in f.ref)

    def stale(self, L: int) -> int | None:
        """The first layer run so far (of those up to L) that did not run as `_attention(L)`
        would run it now, or None. The candidate source's forced scores only steer the layers
        after it, so for L at the source they do not count."""
        c = self.f.lm.cfg.candidate_source_layer
        for j in self.done:
            if j > L:
                break
            then, now = self.seen[j], self._forcing(j)
            if j >= L or j != c:
                then, now = then[:2], now[:2]
            if then != now:
                return j
        return None

    def rewind(self, j: int) -> None:
        """Forget layer j and every layer after it: the chunks' state back to what it was before
        j ran (a later layer only writes its own cache and the chunk's shared fields)."""
        self.shared = [dataclasses.replace(s) for s in self.marks[j]]
        for k in [k for k in self.done if k >= j]:
            self.done.remove(k)
            for d in (self.seen, self.caches, self.out, self.marks):
                d.pop(k, None)

    def upto(self, L: int) -> tuple:
        f, lm = self.f, self.f.lm
        for layer in [layer for j, layer in lm.stack.items() if j <= L and j not in self.out]:
            self._run(layer)
        return self.out[L]

    def _run(self, layer) -> None:
        f, lm, j = self.f, self.f.lm, layer.index
        x, pre = f.entering(j)
        x = layer.attn_input(layer.enter(x, f.hashes, f.image)[0], pre)[0]
        sel = None if self.own else f.ref.get(f"index.{j}.ids")
        c = lm.cfg.candidate_source_layer
        blocks = f.ref.get(f"index.{c}.scores") if j == c else None
        self.marks[j] = [dataclasses.replace(s) for s in self.shared]
        cache = self.caches[j] = layer.attn.new_cache(lm.dtype, lm.device)
        n = f.chunks[-1][1] if f.chunks else 0
        outs, sels, scores = [], [], []
        for (lo, hi), shared in zip(f.chunks, self.shared):
            shared.forced = None if sel is None else {j: sel.to(lm.device)[lo:hi]}
            shared.forced_scores = None if blocks is None else {c: blocks[lo:hi]}
            outs.append(layer.attn(x[lo:hi], lo, cache, shared))
            # the source's lists as this chunk left them: a later layer of this chunk reads no further
            snap = LayerCache(cache.window_kv, list(cache.latents), list(cache.index_k))
            self.snapshot_of[id(snap)] = j
            shared.kv_cache = snap if shared.kv_cache is cache else shared.kv_cache
            shared.key_cache = snap if shared.key_cache is cache else shared.key_cache
            if layer.attn.index_source and self.own:
                sels.append(index_ids(shared.selection, lm.cfg.index_topk))
                scores.append(selection_scores(shared.selection_scores, n // layer.attn.ratio))
        self.done.append(j)
        self.seen[j] = self._forcing(j)
        self.out[j] = (torch.cat(outs), (torch.cat(sels) if sels else None), (torch.cat(scores) if scores else None))


def make_language_stages(req, run: dict, image_rows: torch.Tensor | None = None) -> dict:
    lm = language_model(req)
    cfg, dev = lm.cfg, lm.device
    opts = req.options or {}
    cells = (run.get("inputs") or {}).get("cells") or opts.get("cells")
    has_image = cells is not None and (image_rows is not None or opts.get("image_rows") is not None
                                       or (run.get("inputs") or {}).get("grid") is not None)
    # several images: each one's cells, and its aligner rows under its name (`tensordiff.format.images`)
    several = [tuple(f["cells"]) for f in (run.get("inputs") or {}).get("images") or []]
    grids = several or ([tuple(cells)] if has_image else [])
    ids, types = tokenize(req.prompt if req.prompt is not None else DEFAULT_PROMPT, cfg, grids or None)
    n = ids.numel()
    step = n if req.chunk is None else req.chunk
    chunks = [(lo, min(n, lo + step)) for lo in range(0, n, step)]
    hashes = None
    if lm.engram_tables is not None:  # the n-gram window, chunk by chunk as the engine carries it
        state = EngramHashState(lm.engram_tables, lm.fault)
        hashes = torch.cat([state.hash(ids[lo:hi], types[lo:hi] >= 0) for lo, hi in chunks]).to(dev)

    def sequence():
        """The prompt's engine sequence as prefill leaves it, but for its caches (the caller's):
        position and Engram window past the prompt."""
        seq = lm.sequence(ids, types)  # no image rows: only decode positions past the spans run on it
        if seq.engram_state is not None:
            for lo, hi in chunks:
                seq.engram_state.hash(ids[lo:hi], types[lo:hi] >= 0)
        return seq

    forced = TeacherForced(lm, (types >= 0).to(dev), hashes, chunks, sequence)

    def stage(fn):
        def run_stage(ref):
            forced.ref.update(ref)
            return fn(forced)

        return torch.inference_mode()(run_stage)

    def embeddings(f):
        rows = image_rows if image_rows is not None else f.ref.get("aligner", opts.get("image_rows"))
        more = [f.ref[images.prefix(k) + "aligner"] for k in range(1, len(grids))]
        seq = lm.sequence(ids, types, images=[(lambda r=r: r, g) for r, g in zip([rows, *more], grids)])
        return {"embeddings": torch.cat([seq.embed(lo, hi) for lo, hi in chunks])}

    def logits(f):
        return {"logits": lm.logits(f.act(f.ref[f"hidden.{f.last}"]), f.layer(f.last).pre)}

    stages = {"embeddings": stage(embeddings)}
    for L, layer in lm.stack.items():
        if layer.engram is not None:
            stages[f"engram.{L}"] = stage(lambda f, L=L: {f"engram.{L}.gate": f.engram_gate(L)})
        if layer.attn.index_source:
            stages[f"index.{L}.ids"] = stage(lambda f, L=L: {f"index.{L}.ids": f.attention(L, True)[1],
                                                             f"index.{L}.scores": f.attention(L, True)[2]})
        stages[f"attn.{L}"] = stage(lambda f, L=L: {f"attn.{L}": f.attention(L)[0]})
        stages[f"router.{L}.ids"] = stage(lambda f, L=L: f.router(L))
        stages[f"router.{L}.weights"] = stage(lambda f, L=L: {f"router.{L}.weights": f.layer(L).router_weights})
        stages[f"hidden.{L}"] = stage(lambda f, L=L: {f"hidden.{L}": f.layer(L).hidden})
    stages["logits"] = stage(logits)
    for k in range(1, req.decode + 1):  # a step the reference never took (it stopped) is not in its dump
        stages[f"logits.step.{k}"] = stage(lambda f, k=k: {f"logits.step.{k}": f.step(k)})
    return stages
