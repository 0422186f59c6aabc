"""The checkpoint's config.json, read by transformers itself."""
from __future__ import annotations

from pathlib import Path

from tensordiff.errors import BadInput


def load_config(ckpt: Path):
    """-> transformers' Qwen3VLConfig (vision_config, token ids)."""
    from transformers import AutoConfig, Qwen3VLConfig

    if not (Path(ckpt) / "config.json").is_file():
        raise BadInput(f"checkpoint {ckpt} has no config.json")
    try:
        cfg = AutoConfig.from_pretrained(str(ckpt), local_files_only=True)
    except (ValueError, OSError, TypeError) as e:
        raise BadInput(f"cannot read {ckpt}/config.json with transformers: {e}") from None
    if not isinstance(cfg, Qwen3VLConfig):
        raise BadInput(f"{ckpt}/config.json is a {type(cfg).__name__}, not a Qwen3-VL config")
    return cfg
