"""bench/attention_sweep.py: each shape's kernels in worker processes, so a config that faults
the device (poisoning the CUDA context for every later call) or kills its process leaves the
other configs measured. Runs the CPU smoke shapes through Triton's interpreter where Triton is
installed; the faults are planted (ATTENTION_SWEEP_PLANT) since a real one needs a GPU."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")


def sweep(tmp_path, plant: str):
    env = dict(os.environ, ATTENTION_SWEEP_PLANT=plant,
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, str(ROOT / "bench/attention_sweep.py"), str(tmp_path), "--small", "--reps",
                        "1", "--device", "cpu", "--only", "qwen"], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads((tmp_path / "attention_sweep.json").read_text())["shapes"]["qwen"]


def test_a_faulting_and_a_dying_config_leave_the_others_measured(tmp_path):
    # the first Triton config faults, the second kills its process: each is recorded, a fresh worker
    # takes the rest, and every other config (and SDPA, the error floor) is measured and checked
    r = sweep(tmp_path, "fault:triton 32,32,4,2,tuned")
    k = r["kernels"]
    assert k["triton 32,32,4,2,tuned"]["device_fault"] and "illegal" in k["triton 32,32,4,2,tuned"]["error"]
    measured = [label for label, e in k.items() if "ms" in e]
    assert "sdpa_cpu" in measured and "triton 64,32,4,2,tuned" in measured and len(measured) >= 4
    assert all(e.get("ok") for e in k.values() if "ms" in e) and r["workers"] == 2
    assert r["faulted_configs"] == ["triton 32,32,4,2,tuned"] and r["best_triton"]


def test_a_process_that_dies_on_a_config_is_recorded_and_the_rest_run(tmp_path):
    r = sweep(tmp_path, "die:triton 64,32,4,2,tuned")
    k = r["kernels"]
    assert "died" in k["triton 64,32,4,2,tuned"]["error"] and r["workers"] == 2
    assert "ms" in k["sdpa_cpu"] and "ms" in k["triton 32,32,4,2,tuned"] and len(k) >= 3


def test_a_clean_sweep_runs_in_one_worker(tmp_path):
    r = sweep(tmp_path, "")
    assert r["workers"] == 1 and not r["failed_configs"] and not r["faulted_configs"]
    assert all("ms" in e for e in r["kernels"].values())
