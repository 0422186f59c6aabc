"""The language side of an image: its token span and the 3-axis M-RoPE position ids.

A prompt is text with `<image>` markers. Text is tokenised by a deterministic byte-level stand-in
(one token per UTF-8 byte): positions depend only on token counts and image grids, so a real
tokenizer would change the counts, never the rule. Each marker becomes
`<|vision_start|> <|image_pad|> x (t·gh·gw/m²) <|vision_end|>`.

M-RoPE: a text token sits at p on all three axes (t, h, w), p = previous end + 1. An image's pads
sit at (p0 + t_i, p0 + row, p0 + col) over the merged grid, p0 = the position after the text
before it, and the text after it continues at p0 + max(gh, gw)/m. So the last position is less
than the sequence length for any image larger than one cell, and decoding must continue from
`rope_deltas` = max position + 1 − sequence length: decode step k sits at S + k + rope_deltas.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import EngineInputError
from .config import Qwen3VLConfig

IMAGE_MARKER = "<image>"
DEFAULT_PROMPT = "Describe <image> briefly."


@dataclass(frozen=True)
class Segment:
    kind: str  # "text" | "image"
    length: int  # tokens
    grid: tuple[int, int, int] | None = None  # (t, gh, gw) in patches, for images


@dataclass(frozen=True)
class Prompt:
    input_ids: torch.Tensor  # [S] int64
    segments: tuple[Segment, ...]


def tokenize(prompt: str | None, grid_thw: tuple[int, int, int], cfg: Qwen3VLConfig) -> Prompt:
    text = DEFAULT_PROMPT if prompt is None else prompt
    if IMAGE_MARKER not in text:
        text = IMAGE_MARKER + text  # a chat template puts the picture before the text
    m = cfg.vision.spatial_merge_size
    t, gh, gw = grid_thw
    n_pad = t * gh * gw // (m * m)
    ids: list[int] = []
    segs: list[Segment] = []
    for i, piece in enumerate(text.split(IMAGE_MARKER)):
        if i:
            ids.append(cfg.vision_start_token_id)
            ids.extend([cfg.image_token_id] * n_pad)
            ids.append(cfg.vision_end_token_id)
            segs.append(Segment("text", 1))
            segs.append(Segment("image", n_pad, grid_thw))
            segs.append(Segment("text", 1))
        raw = piece.encode("utf-8")
        ids.extend(raw)
        if raw:
            segs.append(Segment("text", len(raw)))
    return Prompt(torch.tensor(ids, dtype=torch.int64), tuple(segs))


def mrope_positions(prompt: Prompt, merge: int) -> tuple[torch.Tensor, int]:
    """-> position ids [3, S] int64 and rope_deltas."""
    cols: list[torch.Tensor] = []
    p = 0
    for seg in prompt.segments:
        if seg.kind == "text":
            cols.append(torch.arange(p, p + seg.length).expand(3, -1))
            p += seg.length
            continue
        t, gh, gw = seg.grid
        ch, cw = gh // merge, gw // merge
        tt = torch.arange(t).view(t, 1, 1).expand(t, ch, cw)
        hh = torch.arange(ch).view(1, ch, 1).expand(t, ch, cw)
        ww = torch.arange(cw).view(1, 1, cw).expand(t, ch, cw)
        cols.append(torch.stack([tt, hh, ww]).reshape(3, -1) + p)
        p += max(ch, cw)
    pos = torch.cat(cols, 1) if cols else torch.zeros(3, 0, dtype=torch.int64)
    if pos.shape[1] != prompt.input_ids.shape[0]:
        raise EngineInputError("internal: position count differs from token count")
    deltas = int(pos.max()) + 1 - pos.shape[1] if pos.numel() else 0
    return pos.to(torch.int64), deltas


def decode_positions(seq_len: int, steps: int, rope_deltas: int) -> torch.Tensor:
    """[3, steps]: decode step k (one token each) at seq_len + k + rope_deltas on every axis."""
    return (torch.arange(seq_len, seq_len + steps) + rope_deltas).expand(3, -1).to(torch.int64).contiguous()
