"""bench/gpu.sh, the one GPU entry script: it lists its stages, refuses an unknown stage or a
missing OUTDIR in one line (exit 2) before running anything, and counts a stage that fails (here,
on a machine without CUDA, the `taps` stage: its bench asks for `--device cuda`) as a failure of
the run (exit 1) while still writing its log."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu.sh"


def gpu_sh(*args, env=None):
    env = {**os.environ, "PYTHON": sys.executable,
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]), **(env or {})}
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=300, cwd=ROOT)


def test_every_stage_is_listed_with_a_line_and_the_default_set_is_named():
    r = gpu_sh("--list")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    stages = [line.split()[0] for line in lines[:-1]]
    assert {"hip", "kernels", "engines", "checks", "faults", "quant", "sharded", "real-dims"} <= set(stages)
    assert all(len(line.split(None, 1)) == 2 for line in lines[:-1])  # each stage says what it runs
    default = lines[-1].removeprefix("default: ").split()
    assert default and set(default) <= set(stages)


@pytest.mark.parametrize("args,message", [((), "usage: bash bench/gpu.sh OUTDIR"),
                                          (("OUT", "kernels", "no-such-stage"), "unknown stage 'no-such-stage'")])
def test_bad_usage_is_one_line_and_exit_2_before_anything_runs(tmp_path, args, message):
    args = [tmp_path / a if a == "OUT" else a for a in args]
    r = gpu_sh(*args)
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and message in r.stderr
    assert not (tmp_path / "OUT").exists()


def test_a_failing_stage_fails_the_run_and_is_named(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("the planted failure is the missing GPU")
    r = gpu_sh(tmp_path / "out", "taps")
    log = (tmp_path / "out" / "gpu.log").read_text()
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    assert "=== taps: FAILED" in log and log.rstrip().endswith("failed stages: taps")
