"""DeepSeek V4.1 Flash model arguments: one flat frozen dataclass, field names = config.json keys.

The defaults are the released model (`inference/config.json`), so `ModelArgs()` is the full
shape; the runtime-only fields (`max_batch_size`, `max_seq_len`, `temperature`, `gate_temp`,
`norm_topk_prob`) take the official reference's defaults because the released config omits
them. A checkpoint directory's `config.json` overrides any field; an unknown key is an error
(the official code builds its args with `ModelArgs(**config)` and would fail the same way).
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tensordiff.errors import BadInput


@dataclass(frozen=True)
class ModelArgs:
    # runtime limits rather than model shape: they size the KV caches
    max_batch_size: int = 4
    max_seq_len: int = 4096
    temperature: float = 1.0
    dtype: Literal["bf16", "fp8"] = "fp8"
    expert_dtype: Literal["fp4"] | None = "fp4"
    vocab_size: int = 129280
    dim: int = 5120
    moe_inter_dim: int = 2304
    n_layers: int = 40
    n_mtp_layers: int = 3  # draft layers after the backbone, indices n_layers..
    n_heads: int = 64
    # moe
    n_routed_experts: int = 384
    n_shared_experts: int = 1
    n_activated_experts: int = 6
    score_func: Literal["softmax", "sigmoid", "sqrtsoftplus"] = "sqrtsoftplus"
    gate_temp: float = 1.0
    norm_topk_prob: bool = True
    route_scale: float = 1.5
    swiglu_limit: float = 10.0
    # attention: latent q/kv, grouped low-rank output
    q_lora_rank: int = 1280
    head_dim: int = 512
    rope_head_dim: int = 64
    norm_eps: float = 1e-20
    o_groups: int = 8
    o_lora_rank: int = 1024
    # sparse attention: sliding window, plus compressed KV per layer (0 = window only)
    window_size: int = 128
    compress_ratios: tuple[int, ...] = (0, 0) + (2,) * 18 + (1,) * 20 + (0, 0, 0)
    kv_source_layers: tuple[int, ...] = (2, 8, 14, 20)
    index_source_layers: tuple[int, ...] = (2, 8, 14, 20, 24, 28, 32, 36)
    # rope (YaRN when original_seq_len > 0); compressed KV rotates at its own theta
    compress_rope_theta: float = 160000.0
    original_seq_len: int = 65536
    rope_theta: float = 10000.0
    rope_factor: float = 16.0
    beta_fast: int = 32
    beta_slow: int = 1
    # lightning indexer
    index_n_heads: int = 32
    index_head_dim: int = 128
    index_topk: int = 512
    # candidate pre-filtering (candidate_source_layer < 0 turns it off)
    candidate_source_layer: int = 20
    candidate_topk_blocks: int = 2048
    candidate_block_size: int = 8
    # hyper-connections
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    # engram
    engram_layer_ids: tuple[int, ...] = (1, 14)
    engram_num_embeddings: tuple[int, ...] = (384006168, 384016682)
    engram_max_ngram_size: int = 4
    engram_vocab_size: int = 16000000
    engram_n_heads: int = 8
    engram_head_dim: int = 256
    engram_pad_id: int = 2
    engram_compressed_vocab_size: int = 99092
    # vision; vision_n_layers == 0 disables the vision path
    vision_n_layers: int = 32
    vision_dim: int = 1024
    vision_n_heads: int = 16
    vision_inter_dim: int = 2816
    vision_patch_size: int = 14
    vision_rope_theta: float = 10000.0
    vision_downsample_ratio: int = 3
    vision_max_n_token: int = 1024
    vision_min_pixels: int = 544 * 544
    vision_max_wh_ratio: int | None = None
    # every position of an image span carries this id in input_ids
    image_token_id: int = 129264
    # dspark draft head
    dspark_block_size: int = 5
    dspark_noise_token_id: int = 128799
    dspark_target_layer_ids: tuple[int, ...] = (37, 38, 39)
    dspark_markov_rank: int = 256
    dspark_n_routed_experts: int = 128
    dspark_n_activated_experts: int = 3

    @property
    def vision_enabled(self) -> bool:
        return self.vision_n_layers > 0

    @property
    def vision_head_dim(self) -> int:
        return self.vision_dim // self.vision_n_heads

    @classmethod
    def from_dict(cls, config: dict, source: str = "config") -> "ModelArgs":
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(k for k in config if k not in fields)
        if unknown:
            raise BadInput(f"{source}: unknown DeepSeek V4.1 Flash config keys {unknown}")
        for k, v in config.items():
            _check_field(k, v, source)
        # JSON lists become tuples so the args stay hashable and frozen
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in config.items()}
        args = cls(**values)
        args._check_shape(source)
        return args

    def _check_shape(self, source: str) -> None:
        """What the fields must say together: the head split, the per-layer lists, the experts."""
        def bad(field: str, what: str):
            return BadInput(f"{source}: {field} = {getattr(self, field)!r} {what}")

        if self.vision_n_layers and (self.vision_dim % self.vision_n_heads or self.vision_dim // self.vision_n_heads % 2):
            raise bad("vision_dim", f"does not split into {self.vision_n_heads} heads of an even size (vision_n_heads)")
        if len(self.compress_ratios) < self.n_layers:
            raise bad("compress_ratios", f"has {len(self.compress_ratios)} entries; it needs one per layer "
                      f"(n_layers = {self.n_layers})")
        if self.n_activated_experts > self.n_routed_experts:
            raise bad("n_activated_experts", f"is more than the n_routed_experts = {self.n_routed_experts}")
        if self.rope_head_dim > self.head_dim or self.rope_head_dim % 2:
            raise bad("rope_head_dim", f"must be even and at most head_dim = {self.head_dim}")
        for field in ("kv_source_layers", "index_source_layers", "engram_layer_ids"):
            outside = [i for i in getattr(self, field) if i >= self.n_layers]
            if outside:
                raise bad(field, f"names layer {outside[0]}, but the model has n_layers = {self.n_layers}")

    @classmethod
    def from_dir(cls, checkpoint: str | Path) -> "ModelArgs":
        path = Path(checkpoint) / "config.json"
        if not path.is_file():
            raise BadInput(f"{path} is a directory, not the checkpoint's config file" if path.is_dir()
                           else f"{path} is missing: a DeepSeek V4.1 Flash checkpoint needs its config.json")
        try:
            config = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise BadInput(f"{path} is not readable JSON ({e})") from None
        if not isinstance(config, dict):
            raise BadInput(f"{path} must hold a JSON object")
        return cls.from_dict(config, str(path))


# Each field's admissible values, checked before any of them is used: (test, what it must be).
# Sizes and counts that size tensors or loops are integers >= 1; switches and ids may be 0; the
# floats are finite and > 0 where they divide or take a root or logarithm.
def _int(lo: int):
    return lambda v: type(v) is int and v >= lo, f"an integer >= {lo}"


def _num(lo_open: float | None = 0.0):
    """A finite JSON number (not a boolean), > lo_open (None: any)."""
    return (lambda v: type(v) in (int, float) and math.isfinite(v) and (lo_open is None or v > lo_open),
            "a finite number" + (f" > {lo_open:g}" if lo_open is not None else ""))


def _ints(lo: int):
    return lambda v: isinstance(v, list) and all(type(x) is int and x >= lo for x in v), f"a list of integers >= {lo}"


def _choice(*options: str):
    return lambda v: isinstance(v, str) and v in options, "one of " + ", ".join(json.dumps(o) for o in options)


def _or_none(rule):
    test, what = rule
    return lambda v: v is None or test(v), f"{what}, or null"


POSITIVE = ("max_batch_size", "max_seq_len", "vocab_size", "dim", "moe_inter_dim", "n_layers", "n_heads",
            "n_routed_experts", "n_activated_experts", "q_lora_rank", "head_dim", "rope_head_dim", "o_groups",
            "o_lora_rank", "window_size", "index_n_heads", "index_head_dim", "index_topk", "candidate_topk_blocks",
            "candidate_block_size", "hc_mult", "hc_sinkhorn_iters", "engram_max_ngram_size", "engram_vocab_size",
            "engram_n_heads", "engram_head_dim", "engram_compressed_vocab_size", "vision_dim", "vision_n_heads",
            "vision_inter_dim", "vision_patch_size", "vision_downsample_ratio", "vision_max_n_token",
            "vision_min_pixels", "beta_fast", "beta_slow")
NON_NEGATIVE = ("n_mtp_layers", "n_shared_experts", "original_seq_len", "vision_n_layers", "engram_pad_id",
                "image_token_id", "dspark_block_size", "dspark_noise_token_id", "dspark_markov_rank",
                "dspark_n_routed_experts", "dspark_n_activated_experts")
RULES: dict = {
    **{k: _int(1) for k in POSITIVE}, **{k: _int(0) for k in NON_NEGATIVE},
    "candidate_source_layer": (lambda v: type(v) is int, "an integer (< 0 turns candidate pre-filtering off)"),
    **{k: _num() for k in ("temperature", "gate_temp", "route_scale", "swiglu_limit", "norm_eps", "hc_eps",
                           "compress_rope_theta", "rope_theta", "rope_factor", "vision_rope_theta")},
    "norm_topk_prob": (lambda v: type(v) is bool, "true or false"),
    "dtype": _choice("bf16", "fp8"), "expert_dtype": _or_none(_choice("fp4")),
    "score_func": _choice("softmax", "sigmoid", "sqrtsoftplus"),
    **{k: _ints(0) for k in ("compress_ratios", "kv_source_layers", "index_source_layers", "engram_layer_ids",
                             "dspark_target_layer_ids")},
    "engram_num_embeddings": _ints(1),
    "vision_max_wh_ratio": _or_none(_int(1)),
}


def _check_field(name: str, value, source: str) -> None:
    test, what = RULES[name]
    if not test(value):
        shown = json.dumps(value) if isinstance(value, (int, float, str, bool, type(None))) else repr(value)[:80]
        raise BadInput(f"{source}: {name} must be {what}, not {shown}")
