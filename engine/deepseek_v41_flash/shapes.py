"""The shape the config implies for every language tensor the engine reads, checked before any
data is read (`engine.runtime.shards.read`): a checkpoint tensor of another shape is one
EngineInputError naming it, never a broadcast or a crash deep in a matmul.

Shapes as safetensors states them: a matrix [out, in] whatever its format (FP4 `F4` counts
logical elements, two per byte); a quantised matrix's `.scale` one e8m0 value per 32x32 block
(FP8) or per row and 32 inputs (FP4, the FP8 Engram table).
"""
from __future__ import annotations

from engine.deepseek_v41_flash import quant


def _block(n: int) -> int:
    return -(-n // quant.BLOCK)


def scale_shape(fmt: str, shape: tuple[int, int]) -> tuple[int, int]:
    rows, cols = shape
    return (_block(rows), _block(cols)) if fmt == "fp8" else (rows, cols // quant.BLOCK)


def layer_shapes(cfg, i: int) -> dict[str, tuple[int, ...]]:
    """Every tensor of decoder layer `i` that the config gives it -> its shape."""
    d, hc = cfg.dim, cfg.hc_mult
    mix = (2 + hc) * hc  # the hyper-connection mixes: pre (hc), post (hc), combine (hc x hc)
    p = f"layers.{i}."
    out = {p + "attn_norm.weight": (d,), p + "ffn_norm.weight": (d,)}
    for s in ("attn", "ffn"):
        out.update({p + f"hc_{s}_fn": (mix, hc * d), p + f"hc_{s}_base": (mix,), p + f"hc_{s}_scale": (3,)})
    a = p + "attn."
    heads = cfg.n_heads * cfg.head_dim
    out.update({a + "attn_sink": (cfg.n_heads,), a + "wq_a.weight": (cfg.q_lora_rank, d),
                a + "q_norm.weight": (cfg.q_lora_rank,), a + "wq_b.weight": (heads, cfg.q_lora_rank),
                a + "wkv.weight": (cfg.head_dim, d), a + "kv_norm.weight": (cfg.head_dim,),
                # grouped low-rank output: o_groups blocks of heads/o_groups channels -> o_lora_rank each
                a + "wo_a.weight": (cfg.o_groups * cfg.o_lora_rank, heads // cfg.o_groups),
                a + "wo_b.weight": (d, cfg.o_groups * cfg.o_lora_rank)})
    if i in cfg.kv_source_layers:
        out.update({a + "compressor.wkv.weight": (cfg.head_dim, d), a + "compressor.norm.weight": (cfg.head_dim,)})
        if cfg.compress_ratios[i] > 1:
            out[a + "compressor.wgate.weight"] = (cfg.head_dim, d)
    if i in cfg.index_source_layers:
        out.update({a + "indexer.wq_b.weight": (cfg.index_n_heads * cfg.index_head_dim, cfg.q_lora_rank),
                    a + "indexer.weights_proj.weight": (cfg.index_n_heads, d)})
        if i in cfg.kv_source_layers:
            out.update({a + "indexer.wk.weight": (cfg.index_head_dim, cfg.head_dim),
                        a + "indexer.k_norm.weight": (cfg.index_head_dim,)})
    f = p + "ffn."
    E, inter = cfg.n_routed_experts, cfg.moe_inter_dim
    out.update({f + "gate.weight": (E, d), f + "gate.bias": (E,), f + "gate.bias_vl": (E,)})
    for e in range(E):
        out.update({f + f"experts.{e}.w1.weight": (inter, d), f + f"experts.{e}.w3.weight": (inter, d),
                    f + f"experts.{e}.w2.weight": (d, inter)})
    shared = cfg.n_shared_experts * inter
    out.update({f + "shared_experts.w1.weight": (shared, d), f + "shared_experts.w3.weight": (shared, d),
                f + "shared_experts.w2.weight": (d, shared)})
    if i in cfg.engram_layer_ids:
        j = cfg.engram_layer_ids.index(i)
        g = p + "engram."
        hashes = (cfg.engram_max_ngram_size - 1) * cfg.engram_n_heads  # one row per (n-gram size, head)
        out.update({g + "embed.weight": (cfg.engram_num_embeddings[j], cfg.engram_head_dim),
                    g + "wkv.weight": (d * (hc + 1), hashes * cfg.engram_head_dim),
                    g + "q_weight": (hc, d), g + "k_weight": (hc, d)})
    return out


def language_shapes(cfg, layers) -> dict[str, tuple[int, ...]]:
    """name -> implied shape for the backbone's tensors of `layers` (ids), scales included."""
    d = cfg.dim
    out = {"embed.weight": (cfg.vocab_size, d), "head.weight": (cfg.vocab_size, d), "norm.weight": (d,),
           **dict.fromkeys(("image_start", "image_end", "image_newline"), (d,))}
    for i in layers:
        out.update(layer_shapes(cfg, i))
    for name, shape in list(out.items()):
        fmt = quant.weight_format(cfg, name)
        if fmt is not None:
            out[quant.scale_name(name)] = scale_shape(fmt, shape)
    return out
