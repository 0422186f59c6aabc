"""The sharded-run benchmarks run end to end on small sizes on the CPU and write the fields the
closing note quotes (smoke tests: no time is asserted)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_shard_merge_small_writes_its_report(tmp_path):
    out = tmp_path / "shard.json"
    r = subprocess.run([sys.executable, ROOT / "bench" / "shard_merge.py", "--dir", tmp_path / "d", "--size-mb", "20",
                        "--ranks", "4", "--json", out], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rep = json.loads(out.read_text())
    assert 15e6 < rep["rank_dump_bytes"] < 25e6 and rep["ranks"] == 4
    assert rep["compare"]["verdict"] == "match"
    assert rep["compare"]["statuses"] == {"h": "match", "t": "match", "p": "match", "ids": "match"}
    assert rep["met"]["rss"] and rep["compare"]["peak_rss_mb"] > 0 and rep["read"]["logical_bytes"] > 0


def test_multi_gpu_sharded_runs_on_the_cpu_with_gloo(tmp_path):
    out = tmp_path / "mg"
    env = {**os.environ, "TENSORDIFF_CACHE": os.environ.get("TENSORDIFF_CACHE", str(tmp_path / "cache")),
           "TMPDIR": str(tmp_path)}  # torchrun's agent leaves a torchelastic_* directory there
    for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS", "NPROC", "LAYERS"):
        env.pop(k, None)  # the script sets the multicast switches for its children itself
    r = subprocess.run([sys.executable, ROOT / "bench" / "multi_gpu_sharded.py", "--out", out, "--device", "cpu",
                        "--faults", "shard-order-reversed"], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rep = json.loads((out / "multi_gpu_sharded.json").read_text())
    assert rep["backend"] == "gloo" and rep["dtype"] == "bfloat16" and rep["nproc"] == 2
    clean, fault = rep["checks"]["clean"], rep["checks"]["shard-order-reversed"]
    assert clean["verdict"] == "match" and clean["merge_compare_s"] > 0 and clean["torchrun_wall_s"] > 0
    assert fault["caught"] and fault["earliest"] == ["logits"]
    for facts in clean["ranks"].values():  # torchrun's children saw NVLink multicast off
        assert facts["run_s"] > 0 and facts["env"] == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                                                       "NVSHMEM_DISABLE_NVLS": "1"}
