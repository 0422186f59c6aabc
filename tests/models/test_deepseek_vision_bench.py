"""The vision benchmark runs end to end on a CPU with tiny weights (`bash bench/gpu.sh OUT vision` on a GPU)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_smoke_tiny_cpu(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("ds_bench", ROOT / "bench" / "deepseek_vision.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "bench.json"
    res = bench.main([str(out), "--device", "cpu", "--weights", "synthetic:tiny", "--dtype", "float32",
                      "--grid", "40x40", "--iters", "1", "--warmup", "0", "--oracle-iters", "1"])
    saved = json.loads(out.read_text())
    assert saved["grid"] == [40, 40] and saved["patches"] == 1600 and saved["tokens"] == 14 * 14
    t = saved["tower_aligner_ms"]
    assert t["engine"] > 0 and t["engine_taps"] > 0 and t["oracle"] > 0
    assert saved["preprocess_ms"]["oracle"] > 0 and saved["preprocess_ms"]["engine"] > 0
    assert saved["engine_vs_oracle"]["cosine"] > 0.9999  # fp32: the two routes agree
    assert saved["flops"]["total"] == sum(saved["flops"][k] for k in ("gemm", "attention", "aligner"))
    assert res["engine_tflops"] > 0
    assert saved["speed_path"]["vision"]["block"]["ran"] == "eager"  # the CPU has no compiled route
    assert "tower + aligner" in capsys.readouterr().out
