"""Synthetic DeepSeek V4.1 Flash language weights: official names and shapes, each tensor
seeded from its own name (so `layers.3.ffn.experts.5.w1.weight` is the same numbers in every
config that has it with that shape).

Two ways in:
- `language_config(dim)` + `language_tensors(config)`: the vision writer merges these into its
  own checkpoint (one `config.json`, one index), so a `synthetic:tiny` directory holds both.
- `write_checkpoint(path, config)`: a language-only directory (tests that feed a fixed aligner
  output instead of running the tower).

Storage: matrices bf16; fp32 where the official module declares fp32 (`attn_sink`, gate `bias` /
`bias_vl`, the `hc_*` mixes). The released FP4 experts / FP8 dense layers are out of scope.
"""
from __future__ import annotations

import json
from pathlib import Path

from . import generator, share

TINY_VOCAB = 512
SYNTH_VERSION = 3  # bump when `synth` changes, so cached checkpoints are rewritten


def _is_prime(n: int) -> bool:
    if n < 2 or n % 2 == 0:
        return n == 2
    f = 3
    while f * f <= n:
        if n % f == 0:
            return False
        f += 2
    return True


def engram_table_rows(layer_ids, max_ngram: int, n_heads: int, vocab_start: int) -> list[int]:
    """Rows of each engram layer's table: the sum of its (n-gram size, head) prime buckets,
    primes drawn in order above `vocab_start - 1` and never reused (as the official layout)."""
    seen: set[int] = set()
    rows = []
    for _ in layer_ids:
        total = 0
        for _ in range(max_ngram - 1):
            cur = vocab_start - 1
            for _ in range(n_heads):
                cur += 1
                while cur in seen or not _is_prime(cur):
                    cur += 1
                seen.add(cur)
                total += cur
        rows.append(total)
    return rows


def byte_tokenizer_compressed_vocab(vocab_size: int) -> int:
    """Compressed size of the synthetic byte tokenizer: 26 upper-case letters fold onto lower
    case and tab / CR / LF onto space (see `oracle/deepseek_v41_flash/tokens.py`)."""
    return vocab_size - 26 - 3


def language_config(dim: int = 64, *, vision: bool = True) -> dict:
    """A small config that still has every mechanism: 6 layers (window-only, ratio-2 with a KV
    source and a reuser, ratio-1 with an own and a shared-key indexer), 8 experts top-2, Engram at
    layers 1 and 3, YaRN on the compressed layers, a window of 8 so prompts outgrow it."""
    layer_ids = [1, 3]
    cfg = {
        "max_seq_len": 2048, "dtype": "bf16", "expert_dtype": None,
        "vocab_size": TINY_VOCAB, "image_token_id": 500,
        "dim": dim, "moe_inter_dim": 32, "n_layers": 6, "n_mtp_layers": 0, "n_heads": 4,
        "n_routed_experts": 8, "n_shared_experts": 1, "n_activated_experts": 2,
        "score_func": "sqrtsoftplus", "route_scale": 1.5, "swiglu_limit": 10.0,
        "q_lora_rank": 32, "head_dim": 32, "rope_head_dim": 8, "norm_eps": 1e-20,
        "o_groups": 2, "o_lora_rank": 16, "window_size": 8,
        "compress_ratios": [0, 0, 2, 2, 1, 1], "kv_source_layers": [2, 4], "index_source_layers": [2, 4, 5],
        "compress_rope_theta": 160000.0, "original_seq_len": 32, "rope_theta": 10000.0, "rope_factor": 4.0,
        "beta_fast": 32, "beta_slow": 1,
        "index_n_heads": 8, "index_head_dim": 32, "index_topk": 4,
        "candidate_source_layer": 4, "candidate_topk_blocks": 2, "candidate_block_size": 4,
        "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6,
        "engram_layer_ids": layer_ids, "engram_max_ngram_size": 4, "engram_vocab_size": 64,
        "engram_n_heads": 2, "engram_head_dim": 16, "engram_pad_id": 2,
        "engram_compressed_vocab_size": byte_tokenizer_compressed_vocab(TINY_VOCAB),
        "engram_num_embeddings": engram_table_rows(layer_ids, 4, 2, 64),
        "dspark_block_size": 0, "dspark_target_layer_ids": [], "dspark_n_routed_experts": 0,
        "dspark_n_activated_experts": 0,
    }
    if not vision:
        cfg["vision_n_layers"] = 0
    return cfg


