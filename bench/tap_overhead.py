"""What `tensordiff.tap` costs a model's forward, as ratios to the untapped forward.

    python bench/tap_overhead.py OUT [--device cuda] [--quick]

A transformer encoder (nn.TransformerEncoder, batch 1) runs untapped, then with every layer's
output tapped into a `MemoryRecorder` (a device-side clone per tap) and into a `Recorder` (a
device copy queued per tap; the host transfer and the write happen at close, timed apart).
Writes OUT/tap_overhead.json: median forward seconds per route and the ratios tapped/untapped.
On a GPU the forward is synchronised before each clock read.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--quick", action="store_true", help="a tiny model and few repeats (smoke test)")
    a = ap.parse_args(argv)
    import torch

    from tensordiff import MemoryRecorder, Recorder, tap

    width, layers, tokens, repeat = (64, 2, 32, 3) if a.quick else (1024, 24, 2048, 20)
    dev = torch.device(a.device)
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(width, 16 if width >= 256 else 4, 4 * width, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).to(dev).eval()
    x = torch.randn(1, tokens, width, device=dev)
    points = {f"hidden.{i}": f"layers.{i}" for i in range(layers)}

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def timed(fn):
        times = []
        for _ in range(repeat + 1):  # the first run warms up
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t0)
        return statistics.median(times[1:])

    a.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="tap-bench-"))
    close_s = []
    with torch.inference_mode():
        plain = timed(lambda: model(x))

        def memory():
            with tap(model, points, MemoryRecorder()):
                model(x)

        fwd_s: list[float] = []

        def recorder():  # the forward and the close timed apart; each dump removed before the next
            rec = Recorder(work / "d", model="bench")
            sync()
            t0 = time.perf_counter()
            with tap(model, points, rec):
                model(x)
            sync()
            t1 = time.perf_counter()
            rec.close()
            close_s.append(time.perf_counter() - t1)
            fwd_s.append(t1 - t0)
            shutil.rmtree(work / "d")

        mem = timed(memory)
        timed(recorder)
    shutil.rmtree(work, ignore_errors=True)
    rec_fwd, close = statistics.median(fwd_s[1:]), statistics.median(close_s[1:])
    res = {"device": str(dev), "torch": torch.__version__, "width": width, "layers": layers, "tokens": tokens,
           "repeat": repeat, "tap_points": len(points),
           "median_s": {"untapped": plain, "memory_recorder": mem, "recorder_forward": rec_fwd,
                        "recorder_close": close},
           "ratio_memory_to_untapped": mem / plain, "ratio_recorder_forward_to_untapped": rec_fwd / plain,
           "bytes_per_forward": layers * tokens * width * 4}
    (a.out / "tap_overhead.json").write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
