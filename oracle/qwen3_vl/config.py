"""The checkpoint's config.json, read by transformers itself, after the values the oracle builds
from have been checked (transformers takes most of them as they come)."""
from __future__ import annotations

import json
import math
from pathlib import Path

from tensordiff.errors import BadInput

# Sizes the oracle's modules are built from: each a whole number >= 1 where the file gives it.
VISION_SIZES = ("depth", "hidden_size", "intermediate_size", "num_heads", "in_channels", "patch_size",
                "spatial_merge_size", "temporal_patch_size", "out_hidden_size", "num_position_embeddings")
TEXT_SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "max_position_embeddings")
TOKEN_IDS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")


def load_config(ckpt: Path):
    """-> transformers' Qwen3VLConfig (vision_config, token ids)."""
    from transformers import AutoConfig, Qwen3VLConfig

    path = Path(ckpt) / "config.json"
    if path.is_dir():
        raise BadInput(f"{path} is a directory; the checkpoint's config.json is a file")
    if not path.is_file():
        raise BadInput(f"checkpoint {ckpt} has no config.json")
    check_values(path)
    try:
        cfg = AutoConfig.from_pretrained(str(ckpt), local_files_only=True)
    except (ValueError, OSError, TypeError) as e:
        raise BadInput(f"cannot read {ckpt}/config.json with transformers: {str(e).splitlines()[0][:300]}") from None
    if not isinstance(cfg, Qwen3VLConfig):
        raise BadInput(f"{ckpt}/config.json is a {type(cfg).__name__}, not a Qwen3-VL config")
    return cfg


def read_object(path: Path) -> dict:
    """A checkpoint's JSON file as a dict, or BadInput naming the file (missing, a directory,
    unreadable, not JSON, not an object)."""
    if path.is_dir():
        raise BadInput(f"{path} is a directory; the checkpoint's {path.name} is a file")
    try:
        raw = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise BadInput(f"checkpoint {path.parent} has no {path.name}") from None
    except OSError as e:
        raise BadInput(f"cannot read {path}: {e.strerror}") from None
    except ValueError as e:
        raise BadInput(f"{path} is not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise BadInput(f"{path} must hold a JSON object")
    return raw


def refusal(path: Path, key: str, value, want: str) -> BadInput:
    """The one-line refusal of a value: the file, the key, what it holds and what was expected."""
    return BadInput(f"{path}: {key} is {json.dumps(value)[:60]}; expected {want}")


def check_values(path: Path) -> None:
    """BadInput naming the file and the key for a value the oracle cannot be built from."""
    raw = read_object(path)

    def refuse(key: str, value, want: str):
        return refusal(path, key, value, want)

    for key in TOKEN_IDS:
        if key in raw and not (type(raw[key]) is int and raw[key] >= 0):
            raise refuse(key, raw[key], "a token id (an integer >= 0)")
    for table, sizes in (("vision_config", VISION_SIZES), ("text_config", TEXT_SIZES)):
        sub = raw.get(table, {})
        if not isinstance(sub, dict):
            raise refuse(table, sub, "a JSON object")
        for key in sizes:
            if key in sub and not (type(sub[key]) is int and sub[key] >= 1):
                raise refuse(f"{table}.{key}", sub[key], "a whole number >= 1")
        for key in ("rms_norm_eps", "rope_theta"):
            v = sub.get(key)
            if v is not None and not (type(v) in (int, float) and math.isfinite(v) and v > 0):
                raise refuse(f"{table}.{key}", v, "a finite number > 0")
    vision = raw.get("vision_config", {})
    n = vision.get("num_position_embeddings")
    if n is not None and math.isqrt(n) ** 2 != n:
        raise refuse("vision_config.num_position_embeddings", n, "a square (the learned position table is side x side)")
    heads, width = vision.get("num_heads", 16), vision.get("hidden_size", 1152)
    if width % heads:
        raise refuse("vision_config.hidden_size", width, f"a multiple of vision_config.num_heads {heads}")
    deep = vision.get("deepstack_visual_indexes", [])
    depth = vision.get("depth", 27)
    if not (isinstance(deep, list) and all(type(i) is int and 0 <= i < depth for i in deep)):
        raise refuse("vision_config.deepstack_visual_indexes", deep, f"a list of block indices in 0..{depth - 1}")
    text = raw.get("text_config", {})
    heads, kv = text.get("num_attention_heads", 32), text.get("num_key_value_heads", 32)
    if heads % kv:
        raise refuse("text_config.num_attention_heads", heads, f"a multiple of num_key_value_heads {kv}")
