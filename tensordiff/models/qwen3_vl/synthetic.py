"""Synthetic Qwen3-VL checkpoints: official `model.visual.*` / `model.language_model.*` names, shapes,
shards and index.

Variants:
- `tiny`: merge 2, hidden 64, 4 blocks, DeepStack at [0, 1, 2], the real 48x48 position table,
  and an image budget of 64x64 .. 256x256 pixels (grids 4x4 .. 16x16 patches); a 4-layer text
  model (hidden 96, 4 heads, 2 KV heads, head dim 24, interleaved mrope_section [6, 3, 3]: three
  DeepStack injection layers and one clean one), untied LM head; seconds on a CPU.
- `full` (8B/32B tower: 27 blocks, hidden 1152, DeepStack [8, 16, 24], text width 4096) and
  `full-2b` (2B tower: 24 blocks, hidden 1024, DeepStack [5, 11, 17], text width 2048), with the
  checkpoint's image budget (shortest_edge 65536, longest_edge 16777216).

Each unit (`model.visual.blocks.3`, `model.visual.merger`, ...) draws from a generator seeded by
its own name, tensors in sorted-name order, so a unit never depends on which others exist.
Stored in bfloat16, as the released checkpoints are. The text model (`model.language_model.*`,
`lm_head`) is written for `tiny` and `full-2b` (`"language": True`); `full` (8B text, 16 GB) keeps
the vision tower only.

`full-2b` has Qwen3-VL-2B-Instruct's published dimensions, checked against transformers 5.17.0's
`Qwen3VLTextConfig` fields and the published config.json: text hidden 2048, 28 layers, 16 heads,
8 KV heads, head dim 128, intermediate 6144, vocab 151936, rms_norm_eps 1e-6, rope_theta 5e6,
mrope_section [24, 20, 20] interleaved, max_position_embeddings 262144, tie_word_embeddings true
(no `lm_head.weight` stored: the head is the embedding table); vision depth 24, hidden 1024,
DeepStack [5, 11, 17], out_hidden 2048.

Seeds: `<variant>-s<N>` (N >= 1, e.g. `synthetic:full-s2`) is the same variant with every unit
drawn from seed N instead of 0 (the plain name): does a clean engine's profile hold on other
weights (`tensordiff calibrate`)?
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from tensordiff.cache import cache_root, share
from tensordiff.models.synthetic import generator
from tensordiff.errors import BadInput
from tensordiff.format.checkpoint import INDEX, write_index

SCHEMA = 2  # bump when the layout or the initialisation changes: the cache key changes with it

VARIANTS: dict[str, dict] = {
    "tiny": {
        "vision": dict(depth=4, hidden_size=64, num_heads=4, intermediate_size=128, out_hidden_size=96,
                       deepstack_visual_indexes=[0, 1, 2], num_position_embeddings=2304),
        "text": dict(hidden_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=24, intermediate_size=192, mrope_section=[6, 3, 3]),
        "language": True, "tie": False,
        "pixels": (64 * 64, 256 * 256),
        "shard_bytes": 1 << 30,
    },
    "full": {
        "vision": dict(depth=27, hidden_size=1152, num_heads=16, intermediate_size=4304, out_hidden_size=4096,
                       deepstack_visual_indexes=[8, 16, 24], num_position_embeddings=2304),
        "text": dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, intermediate_size=12288, mrope_section=[24, 20, 20]),
        "language": False, "tie": False,
        "pixels": (65536, 16777216),
        "shard_bytes": 400 << 20,
    },
    "full-2b": {
        "vision": dict(depth=24, hidden_size=1024, num_heads=16, intermediate_size=4096, out_hidden_size=2048,
                       deepstack_visual_indexes=[5, 11, 17], num_position_embeddings=2304),
        "text": dict(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                     head_dim=128, intermediate_size=6144, mrope_section=[24, 20, 20]),
        "language": True, "tie": True,
        "pixels": (65536, 16777216),
        "shard_bytes": 400 << 20,
    },
}

VISION_COMMON = dict(hidden_act="gelu_pytorch_tanh", in_channels=3, patch_size=16, spatial_merge_size=2,
                     temporal_patch_size=2, initializer_range=0.02, model_type="qwen3_vl")


def split_seed(variant: str) -> tuple[str, int]:
    """"full-s2" -> ("full", 2); "full" -> ("full", 0)."""
    base, sep, tail = variant.rpartition("-s")
    if sep and base in VARIANTS and tail.isdigit() and int(tail) >= 1 and tail == str(int(tail)):
        return base, int(tail)
    return variant, 0


def config_json(variant: str) -> dict:
    v = VARIANTS[split_seed(variant)[0]]
    t = dict(v["text"])
    mrope = t.pop("mrope_section")
    return {
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "model_type": "qwen3_vl",
        "image_token_id": 151655,
        "video_token_id": 151656,
        "vision_start_token_id": 151652,
        "vision_end_token_id": 151653,
        "tie_word_embeddings": v["tie"],
        "dtype": "bfloat16",
        "vision_config": {**VISION_COMMON, **v["vision"]},
        "text_config": {
            "model_type": "qwen3_vl_text", "vocab_size": 151936, "hidden_act": "silu",
            "max_position_embeddings": 262144, "rms_norm_eps": 1e-6, "attention_bias": False,
            "dtype": "bfloat16", "tie_word_embeddings": v["tie"],
            "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0,
                                "mrope_section": mrope, "mrope_interleaved": True},
            **t,
        },
        "synthetic": {"variant": variant, "schema": SCHEMA},
    }


def preprocessor_json(variant: str) -> dict:
    lo, hi = VARIANTS[split_seed(variant)[0]]["pixels"]
    return {
        "size": {"shortest_edge": lo, "longest_edge": hi},
        "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True, "do_convert_rgb": True,
        "resample": 3,
        "image_processor_type": "Qwen2VLImageProcessorFast",
        "processor_class": "Qwen3VLProcessor",
    }


def unit_shapes(vc: dict) -> dict[str, dict[str, tuple[int, ...]]]:
    """unit name -> {tensor name: shape}, in the official layout."""
    h, f, o = vc["hidden_size"], vc["intermediate_size"], vc["out_hidden_size"]
    p, t, c, m = vc["patch_size"], vc["temporal_patch_size"], vc["in_channels"], vc["spatial_merge_size"]
    hm = h * m * m
    pre = "model.visual"
    units: dict[str, dict[str, tuple[int, ...]]] = {
        f"{pre}.patch_embed": {f"{pre}.patch_embed.proj.weight": (h, c, t, p, p), f"{pre}.patch_embed.proj.bias": (h,)},
        f"{pre}.pos_embed": {f"{pre}.pos_embed.weight": (vc["num_position_embeddings"], h)},
    }
    for i in range(vc["depth"]):
        b = f"{pre}.blocks.{i}"
        units[b] = {
            f"{b}.norm1.weight": (h,), f"{b}.norm1.bias": (h,), f"{b}.norm2.weight": (h,), f"{b}.norm2.bias": (h,),
            f"{b}.attn.qkv.weight": (3 * h, h), f"{b}.attn.qkv.bias": (3 * h,),
            f"{b}.attn.proj.weight": (h, h), f"{b}.attn.proj.bias": (h,),
            f"{b}.mlp.linear_fc1.weight": (f, h), f"{b}.mlp.linear_fc1.bias": (f,),
            f"{b}.mlp.linear_fc2.weight": (h, f), f"{b}.mlp.linear_fc2.bias": (h,),
        }

    def merger(name: str, norm: int) -> dict[str, tuple[int, ...]]:
        return {f"{name}.norm.weight": (norm,), f"{name}.norm.bias": (norm,),
                f"{name}.linear_fc1.weight": (hm, hm), f"{name}.linear_fc1.bias": (hm,),
                f"{name}.linear_fc2.weight": (o, hm), f"{name}.linear_fc2.bias": (o,)}

    units[f"{pre}.merger"] = merger(f"{pre}.merger", h)
    for k in range(len(vc["deepstack_visual_indexes"])):
        units[f"{pre}.deepstack_merger_list.{k}"] = merger(f"{pre}.deepstack_merger_list.{k}", hm)
    return units


def text_unit_shapes(tc: dict, tie: bool) -> dict[str, dict[str, tuple[int, ...]]]:
    """The text model's units in the official layout (`model.language_model.*`, `lm_head`)."""
    d, f, v = tc["hidden_size"], tc["intermediate_size"], tc["vocab_size"]
    hd, nq, nkv = tc["head_dim"], tc["num_attention_heads"], tc["num_key_value_heads"]
    pre = "model.language_model"
    units: dict[str, dict[str, tuple[int, ...]]] = {f"{pre}.embed_tokens": {f"{pre}.embed_tokens.weight": (v, d)}}
    for i in range(tc["num_hidden_layers"]):
        p = f"{pre}.layers.{i}"
        units[p] = {f"{p}.input_layernorm.weight": (d,), f"{p}.post_attention_layernorm.weight": (d,),
                    f"{p}.self_attn.q_proj.weight": (nq * hd, d), f"{p}.self_attn.k_proj.weight": (nkv * hd, d),
                    f"{p}.self_attn.v_proj.weight": (nkv * hd, d), f"{p}.self_attn.o_proj.weight": (d, nq * hd),
                    f"{p}.self_attn.q_norm.weight": (hd,), f"{p}.self_attn.k_norm.weight": (hd,),
                    f"{p}.mlp.gate_proj.weight": (f, d), f"{p}.mlp.up_proj.weight": (f, d),
                    f"{p}.mlp.down_proj.weight": (d, f)}
    units[f"{pre}.norm"] = {f"{pre}.norm.weight": (d,)}
    if not tie:
        units["lm_head"] = {"lm_head.weight": (v, d)}
    return units


