"""The language backbone as an engine: weights prepared once, then sequences run chunk by chunk.

    lm = LanguageModel.load(checkpoint, dtype=torch.float32, backend=backend)
    seq = lm.sequence(input_ids, token_types, image=lambda: aligner_rows, cells=(h, w))
    seq.prefill(chunk=16, taps=rec)        # any chunking; the image span may cross chunks
    seq.decode(steps=4, taps=rec)          # one position at a time against the KV cache

A `Sequence` owns every per-sequence state: the KV caches, the pending compressor groups, the
Engram n-gram window and the position. The vision rows are asked for once, by the first chunk
that touches the image span, and never again (decode never reaches the tower).

Taps (when `taps` is given and enabled): prefill records `embeddings`, per layer `engram.L.gate`,
`index.L.ids` (index-source layers: the compressed groups each query kept), `attn.L`,
`router.L.ids` (ascending per row) and `router.L.weights` (aligned to those ids), `hidden.L`
([S, hc_mult, dim]) and `logits`, each over the whole prompt (chunks are concatenated before
recording, so a chunked run is compared row for row with a single-shot one); decode records
`logits.step.K`.

Faults (off by default; `FAULTS`): `overlay-chunk-shift` here (the span overlaid as if every
chunk started at position 0), `decode-engram-window-reset` (`Sequence.step`: the n-gram window
dropped on every decode step after the first), `embed-last-row-scale` (`Sequence.embed`: the
prompt's last row scaled), `decode-rope-off-by-one` (`Sequence.step`: step 2 rotated one position
on), the router faults in `moe` (`router-last-row-renorm` on the rows that end the prompt: `tail`),
the Engram one in `engram`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from engine.errors import EngineInputError
from engine.runtime.embedding import Span, overlay
import engine.deepseek_v41_flash.checkpoint as W
from engine.deepseek_v41_flash.config import Config
from engine.deepseek_v41_flash.faults import (
    DECODE_ENGRAM_WINDOW_RESET, DECODE_ROPE_OFF_BY_ONE, EMBED_LAST_ROW_SCALE, IMAGE_SPAN_UNEXPANDED,
    LANGUAGE as FAULTS, OVERLAY_CHUNK_SHIFT,
)
from engine.deepseek_v41_flash.span import span_rows
from engine.deepseek_v41_flash import hyper, quant
from engine.deepseek_v41_flash.attention import Attention, AttnWeights, ChunkShared
from engine.deepseek_v41_flash.engram import EngramHashState, EngramLayer, EngramTables
from engine.deepseek_v41_flash.layer import Layer, first_stream, index_ids, selection_scores
from engine.deepseek_v41_flash.moe import ExpertBank, GateWeights, MoE
from engine.deepseek_v41_flash.shapes import language_shapes
from engine.deepseek_v41_flash.subset import parse_layers
from engine.deepseek_v41_flash.tokens import compressed_token_map



@dataclass(frozen=True)
class BlockWeights:
    attn_norm: torch.Tensor
    ffn_norm: torch.Tensor
    attn_mix: hyper.MixWeights
    ffn_mix: hyper.MixWeights


class LanguageModel:
    def __init__(self, cfg: Config, t: dict[str, torch.Tensor], dtype: torch.dtype, backend,
                 fault: str | None = None, device="cpu", kernel_quant: bool = False,
                 layers: tuple[int, ...] | None = None, index_keys: str = "official", parallel=None):
        """`parallel`: this process's rank of a tensor- and expert-parallel run (`distributed.Parallel`):
        `t` then holds only its experts, and it slices the rest and reduces across ranks."""
        # quantised checkpoint weights go through the wrapper's `linear` (`quant.QuantBackend`)
        backend = quant.QuantBackend(backend, kernel_quant)
        self.parallel = parallel
        self.cfg, self.dtype, self.backend, self.fault = cfg, dtype, backend, fault
        self.layers = tuple(range(cfg.n_layers)) if layers is None else tuple(layers)  # the ids that run
        self.index_keys = index_keys  # the decode index-key rule (the option `index_keys`)
        self.device = torch.device(device)
        f32 = torch.float32
        # a matrix as stored: plain in the activation dtype, or FP8 / FP4 with its scale
        act = lambda n: quant.weight(t, n, cfg, dtype, self.device, fault)  # noqa: E731
        fp = lambda n: quant.plain(t, n, f32, self.device)  # noqa: E731
        self.embed = act("embed.weight")
        self.markers = {n: act(n) for n in ("image_start", "image_end", "image_newline")}
        self.norm = fp("norm.weight")  # norm weights fp32, as the backend protocol takes them
        self.head = fp("head.weight")
        token_map, n_comp = compressed_token_map(cfg.vocab_size)
        if cfg.engram_layer_ids and n_comp != cfg.engram_compressed_vocab_size:
            raise EngineInputError(f"engram_compressed_vocab_size is {cfg.engram_compressed_vocab_size} but the "
                                   f"tokenizer compresses to {n_comp}")
        self.engram_tables = EngramTables.build(cfg, token_map, n_comp) if cfg.engram_layer_ids else None
        self.blocks, self.attn, self.moe, self.engram = {}, {}, {}, {}  # keyed by layer id
        for i in self.layers:
            p = f"layers.{i}."
            mix = lambda s: hyper.MixWeights(fp(p + f"hc_{s}_fn"), fp(p + f"hc_{s}_base"), fp(p + f"hc_{s}_scale"))  # noqa: E731
            self.blocks[i] = BlockWeights(fp(p + "attn_norm.weight"), fp(p + "ffn_norm.weight"),
                                          mix("attn"), mix("ffn"))
            a = p + "attn."
            opt = lambda n, conv=act: conv(a + n) if a + n in t else None  # noqa: E731
            ratio = cfg.compress_ratios[i]
            cdt = fp if ratio > 1 else act  # the pooling compressor runs in fp32
            aw = AttnWeights(fp(a + "attn_sink"), act(a + "wq_a.weight"), fp(a + "q_norm.weight"),
                             act(a + "wq_b.weight"), act(a + "wkv.weight"), fp(a + "kv_norm.weight"),
                             act(a + "wo_a.weight"), act(a + "wo_b.weight"),
                             opt("compressor.wkv.weight", cdt), opt("compressor.wgate.weight", fp),
                             opt("compressor.norm.weight", fp), opt("indexer.wq_b.weight"),
                             opt("indexer.weights_proj.weight"), opt("indexer.wk.weight"),
                             opt("indexer.k_norm.weight", fp))
            self.attn[i] = Attention(i, cfg, aw, backend, kernel_quant)
            f = p + "ffn."
            held = [e for e in range(cfg.n_routed_experts) if f + f"experts.{e}.w1.weight" in t]  # all, or a rank's
            stack = lambda k: _stack([act(f + f"experts.{e}.{k}.weight") for e in held])  # noqa: E731
            bank = ExpertBank(stack("w1"), stack("w3"), stack("w2"), first=held[0])
            shared = ExpertBank(*(_stack([act(f + f"shared_experts.{k}.weight")]) for k in ("w1", "w3", "w2")))
            gate = GateWeights(fp(f + "gate.weight"), fp(f + "gate.bias"),
                               fp(f + "gate.bias_vl") if f + "gate.bias_vl" in t else None)
            self.moe[i] = MoE(gate, bank, shared, topk=cfg.n_activated_experts, route_scale=cfg.route_scale,
                              gate_temp=cfg.gate_temp, swiglu_limit=cfg.swiglu_limit, score_func=cfg.score_func,
                              norm_topk_prob=cfg.norm_topk_prob, backend=backend, fault=fault)
            if parallel is not None:  # heads, experts and the shared expert sliced; reductions added
                self.attn[i], self.moe[i] = parallel.localise(i, cfg, self.attn[i], self.moe[i])
            if i in cfg.engram_layer_ids:
                g = p + "engram."
                self.engram[i] = EngramLayer(act(g + "embed.weight"), act(g + "wkv.weight"),
                                             fp(g + "q_weight") * fp(g + "k_weight"), cfg.hc_mult, cfg.dim,
                                             cfg.norm_eps)
        if parallel is not None:
            self.head = parallel.vocab_rows(self.head)  # a vocab-parallel head
        # the decoder layers by id, in stack order: what prefill, decode and the stages run
        self.stack = {i: Layer(i, cfg, self.blocks[i], self.attn[i], self.moe[i], self.engram.get(i),
                               cfg.engram_layer_ids.index(i) if i in self.engram else None, backend)
                      for i in self.layers}

    def logits(self, x: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
        """The stream leaving the last layer [n, hc, D] and its FFN-side pre mix -> logits [n, vocab] fp32."""
        final = self.backend.rms_norm(hyper.collapse(x, pre), self.norm, self.cfg.norm_eps)
        out = self.backend.linear(final.float(), self.head, None)
        return out if self.parallel is None else self.parallel.gather_vocab(out)

    @staticmethod
    def tensor_names(cfg: Config, layers: tuple[int, ...] | None = None) -> list[str]:
        names = ["embed.weight", "norm.weight", "head.weight", "image_start", "image_end", "image_newline"]
        for i in range(cfg.n_layers) if layers is None else layers:
            p = f"layers.{i}."
            names += [p + "attn_norm.weight", p + "ffn_norm.weight"]
            names += [p + f"hc_{s}_{k}" for s in ("attn", "ffn") for k in ("fn", "base", "scale")]
            a = p + "attn."
            names += [a + n for n in ("attn_sink", "wq_a.weight", "q_norm.weight", "wq_b.weight", "wkv.weight",
                                      "kv_norm.weight", "wo_a.weight", "wo_b.weight")]
            if i in cfg.kv_source_layers:
                names += [a + "compressor.wkv.weight", a + "compressor.norm.weight"]
                if cfg.compress_ratios[i] > 1:
                    names.append(a + "compressor.wgate.weight")
            if i in cfg.index_source_layers:
                names += [a + "indexer.wq_b.weight", a + "indexer.weights_proj.weight"]
                if i in cfg.kv_source_layers:
                    names += [a + "indexer.wk.weight", a + "indexer.k_norm.weight"]
            f = p + "ffn."
            names += [f + "gate.weight", f + "gate.bias", f + "gate.bias_vl"]
            for e in [f"experts.{j}." for j in range(cfg.n_routed_experts)] + ["shared_experts."]:
                names += [f + e + f"{k}.weight" for k in ("w1", "w2", "w3")]
            if i in cfg.engram_layer_ids:
                names += [p + "engram." + n for n in ("embed.weight", "wkv.weight", "q_weight", "k_weight")]
        return names + [quant.scale_name(n) for n in names if quant.weight_format(cfg, n)]

    @classmethod
    def load(cls, checkpoint: str | Path, *, dtype: torch.dtype, backend, fault: str | None = None,
             device="cpu", kernel_quant: bool = False, index_keys: str = "official",
             layers: str | None = None, parallel=None) -> "LanguageModel":
        """`layers`: a subset spec such as "0-2" (see `subset`); None runs every layer. `parallel`:
        a rank of a sharded run (see `__init__`), which reads only its own experts."""
        if fault is not None and fault not in FAULTS:
            fault = None  # a vision fault: the language path runs clean
        cfg = Config.load(checkpoint)
        ids = parse_layers(layers, cfg)
        names = cls.tensor_names(cfg, ids)
        # the release stores `wo_a` FP8 with a block scale (`quant.released_wo_a`)
        names += W.stored_beside(checkpoint, names, "attn.wo_a.weight", "attn.wo_a.scale")
        if parallel is not None:  # a rank reads only the tensors it holds
            names = [n for n in names if parallel.reads(n, cfg)]
        # every tensor's shape checked against the config before its data is read; the release's
        # routed experts may be int8 bytes of packed FP4 (half the logical columns)
        packed = frozenset(n for n in names if quant.ROUTED_EXPERT.match(n))
        t = W.read(checkpoint, names, shapes=language_shapes(cfg, ids), packed=packed)
        return cls(cfg, t, dtype, backend, fault, device, kernel_quant, ids, index_keys, parallel)

    def sequence(self, input_ids: torch.Tensor, token_types: torch.Tensor,
                 image: Callable[[], torch.Tensor] | None = None, cells: tuple[int, int] | None = None,
                 images: list[tuple[Callable[[], torch.Tensor], tuple[int, int]]] | None = None) -> "Sequence":
        """`image` / `cells`: one image's rows (a callable) and token grid; `images`: one
        (rows callable, cells) per image span, in sequence order, for several."""
        if images is None:
            images = [] if image is None else [(image, tuple(cells))]
        return Sequence(self, input_ids, token_types, images)


def _stack(ws: list):
    return quant.QuantWeight.stack(ws) if isinstance(ws[0], quant.QuantWeight) else torch.stack(ws)


class Sequence:
    """One prompt's run: prefill in chunks, then greedy decode."""

    def __init__(self, lm: LanguageModel, input_ids, token_types, images):
        self.lm = lm
        self.ids = input_ids.clone()
        self.types = token_types.clone()
        if self.ids.numel() > lm.cfg.max_seq_len:
            raise EngineInputError(f"prompt of {self.ids.numel()} tokens exceeds max_seq_len {lm.cfg.max_seq_len}")
        self.pos = 0
        self.prompt_len = int(self.ids.numel())  # decode steps append to `ids`, never to the prompt
        self.caches = {i: a.new_cache(lm.dtype, lm.device) for i, a in lm.attn.items()}
        self.engram_state = EngramHashState(lm.engram_tables, lm.fault) if lm.engram_tables else None
        self._images = list(images)  # (rows callable, cells) per span, in sequence order
        self.vision_calls = 0
        starts = (token_types == 0).nonzero().flatten().tolist()  # IMAGE_START of every span
        if self._images and len(starts) != len(self._images):
            raise EngineInputError(f"the prompt has {len(starts)} image span(s) but {len(self._images)} image(s)")
        lengths = [int(c[0]) * (int(c[1]) + 1) + 2 for _, c in self._images]
        if lm.fault == IMAGE_SPAN_UNEXPANDED:
            # wrong: a later span placed where its tag sits in the unexpanded prompt (one token
            # per tag), the earlier spans' expansion not counted
            starts = [s - sum(n - 1 for n in lengths[:k]) for k, s in enumerate(starts)]
        self.span_starts = starts
        self.span_lens = lengths
        self._spans_built: dict[int, Span] = {}  # span k's rows, built the first time a chunk touches it
        self.span_start = starts[0] if starts else None
        self.span_len = int((token_types >= 0).sum())
        self.generated: list[int] = []
        self.stop = "steps"
        self.key_owner = None  # the index-key cache the last chunk left published (official decode)

    def _spans(self, lo: int, hi: int) -> list[Span]:
        """The image spans positions lo..hi-1 touch, each one's rows built the first time."""
        if not self._images:
            # a sequence built without image rows (a decode-step stage past the prompt) may run
            # positions outside the spans; only a chunk that reaches an image row needs them
            if bool((self.types[lo:hi] >= 0).any()):
                raise EngineInputError("the prompt has an image span but no image rows were given")
            return []
        out = []
        for k, (start, n) in enumerate(zip(self.span_starts, self.span_lens)):
            if hi <= start or lo >= start + n:
                continue
            if k not in self._spans_built:
                image, cells = self._images[k]
                self.vision_calls += 1
                rows = image().to(device=self.lm.device, dtype=self.lm.dtype)
                m = self.lm.markers
                self._spans_built[k] = Span(start, span_rows(rows, m["image_start"], m["image_end"],
                                                             m["image_newline"], cells))
            out.append(self._spans_built[k])
        return out

    def embed(self, lo: int, hi: int) -> torch.Tensor:
        """Token embeddings of positions lo..hi-1 with the image span's rows that fall inside."""
        lm = self.lm
        emb = lm.embed[self.ids[lo:hi].to(lm.device)].clone()
        if lm.fault == EMBED_LAST_ROW_SCALE and lo < self.prompt_len <= hi:
            emb[self.prompt_len - 1 - lo] *= 1 + 2 ** -5  # wrong: the prompt's last row scaled
        spans = self._spans(lo, hi)
        if lm.fault == OVERLAY_CHUNK_SHIFT:
            spans = list(self._spans_built.values())
            return overlay(emb, 0, spans, lm.backend)  # wrong: the chunk's own start is ignored
        return overlay(emb, lo, spans, lm.backend)

    def _forward(self, lo: int, hi: int, out: dict | None, decoding: bool = False, rope_shift: int = 0) -> torch.Tensor:
        """Positions lo..hi-1 through the stack; returns logits [n, vocab] fp32. `rope_shift`:
        a planted fault's rotary positions moved on (0: right)."""
        lm, cfg = self.lm, self.lm.cfg
        ids, types = self.ids[lo:hi], self.types[lo:hi]  # host tensors
        image = (types >= 0).to(lm.device)
        emb = self.embed(lo, hi)
        keep = out is not None
        if keep:
            out.setdefault("embeddings", []).append(emb)
        # n-gram hashing is host integer work; only the hash rows go to the device
        hashes = self.engram_state.hash(ids, types >= 0).to(lm.device) if self.engram_state is not None else None
        x, pre = first_stream(emb, cfg.hc_mult)
        # official decode: the indexers read the keys the last owner published (see `ChunkShared`)
        official = decoding and lm.index_keys == "official"
        shared = ChunkShared(key_cache=self.key_owner if official else None, decoding=official, rope_shift=rope_shift)
        tail = not decoding and hi == self.prompt_len  # these rows end the prompt
        for i, layer in lm.stack.items():
            cache = self.caches[i]
            o = layer(x, pre, lambda h_in: layer.attn(h_in, lo, cache, shared), image, hashes, tail=tail)
            x, pre = o.hidden, o.pre
            if keep:
                if o.gate is not None:
                    out.setdefault(f"engram.{i}.gate", []).append(o.gate)
                if layer.attn.index_source:  # the indexer's choice
                    out.setdefault(f"index.{i}.ids", []).append(index_ids(shared.selection, cfg.index_topk))
                    out.setdefault(f"index.{i}.scores", []).append(
                        selection_scores(shared.selection_scores, self.ids.numel() // layer.attn.ratio))
                out.setdefault(f"router.{i}.scores", []).append(layer.router_scores(o, image))
                out.setdefault(f"attn.{i}", []).append(o.attn)
                out.setdefault(f"router.{i}.ids", []).append(o.router_ids)
                out.setdefault(f"router.{i}.weights", []).append(o.router_weights)
                out.setdefault(f"hidden.{i}", []).append(x)
        self.pos, self.key_owner = hi, shared.key_cache
        return lm.logits(x, pre)

    @torch.inference_mode()
    def prefill(self, chunk: int | None = None, taps=None) -> torch.Tensor:
        """The whole prompt in chunks of `chunk` positions (None: one chunk). Returns the last
        position's logits [vocab]."""
        n = self.ids.numel()
        if chunk is not None and chunk < 1:
            raise EngineInputError(f"chunk must be at least 1 (got {chunk})")
        step = n if chunk is None else chunk
        record = taps is not None and taps.enabled
        out: dict | None = {} if record else None
        logits = []
        for lo in range(0, n, step):
            logits.append(self._forward(lo, min(n, lo + step), out))
        if record:
            for name, parts in out.items():
                taps.record(name, torch.cat(parts), boundary=boundary_of(name))
            taps.record("logits", torch.cat(logits))
        return logits[-1][-1]

    @torch.inference_mode()
    def step(self, token: int, k: int) -> torch.Tensor:
        """Feed `token` as generated token k (1-based) at the next position -> logits [1, vocab].
        The one decode step: `decode` runs it on its own argmax, the local-error stage on the
        reference's token."""
        if self.pos >= self.lm.cfg.max_seq_len:
            raise EngineInputError(f"decode ran past max_seq_len {self.lm.cfg.max_seq_len}")
        if self.lm.fault == DECODE_ENGRAM_WINDOW_RESET and k >= 2 and self.engram_state is not None:
            self.engram_state.reset()  # wrong: the n-gram window is carried across every step
        self.ids = torch.cat([self.ids, torch.tensor([token])])
        self.types = torch.cat([self.types, torch.tensor([-1])])
        shift = 1 if self.lm.fault == DECODE_ROPE_OFF_BY_ONE and k == 2 else 0  # wrong: step 2 one position on
        return self._forward(self.pos, self.pos + 1, None, decoding=True, rope_shift=shift)

    @torch.inference_mode()
    def decode(self, steps: int, last_logits: torch.Tensor, taps=None) -> list[int]:
        """Greedy: feed argmax tokens back `steps` times; a generated image token stops it (it is
        never fed: an image can only enter through the image path). Returns every generated id."""
        record = taps is not None and taps.enabled
        image_id = self.lm.cfg.image_token_id
        row = last_logits.reshape(1, -1)
        nxt = int(row.argmax())
        self.generated = [nxt]
        for k in range(1, steps + 1):
            if nxt == image_id:
                self.stop = "image-token"
                break
            if record:  # the token fed to step k and the logits row it was chosen from (ties are judged on it)
                taps.record(f"token.step.{k}.ids", torch.tensor([[nxt]]), boundary=f"token.step.{k}")
                taps.record(f"token.step.{k}.scores", row.float(), boundary=f"token.step.{k}")
            logits = self.step(nxt, k)
            if record:
                taps.record(f"logits.step.{k}", logits, boundary=f"logits.step.{k}")
            row = logits[-1:]
            nxt = int(row.argmax())
            self.generated.append(nxt)
        else:
            if nxt == image_id:
                self.stop = "image-token"
        return self.generated


def boundary_of(name: str) -> str:
    """`router.3.ids` -> `router.3.ids`, `engram.1.gate` -> `engram.1`, `hidden.2` -> `hidden.2`; the
    scores behind a choice belong to the choice: `router.3.scores` -> `router.3.ids`."""
    parts = name.split(".")
    if parts[0] == "engram":
        return ".".join(parts[:2])
    if parts[-1] == "scores":
        return ".".join(parts[:-1] + ["ids"])
    return name
