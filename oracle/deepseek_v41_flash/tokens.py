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


def build_prompt(prompt: str, args, cells: tuple[int, int] | None) -> tuple[torch.Tensor, torch.Tensor, int | None]:
    """(input_ids [S], token_types [S], span start or None). `cells` = (n_llm_h, n_llm_w) of the
    image, or None for a text-only prompt. The image span replaces the one `<image>`; as the
    official `prepare_vl_inputs`, the placeholders must match the images one for one."""
    if args.vocab_size < 256 + BYTE_OFFSET or args.image_token_id < 256 + BYTE_OFFSET:
        raise BadInput("this checkpoint's vocabulary cannot hold the byte tokenizer of synthetic checkpoints")
    parts = prompt.split(PLACEHOLDER)
    if len(parts) > 2:
        raise BadInput(f"the prompt holds {len(parts) - 1} '{PLACEHOLDER}' placeholders; one image is supported")
    if len(parts) == 2 and cells is None:
        raise BadInput(f"the prompt holds '{PLACEHOLDER}' but no image was given")
    if len(parts) == 1 and cells is not None:
        raise BadInput(f"an image was given but the prompt holds no '{PLACEHOLDER}' placeholder for it")
    ids = [BOS] + encode_text(parts[0])
    types = [TEXT] * len(ids)
    start = None
    if cells is not None:
        span = image_token_types(*cells).tolist()
        start = len(ids)
        ids += [args.image_token_id] * len(span)
        types += span
        tail = encode_text(parts[1])
        ids += tail
        types += [TEXT] * len(tail)
    return torch.tensor(ids, dtype=torch.int64), torch.tensor(types, dtype=torch.int64), start
