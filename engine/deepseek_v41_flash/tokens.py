"""Prompt -> (input_ids, token_types) for synthetic checkpoints, which carry no tokenizer.

The byte tokenizer: BOS 0, EOS 1, PAD 2, then UTF-8 byte b -> b + 3. The k-th `<image>` in the
prompt becomes image k's span (every position `image_token_id`, told apart by token type); tags
and images must pair up, as the official `prepare_vl_inputs` requires. The Engram
compressed vocabulary folds what the official normaliser folds for these tokens: ASCII capitals onto lower case, tab / CR / LF onto
space; every other token keeps an id of its own, numbered in token order.
"""
from __future__ import annotations

import torch

from engine.errors import EngineInputError
from engine.deepseek_v41_flash.span import TEXT, span_types

OFFSET = 3
IMAGE_TAG = "<image>"
DEFAULT_PROMPT = "A picture: <image> What does it show?"


def compressed_token_map(vocab_size: int) -> tuple[torch.Tensor, int]:
    canon = {}
    for t in range(vocab_size):
        b = t - OFFSET
        c = b
        if 65 <= b <= 90:  # 'A'..'Z' -> 'a'..'z'
            c = b + 32
        elif b in (9, 10, 13):  # tab, LF, CR -> space
            c = 32
        canon[t] = c + OFFSET if 0 <= b < 256 else t
    first: dict[int, int] = {}
    ids = []
    for t in range(vocab_size):
        key = canon[t]
        if key not in first:
            first[key] = len(first)
        ids.append(first[key])
    return torch.tensor(ids, dtype=torch.int64), len(first)


def _text(s: str) -> torch.Tensor:
    return torch.tensor([b + OFFSET for b in s.encode("utf-8")], dtype=torch.int64)


def tokenize(prompt: str, cfg, cells) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids [S], token_types [S]): BOS, then the prompt's text with tag k replaced by image
    k's span. `cells` is one (cells_h, cells_w) per image in prompt order (a lone pair: one
    image; None: no image); tags and images must pair up one for one."""
    if cfg.vocab_size < 256 + OFFSET or cfg.image_token_id < 256 + OFFSET:
        raise EngineInputError("this checkpoint's vocabulary cannot hold the byte tokenizer of synthetic checkpoints")
    if cells is None:
        grids = []
    elif isinstance(cells[0], int):
        grids = [tuple(cells)]
    else:
        grids = [tuple(c) for c in cells]
    pieces = prompt.split(IMAGE_TAG)
    if len(pieces) != len(grids) + 1:
        raise EngineInputError(f"{len(pieces) - 1} '{IMAGE_TAG}' tag(s) in the prompt for {len(grids)} image(s): "
                               "each image needs its own tag, in order")
    # the sequence as (ids, types) segments: BOS + text | span 0 | text | span 1 | ... | text
    head = torch.cat([torch.zeros(1, dtype=torch.int64), _text(pieces[0])])
    segments = [(head, torch.full_like(head, TEXT))]
    for grid, text in zip(grids, pieces[1:]):
        st = span_types(*grid)
        segments.append((torch.full_like(st, cfg.image_token_id), st))
        tail = _text(text)
        segments.append((tail, torch.full_like(tail, TEXT)))
    return torch.cat([i for i, _ in segments]), torch.cat([t for _, t in segments])
