"""The image span in the text sequence, and its rows for the embedding overlay.

    [START] + ([IMAGE] * cells_w + [NEWLINE]) * cells_h + [END]

Every span position carries `image_token_id` in input_ids; the token types (TEXT = -1 outside)
tell them apart. The span's embedding rows are START / END / NEWLINE = the learned
`image_start` / `image_end` / `image_newline`, IMAGE = aligner rows in reading order. They are
assembled with one device gather from [aligner rows; start; end; newline], so chunked prefill can
overlay any slice of them (`engine.runtime.embedding.overlay`).
"""
from __future__ import annotations

import torch

from ..runtime.embedding import Span

TEXT, IMAGE_START, IMAGE, IMAGE_NEW_LINE, IMAGE_END = -1, 0, 1, 2, 3


def span_types(cells_h: int, cells_w: int, device="cpu") -> torch.Tensor:
    """[cells_h * (cells_w + 1) + 2] int64 token types."""
    inner = torch.full((cells_h, cells_w + 1), IMAGE, dtype=torch.int64, device=device)
    inner[:, -1] = IMAGE_NEW_LINE
    ends = torch.tensor([IMAGE_START, IMAGE_END], dtype=torch.int64, device=device)
    return torch.cat([ends[:1], inner.reshape(-1), ends[1:]])


def span_source_index(cells_h: int, cells_w: int, device="cpu") -> torch.Tensor:
    """[span] int64 row into [aligner rows (T); start; end; newline] for each span position."""
    t = cells_h * cells_w
    grid = torch.arange(t, device=device).view(cells_h, cells_w)
    newline = torch.full((cells_h, 1), t + 2, dtype=torch.int64, device=device)
    inner = torch.cat([grid, newline], dim=1).reshape(-1)
    return torch.cat([inner.new_tensor([t]), inner, inner.new_tensor([t + 1])])


def span_rows(aligned: torch.Tensor, start: torch.Tensor, end: torch.Tensor, newline: torch.Tensor,
              cells: tuple[int, int]) -> torch.Tensor:
    """aligned: [T, dim] -> [span, dim] embedding rows of the whole span (in aligned's dtype)."""
    table = torch.cat([aligned, torch.stack([start, end, newline]).to(aligned.dtype)], dim=0)
    return table[span_source_index(*cells, device=aligned.device)]


def image_span(position: int, aligned: torch.Tensor, markers: dict[str, torch.Tensor],
               cells: tuple[int, int]) -> Span:
    """The overlay span of one image whose START sits at sequence `position`."""
    rows = span_rows(aligned, markers["image_start"], markers["image_end"], markers["image_newline"], cells)
    return Span(position, rows)
