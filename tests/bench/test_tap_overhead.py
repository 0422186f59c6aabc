"""bench/tap_overhead.py runs on a tiny model and writes its ratios (a smoke test: no timing asserted)."""
import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "tap_overhead.py"


def test_tap_bench_tiny_writes_its_ratios(tmp_path):
    r = subprocess.run([sys.executable, str(BENCH), str(tmp_path), "--quick"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "tap_overhead.json").read_text())
    assert rep["tap_points"] == rep["layers"] == 2
    assert rep["ratio_memory_to_untapped"] > 0 and rep["ratio_recorder_forward_to_untapped"] > 0
    assert all(v > 0 for v in rep["median_s"].values())