def language_shapes(cfg: dict) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every language tensor: name -> (shape, storage dtype name)."""
    d, hc, E = cfg["dim"], cfg["hc_mult"], cfg["n_routed_experts"]
    H, hd, inter = cfg["n_heads"], cfg["head_dim"], cfg["moe_inter_dim"]
    mix = (2 + hc) * hc
    bf, f32 = "bfloat16", "float32"
    out: dict[str, tuple[tuple[int, ...], str]] = {"embed.weight": ((cfg["vocab_size"], d), bf)}
    vision = cfg.get("vision_n_layers", 32) > 0
    if vision:
        for n in ("image_start", "image_end", "image_newline"):
            out[n] = ((d,), bf)
    engram_ids = list(cfg["engram_layer_ids"])
    for i in range(cfg["n_layers"]):
        p = f"layers.{i}."
        ratio = cfg["compress_ratios"][i]
        out[p + "attn_norm.weight"] = ((d,), bf)
        out[p + "ffn_norm.weight"] = ((d,), bf)
        for sub in ("attn", "ffn"):
            out[p + f"hc_{sub}_fn"] = ((mix, hc * d), f32)
            out[p + f"hc_{sub}_base"] = ((mix,), f32)
            out[p + f"hc_{sub}_scale"] = ((3,), f32)
        a = p + "attn."
        out[a + "attn_sink"] = ((H,), f32)
        out[a + "wq_a.weight"] = ((cfg["q_lora_rank"], d), bf)
        out[a + "q_norm.weight"] = ((cfg["q_lora_rank"],), bf)
        out[a + "wq_b.weight"] = ((H * hd, cfg["q_lora_rank"]), bf)
        out[a + "wkv.weight"] = ((hd, d), bf)
        out[a + "kv_norm.weight"] = ((hd,), bf)
        out[a + "wo_a.weight"] = ((cfg["o_groups"] * cfg["o_lora_rank"], H * hd // cfg["o_groups"]), bf)
        out[a + "wo_b.weight"] = ((d, cfg["o_groups"] * cfg["o_lora_rank"]), bf)
        if i in cfg["kv_source_layers"]:
            out[a + "compressor.wkv.weight"] = ((hd, d), bf)
            out[a + "compressor.norm.weight"] = ((hd,), bf)
            if ratio > 1:
                out[a + "compressor.wgate.weight"] = ((hd, d), bf)
        if i in cfg["index_source_layers"]:
            ih, ihd = cfg["index_n_heads"], cfg["index_head_dim"]
            out[a + "indexer.wq_b.weight"] = ((ih * ihd, cfg["q_lora_rank"]), bf)
            out[a + "indexer.weights_proj.weight"] = ((ih, d), bf)
            if i in cfg["kv_source_layers"]:
                out[a + "indexer.wk.weight"] = ((ihd, hd), bf)
                out[a + "indexer.k_norm.weight"] = ((ihd,), bf)
        f = p + "ffn."
        out[f + "gate.weight"] = ((E, d), bf)
        out[f + "gate.bias"] = ((E,), f32)
        if vision:
            out[f + "gate.bias_vl"] = ((E,), f32)
        for e in [f"experts.{j}." for j in range(E)] + ["shared_experts."]:
            out[f + e + "w1.weight"] = ((inter, d), bf)
            out[f + e + "w3.weight"] = ((inter, d), bf)
            out[f + e + "w2.weight"] = ((d, inter), bf)
        if i in engram_ids:
            g = p + "engram."
            k = engram_ids.index(i)
            cols = (cfg["engram_max_ngram_size"] - 1) * cfg["engram_n_heads"]
            out[g + "embed.weight"] = ((cfg["engram_num_embeddings"][k], cfg["engram_head_dim"]), bf)
            out[g + "wkv.weight"] = ((d * (hc + 1), cols * cfg["engram_head_dim"]), bf)
            out[g + "q_weight"] = ((hc, d), bf)
            out[g + "k_weight"] = ((hc, d), bf)
    out["norm.weight"] = ((d,), bf)
    out["head.weight"] = ((cfg["vocab_size"], d), bf)
    return out


def synth(name: str, shape: tuple[int, ...], dtype: str):
    """One tensor from its own name: scales chosen so every mechanism is live (biases move the
    router's choice, the hc mixes are far from uniform, gates sit away from 0 and 1)."""
    import torch

    g = generator(name)
    leaf = name.rsplit(".", 1)[-1]
    if leaf in ("bias", "bias_vl"):
        t = (torch.rand(shape, generator=g) - 0.5) * 0.6
    elif leaf in ("q_weight", "k_weight") or (name.endswith("norm.weight") or leaf.endswith("_scale")):
        t = 1 + 0.1 * torch.randn(shape, generator=g)
    elif leaf.endswith("_base"):
        t = 0.5 * torch.randn(shape, generator=g)
    elif leaf == "attn_sink" or name in ("embed.weight", "image_start", "image_end", "image_newline") \
            or name.endswith("engram.embed.weight"):
        t = torch.randn(shape, generator=g)
    else:  # a projection [out, in]
        t = torch.randn(shape, generator=g) / shape[-1] ** 0.5
    return t.to(getattr(torch, dtype))


def language_tensors(cfg: dict, skip: set[str] | frozenset[str] = frozenset()) -> dict:
    return {n: synth(n, shape, dt) for n, (shape, dt) in language_shapes(cfg).items() if n not in skip}


def write_checkpoint(path: Path, cfg: dict) -> Path:
    """A language-only checkpoint: config.json, one shard and its index (atomic rename)."""
    import os
    import tempfile

    from safetensors.torch import save_file

    path = Path(path)
    if (path / "model.safetensors.index.json").is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    tensors = language_tensors(cfg)
    shard = "model-00001-of-00001.safetensors"
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / shard))
    (tmp / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    (tmp / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {k: shard for k in tensors}}, indent=1) + "\n")
    share(tmp)
    try:
        os.rename(tmp, path)
    except OSError:  # another process wrote it first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return path


