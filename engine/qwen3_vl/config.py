"""Qwen3-VL configuration as the checkpoint states it: `config.json` and `preprocessor_config.json`.

Field names are the JSON keys: the vision path, the image-token positions and the text model.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

from ..errors import EngineInputError


@dataclass(frozen=True)
class VisionConfig:
    depth: int = 27
    hidden_size: int = 1152
    hidden_act: str = "gelu_pytorch_tanh"
    intermediate_size: int = 4304
    num_heads: int = 16
    in_channels: int = 3
    patch_size: int = 16
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    out_hidden_size: int = 3584
    num_position_embeddings: int = 2304
    deepstack_visual_indexes: tuple[int, ...] = (8, 16, 24)
    rope_theta: float = 10000.0  # the tower's 2D RoPE base (rope_parameters.rope_theta)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def grid_side(self) -> int:  # the learned position table is side x side
        return int(self.num_position_embeddings ** 0.5)


@dataclass(frozen=True)
class ProcessorConfig:
    shortest_edge: int = 56 * 56  # min_pixels
    longest_edge: int = 28 * 28 * 1280  # max_pixels
    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    image_mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    image_std: tuple[float, ...] = (0.5, 0.5, 0.5)
    rescale_factor: float = 1 / 255

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size


@dataclass(frozen=True)
class TextConfig:
    """text_config (defaults: transformers' Qwen3VLTextConfig; a checkpoint states every field)."""
    vocab_size: int = 151936
    hidden_size: int = 4096
    intermediate_size: int = 22016
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int = 32
    head_dim: int = 128
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-6
    attention_bias: bool = False
    rope_theta: float = 5000000.0
    mrope_section: tuple[int, ...] = (24, 20, 20)
    mrope_interleaved: bool = True


@dataclass(frozen=True)
class Qwen3VLConfig:
    vision: VisionConfig
    processor: ProcessorConfig
    text: TextConfig | None = None  # None: config.json has no text_config
    tie_word_embeddings: bool = False
    image_token_id: int = 151655
    video_token_id: int = 151656
    vision_start_token_id: int = 151652
    vision_end_token_id: int = 151653


def _pick(cls, raw: dict, **extra):
    names = {f.name for f in fields(cls)}
    kw = {k: v for k, v in raw.items() if k in names}
    kw.update(extra)
    for k, v in kw.items():
        if isinstance(v, list):
            kw[k] = tuple(v)
    return cls(**kw)


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise EngineInputError(f"checkpoint is missing {path.name} ({path})")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise EngineInputError(f"{path} is not valid JSON ({e})") from None


def load_config(ckpt: Path) -> Qwen3VLConfig:
    raw = _read_json(Path(ckpt) / "config.json")
    if raw.get("model_type") != "qwen3_vl" or "vision_config" not in raw:
        raise EngineInputError(f"{ckpt}/config.json is not a Qwen3-VL config (model_type {raw.get('model_type')!r})")
    vraw = raw["vision_config"]
    theta = (vraw.get("rope_parameters") or {}).get("rope_theta", vraw.get("rope_theta", 10000.0))
    vision = _pick(VisionConfig, vraw, rope_theta=float(theta))
    if vision.num_position_embeddings != vision.grid_side ** 2:
        raise EngineInputError(f"num_position_embeddings {vision.num_position_embeddings} is not a square")
    pp = Path(ckpt) / "preprocessor_config.json"
    praw = _read_json(pp)  # the processor's defaults are Qwen2-VL's (patch 14, CLIP mean): never guess
    size = dict(praw.get("size") or {})
    # the processor's constructor lets top-level min_pixels / max_pixels override `size`
    if praw.get("min_pixels") is not None:
        size["shortest_edge"] = praw["min_pixels"]
    if praw.get("max_pixels") is not None:
        size["longest_edge"] = praw["max_pixels"]
    proc = _pick(ProcessorConfig, {**praw, **size})
    if proc.patch_size != vision.patch_size or proc.merge_size != vision.spatial_merge_size:
        raise EngineInputError(f"{pp.name} (patch {proc.patch_size}, merge {proc.merge_size}) disagrees with config.json "
                               f"(patch {vision.patch_size}, merge {vision.spatial_merge_size})")
    text = None
    if isinstance(raw.get("text_config"), dict):
        traw = raw["text_config"]
        rope = traw.get("rope_parameters") or traw.get("rope_scaling") or {}
        text = _pick(TextConfig, traw, rope_theta=float(rope.get("rope_theta", traw.get("rope_theta", 5000000.0))),
                     mrope_section=tuple(rope.get("mrope_section", (24, 20, 20))),
                     mrope_interleaved=bool(rope.get("mrope_interleaved", True)))
        if sum(text.mrope_section) * 2 != text.head_dim:
            raise EngineInputError(f"mrope_section {list(text.mrope_section)} does not cover head_dim {text.head_dim}")
        if text.hidden_act != "silu" or text.attention_bias:
            raise EngineInputError(f"text hidden_act {text.hidden_act!r} / attention_bias {text.attention_bias} "
                                   "is not supported (silu, no bias)")
    return _pick(Qwen3VLConfig, raw, vision=vision, processor=proc, text=text)