def all_unit_shapes(variant: str) -> dict[str, dict[str, tuple[int, ...]]]:
    cfg = config_json(variant)
    base = split_seed(variant)[0]
    units = unit_shapes(cfg["vision_config"])
    if VARIANTS[base]["language"]:
        units.update(text_unit_shapes(cfg["text_config"], VARIANTS[base]["tie"]))
    return units


def _init(name: str, shape: tuple[int, ...], g):
    import torch

    leaf = name.rsplit(".", 2)
    if name.endswith("pos_embed.weight"):
        return torch.randn(shape, generator=g) * 0.5
    if name.endswith("embed_tokens.weight"):
        return torch.randn(shape, generator=g)
    if "norm" in leaf[-2]:
        if name.endswith("weight"):
            return 1.0 + 0.1 * torch.randn(shape, generator=g)
        return 0.05 * torch.randn(shape, generator=g)
    if name.endswith("bias"):
        return 0.02 * torch.randn(shape, generator=g)
    fan_in = 1
    for d in shape[1:]:
        fan_in *= d
    return torch.randn(shape, generator=g) / fan_in ** 0.5


def build_tensors(variant: str):
    """Yields (name, bf16 tensor) unit by unit."""
    import torch

    seed = split_seed(variant)[1]
    for unit, tensors in all_unit_shapes(variant).items():
        g = generator(unit, seed)
        for name in sorted(tensors):
            yield name, _init(name, tensors[name], g).to(torch.bfloat16)


