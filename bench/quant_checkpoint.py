"""Quantised DeepSeek V4.1 Flash weights on a GPU: the engine's dequantising matmul against the
oracle's block-scaled FP8 GEMM (the official kernel's K-block order) and a plain bf16 matmul, at
the released projection shapes, in the official numerics (bf16 input rounded to FP8 per 32).

    python bench/quant_checkpoint.py --device cuda --json OUT/quant_gemm.json
    python bench/quant_checkpoint.py --small            # CPU smoke (small shapes)

Reports per shape: max |engine - oracle| in bf16 ulps of the output and the fraction of elements
that differ, and the time ratios engine / plain-bf16 and oracle / plain-bf16 (speed only as ratios).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.deepseek_v41_flash import quant as E  # noqa: E402
from oracle.deepseek_v41_flash import quant as O  # noqa: E402
from tensordiff.models.deepseek_v41_flash.synthetic_language import quantise, synth  # noqa: E402

# (name, format, out, in): the released config's projections (dim 5120, q_lora 1280, 64 x 512
# heads, o_groups 8 x o_lora 1024, experts 2304 wide)
SHAPES = [("layers.0.attn.wq_a.weight", "fp8", 1280, 5120),
          ("layers.0.attn.wq_b.weight", "fp8", 64 * 512, 1280),
          ("layers.0.attn.wo_b.weight", "fp8", 5120, 8 * 1024),
          ("layers.0.ffn.shared_experts.w1.weight", "fp8", 2304, 5120),
          ("layers.0.ffn.experts.0.w1.weight", "fp4", 2304, 5120),
          ("layers.0.ffn.experts.0.w2.weight", "fp4", 5120, 2304)]


def timed(fn, device, repeat):
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t = time.perf_counter()
    for _ in range(repeat):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - t) / repeat


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--small", action="store_true", help="shapes / 8 (a CPU smoke run)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    dev = torch.device(a.device)
    shrink = 8 if a.small else 1
    rows = []
    for name, fmt, n_out, n_in in SHAPES:
        n_out, n_in = n_out // shrink, n_in // shrink
        st = quantise(fmt, name, synth(name, (n_out, n_in), "bfloat16"))
        w, s = st[name].to(dev), st[name.removesuffix("weight") + "scale"].to(dev)
        qw = E.prepare({name: w, E.scale_name(name): s}, name, fmt, dev)
        x = torch.randn(a.tokens // shrink, n_in, generator=torch.Generator().manual_seed(0)).to(dev, torch.bfloat16)
        eng = qw.matmul(x, kernel_quant=True)
        ora = O.block_scaled_gemm(x, w, s).to(torch.bfloat16)
        dense = qw.dense().to(torch.bfloat16)
        _, e = torch.frexp(ora.float())
        ulp = torch.ldexp(torch.ones_like(ora.float()), (e - 8).clamp_min(-133))  # bf16 spacing at |ora|
        diff = (eng.float() - ora.float()).abs() / ulp
        t_plain = timed(lambda: torch.nn.functional.linear(x, dense), dev, a.repeat)
        t_eng = timed(lambda: qw.matmul(x, kernel_quant=True), dev, a.repeat)
        t_ora = timed(lambda: O.block_scaled_gemm(x, w, s), dev, max(1, a.repeat // 5))
        rows.append({"name": name, "format": fmt, "shape": [n_out, n_in], "tokens": x.shape[0],
                     "max_ulps": float(diff.max()), "frac_differ": float((diff > 0).float().mean()),
                     "ratio_engine_to_bf16": t_eng / t_plain, "ratio_oracle_to_bf16": t_ora / t_plain})
        r = rows[-1]
        print(f"{name:40s} {fmt} {n_out}x{n_in}: max {r['max_ulps']:.2f} ulp, {100 * r['frac_differ']:.3f}% differ; "
              f"engine {r['ratio_engine_to_bf16']:.2f}x, oracle {r['ratio_oracle_to_bf16']:.1f}x of a bf16 matmul")
    if a.json:
        a.json.write_text(json.dumps({"device": str(dev), "torch": torch.__version__, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
