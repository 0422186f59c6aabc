"""One prompt through the text decoder: chunked prefill, then greedy decode against the KV cache.

    seq = Sequence(decoder, prompt, positions, rope_deltas, image_rows, deepstack_rows)
    seq.prefill(chunk=16, taps=rec)   # any chunking; an image's pad range may cross chunks
    seq.decode(steps=4, taps=rec)

Image overlay: the text lookup first, then every `<|image_pad|>` range's rows are replaced by the
merger's rows (`engine.runtime.embedding.overlay`, the chunk's own slice of each range).
DeepStack: after decoder layer i (i < number of DeepStack features) the feature's rows are ADDED
to the visual (pad) rows only, again the chunk's slice of each range.
Decode: step k (one generated token at sequence index S + k - 1) sits at S + k - 1 + rope_deltas
on all three axes; a generated vision special token stops generation (it is never fed).

Taps (prefill, over the whole prompt: chunks are concatenated before recording, so a chunked run
is compared row for row with the oracle's single shot): `embeddings`, `text_rope.cos/.sin`,
`hidden.L`, `deepstack_add.L`, `logits`; decode: `logits.step.K`.
"""
from __future__ import annotations

import torch

from ..runtime.embedding import Span, intersect, overlay
from . import faults as F
from .decoder import Decoder, KVCache
from .text_rope import mrope_tables


def pad_ranges(ids: torch.Tensor, image_token_id: int) -> list[tuple[int, int]]:
    """[(start, length)] of every run of image pad tokens, in order."""
    out, start = [], None
    flags = (ids == image_token_id).tolist() + [False]
    for i, f in enumerate(flags):
        if f and start is None:
            start = i
        elif not f and start is not None:
            out.append((start, i - start))
            start = None
    return out


def _shifted(span: Span, chunk_start: int, n: int) -> list[Span]:
    """The planted `image-chunk-shift`: a chunk that starts inside the range takes the range's rows
    one row late (the continuation's offset counted from the wrong side of the boundary)."""
    if not span.start < chunk_start < span.end:
        return [span]
    rows = torch.cat([span.rows[1:], span.rows[-1:]])
    return [Span(span.start, rows)]


def add_rows(x: torch.Tensor, chunk_start: int, spans: list[Span]) -> torch.Tensor:
    """x [n, D] rows chunk_start..: each span's rows that fall inside the chunk are added to theirs."""
    for span in spans:
        lo, hi = intersect(span.start, span.length, chunk_start, x.shape[0])
        if hi > lo:
            first = span.start + lo - chunk_start
            x[first:first + hi - lo] += span.rows[lo:hi].to(x.dtype)
    return x


def add_every_row(x: torch.Tensor, chunk_start: int, spans: list[Span]) -> torch.Tensor:
    """The planted `deepstack-every-row`: the feature gathered by a running visual-row count with no
    mask, so every row gets one (a text row the last visual row's before it, or the first's)."""
    rows = torch.cat([s.rows for s in spans])
    p = torch.arange(chunk_start, chunk_start + x.shape[0])
    seen = sum(torch.clamp(p - s.start + 1, 0, s.length) for s in spans)  # visual rows at or before p
    return x + rows[torch.clamp(seen - 1, min=0).to(rows.device)].to(x.dtype)


