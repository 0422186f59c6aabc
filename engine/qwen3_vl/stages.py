"""The engine's Qwen3-VL stages, each runnable on another producer's tensors (tensordiff's local error).

    stages = make_stages(req, run)      # run: the reference dump's run record (inputs.grid_thw)
    stages["block0"]({"patches": ..., "pos_embed": ..., "rope.cos": ..., "rope.sin": ...})

Each stage is the engine's own code (`VisionTower.embed`, `block`, `later_blocks`, `merger_norm`,
`merger_project`, `deepstack_merge`) under the request's device, dtype, backend and fault; inputs
arrive as the reference stored them and are cast as the engine holds them. The later blocks are
run once from the reference's `block0` and shared by `final_norm` and the DeepStack stages (each
DeepStack merger reads the block its index names).
`patches`, `pos_embed`, `rope` and `positions` have no upstream boundary: compared end to end.

With a language run (the reference dumped `embeddings`), the text model's stages too, each on the
reference's tensors: `embeddings` overlays the reference's `aligner` rows; `text_rope` turns the
reference's `positions.ids` into tables; `hidden.L` runs layer L on the reference's stream entering
it (`embeddings`, `hidden.(L-1)` or `deepstack_add.(L-1)`) and its `text_rope`, chunk by chunk
with a fresh KV cache (the request's `chunk`); `deepstack_add.L` adds the reference's
`deepstack.*` to the reference's `hidden.L`; `logits` reads the reference's last stream;
`logits.step.K` decodes the reference's generated tokens against a KV cache filled by running
every layer on the reference's prefill streams (teacher forced), so a decode-only bug is named
at the first step. That prefill is the `hidden.L` stages' own calls (their caches are kept), and
the steps share one decode, run once each in order: the numbers are those of decoding each K
afresh, bit for bit (tests/engine/qwen3_vl/test_qwen3vl_stages.py).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence as SequenceABC

import torch

from .. import backend as backends
from .config import load_config
from .decoder import Decoder, KVCache
from .positions import tokenize
from .runner import load_tower, torch_dtype
from .sequence import Sequence


def make_stages(req, run: dict) -> dict:
    dtype = torch_dtype(req.dtype)
    tower = load_tower(req, load_config(req.weights_dir))
    t, gh, gw = (int(v) for v in run["inputs"]["grid_thw"])
    cu = [i * gh * gw for i in range(t + 1)]
    trail: dict[int, torch.Tensor] = {}  # block index -> output, from the reference's block0

    def act(x: torch.Tensor) -> torch.Tensor:
        return x.to(device=req.device, dtype=dtype)

    def rope(i):
        return i["rope.cos"].to(req.device), i["rope.sin"].to(req.device)

    def blocks_from_block0(i) -> dict[int, torch.Tensor]:
        if not trail:
            x = act(i["block0"])
            trail[0] = x
            trail.update(tower.later_blocks(x, *rope(i), cu))
        return trail

    @torch.inference_mode()
    def block0(i):
        x = tower.embed(i["patches"].to(req.device)) + act(i["pos_embed"])
        return {"block0": tower.block(0, x, *rope(i), cu)}

    @torch.inference_mode()
    def final_norm(i):
        return {"final_norm": tower.merger_norm(blocks_from_block0(i)[tower.depth - 1])}

    @torch.inference_mode()
    def aligner(i):
        return {"aligner": tower.merger_project(act(i["final_norm"]))}

    def deepstack(k: int):
        @torch.inference_mode()
        def stage(i):
            x = blocks_from_block0(i).get(tower.deepstack_taps[k])
            if x is None:
                raise RuntimeError(f"DeepStack {k} reads block {tower.deepstack_taps[k]}, past the {tower.depth} "
                                   "blocks run")
            return {f"deepstack.{k}": tower.deepstack_merge(k, x)}
        return stage

    out = {"block0": block0, "final_norm": final_norm, "aligner": aligner}
    out.update({f"deepstack.{k}": deepstack(k) for k in range(len(tower.deepstack_taps))})
    cfg = load_config(req.weights_dir)
    if cfg.text is not None and (req.prompt is not None or req.decode > 0):
        out.update(language_stages(req, run, cfg, (t, gh, gw)))
    return out


def language_stages(req, run: dict, cfg, grid_thw) -> dict:
    dtype = torch_dtype(req.dtype)
    tc = cfg.text
    dec = Decoder.load(req.weights_dir, tc, cfg.tie_word_embeddings, backends.get(req.backend), dtype, req.device,
                       req.fault)
    ids = tokenize(req.prompt, grid_thw, cfg).input_ids
    n = int(ids.numel())
    step = n if req.chunk is None else req.chunk
    chunks = [(lo, min(n, lo + step)) for lo in range(0, n, step)]
    n_deep = len(cfg.vision.deepstack_visual_indexes)
    stops = {cfg.vision_start_token_id, cfg.vision_end_token_id, cfg.image_token_id, cfg.video_token_id}

    def act(x: torch.Tensor) -> torch.Tensor:
        return x.to(device=req.device, dtype=dtype)

    def sequence(i, *, image: bool = True, positions: bool = True) -> Sequence:
        """The engine's sequence on the reference's tensors; each stage reads only what its
        computation reads (`image`: the merger rows, `positions`: the M-RoPE ids), DeepStack
        features as an injection asks for them (`_Features`)."""
        deltas = int(i["positions.rope_deltas"][0]) if positions and "positions.rope_deltas" in i else 0
        return Sequence(dec, ids, i.get("positions.ids") if positions else None, deltas, cfg.image_token_id, stops,
                        i.get("aligner") if image else None, _Features(i, n_deep) if image else [])

    def entering(i, L: int) -> torch.Tensor:
        """The reference's stream entering layer L."""
        if L == 0:
            return act(i["embeddings"])
        name = f"deepstack_add.{L - 1}" if f"deepstack_add.{L - 1}" in i else f"hidden.{L - 1}"
        return act(i[name])

    def tables(i):
        return act(i["text_rope.cos"]), act(i["text_rope.sin"])

    @torch.inference_mode()
    def embeddings(i):
        seq = sequence(i, positions=False)
        return {"embeddings": torch.cat([seq.embed(lo, hi) for lo, hi in chunks])}

    @torch.inference_mode()
    def text_rope(i):
        cos, sin = sequence(i, image=False, positions=False).rope(i["positions.ids"])
        return {"text_rope.cos": cos, "text_rope.sin": sin}

    # layer -> (its KV cache after the prompt, what it read), as `hidden.L`'s stage filled it on
    # the reference's stream: the decode steps' teacher-forced prefill is those same calls, so on
    # the same inputs (a diagnosis replay feeds others) it is not run again
    prefill: dict[int, tuple[KVCache, dict]] = {}

    def prefill_layer(i, L: int) -> tuple[torch.Tensor, KVCache]:
        """Layer L on the reference's stream entering it, chunk by chunk into a fresh cache."""
        r = _Reads(i)
        x, (cos, sin), cache = entering(r, L), tables(r), KVCache()
        out = torch.cat([dec.layer(L, x[lo:hi], cos[lo:hi], sin[lo:hi], lo, cache) for lo, hi in chunks])
        prefill[L] = (cache, r.seen)  # only once every chunk ran: a stage that raised leaves none
        return out, cache

    def hidden(L: int):
        @torch.inference_mode()
        def stage(i):
            return {f"hidden.{L}": prefill_layer(i, L)[0]}
        return stage

    def inject(L: int):
        @torch.inference_mode()
        def stage(i):
            seq, x = sequence(i, positions=False), act(i[f"hidden.{L}"])
            return {f"deepstack_add.{L}": torch.cat([seq.inject(L, x[lo:hi], lo) for lo, hi in chunks])}
        return stage

    @torch.inference_mode()
    def logits(i):
        return {"logits": dec.logits(entering(i, tc.num_hidden_layers))}

    # the one teacher-forced decode the steps share: step K continues the sequence steps 1..K-1
    # left (the same calls, in the same order, as decoding K steps afresh), each step run once
    decoding: dict = {}

    def decode_step(K: int):
        @torch.inference_mode()
        def stage(i):
            generated = run.get("outputs", {}).get("generated") or []
            if len(generated) < K:
                raise RuntimeError(f"the reference generated {len(generated)} tokens; step {K} needs {K}")
            if "seq" not in decoding or not _same(decoding["seen"], i):
                r = _Reads(i)
                seq = sequence(r)
                for L in range(tc.num_hidden_layers):  # the prefill KV cache from the reference's streams
                    if L not in prefill or not _same(prefill[L][1], i):
                        prefill_layer(i, L)
                    cache, seen = prefill[L]
                    r.seen.update(seen)
                    seq.cache.k[L], seq.cache.v[L] = cache.k[L], cache.v[L]  # extend() never writes in place
                seq.pos = n
                decoding.update(seq=seq, steps={}, seen=r.seen)
            steps = decoding["steps"]
            for k in range(len(steps) + 1, K + 1):
                steps[k] = decoding["seq"].step(int(generated[k - 1]))
            return {f"logits.step.{K}": steps[K]}
        return stage

    out = {"embeddings": embeddings, "text_rope": text_rope, "logits": logits}
    for L in range(tc.num_hidden_layers):
        out[f"hidden.{L}"] = hidden(L)
        if L < n_deep:
            out[f"deepstack_add.{L}"] = inject(L)
    for K in range(1, req.decode + 1):
        out[f"logits.step.{K}"] = decode_step(K)
    return out


