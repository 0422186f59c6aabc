"""Synthetic DeepSeek V4.1 Flash checkpoints: official names, shapes and sharding, random values.

    resolve("synthetic:tiny") -> Path   # written into cache_root() on first use, then reused
    resolve("/path/to/checkpoint")      # checked: config, index, and every vision tensor present

Two configs: `full` is the released config (32 vision layers, 1024 wide, 16 heads, aligner into
5120); `tiny` keeps every code path (head_dim 64, so rope tables are [N, 32] as in full; 14 px
patches, 3x3 aligner, the same token budget) with small widths and two layers, so the real
preprocessing sizes run in seconds on a CPU.

Values: each unit (`vision.patch_embed`, `vision.blocks.N`, `vision.norm`, `aligner`,
`image_markers`) draws from a generator seeded by its own name (`tensordiff.models.synthetic.generator`),
at trained-like scales: fan-in scaled weights, residual outputs scaled down by sqrt(2 * layers),
small biases, norm weights near 1. Stored in bf16, as the released vision weights are.

`tiny-fp8` is `tiny` in the released storage (FP8 dense layers and Engram table with block scales,
FP4 routed experts in int8 tensors, `wo_a` FP8 with its block scale); `tiny-fp8-converted` the same
weights as the official `convert.py` leaves them (experts float4, `wo_a` bf16). `tiny` also holds the language backbone (`synthetic_language`, merged into the same
config and index); `full` holds the vision path only (tower, aligner, span markers).

Seeds: `synthetic:<size>-s<N>` (N >= 1, e.g. `synthetic:full-s2`) is the same config with the
vision path's units (tower, aligner, span markers) drawn from seed N instead of 0; the language
backbone of `tiny` keeps its one seeding. It asks whether a clean engine's profile measured on
one set of weights holds on another (`tensordiff calibrate`).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterator

from tensordiff.errors import BadInput
from tensordiff.format.checkpoint import INDEX, check_shard, weight_map as checkpoint_weight_map, write_index
from tensordiff.format.storage import read_safetensors_layout
from tensordiff.cache import cache_root, share
from tensordiff.models.synthetic import generator
from tensordiff.models.deepseek_v41_flash.synthetic_language import (
    SYNTH_VERSION, byte_tokenizer_compressed_vocab, language_config, language_tensors, quantised_config,
    release_layer_units,
)

MODEL = "deepseek-v4.1-flash"
VERSION = 1  # bump when the values or layout change: a new cache directory is written

# The released inference/config.json.
FULL: dict = {
    "vocab_size": 129280, "dim": 5120, "moe_inter_dim": 2304, "n_layers": 40, "n_mtp_layers": 3,
    "dspark_block_size": 5, "dspark_noise_token_id": 128799, "dspark_target_layer_ids": [37, 38, 39],
    "dspark_markov_rank": 256, "dspark_n_routed_experts": 128, "dspark_n_activated_experts": 3,
    "n_heads": 64, "n_routed_experts": 384, "n_shared_experts": 1, "n_activated_experts": 6,
    "score_func": "sqrtsoftplus", "route_scale": 1.5, "swiglu_limit": 10.0, "q_lora_rank": 1280,
    "head_dim": 512, "rope_head_dim": 64, "norm_eps": 1e-20, "o_groups": 8, "o_lora_rank": 1024,
    "window_size": 128, "kv_source_layers": [2, 8, 14, 20],
    "index_source_layers": [2, 8, 14, 20, 24, 28, 32, 36], "original_seq_len": 65536,
    "rope_theta": 10000, "rope_factor": 16, "beta_fast": 32, "beta_slow": 1, "index_n_heads": 32,
    "index_head_dim": 128, "index_topk": 512, "candidate_source_layer": 20,
    "candidate_topk_blocks": 2048, "candidate_block_size": 8, "hc_mult": 4, "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-06, "engram_layer_ids": [1, 14], "engram_vocab_size": 16000000,
    "engram_num_embeddings": [384006168, 384016682], "engram_max_ngram_size": 4, "engram_pad_id": 2,
    "engram_compressed_vocab_size": 99092, "dtype": "fp8", "expert_dtype": "fp4",
    "compress_rope_theta": 160000, "compress_ratios": [0, 0] + [2] * 18 + [1] * 20 + [0, 0, 0],
    "vision_n_layers": 32, "vision_dim": 1024, "vision_n_heads": 16, "vision_inter_dim": 2816,
    "vision_patch_size": 14, "vision_downsample_ratio": 3, "vision_max_n_token": 1024,
    "vision_min_pixels": 295936, "vision_max_wh_ratio": None, "image_token_id": 129264,
    "engram_n_heads": 8, "engram_head_dim": 256, "vision_rope_theta": 10000,
}

# Small widths and depth; the vision geometry (patch, ratio, budget, head_dim) is the released one.
# The language keys are the language backbone's small config, whose width is the aligner's output.
TINY_DIM = 64
TINY_VISION: dict = {"vision_n_layers": 2, "vision_dim": 128, "vision_n_heads": 2, "vision_inter_dim": 192}


def _tiny() -> dict:
    return {**FULL, **language_config(TINY_DIM), **TINY_VISION}


def _tiny_fp8() -> dict:
    return quantised_config(_tiny())


# `tiny-fp8` is `tiny` stored as the released shards are: FP8 dense layers and Engram table with
# their block scales, FP4 routed experts in int8 tensors, `wo_a` FP8 with its block scale;
# `tiny-fp8-converted` the same weights as the official `convert.py` leaves them (FP4 experts as
# float4, `wo_a` bf16). See `synthetic_language`.
CONFIGS: dict[str, Callable[[], dict]] = {"tiny": _tiny, "tiny-fp8": _tiny_fp8, "tiny-fp8-converted": _tiny_fp8,
                                          "full": lambda: dict(FULL)}


# --------------------------------------------------------------------------- names and shapes

def vision_units(cfg: dict) -> Iterator[tuple[str, dict[str, tuple[int, ...]]]]:
    """(unit, {tensor name: shape}) for every tensor of the vision path, in checkpoint order."""
    d, p, r = cfg["vision_dim"], cfg["vision_patch_size"], cfg["vision_downsample_ratio"]
    inter, out = cfg["vision_inter_dim"], cfg["dim"]
    yield "vision.patch_embed", {"vision.patch_embed.proj.weight": (d, 3 * p * p),
                                 "vision.patch_embed.proj.bias": (d,)}
    for i in range(cfg["vision_n_layers"]):
        b = f"vision.blocks.{i}"
        yield b, {f"{b}.norm1.weight": (d,), f"{b}.attn.wqkv.weight": (3 * d, d), f"{b}.attn.wqkv.bias": (3 * d,),
                  f"{b}.attn.wo.weight": (d, d), f"{b}.attn.wo.bias": (d,), f"{b}.norm2.weight": (d,),
                  f"{b}.mlp.w1.weight": (2 * inter, d), f"{b}.mlp.w2.weight": (d, inter)}
    yield "vision.norm", {"vision.norm.weight": (d,)}
    yield "aligner", {"aligner.w1.weight": (out, d * r * r), "aligner.w1.bias": (out,),
                      "aligner.w2.weight": (out, out), "aligner.w2.bias": (out,)}
    yield "image_markers", {"image_start": (out,), "image_end": (out,), "image_newline": (out,)}


def vision_tensor_names(cfg: dict) -> list[str]:
    return [n for _, tensors in vision_units(cfg) for n in tensors]


def _scale(name: str, shape: tuple[int, ...], cfg: dict) -> tuple[str, float]:
    """(kind, std) of a tensor: "norm" (1 + std * noise), "normal" (std * noise)."""
    if name.endswith(("norm1.weight", "norm2.weight", "norm.weight")):
        return "norm", 0.05
    if name.endswith(".bias") or name.startswith("image_"):
        return "normal", 0.02
    std = 1.0 / math.sqrt(shape[1])
    if name.endswith(("attn.wo.weight", "mlp.w2.weight")):  # residual writers: keep the stream tame
        std /= math.sqrt(2 * cfg["vision_n_layers"])
    return "normal", std


def _vision_values(cfg: dict, seed: int = 0) -> Iterator[tuple[str, dict]]:
    import torch

    for unit, tensors in vision_units(cfg):
        g = generator(f"{MODEL}:{unit}", seed)
        values = {}
        for name, shape in tensors.items():
            kind, std = _scale(name, shape, cfg)
            noise = torch.randn(shape, generator=g, dtype=torch.float32)
            t = 1.0 + std * noise if kind == "norm" else std * noise
            values[name] = t.to(torch.bfloat16)
        yield unit, values


def _language_values(cfg: dict, seed: int = 0, storage: str = "release") -> Iterator[tuple[str, dict]]:
    """The language backbone's tensors (its own seeding and scales), minus what the vision
    writer already holds (the span markers). Its seeding is its own: `seed` changes nothing here."""
    yield "language", language_tensors(cfg, skip=frozenset(vision_tensor_names(cfg)), storage=storage)


def _converted_language_values(cfg: dict, seed: int = 0) -> Iterator[tuple[str, dict]]:
    return _language_values(cfg, seed, storage="converted")


# `full-layers-IDS` (e.g. `full-layers-2`, `full-layers-0,2`): the released config stored as the
# release is, holding the vision path and, of the language backbone, only the layers IDS with the
# embedding, final norm and head: what a partial download holds, run with `--layers IDS`. About
# 7.3 GB a layer (384 FP4 experts) and 3.5 GB besides; the Engram layers (1, 14: 384M-row tables,
# about 100 GB each) are refused. The byte tokenizer of every synthetic checkpoint sets the compressed
# vocabulary size.
LAYERS_PREFIX = "full-layers-"


def _layer_ids(size: str) -> tuple[int, ...]:
    spec = size[len(LAYERS_PREFIX):]
    ids: set[int] = set()
    for piece in spec.split(","):
        first, dash, last = piece.partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise BadInput(f"synthetic:{size}: write the layers as ids and ranges, e.g. full-layers-2 or full-layers-0,2")
        ids.update(range(int(first), int(last if dash else first) + 1))
    bad = sorted(i for i in ids if not 0 <= i < FULL["n_layers"])
    if bad or not ids:
        raise BadInput(f"synthetic:{size}: layer {bad[0] if bad else spec} is not inside 0-{FULL['n_layers'] - 1}")
    engram = sorted(ids & set(FULL["engram_layer_ids"]))
    if engram:
        raise BadInput(f"synthetic:{size}: layer {engram[0]} holds an Engram table of "
                       f"{FULL['engram_num_embeddings'][FULL['engram_layer_ids'].index(engram[0])]:,} rows, too large "
                       "for a synthetic checkpoint; choose layers without one")
    return tuple(sorted(ids))


def _full_language() -> dict:
    return {**FULL, "engram_compressed_vocab_size": byte_tokenizer_compressed_vocab(FULL["vocab_size"])}


def _layers_writer(layers: tuple[int, ...]):
    def write(cfg: dict, seed: int = 0) -> Iterator[tuple[str, dict]]:
        yield from release_layer_units(cfg, layers)
    return write


# Units each size holds: `full` is the vision path only (the released language backbone is
# ~280B parameters); `tiny` holds the whole model.
UNIT_WRITERS: dict[str, list[Callable[[dict], Iterator[tuple[str, dict]]]]] = {
    "tiny": [_vision_values, _language_values], "tiny-fp8": [_vision_values, _language_values],
    "tiny-fp8-converted": [_vision_values, _converted_language_values], "full": [_vision_values]}

SHARD_BYTES = 512 << 20


# --------------------------------------------------------------------------- writing

def _write(target: Path, cfg: dict, writers, seed: int = 0) -> None:
    """Shards of whole units up to SHARD_BYTES, an index, and config.json, atomically. Each shard
    is written as soon as it is full (a real-dimensions checkpoint never sits in memory whole)."""
    from safetensors.torch import save_file

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        written: list[tuple[Path, dict[str, int]]] = []  # (file, {name: bytes})
        pending: dict = {}

        def flush(tensors: dict) -> None:
            f = tmp / f".shard-{len(written) + 1:05d}"
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(f), metadata={"format": "pt"})
            written.append((f, {k: v.numel() * v.element_size() for k, v in tensors.items()}))

        size = 0
        for writer in writers:
            for _unit, values in writer(cfg, seed):
                nbytes = sum(t.numel() * t.element_size() for t in values.values())
                if pending and size + nbytes > SHARD_BYTES:
                    flush(pending)
                    pending, size = {}, 0
                pending.update(values)
                size += nbytes
        if not written:  # always exercise the index: at least two shards
            names = list(pending)
            cut = max(1, len(names) // 2)
            flush({n: pending[n] for n in names[:cut]})
            pending = {n: pending[n] for n in names[cut:]}
        if pending:
            flush(pending)
        weight_map, total = {}, 0
        for i, (f, tensors) in enumerate(written, 1):
            fname = f"model-{i:05d}-of-{len(written):05d}.safetensors"
            os.rename(f, tmp / fname)
            weight_map.update(dict.fromkeys(tensors, fname))
            total += sum(tensors.values())
        write_index(tmp, weight_map, total)
        (tmp / "config.json").write_text(json.dumps(cfg, indent=4) + "\n")
        share(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / INDEX).is_file():  # someone else won the race only if they finished
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def split_seed(variant: str) -> tuple[str, int]:
    """"full-s2" -> ("full", 2); "full" -> ("full", 0). A size without a seed suffix is seed 0."""
    base, sep, tail = variant.rpartition("-s")
    if sep and base in CONFIGS and tail.isdigit() and int(tail) >= 1 and tail == str(int(tail)):
        return base, int(tail)
    return variant, 0


def synthetic_dir(size: str) -> Path:
    """The cached checkpoint for `size` ("tiny", "tiny-fp8", "full", each optionally with a
    seed suffix "-s<N>"), written on first use."""
    base, seed = split_seed(size)
    if base.startswith(LAYERS_PREFIX):
        cfg, writers = _full_language(), [_vision_values, _layers_writer(_layer_ids(base))]
    elif base not in CONFIGS:
        raise BadInput(f"unknown synthetic size {size!r} ({', '.join(CONFIGS)}, each optionally "
                       f"with a vision seed suffix such as -s2; or {LAYERS_PREFIX}IDS)")
    else:
        cfg, writers = CONFIGS[base](), UNIT_WRITERS[base]

    # the directory name changes with the config, either writer's version or the seed (seed 0
    # keeps the name it always had)
    text = f"{VERSION}:{SYNTH_VERSION}:{json.dumps(cfg, sort_keys=True)}" + (f":seed={seed}" if seed else "")
    key = hashlib.sha256(text.encode()).hexdigest()[:12]
    target = cache_root() / MODEL / f"synthetic-{size}-{key}"
    if not (target / INDEX).is_file():
        _write(target, cfg, writers, seed)
    return target


# --------------------------------------------------------------------------- resolving a SPEC

def check_checkpoint(path: Path) -> None:
    """A real checkpoint directory must have a config and every vision tensor in its index."""
    if not path.is_dir():
        raise BadInput(f"weights {path} is neither synthetic:tiny, synthetic:full nor a directory")
    config = path / "config.json"
    if not config.is_file():
        raise BadInput(f"{config} is a directory, not the checkpoint's config file" if config.is_dir()
                       else f"{path} has no config.json: not a DeepSeek V4.1 Flash checkpoint")
    try:
        cfg = json.loads(config.read_text())
    except ValueError as e:
        raise BadInput(f"{config} is not valid JSON ({e})") from None
    except OSError as e:
        raise BadInput(f"cannot read {config}: {e.strerror}") from None
    if not isinstance(cfg, dict):
        raise BadInput(f"{config} must hold a JSON object of config keys")
    depth = cfg.get("vision_n_layers")
    if type(depth) is not int or depth < 1:  # the names of the tensors to look for come from it
        raise BadInput(f"{config}: vision_n_layers must be an integer >= 1 (the vision tower's depth), "
                       f"not {json.dumps(depth)[:40]}" + (" (absent)" if "vision_n_layers" not in cfg else ""))
    merged = {**FULL, **cfg}
    weight_map = checkpoint_weight_map(path)
    needed = vision_tensor_names(merged)
    missing = [n for n in needed if n not in weight_map]
    if missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise BadInput(f"checkpoint {path} lacks {len(missing)} vision tensor(s): {shown}")
    check_shards(path, {weight_map[n] for n in needed}, {n: weight_map[n] for n in needed})


def check_shards(path: Path, shards: set[str], where: dict[str, str]) -> None:
    """The shards holding the tensors a run loads: safetensors files inside the checkpoint,
    whole (every header offset inside the file), holding what the index says. Only these
    shards' headers are read, never their data, and never another shard."""
    for shard in sorted(shards):
        f = check_shard(path, shard)
        keys, _ = read_safetensors_layout(f)  # BadInput naming the file if truncated or corrupt (any dtype)
        absent = [n for n, s in where.items() if s == shard and n not in keys]
        if absent:
            raise BadInput(f"{f}: the index places {absent[0]!r} here, but the shard has no such tensor "
                           f"({len(absent)} missing); the index and the shards disagree")


def resolve(spec: str) -> Path:
    """`synthetic:tiny` | `synthetic:full` | a checkpoint directory -> the directory to load."""
    if spec.startswith("synthetic:"):
        return synthetic_dir(spec.split(":", 1)[1])
    try:
        path = Path(spec).expanduser()
    except RuntimeError:  # ~name of no user on this machine
        raise BadInput(f"weights {spec!r}: {spec.split('/')[0]} is no user's home directory on this machine") from None
    check_checkpoint(path)
    return path