class Sequence:
    def __init__(self, dec: Decoder, input_ids: torch.Tensor, positions: torch.Tensor, rope_deltas: int,
                 image_token_id: int, stop_ids: set[int], image_rows: torch.Tensor | None = None,
                 deepstack_rows: list[torch.Tensor] = ()):
        self.dec, self.ids, self.positions, self.rope_deltas = dec, input_ids.clone(), positions, rope_deltas
        self.stop_ids = stop_ids
        self.cache = KVCache()
        # (image_rows None: no overlay, for a local-error stage that never embeds)
        ranges = pad_ranges(input_ids, image_token_id) if image_rows is not None else []
        dev = dec.embed.device
        self.image = [Span(s, image_rows.to(device=dev, dtype=dec.dtype)) for s, n in ranges]
        self._ranges, self._deep_rows, self._deep = ranges, deepstack_rows, {}
        for s, n in ranges:
            if image_rows.shape[0] != n:
                raise ValueError(f"an image range of {n} pad tokens needs as many merger rows, not {image_rows.shape[0]}")
        self.pos = 0
        self.generated: list[int] = []
        self.stop = "steps"

    def embed(self, lo: int, hi: int) -> torch.Tensor:
        """Token embeddings of rows lo..hi-1 with the merger rows of every pad range inside."""
        d = self.dec
        emb = d.embed[self.ids[lo:hi].to(d.embed.device)].clone()
        spans = self.image
        if d.fault == F.IMAGE_CHUNK_SHIFT:
            spans = [t for s in spans for t in _shifted(s, lo, hi - lo)]
        return overlay(emb, lo, spans, d.backend)

    def rope(self, positions: torch.Tensor):
        d = self.dec
        return mrope_tables(positions.to(d.embed.device), d.cfg.head_dim, d.cfg.rope_theta, d.cfg.mrope_section,
                            interleaved=d.cfg.mrope_interleaved and d.fault != F.MROPE_CHUNKED, dtype=d.dtype)

    def inject(self, layer: int, x: torch.Tensor, lo: int) -> torch.Tensor:
        """The stream after `layer`'s DeepStack add (x itself after a layer with none)."""
        d = self.dec
        k = layer - 1 if d.fault == F.DEEPSTACK_LAYER_LATE else layer
        if not 0 <= k < len(self._deep_rows):
            return x
        add = add_every_row if d.fault == F.DEEPSTACK_EVERY_ROW else add_rows
        return add(x.clone(), lo, self.deepstack(k))

    def deepstack(self, k: int) -> list[Span]:
        """DeepStack feature k's rows on every pad range, cast once, when an injection first reads
        it (a local-error stage reads only the features its layer adds)."""
        if k not in self._deep:
            d, dev = self._deep_rows[k], self.dec.embed.device
            self._deep[k] = [Span(s, d.to(device=dev, dtype=self.dec.dtype)) for s, n in self._ranges]
        return self._deep[k]

    def decode_position(self, at: int) -> torch.Tensor:
        """[3, 1]: the row at sequence index `at` (past the prompt) sits at at + rope_deltas."""
        delta = 0 if self.dec.fault == F.DECODE_NO_DELTA else self.rope_deltas
        return torch.full((3, 1), at + delta, dtype=torch.int64)

    def _forward(self, lo: int, hi: int, positions: torch.Tensor, out: dict | None) -> torch.Tensor:
        d = self.dec
        x = self.embed(lo, hi)
        cos, sin = self.rope(positions)
        if out is not None:
            out.setdefault("embeddings", []).append(x.clone())
            out.setdefault("text_rope.cos", []).append(cos)
            out.setdefault("text_rope.sin", []).append(sin)
        for i in range(d.cfg.num_hidden_layers):
            x = d.layer(i, x, cos, sin, lo, self.cache)
            if out is not None:
                out.setdefault(f"hidden.{i}", []).append(x)
            x = self.inject(i, x, lo)
            if out is not None and i < len(self._deep_rows):
                out.setdefault(f"deepstack_add.{i}", []).append(x)
        self.pos = hi
        return d.logits(x)

    def step(self, token: int) -> torch.Tensor:
        """Feed one generated token at the next index; -> its logits [1, vocab]."""
        at = self.pos
        self.ids = torch.cat([self.ids, torch.tensor([token])])
        return self._forward(at, at + 1, self.decode_position(at), None)

    @torch.inference_mode()
    def prefill(self, chunk: int | None = None, taps=None) -> torch.Tensor:
        """The prompt in chunks of `chunk` rows (None: one). Returns the last row's logits."""
        n = int(self.ids.numel())
        step = n if chunk is None else chunk
        record = taps is not None and taps.enabled
        out: dict | None = {} if record else None
        logits = []
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            logits.append(self._forward(lo, hi, self.positions[:, lo:hi], out))
        if record:
            for name, parts in out.items():
                taps.record(name, torch.cat(parts), boundary="text_rope" if name.startswith("text_rope") else name)
            taps.record("logits", torch.cat(logits))
        return logits[-1][-1]

    @torch.inference_mode()
    def decode(self, steps: int, last_logits: torch.Tensor, taps=None) -> list[int]:
        record = taps is not None and taps.enabled
        row = last_logits.reshape(1, -1)
        nxt = int(row.argmax())
        self.generated = [nxt]
        for k in range(1, steps + 1):
            if nxt in self.stop_ids:
                self.stop = "vision-token"
                break
            if record:  # the token fed to step k and the logits row it was chosen from (ties are judged on it)
                taps.record(f"token.step.{k}.ids", torch.tensor([[nxt]]), boundary=f"token.step.{k}")
                taps.record(f"token.step.{k}.scores", row.float(), boundary=f"token.step.{k}")
            logits = self.step(nxt)
            if record:
                taps.record(f"logits.step.{k}", logits, boundary=f"logits.step.{k}")
            row = logits[-1:]
            nxt = int(row.argmax())
            self.generated.append(nxt)
        else:
            if nxt in self.stop_ids:
                self.stop = "vision-token"
        return self.generated
