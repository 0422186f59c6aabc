"""The DeepSeek V4.1 Flash language backbone at its real dimensions, a few layers at a time.

Writes a checkpoint in the official layout: the vision tower and aligner of `synthetic:full`
(symlinked, not copied) plus, for the chosen layers only, the language tensors at the released
shapes (dim 5120, 64 heads of 512, 384 routed experts + 1 shared, top-512 indexer, the layers'
real compression ratios), bf16 storage. Then runs the oracle and the engine with `layers=...`
on a prompt with an image span (the same aligner rows fed to both sides), compares them, and runs the engine once more with a planted fault.
Reports wall time and peak GPU memory per side, the verdict, and whether the fault was caught.

    python bench/real_dims_layers.py --out OUT --layers 2 --device cuda --dtype bfloat16   # H200
    python bench/real_dims_layers.py --out OUT --config tiny --layers 2-5                 # CPU smoke

`--config tiny` writes the same kind of checkpoint from synthetic:tiny's vision and its small
language config, so the whole path is exercised on a CPU in seconds. One released MoE layer is ~27 GB in bf16: layer 2 (the first compressed,
KV- and index-source layer) is the default; layer 1 holds an Engram table of 384M rows and
does not fit a synthetic checkpoint.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import time
from pathlib import Path


def write_checkpoint(root: Path, layers: tuple[int, ...], base: str = "synthetic:full", cfg: dict | None = None) -> Path:
    """`base`'s vision shards (symlinked) + the language tensors of `layers` (+ embed, norm,
    head) at the shapes `cfg` implies (default: the released config, bf16 storage), written in
    shards of about 4 GB; config.json and the index name exactly what is there."""
    from safetensors.torch import save_file

    from tensordiff.models.deepseek_v41_flash.synthetic import FULL, INDEX, resolve
    from tensordiff.models.deepseek_v41_flash.synthetic_language import (
        byte_tokenizer_compressed_vocab, language_shapes, synth,
    )

    if (root / INDEX).is_file() and (root / "config.json").is_file():
        return root  # written by an earlier run with --work: the same seeds give the same tensors
    vision = resolve(base)
    # bf16 storage (the quantised formats are not modelled here); the synthetic byte tokenizer's
    # compressed vocabulary, as every synthetic checkpoint has (the released 99092 is the real
    # tokenizer's)
    cfg = cfg or {**FULL, "dtype": "bf16", "expert_dtype": None, "n_mtp_layers": 0,
                  "engram_compressed_vocab_size": byte_tokenizer_compressed_vocab(FULL["vocab_size"])}
    root.mkdir(parents=True, exist_ok=True)
    index = {n: f for n, f in json.loads((vision / INDEX).read_text())["weight_map"].items()
             if n.startswith(("vision.", "aligner.", "image_"))}  # what the vision path reads
    for shard in sorted(set(index.values())):
        if not (root / shard).exists():
            os.symlink(vision / shard, root / shard)
    wanted = {n: s for n, s in language_shapes(cfg).items()
              if not n.startswith("image_")  # the span markers come with the vision shards
              and (not n.startswith("layers.") or int(n.split(".")[1]) in layers)}
    shard, size, k = {}, 0, 0

    def flush():
        nonlocal shard, size, k
        if shard:
            name = f"language-{k:05d}.safetensors"
            save_file(shard, str(root / name))
            index.update(dict.fromkeys(shard, name))
            shard, size, k = {}, 0, k + 1

    for name, (shape, dt) in wanted.items():
        t = synth(name, shape, dt)
        shard[name] = t
        size += t.numel() * t.element_size()
        if size > (4 << 30):
            flush()
    flush()
    (root / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": index}))
    (root / "config.json").write_text(json.dumps(cfg, indent=1))
    return root


def parse_ids(spec: str) -> tuple[int, ...]:
    out = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return tuple(sorted(out))


def peak_gpu(device: str):
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() / 2**30
    return None


def reset_gpu(device: str):
    import torch

    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _full_config(experts: int) -> dict:
    from tensordiff.models.deepseek_v41_flash.synthetic import FULL
    from tensordiff.models.deepseek_v41_flash.synthetic_language import byte_tokenizer_compressed_vocab

    return {**FULL, "dtype": "bf16", "expert_dtype": None, "n_mtp_layers": 0, "n_routed_experts": experts,
            "engram_compressed_vocab_size": byte_tokenizer_compressed_vocab(FULL["vocab_size"])}


def _tiny_config() -> dict:
    from tensordiff.models.deepseek_v41_flash.synthetic import CONFIGS

    return CONFIGS["tiny"]()


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--config", choices=["full", "tiny"], default="full")
    ap.add_argument("--layers", default=None, help="default: 2 (full), 2-5 (tiny)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--fault", default="router-biased-weights")
    ap.add_argument("--experts", type=int, default=None,
                    help="full config with this many routed experts (a CPU dry run of the real-dims path)")
    ap.add_argument("--cells", type=int, nargs=2, default=(30, 34),
                    help="image token grid (30x34: a 1052-token span, over 512 compressed groups at ratio 2)")
    ap.add_argument("--prompt", default="Describe <image> in one sentence, then name its colours.")
    ap.add_argument("-o", "--option", dest="extra", action="append", default=[],
                    help="KEY=VALUE run option for both sides, e.g. kernel_quant=1")
    ap.add_argument("--work", type=Path, default=None, help="where the checkpoint goes (default: a temp dir, removed)")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    layers = a.layers or ("2" if a.config == "full" else "2-5")

    from tensordiff.pipeline.compare import compare_dumps
    from tensordiff.models.deepseek_v41_flash.adapter import ADAPTER
    from tensordiff.format.dump import open_dump

    result = {"config": a.config, "layers": layers, "options": a.extra, "device": a.device, "dtype": a.dtype, "prompt": a.prompt}
    work = a.work or Path(os.environ.get("TMPDIR", "/tmp")) / f"real-dims-{os.getpid()}"
    try:
        t0 = time.perf_counter()
        base, cfg = ("synthetic:full", None) if a.config == "full" else ("synthetic:tiny", _tiny_config())
        if a.experts:  # a dry run of the real-dims path with fewer routed experts (everything else real)
            cfg = _full_config(a.experts)
        weights = str(write_checkpoint(work / "ckpt", parse_ids(layers), base, cfg))
        result["write_checkpoint_s"] = time.perf_counter() - t0
        # Both sides get the SAME image rows (what the aligner hands the language model), so the
        # comparison is of the language layers alone, not of two vision towers' rounding.
        import torch

        from tensordiff.pipeline.adapter import RunRequest
        from tensordiff.format.capture import Recorder

        ckpt_dir = ADAPTER.weights(weights)
        dim = json.loads((ckpt_dir / "config.json").read_text())["dim"]
        cells = tuple(a.cells)
        rows = torch.randn(cells[0] * cells[1], dim, generator=torch.Generator().manual_seed(0)) * 0.5
        opts = {"image_rows": rows, "cells": cells, "layers": layers}
        for item in a.extra:
            k, _, v = item.partition("=")
            opts[k] = v
        result["cells"] = list(cells)
        dumps = work / f"dumps-{a.dtype}"  # one checkpoint, a dump set per dtype
        for side, fault in (("oracle", None), ("engine", None), ("engine-fault", a.fault)):
            if side == "oracle":
                from oracle.deepseek_v41_flash.model import run
            else:
                from engine.deepseek_v41_flash.language_run import run
            req = RunRequest(weights=weights, weights_dir=ckpt_dir, prompt=a.prompt, dtype=a.dtype,
                             device="cpu" if side == "oracle" else a.device, fault=fault, options=opts)
            reset_gpu(a.device)
            t = time.perf_counter()
            rec = Recorder(dumps / side, model=ADAPTER.name, producer={"name": side, "side": side.split("-")[0]})
            run(req, rec)
            rec.close()
            result[f"{side}_s"] = time.perf_counter() - t
            result[f"{side}_peak_gpu_gib"] = peak_gpu(a.device)
            result[f"{side}_peak_rss_gib_so_far"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
            print(f"{side}: {result[f'{side}_s']:.1f} s, peak GPU {result[f'{side}_peak_gpu_gib']} GiB", flush=True)
        result["prompt_tokens"] = open_dump(dumps / "oracle").run["inputs"]["language"]["prompt_tokens"]
        clean = compare_dumps(dumps / "oracle", dumps / "engine")
        faulty = compare_dumps(dumps / "oracle", dumps / "engine-fault")
        result["verdict"] = clean.verdict
        result["not_matching"] = [b.name for b in clean.boundaries if b.status != "match"]
        result["boundaries"] = len(clean.boundaries)
        result["fault"] = a.fault
        result["fault_verdict"] = faulty.verdict
        result["fault_earliest"] = faulty.earliest
        # caught = the fault makes boundaries diverge that the clean engine matched (a clean run
        # that diverges by itself, e.g. bf16 rounding flips, must not count as a catch)
        clean_ok = {b.name for b in clean.boundaries if b.status == "match"}
        result["fault_new_divergences"] = [b.name for b in faulty.boundaries
                                           if b.status != "match" and b.name in clean_ok]
        result["fault_caught"] = bool(result["fault_new_divergences"])
        result["boundary_status"] = {b.name: b.status for b in clean.boundaries}
    finally:
        if a.work is None:
            shutil.rmtree(work, ignore_errors=True)
    (a.out / "real_dims_layers.json").write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
