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
        # JSON lists become tuples so the args stay hashable and frozen
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in config.items()}
        return cls(**values)

    @classmethod
    def from_dir(cls, checkpoint: str | Path) -> "ModelArgs":
        path = Path(checkpoint) / "config.json"
        if not path.is_file():
            raise BadInput(f"{path} is missing: a DeepSeek V4.1 Flash checkpoint needs its config.json")
        try:
            config = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise BadInput(f"{path} is not readable JSON ({e})") from None
        if not isinstance(config, dict):
            raise BadInput(f"{path} must hold a JSON object")
        return cls.from_dict(config, str(path))
