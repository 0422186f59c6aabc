"""The engine's view of a DeepSeek V4.1 Flash checkpoint config: one flat frozen dataclass whose
fields are config.json keys. Defaults are the released model; a checkpoint's config.json
overrides them. Unknown keys are refused, so a misspelt key never silently keeps a default.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal

from ..errors import EngineInputError


@dataclass(frozen=True)
class Config:
    # runtime (not in the released config)
    max_batch_size: int = 4
    max_seq_len: int = 4096
    temperature: float = 1.0
    gate_temp: float = 1.0
    norm_topk_prob: bool = True
    # language backbone
    dtype: Literal["bf16", "fp8"] = "fp8"
    expert_dtype: Literal["fp4"] | None = "fp4"
    vocab_size: int = 129280
    dim: int = 5120
    moe_inter_dim: int = 2304
    n_layers: int = 40
    n_mtp_layers: int = 3
    n_heads: int = 64
    n_routed_experts: int = 384
    n_shared_experts: int = 1
    n_activated_experts: int = 6
    score_func: Literal["softmax", "sigmoid", "sqrtsoftplus"] = "sqrtsoftplus"
    route_scale: float = 1.5
    swiglu_limit: float = 10.0
    q_lora_rank: int = 1280
    head_dim: int = 512
    rope_head_dim: int = 64
    norm_eps: float = 1e-20
    o_groups: int = 8
    o_lora_rank: int = 1024
    window_size: int = 128
    compress_ratios: tuple[int, ...] = (0, 0) + (2,) * 18 + (1,) * 20 + (0, 0, 0)
    kv_source_layers: tuple[int, ...] = (2, 8, 14, 20)
    index_source_layers: tuple[int, ...] = (2, 8, 14, 20, 24, 28, 32, 36)
    compress_rope_theta: float = 160000.0
    original_seq_len: int = 65536
    rope_theta: float = 10000.0
    rope_factor: float = 16.0
    beta_fast: int = 32
    beta_slow: int = 1
    index_n_heads: int = 32
    index_head_dim: int = 128
    index_topk: int = 512
    candidate_source_layer: int = 20
    candidate_topk_blocks: int = 2048
    candidate_block_size: int = 8
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    engram_layer_ids: tuple[int, ...] = (1, 14)
    engram_num_embeddings: tuple[int, ...] = (384006168, 384016682)
    engram_max_ngram_size: int = 4
    engram_vocab_size: int = 16000000
    engram_n_heads: int = 8
    engram_head_dim: int = 256
    engram_pad_id: int = 2
    engram_compressed_vocab_size: int = 99092
    dspark_block_size: int = 5
    dspark_noise_token_id: int = 128799
    dspark_target_layer_ids: tuple[int, ...] = (37, 38, 39)
    dspark_markov_rank: int = 256
    dspark_n_routed_experts: int = 128
    dspark_n_activated_experts: int = 3
    # vision
    vision_n_layers: int = 32
    vision_dim: int = 1024
    vision_n_heads: int = 16
    vision_inter_dim: int = 2816
    vision_patch_size: int = 14
    vision_rope_theta: float = 10000.0
    vision_downsample_ratio: int = 3
    vision_max_n_token: int = 1024
    vision_min_pixels: int = 295936
    vision_max_wh_ratio: int | None = None
    image_token_id: int = 129264

    # derived
    @property
    def vision_head_dim(self) -> int:
        return self.vision_dim // self.vision_n_heads

    @property
    def vision_rope_dim(self) -> int:
        """Angles per axis pair: half a head (rotate-half over the head, blocked row/col)."""
        return self.vision_head_dim // 2

    @property
    def patch_features(self) -> int:
        return 3 * self.vision_patch_size ** 2  # 588

    @property
    def cell(self) -> int:
        """Pixels per token side: one aligner cell of downsample x downsample patches."""
        return self.vision_patch_size * self.vision_downsample_ratio

    @classmethod
    def load(cls, checkpoint: str | Path) -> "Config":
        path = Path(checkpoint) / "config.json"
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise EngineInputError(f"{path} is missing (a checkpoint needs its config.json)") from None
        except IsADirectoryError:
            raise EngineInputError(f"{path} is a directory; a checkpoint's config.json is a file") from None
        except OSError as e:
            raise EngineInputError(f"cannot read {path}: {e.strerror}") from None
        except ValueError as e:
            raise EngineInputError(f"{path} is not readable JSON ({e})") from None
        if not isinstance(raw, dict):
            raise EngineInputError(f"{path} must hold a JSON object of config keys")
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise EngineInputError(f"{path}: unknown config keys {unknown}")
        for key, value in raw.items():
            why = _refusal(key, known[key].type, value)
            if why:
                raise EngineInputError(f"{path}: {key} = {json.dumps(value)[:60]} is refused: {why}")
        cfg = cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()})
        if len(cfg.compress_ratios) < cfg.n_layers:
            raise EngineInputError(f"{path}: compress_ratios lists {len(cfg.compress_ratios)} layers, n_layers is "
                                   f"{cfg.n_layers}: one ratio per layer is needed")
        for key in ("kv_source_layers", "index_source_layers", "engram_layer_ids"):
            if any(i >= cfg.n_layers for i in getattr(cfg, key)):
                raise EngineInputError(f"{path}: {key} {list(getattr(cfg, key))} names a layer beyond n_layers "
                                       f"{cfg.n_layers}")
        if cfg.n_activated_experts > cfg.n_routed_experts:
            raise EngineInputError(f"{path}: n_activated_experts {cfg.n_activated_experts} exceeds "
                                   f"n_routed_experts {cfg.n_routed_experts}")
        if cfg.rope_head_dim % 2 or cfg.rope_head_dim > cfg.head_dim:
            raise EngineInputError(f"{path}: rope_head_dim {cfg.rope_head_dim} must be even and within head_dim "
                                   f"{cfg.head_dim}")
        if cfg.vision_n_layers <= 0:
            raise EngineInputError(f"{path}: vision_n_layers is {cfg.vision_n_layers}; this checkpoint has no vision tower")
        if cfg.vision_dim % cfg.vision_n_heads or cfg.vision_head_dim % 2:
            raise EngineInputError(f"{path}: vision_dim {cfg.vision_dim} does not split into {cfg.vision_n_heads} even heads")
        return cfg


# Fields that may be zero (switches, ids, optional parts); every other integer sizes something and
# must be >= 1. candidate_source_layer < 0 switches pre-filtering off, so it may be any integer.
MAY_BE_ZERO = frozenset({"n_mtp_layers", "n_shared_experts", "original_seq_len", "vision_n_layers", "engram_pad_id",
                         "image_token_id", "dspark_block_size", "dspark_noise_token_id", "dspark_markov_rank",
                         "dspark_n_routed_experts", "dspark_n_activated_experts"})
ANY_INT = frozenset({"candidate_source_layer"})
CHOICES = {"dtype": ("bf16", "fp8"), "expert_dtype": ("fp4", None), "score_func": ("softmax", "sigmoid", "sqrtsoftplus")}


def _refusal(key: str, annotation: str, value) -> str | None:
    """Why `value` cannot stand for field `key` (its annotation as written above), or None."""
    if key in CHOICES:
        return None if value in CHOICES[key] and (value is None or isinstance(value, str)) else \
            f"expected one of {', '.join(json.dumps(c) for c in CHOICES[key])}"
    if annotation.startswith("tuple[int"):
        if not isinstance(value, list) or not all(type(v) is int and v >= 0 for v in value):
            return "expected a list of integers >= 0"
        if key == "engram_num_embeddings" and 0 in value:
            return "expected table sizes >= 1"
        return None
    if annotation == "bool":
        return None if type(value) is bool else "expected true or false"
    if annotation == "float":
        if type(value) not in (int, float) or not math.isfinite(value) or value <= 0:
            return "expected a finite number > 0"
        return None
    if annotation.startswith("int"):
        if value is None and "None" in annotation:
            return None
        if type(value) is not int:
            return "expected an integer"
        if key in ANY_INT:
            return None
        floor = 0 if key in MAY_BE_ZERO else 1
        return None if value >= floor else f"expected an integer >= {floor}"
    return None
