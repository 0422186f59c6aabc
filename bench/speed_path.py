"""What the engines write as `run.speed_path`, checked where the speed paths exist (CUDA).

    python bench/speed_path.py OUTDIR                                       # H200: synthetic:full, bf16, 90x99
    python bench/speed_path.py OUTDIR --device cpu --weights synthetic:tiny --dtype float32 --grid 40x40   # smoke

Writes OUTDIR/speed_path.json:
- `passes`: the default DeepSeek vision engine's speed path after each of four passes without
  taps (on CUDA: pass 1 eager, pass 2 compiles the block and captures the grid's CUDA graph,
  later passes replay it; the SDPA kernel the attention calls took);
- `forced`: routes that must be recorded as fallbacks: the kernel order `flash, math` on a
  float32 engine (flash declines fp32: `sdpa flash -> math` with the reason), and `fuse=on` with
  compiling made impossible (`vision block compiled -> eager`);
- `log_overhead`: the eager engine's tower + aligner time with the speed log against without it
  (the log asks SDPA which kernel it would take on every call: a host-side query), as a ratio;
- `qwen`: the Qwen3-VL engine's speed path on the same device (synthetic:tiny).
Each check is also a verdict in `checks` (true / false); the exit status is 1 if one is false.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import engine.runtime.fused as fused  # noqa: E402  (where the block compiler lives)
from deepseek_vision import DTYPES, picture, timed  # noqa: E402
from engine.deepseek_v41_flash.run import VisionEngine  # noqa: E402
from tensordiff.format.capture import MemoryRecorder, NullRecorder  # noqa: E402
from tensordiff.pipeline.runs import make_request  # noqa: E402
from tensordiff.models.deepseek_v41_flash.synthetic import resolve  # noqa: E402


def _refuse(fn):
    """A stand-in for torch.compile whose compiled function fails, as a broken toolchain would."""
    def call(*args, **kwargs):
        raise RuntimeError("compiling disabled by bench/speed_path.py")
    return call


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--weights", default="synthetic:full")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=list(DTYPES), default="bfloat16")
    ap.add_argument("--grid", default="90x99")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    gh, gw = (int(v) for v in args.grid.lower().split("x"))
    wdir = resolve(args.weights)
    res: dict = {"device": str(device), "dtype": args.dtype, "grid": [gh, gw], "torch": torch.__version__,
                 "gpu": torch.cuda.get_device_name(device) if cuda else None}
    checks: dict[str, bool] = {}
    null = NullRecorder()

    path = picture(gh, gw, 14, Path(tempfile.mkdtemp()))
    with torch.inference_mode():
        # ---- the default engine, pass by pass
        eng = VisionEngine(wdir, device=args.device, dtype=args.dtype)
        plan, patches = eng.preprocess(path)
        passes = []
        for _ in range(4):
            eng.encode(patches, plan, null)
            passes.append(json.loads(json.dumps(eng.speed_path())))
        res["passes"] = passes
        last = passes[-1]
        checks["a kernel is named for every attention call"] = "unknown" not in last["attention"]["sdpa"]
        if cuda:
            v = last["vision"]
            checks["pass 1 runs eager"] = passes[0]["vision"]["block"]["ran"] == "eager"
            checks["the block runs compiled from pass 2"] = v["block"]["ran"] == "compiled"
            checks["the grid's CUDA graph is captured once and replayed"] = (
                v["cuda_graphs"]["captured"] == 1 and v["cuda_graphs"]["replayed"] >= 1)
            checks["no fallback on the default route"] = last["fallbacks"] == []
        else:
            checks["the CPU stays eager"] = last["vision"]["block"]["ran"] == "eager"

        # ---- forced fallbacks
        forced = {}
        f32 = VisionEngine(wdir, device=args.device, dtype="float32", attention_prefer=["flash", "math"],
                           fuse="off", graphs="off")
        f32.encode(patches, plan, null)
        forced["flash_then_math_fp32"] = f32.speed_path()
        if cuda:
            checks["fp32 flash -> math is a recorded fallback"] = any(
                f["what"] == "sdpa flash -> math" for f in forced["flash_then_math_fp32"]["fallbacks"])
        real = fused._compile
        fused._compile = _refuse
        try:
            broken = VisionEngine(wdir, device=args.device, dtype=args.dtype, fuse="on", graphs="off")
            broken.encode(patches, plan, null)
            forced["failing_compile"] = broken.speed_path()
        finally:
            fused._compile = real
        checks["a failing compile is a recorded fallback"] = any(
            f["what"] == "vision block compiled -> eager" for f in forced["failing_compile"]["fallbacks"])
        res["forced"] = forced

        # ---- what the speed log costs: the eager engine with and without it
        plain = VisionEngine(wdir, device=args.device, dtype=args.dtype, fuse="off", graphs="off")
        with_log, _ = timed(lambda: plain.encode(patches, plan, null), device, args.iters, 2)
        plain.tower.speed = None
        without, _ = timed(lambda: plain.encode(patches, plan, null), device, args.iters, 2)
        res["log_overhead"] = {"with_log_ms": with_log, "without_ms": without, "ratio": with_log / without}

    # ---- Qwen3-VL
    ad, req = make_request("qwen3-vl", device=args.device)
    rec = MemoryRecorder()
    ad.runner("engine")(req, rec)
    res["qwen"] = rec.run["speed_path"]
    checks["qwen names its SDPA kernel"] = bool(res["qwen"]["attention"]["sdpa"]) and \
        "unknown" not in res["qwen"]["attention"]["sdpa"]

    res["checks"] = checks
    (args.out / "speed_path.json").write_text(json.dumps(res, indent=1) + "\n")
    for name, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    print(f"speed log overhead (eager tower + aligner): x{res['log_overhead']['ratio']:.3f}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
