"""bench/router_variants.py on the CPU: its variants are the routes the kernel has, and without a
CUDA GPU it says so in one line and exits 2 (it measures on the H200 only)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench import router_variants as V
from engine.backend.hip_ops import ROUTER_ROUTES

BENCH = Path(V.__file__).resolve()


def test_every_variant_runs_a_route_the_kernel_has():
    assert {code for _, code in V.VARIANTS.values()} <= set(ROUTER_ROUTES.values())
    assert V.VARIANTS["exact_bf16"] == ([], ROUTER_ROUTES["exact_bf16"])  # the shipped build itself


def test_without_a_gpu_it_says_one_line_and_exits_2(tmp_path):
    r = subprocess.run([sys.executable, str(BENCH), str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr and "CUDA GPU" in r.stderr
