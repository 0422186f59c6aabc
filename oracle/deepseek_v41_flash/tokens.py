"""The synthetic checkpoints' tokenizer and the prompt's image span (official `prepare_vl_inputs`).

Synthetic checkpoints carry no tokenizer, so prompts are UTF-8 bytes: id = byte + 3, with
0/1/2 = BOS/EOS/PAD (PAD is `engram_pad_id`). The Engram compressed map follows the official
normalisation (NFKC, lowercase, whitespace runs -> one space) applied to that vocabulary:
upper-case ASCII letters fold onto lower case and tab/CR/LF onto space; everything else keeps
its own compressed id, numbered in token-id order as the official builder does.
"""
from __future__ import annotations

import torch

from tensordiff.errors import BadInput

from .image_processor import TEXT, image_token_types

BOS, EOS, PAD = 0, 1, 2
BYTE_OFFSET = 3
PLACEHOLDER = "<image>"
DEFAULT_PROMPT = "A picture: <image> What does it show?"


def _key(token_id: int) -> str:
    if token_id < BYTE_OFFSET:
        return f"<special{token_id}>"
    b = token_id - BYTE_OFFSET
    if b >= 256:
        return f"<unused{token_id}>"
    if b >= 128:  # a partial UTF-8 byte: keyed by its raw form
        return f"<0x{b:02X}>"
    c = chr(b)
    if c in " \t\r\n":
        return " "
    return c.lower()


def compressed_token_map(vocab_size: int) -> tuple[torch.Tensor, int]:
    """[vocab] compressed id per token id, and the compressed vocabulary size."""
    key_to_new: dict[str, int] = {}
    out = []
    for t in range(vocab_size):
        out.append(key_to_new.setdefault(_key(t), len(key_to_new)))
    return torch.tensor(out, dtype=torch.int64), len(key_to_new)


def encode_text(text: str) -> list[int]:
    return [b + BYTE_OFFSET for b in text.encode("utf-8")]


def build_prompt(prompt: str, args, cells) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """(input_ids [S], token_types [S], every span's start). `cells` is one (n_llm_h, n_llm_w) per
    image in prompt order (a lone pair stands for one image; None: a text-only prompt). As the
    official `prepare_vl_inputs`, the prompt's placeholders must match the images one for one,
    and placeholder k becomes image k's span, sized by that image's own grid; the text between
    them stays as it is (no separator is added)."""
    if args.vocab_size < 256 + BYTE_OFFSET or args.image_token_id < 256 + BYTE_OFFSET:
        raise BadInput("this checkpoint's vocabulary cannot hold the byte tokenizer of synthetic checkpoints")
    grids = [] if cells is None else [tuple(cells)] if isinstance(cells[0], int) else [tuple(c) for c in cells]
    parts = prompt.split(PLACEHOLDER)
    if len(parts) - 1 != len(grids):
        raise BadInput(f"the prompt holds {len(parts) - 1} '{PLACEHOLDER}' placeholder(s) but {len(grids)} "
                       f"image(s) were given: one placeholder per image, in order")
    ids = [BOS] + encode_text(parts[0])
    types = [TEXT] * len(ids)
    starts = []
    for grid, text in zip(grids, parts[1:]):
        span = image_token_types(*grid).tolist()
        starts.append(len(ids))
        ids += [args.image_token_id] * len(span)
        types += span
        tail = encode_text(text)
        ids += tail
        types += [TEXT] * len(tail)
    return torch.tensor(ids, dtype=torch.int64), torch.tensor(types, dtype=torch.int64), starts
