"""The throughput benchmark runs end to end on a tiny size and writes the fields the closing
note quotes (it is a smoke test: no timing is asserted)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "compare_throughput.py"


def test_bench_tiny_writes_its_report(tmp_path):
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, str(BENCH), "--dir", str(tmp_path / "dumps"), "--size-mb", "3",
                        "--repeat", "1", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "compare / read" in r.stdout
    rep = json.loads(out.read_text())
    assert 2.5e6 < rep["dumps"]["bytes"] < 3.5e6
    warm = rep["warm"]
    for route in ("read", "read1", "compare", "naive"):
        for k in ("wall_s", "gb_per_s", "peak_rss_mb", "rss_after_import_mb"):
            assert warm[route][k] > 0, (route, k)
        assert warm[route]["cpu_s"] >= 0
        assert warm[route]["bytes"] == rep["dumps"]["bytes"] - _headers(tmp_path / "dumps")
    assert warm["compare"]["verdict"] == "match"  # B is A plus a few ULP: within the defaults
    assert set(warm["compare"]["statuses"]) == {"patches", "rope.cos", "rope.sin", "block0", "final_norm",
                                                "aligner", "router.0.ids"}
    assert warm["ratio_compare_to_read"] > 0 and warm["cpu_ratio_compare_to_read"] > 0
    assert warm["ratio_run_by_run"]["median"] > 0
    assert "speedup_vs_naive" in warm and "ratio_compare_to_read1" in warm
    assert set(rep["met"]) == {"ratio", "rss"}
    assert rep["comparator"]["kernel"]


def _headers(root: Path) -> int:
    """Bytes of safetensors headers (8-byte length + JSON), which no route reads as tensor data."""
    n = 0
    for p in root.glob("*/*.safetensors"):
        with open(p, "rb") as f:
            n += 8 + int.from_bytes(f.read(8), "little")
    return n
