"""Qwen3-VL configuration as the checkpoint states it: `config.json` and `preprocessor_config.json`.

Field names are the JSON keys: the vision path, the image-token positions and the text model.
"""
from __future__ import annotations

import json
import math
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
    max_position_embeddings: int = 262144  # the longest sequence (prompt + decode steps) it serves


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


# Integer fields that may be 0 (token ids); every other integer sizes something and is >= 1.
MAY_BE_ZERO = frozenset({"image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"})


def _field_refusal(name: str, annotation: str, v) -> str | None:
    """Why `v` cannot be field `name` of the annotation written above, or None."""
    if annotation == "bool":
        return None if type(v) is bool else "expected true or false"
    if annotation == "str":
        return None if isinstance(v, str) and v else "expected a non-empty string"
    if annotation == "int":
        low = 0 if name in MAY_BE_ZERO else 1
        return None if type(v) is int and v >= low else f"expected an integer >= {low}"
    if annotation == "float":
        ok = type(v) in (int, float) and math.isfinite(v) and v > 0
        return None if ok else "expected a finite number > 0"
    if annotation == "tuple[int, ...]":
        ok = isinstance(v, (list, tuple)) and all(type(x) is int and x >= 0 for x in v)
        return None if ok else "expected a list of integers >= 0"
    if annotation == "tuple[float, ...]":
        ok = isinstance(v, (list, tuple)) and all(type(x) in (int, float) and math.isfinite(x) for x in v)
        return None if ok else "expected a list of finite numbers"
    return None


def _pick(cls, raw: dict, where: str = "", **extra):
    """The dataclass from the JSON keys it names, each value checked against its field first."""
    types = {f.name: f.type for f in fields(cls)}
    kw = {k: v for k, v in raw.items() if k in types}
    kw.update(extra)
    for k, v in kw.items():
        why = _field_refusal(k, types[k], v)
        if why:
            raise EngineInputError(f"{where}{k} = {json.dumps(v)[:60]} is refused: {why}")
        if isinstance(v, list):
            kw[k] = tuple(v)
    return cls(**kw)


def _read_json(path: Path) -> dict:
    if path.is_dir():
        raise EngineInputError(f"{path} is a directory; the checkpoint's {path.name} is a file")
    if not path.is_file():
        raise EngineInputError(f"checkpoint is missing {path.name} ({path})")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise EngineInputError(f"{path} is not valid JSON ({e})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise EngineInputError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    if not isinstance(raw, dict):
        raise EngineInputError(f"{path} must hold a JSON object")
    return raw


def _table(raw: dict, key: str, where: str) -> dict:
    v = raw.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise EngineInputError(f"{where}{key} = {json.dumps(v)[:60]} is refused: expected a JSON object")
    return v


def load_config(ckpt: Path) -> Qwen3VLConfig:
    cp = Path(ckpt) / "config.json"
    raw = _read_json(cp)
    if raw.get("model_type") != "qwen3_vl" or "vision_config" not in raw:
        raise EngineInputError(f"{ckpt}/config.json is not a Qwen3-VL config (model_type {raw.get('model_type')!r})")
    where = f"{cp}: vision_config."
    vraw = _table(raw, "vision_config", f"{cp}: ")
    theta = _table(vraw, "rope_parameters", where).get("rope_theta", vraw.get("rope_theta", 10000.0))
    vision = _pick(VisionConfig, vraw, where, rope_theta=theta)
    if vision.num_position_embeddings != vision.grid_side ** 2:
        raise EngineInputError(f"{where}num_position_embeddings {vision.num_position_embeddings} is not a square")
    if vision.hidden_size % vision.num_heads or vision.head_dim % 4:
        raise EngineInputError(f"{where}hidden_size {vision.hidden_size} does not split into num_heads "
                               f"{vision.num_heads} heads of a size divisible by 4 (2D RoPE)")
    if any(i >= vision.depth for i in vision.deepstack_visual_indexes):
        raise EngineInputError(f"{where}deepstack_visual_indexes {list(vision.deepstack_visual_indexes)} name a "
                               f"block beyond depth {vision.depth}")
    if vision.in_channels != 3:
        raise EngineInputError(f"{where}in_channels {vision.in_channels}: the vision path reads RGB (3)")
    pp = Path(ckpt) / "preprocessor_config.json"
    praw = _read_json(pp)  # the processor's defaults are Qwen2-VL's (patch 14, CLIP mean): never guess
    size = dict(_table(praw, "size", f"{pp}: "))
    # the processor's constructor lets top-level min_pixels / max_pixels override `size`
    if praw.get("min_pixels") is not None:
        size["shortest_edge"] = praw["min_pixels"]
    if praw.get("max_pixels") is not None:
        size["longest_edge"] = praw["max_pixels"]
    proc = _pick(ProcessorConfig, {**praw, **size}, f"{pp}: ")
    if proc.shortest_edge > proc.longest_edge:
        raise EngineInputError(f"{pp}: shortest_edge (min pixels) {proc.shortest_edge} exceeds longest_edge "
                               f"(max pixels) {proc.longest_edge}")
    for key in ("image_mean", "image_std"):
        v = getattr(proc, key)
        if len(v) != 3 or (key == "image_std" and not all(x > 0 for x in v)):
            raise EngineInputError(f"{pp}: {key} = {list(v)} is refused: expected 3 numbers (R, G, B)"
                                   + (", each > 0" if key == "image_std" else ""))
    if proc.patch_size != vision.patch_size or proc.merge_size != vision.spatial_merge_size:
        raise EngineInputError(f"{pp.name} (patch {proc.patch_size}, merge {proc.merge_size}) disagrees with config.json "
                               f"(patch {vision.patch_size}, merge {vision.spatial_merge_size})")
    text = None
    if isinstance(raw.get("text_config"), dict):
        traw = raw["text_config"]
        where = f"{cp}: text_config."
        rope = _table(traw, "rope_parameters", where) or _table(traw, "rope_scaling", where)
        text = _pick(TextConfig, traw, where, rope_theta=rope.get("rope_theta", traw.get("rope_theta", 5000000.0)),
                     mrope_section=rope.get("mrope_section", (24, 20, 20)),
                     mrope_interleaved=rope.get("mrope_interleaved", True))
        if text.num_attention_heads % text.num_key_value_heads:
            raise EngineInputError(f"{where}num_attention_heads {text.num_attention_heads} is not a multiple of "
                                   f"num_key_value_heads {text.num_key_value_heads}")
        if sum(text.mrope_section) * 2 != text.head_dim:
            raise EngineInputError(f"mrope_section {list(text.mrope_section)} does not cover head_dim {text.head_dim}")
        if text.hidden_act != "silu" or text.attention_bias:
            raise EngineInputError(f"text hidden_act {text.hidden_act!r} / attention_bias {text.attention_bias} "
                                   "is not supported (silu, no bias)")
    return _pick(Qwen3VLConfig, raw, f"{cp}: ", vision=vision, processor=proc, text=text)
