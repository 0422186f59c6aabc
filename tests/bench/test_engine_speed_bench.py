"""bench/engine_speed.py (the lead's H200 run through bench/engine_speed.sh) runs on the CPU on
small shapes and writes its sections; no timing is asserted. The attention section is the one run
here in full (the tower sections compile and are exercised by tests/engine)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "engine_speed.py"


def test_the_attention_section_on_the_cpu(tmp_path):
    r = subprocess.run([sys.executable, str(BENCH), str(tmp_path), "--device", "cpu", "--small", "--iters", "1",
                        "--only", "attention"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads((tmp_path / "engine_speed.json").read_text())
    a = rep["attention"]
    # the CPU's SDPA routes: flash and math run and agree with the float64 reference; the CUDA-only ones say why
    assert a["kernels"]["sdpa_flash"]["max_abs_vs_reference"] < 1e-4
    assert a["kernels"]["sdpa_math"]["max_abs_vs_reference"] < 1e-4
    assert "error" in a["kernels"]["sdpa_cudnn"]
    assert a["sdpa_order_by_measurement"][0] == "flash" and a["best_overall"] in ("sdpa_flash", "sdpa_math")
    assert rep["checks"] == {"attention: an SDPA kernel agrees": True}