def tiny_language_checkpoint(dim: int = 64) -> Path:
    """The cached language-only tiny checkpoint (tests)."""
    import hashlib

    from . import cache_root

    cfg = language_config(dim)
    key = hashlib.sha256(f"{SYNTH_VERSION}:{json.dumps(cfg, sort_keys=True)}".encode()).hexdigest()[:12]
    return write_checkpoint(cache_root() / f"deepseek-v41-flash-language-tiny-{key}", cfg)


# Beyond this many language parameters a synthetic checkpoint leaves the language backbone out
# (the released shapes are ~280B parameters: nothing to write to a cache or run on a CPU).
MAX_LANGUAGE_PARAMS = 200_000_000


def language_units(cfg: dict):
    """(unit, {name: tensor}) in checkpoint order, for the whole-model writer's `UNIT_WRITERS`.
    The image markers (`image_start` / `image_end` / `image_newline`) are the vision writer's."""
    shapes = language_shapes(cfg)
    if sum(_numel(s) for s, _ in shapes.values()) > MAX_LANGUAGE_PARAMS:
        return
    units: dict[str, dict] = {}
    for name, (shape, dt) in shapes.items():
        if name.startswith("image_"):
            continue
        parts = name.split(".")
        if parts[0] == "layers":
            # one unit per expert, per sublayer, per engram table: whole units never split shards
            depth = 5 if parts[2] == "ffn" and parts[3] == "experts" else 3
            unit = ".".join(parts[:depth])
        else:
            unit = parts[0]
        units.setdefault(unit, {})[name] = synth(name, shape, dt)
    yield from units.items()


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