class _Features(SequenceABC):
    """The reference's DeepStack features deepstack.0, 1, ... as a list read on access: an
    injection reads the one its layer adds (local error notes what a stage reads)."""

    def __init__(self, inputs, n: int):
        self.inputs = inputs
        self.n = next((k for k in range(n) if f"deepstack.{k}" not in inputs), n)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, k):
        if not 0 <= k < self.n:
            raise IndexError(k)
        return self.inputs[f"deepstack.{k}"]


class _Reads(Mapping):
    """A stage's inputs, noting what a memoised computation read of them (name -> tensor, None
    for a name it found absent), so the memo is reused only where those inputs are the same."""

    def __init__(self, inputs):
        self.inputs, self.seen = inputs, {}

    def __getitem__(self, k):
        if k not in self.inputs:
            self.seen[k] = None
            raise KeyError(k)
        self.seen[k] = v = self.inputs[k]
        return v

    def __contains__(self, k) -> bool:
        there = k in self.inputs
        self.seen[k] = self.inputs[k] if there else None
        return there

    def __iter__(self):
        return iter(self.inputs)

    def __len__(self) -> int:
        return len(self.inputs)


def _same(seen: dict, inputs) -> bool:
    """Every input in `seen` is in `inputs` with the same dtype, shape and values (or absent there too)."""
    for k, v in seen.items():
        if (k in inputs) != (v is not None):
            return False
        if v is not None:
            w = inputs[k]
            if w is not v and (w.dtype != v.dtype or w.shape != v.shape or not torch.equal(w, v)):
                return False
    return True
