"""Overlaying precomputed rows (image features, learned markers) onto token embeddings.

A multimodal prompt is embedded by the text lookup first; each media span's rows are then
overwritten by rows the vision path produced. With chunked prefill a span can straddle chunks,
so the overlay works on one chunk at a time: it writes exactly the span rows that fall inside
the chunk, and the result over all chunks equals the one-chunk result (tested).

The bounds are host integers (span start and length, chunk start and length, all known before
any kernel runs), so selecting the rows costs no device synchronisation; the write itself is
the backend's `embed_scatter`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Span:
    """`rows` [length, D] replace the embeddings at sequence positions start .. start+length-1."""

    start: int
    rows: torch.Tensor

    @property
    def length(self) -> int:
        return int(self.rows.shape[0])

    @property
    def end(self) -> int:
        return self.start + self.length


def intersect(span_start: int, span_len: int, chunk_start: int, chunk_len: int) -> tuple[int, int]:
    """The part of a span inside a chunk, as span-relative [lo, hi) (lo == hi: none)."""
    lo = max(span_start, chunk_start) - span_start
    hi = min(span_start + span_len, chunk_start + chunk_len) - span_start
    return (lo, hi) if hi > lo else (0, 0)


def overlay(emb: torch.Tensor, chunk_start: int, spans: list[Span], backend) -> torch.Tensor:
    """emb: [L, D] the text embeddings of positions chunk_start .. chunk_start+L-1 (written in
    place and returned). Every span's rows that fall inside the chunk replace theirs."""
    chunk_len = emb.shape[0]
    for span in spans:
        lo, hi = intersect(span.start, span.length, chunk_start, chunk_len)
        if hi == lo:
            continue
        first = span.start + lo - chunk_start  # chunk-relative row of span row `lo`
        rows = torch.arange(first, first + hi - lo, device=emb.device, dtype=torch.int64)
        backend.embed_scatter(emb, rows, span.rows[lo:hi])
    return emb