def checkpoint_dir(variant: str) -> Path:
    return cache_root() / "qwen3-vl" / f"synthetic-{variant}-s{SCHEMA}"


def ensure(variant: str) -> Path:
    """The cached checkpoint directory for `variant`, written on first use (atomically)."""
    if split_seed(variant)[0] not in VARIANTS:
        raise BadInput(f"unknown synthetic Qwen3-VL variant {variant!r} (known: {', '.join(VARIANTS)}; "
                       "each optionally with a seed suffix such as -s2)")
    out = checkpoint_dir(variant)
    if (out / INDEX).exists():
        return out
    from safetensors.torch import save_file

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        shards: list[dict] = [{}]
        size = 0
        limit = VARIANTS[split_seed(variant)[0]]["shard_bytes"]
        for name, t in build_tensors(variant):
            nbytes = t.numel() * t.element_size()
            if size and size + nbytes > limit:
                shards.append({})
                size = 0
            shards[-1][name] = t
            size += nbytes
        weight_map, total = {}, 0
        for i, shard in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(tmp / fname), metadata={"format": "pt"})
            for name, t in shard.items():
                weight_map[name] = fname
                total += t.numel() * t.element_size()
        write_index(tmp, weight_map, total)
        (tmp / "config.json").write_text(json.dumps(config_json(variant), indent=1) + "\n")
        (tmp / "preprocessor_config.json").write_text(json.dumps(preprocessor_json(variant), indent=1) + "\n")
        share(tmp)  # mkdtemp makes it private and safetensors' files 0600; a shared cache must stay readable
        try:
            os.rename(tmp, out)
        except OSError:  # another process wrote it first
            if not (out / INDEX).exists():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
