"""DeepSeek V4.1 Flash vision path: oracle vs engine wall time, taps overhead, FLOP roofline.

    python bench/deepseek_vision.py out.json                       # CUDA, synthetic:full, bf16, 90x99
    python bench/deepseek_vision.py out.json --device cpu --weights synthetic:tiny --grid 40x40   # smoke

What is timed (median of --iters after --warmup, wall clock around a device synchronise):
- preprocessing: the oracle's `load_image` (Pillow pad, float normalisation, bf16 patches) vs the
  engine's plan + render + on-device patch rows, both from the same PNG to patches on the device;
- tower + aligner: the oracle module (`encode_image`, the official 3-D SDPA call) vs the engine
  without taps (`NullRecorder`) and with taps (a real `Recorder` that copies every boundary
  tensor to the host, aborted instead of written, so disk speed stays out);
- on CUDA, the speed paths one by one (`engine_eager`: neither; `engine_fused_only`: the compiled
  block; `engine_graphs_only`: the whole-pass CUDA graph; `engine` is the default, both after its
  first two passes), the SDPA kernel choices on the fused engine (cuDNN, flash, efficient first),
  the other kernel backend (default and eager), and the oracle module with its one SDPA call made
  4-D (the fused kernels' shape); `--profile` prints the kernel table of one eager and one fused
  pass (which SDPA kernel runs, where the time goes).
FLOPs are counted from the shapes (GEMMs 2mnk, attention 4 N^2 D per layer); the roofline is the
bf16 matrix ceiling measured here with a large GEMM (or --peak-tflops). The picture is generated
at exactly the grid's pixel size, so the plan keeps it unscaled (the 90x99 default is 1,022 span
positions, at the 1,024 budget).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.deepseek_v41_flash.run import VisionEngine  # noqa: E402
from oracle.deepseek_v41_flash.config import ModelArgs  # noqa: E402
from oracle.deepseek_v41_flash.image_processor import load_image  # noqa: E402
from oracle.deepseek_v41_flash.run import build  # noqa: E402
from tensordiff.format.capture import NullRecorder, Recorder  # noqa: E402
from tensordiff.models.deepseek_v41_flash.synthetic import resolve  # noqa: E402

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, iters: int, warmup: int) -> tuple[float, list[float]]:
    """Median milliseconds of fn() over iters runs (after warmup), and all samples."""
    for _ in range(warmup):
        fn()
    sync(device)
    samples = []
    for _ in range(iters):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        samples.append((time.perf_counter() - t) * 1e3)
    return statistics.median(samples), samples


def attention_4d(self, x, cos, sin):
    """The oracle's Attention.forward with one change: SDPA on [1, H, N, hd] instead of [H, N, hd]."""
    from oracle.deepseek_v41_flash.vision import apply_rotary

    n = x.size(0)
    q, k, v = (t.view(n, self.n_heads, self.head_dim) for t in self.wqkv(x).chunk(3, dim=-1))
    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    o = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(0, 1).unsqueeze(0) for t in (q, k, v)))
    return self.wo(o.squeeze(0).transpose(0, 1).reshape(n, -1))


