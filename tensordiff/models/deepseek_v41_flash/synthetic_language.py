"""Synthetic DeepSeek V4.1 Flash language weights: official names and shapes, each tensor
seeded from its own name (so `layers.3.ffn.experts.5.w1.weight` is the same numbers in every
config that has it with that shape).

Two ways in:
- `language_config(dim)` + `language_tensors(config)`: the vision writer merges these into its
  own checkpoint (one `config.json`, one index), so a `synthetic:tiny` directory holds both.
- `write_checkpoint(path, config)`: a language-only directory (tests that feed a fixed aligner
  output instead of running the tower).

Storage follows the config's `dtype` / `expert_dtype`, as the released checkpoint stores it
(the official `inference/model.py` builds its `Linear`s from them):
- `dtype: "bf16"` (the small default): matrices bf16; fp32 where the official module declares
  fp32 (`attn_sink`, gate `bias` / `bias_vl`, the `hc_*` mixes); the Engram table bf16 too (an
  extension: the official code only reads an FP8 table).
- `dtype: "fp8"`: the dense projections that the official code builds as FP8 `Linear`s (attention
  `wq_a`, `wq_b`, `wkv`, `wo_b`; indexer `wq_b`; shared experts; Engram `wkv`) are stored
  float8_e4m3fn with a float8_e8m0fnu `<module>.scale` per 32x32 block; the Engram table
  `engram.embed.weight` float8_e4m3fn with `engram.embed.scale` per row and 32 columns. The rest
  stays bf16 / fp32 as above (`wo_a`, `weights_proj`, indexer `wk`, the compressor, the gate).
- `expert_dtype: "fp4"`: routed experts' `w1` / `w2` / `w3` packed FP4 (two e2m1 codes a byte,
  the even element in the low nibble, [out, in/2] bytes) with a float8_e8m0fnu scale per row and
  32 inputs; with `expert_dtype: null` they follow `dtype`.
Two storages of a quantised config (`STORAGES`):
- `release`, as the released shards store it: the FP4 experts in tensors of safetensors dtype
  int8 (I8), and `wo_a` float8_e4m3fn with a float8_e8m0fnu `attn.wo_a.scale` per 32x32 block;
- `converted`, what the official `convert.py` makes of it: the experts float4_e2m1fn_x2 (F4) and
  `wo_a` bf16 (each block times its scale in fp32, then bf16; no scale).
Quantised values are the bf16 master's, each 32-block first given its own power-of-two gain so
that the block scales differ (a transposed or ignored scale changes the numbers).
"""
from __future__ import annotations

import json
from pathlib import Path

from tensordiff.models.synthetic import generator
from tensordiff.cache import cache_root, share

TINY_VOCAB = 512
SYNTH_VERSION = 4  # bump when `synth` changes, so cached checkpoints are rewritten


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


# Dense projections the official model builds with the default (config `dtype`) Linear dtype;
# `wo_a`, `weights_proj`, the indexer's `wk`, the compressor and the gate declare their own.
FP8_LINEARS = ("attn.wq_a", "attn.wq_b", "attn.wkv", "attn.wo_b", "attn.indexer.wq_b", "engram.wkv",
               "ffn.shared_experts.w1", "ffn.shared_experts.w2", "ffn.shared_experts.w3")
QUANT_BLOCK = 32  # the official fp8_block_size / fp4_block_size
FP8_MAX, FP4_MAX = 448.0, 6.0


def storage_format(cfg: dict, name: str) -> str | None:
    """"fp8" (block-scaled e4m3 matrix), "fp8-rows" (the Engram table: e4m3, a scale per row and
    32 columns), "fp4" (e2m1 packed, a scale per row and 32 inputs) or None (stored as is)."""
    parts = name.split(".")
    if parts[0] != "layers" or not name.endswith(".weight"):
        return None
    sub = ".".join(parts[2:-1])  # layers.N.<sub>.weight
    dense = "fp8" if cfg.get("dtype") == "fp8" else None
    if sub == "engram.embed":
        return "fp8-rows" if dense else None
    if sub.startswith("ffn.experts."):
        return "fp4" if cfg.get("expert_dtype") == "fp4" else dense
    return dense if sub in FP8_LINEARS else None


def _pow2_ceil(v):
    """2^ceil(log2 v), v > 0 (the ue8m0 scale of a block)."""
    import torch

    m, e = torch.frexp(v)
    return torch.ldexp(torch.ones_like(v), torch.where(m == 0.5, e - 1, e))


