"""The diagnosis-cost benchmark runs end to end on the CPU (a smoke test, in this process: no
timing asserted)."""
from __future__ import annotations

import json


def test_the_diagnosis_cost_bench_writes_its_report(tmp_path, bench):
    assert bench("diagnosis_cost").main([str(tmp_path), "--repeat", "1", "--case",
                                         "deepseek-v4.1-flash:rope-interleaved", "--case", "qwen3-vl"]) == 0
    rep = json.loads((tmp_path / "diagnosis_cost.json").read_text())
    fault, clean = rep["cases"]
    assert fault["earliest"] == ["rope"] and "interleave" in fault["diagnosis"][0]
    assert fault["compare_s"] > 0 and fault["diagnose_s"] > 0 and fault["ratio"] > 0
    assert clean["earliest"] == [] and clean["diagnosis"] == []
    assert "ratio (diagnose + replay) / compare" in (tmp_path / "diagnosis_cost.txt").read_text()