def flops(cfg: ModelArgs, gh: int, gw: int) -> dict:
    n, d, i, p = gh * gw, cfg.vision_dim, cfg.vision_inter_dim, 3 * cfg.vision_patch_size ** 2
    r = cfg.vision_downsample_ratio
    t = -(-gh // r) * -(-gw // r)
    gemm = 2 * n * p * d + cfg.vision_n_layers * (2 * n * d * 3 * d + 2 * n * d * d + 2 * n * d * 2 * i + 2 * n * i * d)
    attn = cfg.vision_n_layers * 4 * n * n * d  # q k^T and p v, all heads
    aligner = 2 * t * d * r * r * cfg.dim + 2 * t * cfg.dim * cfg.dim
    return {"gemm": gemm, "attention": attn, "aligner": aligner, "total": gemm + attn + aligner}


def matmul_peak_tflops(device, dtype, iters: int) -> float | None:
    if device.type != "cuda":
        return None
    m = 8192
    a = torch.randn(m, m, device=device, dtype=dtype)
    b = torch.randn(m, m, device=device, dtype=dtype)
    ms, _ = timed(lambda: a @ b, device, iters=max(iters, 10), warmup=3)
    return 2 * m ** 3 / (ms * 1e-3) / 1e12


def profile(fn, device, top: int = 18) -> list[dict]:
    """The device kernels of one fn() by total time: [{name, ms, calls}]."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    fn()
    sync(device)
    with prof(activities=[ProfilerActivity.CUDA]) as p:
        fn()
        sync(device)
    rows = []
    for e in p.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t > 0:
            rows.append({"name": e.key[:110], "ms": t / 1e3, "calls": e.count})
    rows.sort(key=lambda r: -r["ms"])
    for r in rows[:top]:
        print(f"  {r['ms']:8.2f} ms {r['calls']:5d}x  {r['name']}")
    print(f"  total {sum(r['ms'] for r in rows):.2f} ms (kernels may overlap: none here)")
    return rows[:top]


def picture(gh: int, gw: int, patch: int, directory: Path) -> Path:
    rng = np.random.default_rng(0)
    h, w = gh * patch, gw * patch
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), (x ^ y) & 255], -1)
    img = np.clip(img + rng.normal(0, 12, img.shape), 0, 255).astype(np.uint8)
    from PIL import Image

    path = directory / f"bench-{gh}x{gw}.png"
    Image.fromarray(img).save(path)
    return path


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path, help="where to write the JSON results")
    ap.add_argument("--weights", default="synthetic:full")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=list(DTYPES), default="bfloat16")
    ap.add_argument("--grid", default="90x99", help="patch grid HxW (pixels = 14 x that)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--oracle-iters", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--backend", default="auto",
                    help="engine kernels: torch, hip, or auto (hip when its kernels load on this GPU, else torch; "
                         "on CUDA the other one is timed too)")
    ap.add_argument("--peak-tflops", type=float, default=None, help="roofline ceiling (default: measured)")
    ap.add_argument("--profile", action="store_true", help="kernel time table of one eager and one fused pass")
    ap.add_argument("--skip-oracle-tower", action="store_true", help="the official 3-D call is slow; skip it")
    args = ap.parse_args(argv)

    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    backends = ["torch"]
    if device.type == "cuda":
        from engine.backend.hip_ops import unavailable_reason

        hip_ok = unavailable_reason() is None
        if args.backend == "hip" or (args.backend == "auto" and hip_ok):
            backends = ["hip", "torch"]
        elif args.backend == "auto":
            backends = ["torch"]
        else:
            backends = [args.backend] + (["hip"] if hip_ok else [])
    elif args.backend == "hip":
        sys.exit("--backend hip needs a GPU")
    args.backend = backends[0]
    gh, gw = (int(v) for v in args.grid.lower().split("x"))
    wdir = resolve(args.weights)
    cfg = ModelArgs.from_dir(wdir)
    res: dict = {"weights": args.weights, "device": str(device), "dtype": args.dtype, "backend": args.backend,
                 "grid": [gh, gw], "patches": gh * gw, "torch": torch.__version__,
                 "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None}

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        path = picture(gh, gw, cfg.vision_patch_size, tmp)

        # ---- preprocessing
        eng = VisionEngine(wdir, device=device, dtype=args.dtype, backend=args.backend)
        plan, patches = eng.preprocess(path)
        if plan.grid != (gh, gw):
            sys.exit(f"a {gw * 14}x{gh * 14} picture plans to a {plan.grid} grid, not {(gh, gw)}: pick a grid "
                     f"of at least vision_min_pixels ({cfg.vision_min_pixels}) whose span fits the budget")
        res["tokens"], res["span"] = plan.cells[0] * plan.cells[1], plan.span
        o_pre, _ = timed(lambda: load_image(path, cfg)[0].to(device), device, args.iters, 1)
        e_pre, _ = timed(lambda: eng.preprocess(path), device, args.iters, 1)
        res["preprocess_ms"] = {"oracle": o_pre, "engine": e_pre}

        # ---- tower + aligner
        f = flops(cfg, gh, gw)
        res["flops"] = f
        peak = args.peak_tflops or matmul_peak_tflops(device, dtype, args.iters)
        res["peak_tflops"] = peak
        tower: dict = {}
        with torch.inference_mode():
            null = NullRecorder()
            t0 = time.perf_counter()
            for _ in range(2):  # pass 1 eager; pass 2 compiles the block and captures the graph
                eng.encode(patches, plan, null)
            sync(device)
            res["first_two_passes_s"] = time.perf_counter() - t0
            tower["engine"], _ = timed(lambda: eng.encode(patches, plan, null), device, args.iters, args.warmup)
            if eng.graphs is not None and eng.graphs.error:
                res.setdefault("errors", {})["graphs"] = eng.graphs.error
            if eng.tower._fused is not None and eng.tower._fused.error:
                res.setdefault("errors", {})["fuse"] = eng.tower._fused.error
            res["speed_path"] = eng.speed_path()  # what the default engine ran: block, graphs, SDPA kernel, fallbacks

            def with_taps():
                rec = Recorder(tmp / "taps", model="deepseek-v4.1-flash")
                eng.encode(patches, plan, rec)
                rec.abort()

            tower["engine_taps"], _ = timed(with_taps, device, args.iters, args.warmup)

            # The host transfer and file write happen once, after the forward, at close():
            # not model latency, but the whole cost of a dump, so measure it too.
            def with_dump():
                rec = Recorder(tmp / "dump", model="deepseek-v4.1-flash", overwrite=True)
                eng.encode(patches, plan, rec)
                rec.close()

            tower["engine_taps_and_write"], _ = timed(with_dump, device, max(1, args.iters // 4), 1)
            ref = None
            if device.type == "cuda":
                # the speed paths one by one (fused: compiled block; graphs: whole-pass CUDA graph)
                variants = {"engine_eager": ("off", "off"), "engine_fused_only": ("on", "off"),
                            "engine_graphs_only": ("off", "on")}
            else:
                variants = {}
            for b, (base, (fz, gr)) in ((b, v) for b in backends for v in variants.items()):
                name = base if b == args.backend else f"{base}_{b}"
                alt = VisionEngine(wdir, device=device, dtype=args.dtype, backend=b, fuse=fz, graphs=gr)
                tower[name], _ = timed(lambda: alt.encode(patches, plan, null), device, args.iters, args.warmup + 1)
                out = alt.encode(patches, plan, null).float()
                if name == "engine_eager":
                    ref = out
                if base == "engine_eager" and args.profile:
                    print(f"kernels, eager, backend {b}:")
                    res[f"profile_eager_{b}"] = profile(lambda: alt.encode(patches, plan, null), device)
                if base == "engine_fused_only":
                    if args.profile:
                        print(f"kernels, fused, backend {b}:")
                        res[f"profile_fused_{b}"] = profile(lambda: alt.encode(patches, plan, null), device)
                    for kname, prefer in ((f"{name}_cudnn_first", ["cudnn", "flash", "efficient"]),
                                          (f"{name}_flash_first", ["flash", "efficient"]),
                                          (f"{name}_efficient_first", ["efficient", "flash"])):
                        alt.tower.attention_prefer = prefer
                        try:
                            tower[kname], _ = timed(lambda: alt.encode(patches, plan, null), device, args.iters,
                                                    args.warmup)
                        except RuntimeError as e:  # a kernel family missing in this build
                            tower[kname] = None
                            res.setdefault("errors", {})[kname] = str(e).splitlines()[0]
                    alt.tower.attention_prefer = None
                    if alt.tower._fused is not None and alt.tower._fused.full:
                        from engine.deepseek_v41_flash.fused import FusedBlock

                        alt.tower._fused = FusedBlock(alt.tower.block, heads_major=True)
                        tower[f"{name}_heads_major"], _ = timed(lambda: alt.encode(patches, plan, null), device,
                                                                     args.iters, args.warmup)
                alt = None
            for other in backends[1:]:
                try:
                    alt = VisionEngine(wdir, device=device, dtype=args.dtype, backend=other)
                    tower[f"engine_{other}_backend"], _ = timed(lambda: alt.encode(patches, plan, null), device,
                                                                args.iters, args.warmup + 1)
                    alt = None
                except Exception as e:  # e.g. the hip kernels fail to build here: report, go on
                    tower[f"engine_{other}_backend"] = None
                    res.setdefault("errors", {})[other] = str(e).splitlines()[0] if str(e) else type(e).__name__
            out_e = eng.encode(patches, plan, null).float()
            if ref is not None:  # the default (fused, graphed) engine against the plain eager one
                d = (out_e - ref).abs()
                res["engine_vs_eager"] = {"max_abs": d.max().item(), "ref_max_abs": ref.abs().max().item(),
                                          "cosine": torch.nn.functional.cosine_similarity(
                                              out_e.flatten(), ref.flatten(), dim=0).item()}
            if not args.skip_oracle_tower:
                model = build(cfg, wdir, dtype, device)
                o_patches = patches.view(-1, 3, cfg.vision_patch_size, cfg.vision_patch_size).to(dtype)
                tower["oracle"], _ = timed(lambda: model.encode_image(o_patches, gh, gw), device,
                                           args.oracle_iters, 1)
                out_o = model.encode_image(o_patches, gh, gw).float()
                # the same module with a 4-D SDPA call (what the fused kernels need), for reference
                for blk in model.vision.blocks:
                    blk.attn.forward = types.MethodType(attention_4d, blk.attn)
                tower["oracle_4d_sdpa"], _ = timed(lambda: model.encode_image(o_patches, gh, gw), device,
                                                   args.oracle_iters, 1)
                diff = (out_o - out_e).abs()
                res["engine_vs_oracle"] = {
                    "max_abs": diff.max().item(), "cosine": torch.nn.functional.cosine_similarity(
                        out_o.flatten(), out_e.flatten(), dim=0).item()}
                del model
        res["tower_aligner_ms"] = tower
        res["taps_overhead_pct"] = 100 * (tower["engine_taps"] / tower["engine"] - 1)
        res["engine_tflops"] = f["total"] / (tower["engine"] * 1e-3) / 1e12
        if peak:
            res["roofline_ms"] = f["total"] / (peak * 1e12) * 1e3
            res["engine_fraction_of_roofline"] = res["roofline_ms"] / tower["engine"]

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    print_table(res)
    return res


def print_table(res: dict) -> None:
    t, p = res["tower_aligner_ms"], res["preprocess_ms"]
    fmt = lambda v: "-" if v is None else f"{v:10.2f}"  # noqa: E731
    print(f"DeepSeek V4.1 Flash vision, {res['weights']}, {res['dtype']}, {res['device']}"
          f"{' (' + res['gpu'] + ')' if res['gpu'] else ''}, backend {res['backend']}, grid {res['grid'][0]}x{res['grid'][1]} "
          f"= {res['patches']} patches, {res['tokens']} tokens, {res['flops']['total'] / 1e12:.3g} TFLOP")
    print(f"{'stage':28s} {'oracle ms':>10s} {'engine ms':>10s}")
    print(f"{'preprocess':28s} {fmt(p['oracle'])} {fmt(p['engine'])}")
    print(f"{'tower + aligner':28s} {fmt(t.get('oracle'))} {fmt(t['engine'])}")
    if "oracle_4d_sdpa" in t:
        print(f"{'  oracle with a 4-D SDPA call':28s} {fmt(t['oracle_4d_sdpa'])}")
    print(f"{'tower + aligner, taps on':28s} {'':>10s} {fmt(t['engine_taps'])}   "
          f"(taps +{res['taps_overhead_pct']:.1f}%)")
    for k in t:
        if k.startswith("engine_") and k not in ("engine_taps", "engine_taps_and_write"):
            print(f"{'  ' + k[len('engine_'):]:28s} {'':>10s} {fmt(t[k])}")
    if "first_two_passes_s" in res:
        print(f"first two passes (eager, then compile + capture): {res['first_two_passes_s']:.1f} s")
    if "engine_vs_eager" in res:
        e = res["engine_vs_eager"]
        print(f"engine (default path) vs eager engine: max|d| {e['max_abs']:.3g} of {e['ref_max_abs']:.3g}, "
              f"cosine {e['cosine']:.6f}")
    for k, v in res.get("errors", {}).items():
        print(f"  ({k}: {v})")
    line = f"engine {res['engine_tflops']:.1f} TFLOP/s"
    if res.get("peak_tflops"):
        line += (f"; roofline {res['roofline_ms']:.2f} ms at {res['peak_tflops']:.0f} TFLOP/s "
                 f"({100 * res['engine_fraction_of_roofline']:.0f}% of it)")
    print(line)
    if "engine_vs_oracle" in res:
        e = res["engine_vs_oracle"]
        print(f"engine vs oracle aligner output: max|d| {e['max_abs']:.3g}, cosine {e['cosine']:.6f}")


if __name__ == "__main__":
    main()
