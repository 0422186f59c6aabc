"""bench/quant_checkpoint.py runs on a CPU at small shapes and writes its report; the engine's
dequantising matmul is within one bf16 ulp of the official block order everywhere (no timing is
asserted: speed only as ratios, on the GPU). Called in this process."""
from __future__ import annotations

import json


def test_quant_gemm_bench_small(tmp_path, bench):
    out = tmp_path / "q.json"
    assert bench("quant_checkpoint").main(["--small", "--repeat", "1", "--tokens", "128", "--json", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert {row["format"] for row in rep["rows"]} == {"fp8", "fp4"} and len(rep["rows"]) == 6
    for row in rep["rows"]:
        assert row["max_ulps"] <= 1.0, row
        assert row["frac_differ"] < 0.01 and row["ratio_engine_to_bf16"] > 0
