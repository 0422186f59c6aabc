"""Prompt -> token ids -> transformers' M-RoPE positions (`get_rope_index`), and decode positions.

Tokenisation is a deterministic byte-level stand-in (one token per UTF-8 byte; no tokenizer
download): positions depend only on token counts and the image grid. Each `<image>` marker
expands as Qwen3VLProcessor expands it: vision_start, image_pad x (t·h·w / merge²), vision_end.
The positions themselves come from transformers' own `Qwen3VLModel.get_rope_index` and, for
decode steps, `compute_3d_position_ids` with the cached `rope_deltas`, called on a host object
that carries only the config (the text model is never built).
"""
from __future__ import annotations

import torch

IMAGE_MARKER = "<image>"
DEFAULT_PROMPT = "Describe <image> briefly."


def input_ids(prompt: str | None, image_grid_thw: torch.Tensor, cfg) -> torch.Tensor:
    text = DEFAULT_PROMPT if prompt is None else prompt
    if IMAGE_MARKER not in text:
        text = IMAGE_MARKER + text
    merge = cfg.vision_config.spatial_merge_size
    n_pad = int(image_grid_thw[0].prod()) // merge ** 2
    image = [cfg.vision_start_token_id] + [cfg.image_token_id] * n_pad + [cfg.vision_end_token_id]
    ids: list[int] = []
    for i, piece in enumerate(text.split(IMAGE_MARKER)):
        if i:
            ids.extend(image)
        ids.extend(piece.encode("utf-8"))
    return torch.tensor([ids], dtype=torch.long)


class _Host:
    """What `get_rope_index` / `compute_3d_position_ids` read from `self`."""

    def __init__(self, cfg):
        from transformers import Qwen3VLModel

        self.config = cfg
        self.rope_deltas = None
        self._cls = Qwen3VLModel

    def get_vision_position_ids(self, *args, **kwargs):
        return self._cls.get_vision_position_ids(self, *args, **kwargs)

    def get_rope_index(self, *args, **kwargs):
        return self._cls.get_rope_index(self, *args, **kwargs)


class _Past:
    def __init__(self, n: int):
        self.n = n

    def get_seq_length(self) -> int:
        return self.n


def mm_token_type_ids(ids: torch.Tensor, cfg) -> torch.Tensor:
    """The processor's `mm_token_type_ids` for `ids` [1, S], from its own function."""
    from transformers.processing_utils import ProcessorMixin

    tokens = type("T", (), {"image_token_ids": [cfg.image_token_id], "video_token_ids": [cfg.video_token_id],
                            "audio_token_ids": [None]})()
    return torch.tensor(ProcessorMixin.create_mm_token_type_ids(tokens, [ids[0].tolist()]), dtype=torch.int)


def mrope(ids: torch.Tensor, image_grid_thw: torch.Tensor, cfg, decode: int = 0):
    """-> (position ids [3, S], rope_deltas [1], decode positions [3, decode] or None)."""
    from transformers import Qwen3VLModel

    host = _Host(cfg)
    mm = mm_token_type_ids(ids, cfg)
    n_images = int((ids == cfg.vision_start_token_id).sum())
    grids = image_grid_thw.repeat(n_images, 1)  # every marker shows the same picture
    pos = Qwen3VLModel.compute_3d_position_ids(host, input_ids=ids, inputs_embeds=None, image_grid_thw=grids,
                                               mm_token_type_ids=mm)
    deltas = host.rope_deltas.reshape(-1)
    steps = []
    seq = ids.shape[1]
    for k in range(decode):
        tok = torch.zeros(1, 1, dtype=torch.long)
        p = Qwen3VLModel.compute_3d_position_ids(host, input_ids=tok, inputs_embeds=torch.zeros(1, 1, 1),
                                                 past_key_values=_Past(seq + k))
        steps.append(p[:, 0, :])  # [3, 1]
    dec = torch.cat(steps, 1) if steps else None
    return pos[:, 0, :], deltas, dec
