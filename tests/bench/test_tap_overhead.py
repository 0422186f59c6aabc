"""bench/tap_overhead.py runs on a tiny model and writes its ratios (a smoke test, in this
process: no timing asserted)."""
import json

import torch


def test_tap_bench_tiny_writes_its_ratios(tmp_path, bench):
    with torch.random.fork_rng():  # the bench seeds torch's global generator: not for the tests after it
        assert bench("tap_overhead").main([str(tmp_path), "--quick"]) == 0
    rep = json.loads((tmp_path / "tap_overhead.json").read_text())
    assert rep["tap_points"] == rep["layers"] == 2
    assert rep["ratio_memory_to_untapped"] > 0 and rep["ratio_recorder_forward_to_untapped"] > 0
    assert all(v > 0 for v in rep["median_s"].values())