def _block_gains(name: str, rows: int, cols: int, block_rows: int):
    """A power-of-two gain per block (2^-1, 1 or 2, renormalised), seeded by the tensor's name."""
    import torch

    g = generator(name + ":block-gain")
    nb_r, nb_c = -(-rows // block_rows), -(-cols // QUANT_BLOCK)
    k = torch.randint(-1, 2, (nb_r, nb_c), generator=g).float()
    gain = torch.exp2(k) / 1.75 ** 0.5
    return gain.repeat_interleave(block_rows, 0)[:rows].repeat_interleave(QUANT_BLOCK, 1)[:, :cols]


E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _e2m1_codes(v):
    """fp32 in [-6, 6] -> 4-bit codes (bit 3 the sign): nearest grid value; a value exactly halfway
    goes to the even code (round-half-even, as the hardware conversion)."""
    import torch

    grid = torch.tensor(E2M1_GRID)
    mids = (grid[1:] + grid[:-1]) / 2
    up_on_tie = torch.arange(1, 8) % 2 == 0  # crossing mid i lands on code i + 1
    a = v.abs().unsqueeze(-1)
    code = (a > mids).sum(-1) + ((a == mids) & up_on_tie).sum(-1)
    return code.to(torch.uint8) | (torch.signbit(v).to(torch.uint8) << 3)


def quantise(fmt: str, name: str, w) -> dict:
    """{name: stored weight, scale name: float8_e8m0fnu scale} for a master weight `w` [out, in]."""
    import torch

    rows, cols = w.shape
    if cols % QUANT_BLOCK:
        raise ValueError(f"{name}: {cols} inputs is not a multiple of the {QUANT_BLOCK}-wide quantisation block")
    block_rows = QUANT_BLOCK if fmt == "fp8" else 1
    w = w.float() * _block_gains(name, rows, cols, block_rows)
    nb_r = -(-rows // block_rows)
    padded = torch.zeros(nb_r * block_rows, cols)
    padded[:rows] = w
    blocks = padded.view(nb_r, block_rows, cols // QUANT_BLOCK, QUANT_BLOCK)
    amax = blocks.abs().amax(dim=(1, 3)).clamp_min(1e-30)  # [nb_r, nb_c]
    top = FP4_MAX if fmt == "fp4" else FP8_MAX
    scale = _pow2_ceil(amax / top)
    full = scale.repeat_interleave(block_rows, 0)[:rows].repeat_interleave(QUANT_BLOCK, 1)
    v = (w / full).clamp(-top, top)
    if fmt == "fp4":
        codes = _e2m1_codes(v)
        stored = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous().view(torch.float4_e2m1fn_x2)
    else:
        stored = v.to(torch.float8_e4m3fn)
    base = name[: -len(".weight")]
    return {name: stored, base + ".scale": scale.to(torch.float8_e8m0fnu)}


STORAGES = ("release", "converted")


def _is_wo_a(name: str) -> bool:
    return name.startswith("layers.") and name.endswith(".attn.wo_a.weight")


def _fp8_blocks_to_bf16(w, s):
    """What `convert.py` makes of an FP8 weight with 32x32 block scales: bf16 of the fp32 products."""
    import torch

    full = s.float().repeat_interleave(QUANT_BLOCK, 0)[: w.shape[0]].repeat_interleave(QUANT_BLOCK, 1)[:, : w.shape[1]]
    return (w.float() * full).to(torch.bfloat16)


def stored_tensors(cfg: dict, name: str, shape: tuple[int, ...], dtype: str, storage: str = "release") -> dict:
    """The tensor(s) a checkpoint stores for one logical weight: itself, or a quantised weight and
    its scale, in `storage` (see the module docstring)."""
    import torch

    if storage not in STORAGES:
        raise ValueError(f"storage {storage!r} is not one of {STORAGES}")
    fmt = storage_format(cfg, name)
    master = synth(name, shape, dtype)
    if fmt is None and _is_wo_a(name) and cfg.get("dtype") == "fp8":
        q = quantise("fp8", name, master)  # the release's FP8 wo_a and its block scale
        if storage == "converted":
            return {name: _fp8_blocks_to_bf16(q[name], q[name[: -len("weight")] + "scale"])}
        return q
    if fmt is None:
        return {name: master}
    q = quantise(fmt, name, master)
    if fmt == "fp4" and storage == "release":
        q[name] = q[name].view(torch.int8)  # the same bytes, safetensors dtype I8
    return q


def language_tensors(cfg: dict, skip: set[str] | frozenset[str] = frozenset(), storage: str = "release") -> dict:
    out = {}
    for n, (shape, dt) in language_shapes(cfg).items():
        if n not in skip:
            out.update(stored_tensors(cfg, n, shape, dt, storage))
    return out


def write_checkpoint(path: Path, cfg: dict, storage: str = "release") -> Path:
    """A language-only checkpoint: config.json, one shard and its index (atomic rename)."""
    import os
    import tempfile

    from safetensors.torch import save_file

    path = Path(path)
    if (path / "model.safetensors.index.json").is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    tensors = language_tensors(cfg, storage=storage)
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


# The released checkpoint's storage: FP8 dense layers and Engram table, FP4 routed experts. The
# Engram head grows to one 32-wide quantisation block.
QUANTISED = {"dtype": "fp8", "expert_dtype": "fp4", "engram_head_dim": 32}


def quantised_config(cfg: dict) -> dict:
    return {**cfg, **QUANTISED}


def tiny_language_checkpoint(dim: int = 64, quantised: bool = False, storage: str = "release") -> Path:
    """The cached language-only tiny checkpoint (tests); `quantised`: FP8 / FP4 as the release
    stores it (`storage` "release") or as `convert.py` leaves it ("converted")."""
    import hashlib


    cfg = language_config(dim)
    if quantised:
        cfg = quantised_config(cfg)
    key = hashlib.sha256(f"{SYNTH_VERSION}:{json.dumps(cfg, sort_keys=True)}:{storage}".encode()).hexdigest()[:12]
    kind = ("tiny-fp8" + ("-converted" if storage == "converted" else "")) if quantised else "tiny"
    return write_checkpoint(cache_root() / f"deepseek-v41-flash-language-{kind}-{key}", cfg, storage)


# --------------------------------------------------------------------------- released dimensions, some layers
#
# A released layer's 384 routed experts are 13.6G FP4 values; drawing a Gaussian master and
# quantising it would take minutes a layer. At the released dimensions (`release_layer_units`)
# routed experts are drawn in their stored form instead: uniformly random bytes (every byte is two
# valid e2m1 codes, RMS 2.93) and a power-of-two scale per row and 32 inputs at the fan-in scale,
# times a seeded 2^-1, 1 or 2 per block. Everything else is drawn as in the small configs.
FP4_CODE_RMS = (sum(v * v for v in E2M1_GRID) / len(E2M1_GRID)) ** 0.5


def drawn_fp4(name: str, shape: tuple[int, int], storage: str = "release") -> dict:
    """{name: packed FP4 [out, in/2] (int8 in the release, float4 converted), scale name: e8m0}."""
    import math

    import torch

    rows, cols = shape
    g = generator(name)
    data = torch.randint(0, 256, (rows, cols // 2), generator=g, dtype=torch.uint8)
    base = round(math.log2(1.0 / (math.sqrt(cols) * FP4_CODE_RMS)))
    k = torch.randint(-1, 2, (rows, cols // QUANT_BLOCK), generator=g, dtype=torch.int16)
    scale = (127 + base + k).to(torch.uint8).view(torch.float8_e8m0fnu)
    stored = data.view(torch.int8) if storage == "release" else data.view(torch.float4_e2m1fn_x2)
    return {name: stored, name[: -len("weight")] + "scale": scale}


def release_layer_units(cfg: dict, layers, storage: str = "release"):
    """(unit, {name: tensor}) of the language backbone at `cfg`'s dimensions for `layers` only
    (with the embedding, final norm and head; the image markers are the vision writer's), in
    `storage`: one unit per routed expert, one per layer for the rest, so no unit is split across
    shards. Routed experts are drawn in their stored form (`drawn_fp4`)."""
    keep = set(layers)
    units: dict[str, dict[str, tuple]] = {}
    for name, (shape, dt) in language_shapes(cfg).items():
        parts = name.split(".")
        if name.startswith("image_") or (parts[0] == "layers" and int(parts[1]) not in keep):
            continue
        expert = parts[0] == "layers" and parts[2] == "ffn" and parts[3] == "experts"
        unit = ".".join(parts[:5]) if expert else ".".join(parts[:2]) if parts[0] == "layers" else parts[0]
        units.setdefault(unit, {})[name] = (shape, dt)
    for unit, tensors in units.items():
        out = {}
        for name, (shape, dt) in tensors.items():
            if storage_format(cfg, name) == "fp4" and ".ffn.experts." in name:
                out.update(drawn_fp4(name, shape, storage))
            else:
                out.update(stored_tensors(cfg, name, shape, dt, storage))
        yield unit, out


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
        units.setdefault(unit, {}).update(stored_tensors(cfg, name, shape, dt))
    yield from units.items()


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
