"""A grid of Triton flash-attention configs beside SDPA's kernels, in one process, at the towers' shapes.

    python bench/attention_sweep.py OUTDIR                 # GPU: DeepSeek (16 x 8,910 x 64) and Qwen3-VL (16 x 2,728 x 72), bf16
    python bench/attention_sweep.py OUTDIR --small         # CPU smoke: tiny shapes through Triton's interpreter, fp32

Writes OUTDIR/attention_sweep.json. Per shape: SDPA with cuDNN, flash and efficient alone (what
the engine's kernel order can choose) and every config of `engine/runtime/triton_attention.py`'s
kernels in `GRID` (v1, tuned, and where this Triton has them tuned_ws with warp specialisation,
tuned_tma / tuned_tma_ws with tensor descriptors): ms per call
(CUDA events, median of 3 runs of `--reps` calls after a compile-and-warm call), TFLOP/s at the
real head dim (4 N^2 hd per head: Qwen's 72 counted as 72, so padding shows as lost speed), and
max |o - ref| against SDPA's math kernel in fp32 on the same operands. A config is `ok` when that
error is at most twice the worst SDPA kernel's (+1e-5): a kernel that drops a mask or a scale is
off by orders more. `best_triton` is the fastest ok config, with its ratio to cuDNN
(`triton_over_cudnn`, < 1 beats it). q, k, v are strided views of one [N, 3, H, hd] tensor, as the
towers' qkv GEMM leaves them. A config that fails to compile or run is recorded with its error;
`--budget-s` stops trying new configs (recorded as skipped; two thirds of it for DeepSeek's shape,
configs in order of likelihood) so the sweep fits a GPU session.
Exit 0 when the sweep ran (a slow kernel is a figure), 1 when no SDPA kernel ran, 2 on bad arguments.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# (BLOCK_M, BLOCK_N, num_warps, num_stages, variant), the likeliest first (a spent time budget
# skips the tail): the shapes Hopper flash kernels use at head dim 64, then the rest of the grid
_LIKELY = [(128, 128, 8, 3), (128, 64, 4, 3), (128, 128, 8, 2), (128, 64, 8, 3)]
GRID = (
    [(*c, "tuned") for c in _LIKELY]
    + [(*c, v) for v in ("tuned_tma", "tuned_ws", "tuned_tma_ws") for c in _LIKELY]
    + [(128, 64, 4, 3, "v1"), (128, 128, 8, 3, "v1")]
    + [(128, bn, w, st, "tuned") for bn in (64, 128) for w in (4, 8) for st in (2, 3, 4)
       if (128, bn, w, st) not in _LIKELY]
    + [(64, 64, 4, 3, "tuned"), (64, 64, 4, 4, "tuned"), (256, 64, 8, 2, "tuned"), (256, 64, 8, 3, "tuned")]
)
SMALL_GRID = [(32, 32, 4, 2, "v1"), (32, 32, 4, 2, "tuned"), (64, 32, 4, 2, "tuned"), (32, 32, 4, 2, "tuned_ws"),
              (32, 32, 4, 2, "tuned_tma"), (32, 32, 4, 2, "tuned_tma_ws")]
SHAPES = {"deepseek": (16, 8910, 64), "qwen": (16, 2728, 72)}
SMALL_SHAPES = {"deepseek": (2, 150, 64), "qwen": (2, 90, 72)}


def operands(heads: int, n: int, hd: int, dtype, device, seed: int = 0):
    """q, k, v as [1, H, N, hd] strided views of one [N, 3, H, hd] tensor (the qkv GEMM's output)."""
    g = torch.Generator(device=device).manual_seed(seed)
    qkv = torch.randn(n, 3, heads, hd, generator=g, device=device).to(dtype)
    return tuple(qkv[:, i].transpose(0, 1).unsqueeze(0) for i in range(3))


def per_call_ms(fn, device, reps: int) -> float:
    """Median of 3 runs of `reps` calls, after one untimed call (compile, warm-up)."""
    fn()
    runs = []
    for _ in range(3):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(reps):
                fn()
            b.record()
            b.synchronize()
            runs.append(a.elapsed_time(b) / reps)
        else:
            t = time.perf_counter()
            for _ in range(reps):
                fn()
            runs.append((time.perf_counter() - t) * 1e3 / reps)
    return statistics.median(runs)


def sweep_shape(name: str, shape, grid, args, device, dtype, deadline: float) -> dict:
    heads, n, hd = shape
    q, k, v = operands(heads, n, hd, dtype, device)
    flops = 4.0 * heads * n * n * hd
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH]):
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
    out: dict = {"shape": {"heads": heads, "tokens": n, "head_dim": hd, "dtype": str(dtype).split(".")[-1]},
                 "flops_per_call": flops, "kernels": {}}
    errors = {}

    def run(label, fn, kind):
        entry = {"kind": kind}
        try:
            o = fn()
            entry["max_abs_vs_fp32"] = float((o.float() - ref).abs().max())
            entry["ms"] = per_call_ms(fn, device, args.reps)
            entry["tflops"] = flops / (entry["ms"] * 1e-3) / 1e12
        except Exception as e:  # noqa: BLE001 - a config this GPU or Triton cannot run: a figure
            text = str(e).strip()
            entry["error"] = f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"[:300]
        out["kernels"][label] = entry
        if "ms" in entry:
            errors[label] = entry["max_abs_vs_fp32"]
        status = (f"{entry['ms']:8.3f} ms {entry['tflops']:6.0f} TFLOP/s |o-ref| {entry['max_abs_vs_fp32']:.2e}"
                  if "ms" in entry else entry["error"])
        print(f"{name:9s} {label:34s} {status}", flush=True)

    if device.type == "cuda":
        for kname, enum in (("cudnn", "CUDNN_ATTENTION"), ("flash", "FLASH_ATTENTION"),
                            ("efficient", "EFFICIENT_ATTENTION")):
            backend = getattr(SDPBackend, enum, None)
            if backend is None:
                continue

            def call(b=backend):
                with sdpa_kernel([b]):
                    return torch.nn.functional.scaled_dot_product_attention(q, k, v)
            run(f"sdpa_{kname}", call, "sdpa")
    else:  # the CPU's own SDPA, as the floor for the error criterion
        run("sdpa_cpu", lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v), "sdpa")
    sdpa_errors = [errors[k] for k in errors if k.startswith("sdpa_")]
    floor = max(sdpa_errors) if sdpa_errors else None
    out["error_floor"] = floor

    try:
        from engine.runtime import triton_attention as T
    except ImportError as e:
        out["triton"] = f"not importable: {e}"
        return out
    out["triton"] = {"version": __import__("triton").__version__, "warp_specialize": T.WARP_SPECIALIZE,
                     "variants": list(T.VARIANTS)}
    for config in T.candidates(hd, grid):
        label = "triton " + ",".join(map(str, config))
        if config[4] not in T.VARIANTS:
            out["kernels"][label] = {"kind": "triton", "config": list(config),
                                     "skipped": f"this Triton has no {config[4]} (variants {list(T.VARIANTS)})"}
            continue
        if time.monotonic() > deadline:
            out["kernels"][label] = {"kind": "triton", "config": list(config), "skipped": "sweep time budget spent"}
            continue
        run(label, lambda c=config: T.flash_attention(q, k, v, config=c), "triton")
        out["kernels"][label]["config"] = list(config)

    for label, e in out["kernels"].items():
        if "max_abs_vs_fp32" in e:
            e["ok"] = floor is not None and e["max_abs_vs_fp32"] <= 2 * floor + 1e-5
    ok = {k: e for k, e in out["kernels"].items() if e.get("ok")}
    tri = {k: e["ms"] for k, e in ok.items() if e["kind"] == "triton"}
    sdpa = {k: e["ms"] for k, e in ok.items() if e["kind"] == "sdpa"}
    if tri:
        best = min(tri, key=tri.get)
        out["best_triton"] = {"label": best, "config": ok[best]["config"], "ms": tri[best], "tflops": ok[best]["tflops"]}
    if sdpa:
        out["best_sdpa"] = min(sdpa, key=sdpa.get)
    cudnn = ok.get("sdpa_cudnn", {}).get("ms")
    if tri and cudnn:
        out["triton_over_cudnn"] = tri[out["best_triton"]["label"]] / cudnn
    out["failed_configs"] = sorted(k for k, e in out["kernels"].items() if "error" in e)
    out["wrong_configs"] = sorted(k for k, e in out["kernels"].items() if e.get("ok") is False)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--small", action="store_true", help="tiny shapes and a few configs (a CPU smoke run)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--budget-s", type=float, default=150.0, help="stop trying new Triton configs after this")
    ap.add_argument("--only", choices=sorted(SHAPES), action="append", default=[])
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("attention_sweep: --device cuda but no GPU is visible", file=sys.stderr)
        return 2
    if device.type == "cpu" and not args.small:
        print("attention_sweep: the full shapes need a GPU (use --small on the CPU)", file=sys.stderr)
        return 2
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        os.environ["TRITON_INTERPRET"] = "1"  # read when Triton is imported: before the first import below
    args.out.mkdir(parents=True, exist_ok=True)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shapes = SMALL_SHAPES if args.small else SHAPES
    grid = SMALL_GRID if args.small else GRID
    res: dict = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                 "torch": torch.__version__, "small": args.small, "reps": args.reps, "budget_s": args.budget_s,
                 "shapes": {}}
    path = args.out / "attention_sweep.json"
    names = args.only or list(shapes)
    share = {"deepseek": 2.0, "qwen": 1.0}  # DeepSeek's shape carries the tower's target: most of the time
    start, spent = time.monotonic(), 0.0
    for name in names:
        spent += share[name] / sum(share[n] for n in names)
        deadline = start + args.budget_s * spent  # what a shape leaves unspent passes to the next
        res["shapes"][name] = sweep_shape(name, shapes[name], grid, args, device, dtype, deadline)
        path.write_text(json.dumps(res, indent=1) + "\n")  # after each shape: a stopped run keeps what it did
        torch.cuda.empty_cache() if device.type == "cuda" else None
    for name, r in res["shapes"].items():
        b = r.get("best_triton")
        ratio = r.get("triton_over_cudnn")
        print(f"{name}: best triton {b['label'] if b else None} "
              f"{'%.3f ms %.0f TFLOP/s' % (b['ms'], b['tflops']) if b else ''}; best sdpa {r.get('best_sdpa')}; "
              f"triton/cudnn {ratio if ratio is None else round(ratio, 3)}; "
              f"failed {len(r.get('failed_configs', []))}, wrong {len(r.get('wrong_configs', []))}")
    print(f"wrote {path}")
    return 0 if all(r.get("best_sdpa") for r in res["shapes"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
