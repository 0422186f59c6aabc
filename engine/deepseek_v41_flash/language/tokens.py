"""Prompt -> (input_ids, token_types) for synthetic checkpoints, which carry no tokenizer.

The byte tokenizer: BOS 0, EOS 1, PAD 2, then UTF-8 byte b -> b + 3. One `<image>` in the prompt
becomes the image span (every position `image_token_id`, told apart by token type); an image
with no tag for it is refused, as the official `prepare_vl_inputs` refuses it. The Engram compressed vocabulary folds what the
official normaliser folds for these tokens: ASCII capitals onto lower case, tab / CR / LF onto
space; every other token keeps an id of its own, numbered in token order.
"""
from __future__ import annotations

import torch

from ...errors import EngineInputError
from ..span import TEXT, span_types

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


def tokenize(prompt: str, cfg, cells: tuple[int, int] | None) -> tuple[torch.Tensor, torch.Tensor]:
    if cfg.vocab_size < 256 + OFFSET or cfg.image_token_id < 256 + OFFSET:
        raise EngineInputError("this checkpoint's vocabulary cannot hold the byte tokenizer of synthetic checkpoints")
    pieces = prompt.split(IMAGE_TAG)
    if len(pieces) > 2:
        raise EngineInputError(f"the prompt holds {len(pieces) - 1} '{IMAGE_TAG}' tags; one image is supported")
    if len(pieces) == 2 and cells is None:
        raise EngineInputError(f"the prompt holds '{IMAGE_TAG}' but no image was given")
    if cells is not None and len(pieces) == 1:
        raise EngineInputError(f"the prompt has no '{IMAGE_TAG}' tag, but an image was given for it")
    text = lambda s: [b + OFFSET for b in s.encode("utf-8")]  # noqa: E731
    ids = [0] + text(pieces[0])
    types = torch.full((len(ids),), TEXT, dtype=torch.int64)
    if cells is None:
        return torch.tensor(ids, dtype=torch.int64), types
    st = span_types(*cells)
    tail = text(pieces[1])
    ids = ids + [cfg.image_token_id] * st.numel() + tail
    types = torch.cat([types, st, torch.full((len(tail),), TEXT, dtype=torch.int64)])
    return torch.tensor(ids, dtype=torch.int64), types
