"""bench/suite_time.py times a pytest run against torch's import in the same run and records each
test's wall and CPU seconds (bench/suite_cpu.py); no timing is asserted. The run here is a few
fast tests, enough to show every field is filled from the real run; without the suite's conftest
(its session fixtures import torch, which the baseline already measures twice)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "suite_time.py"
SUBSET = ["tests/hip/test_hip_build.py", "-q", "-k", "lint", "-p", "no:cacheprovider", "--noconftest"]


def test_a_small_run_against_the_torch_import(tmp_path):
    r = subprocess.run([sys.executable, str(BENCH), str(tmp_path), "--rounds", "1", "--", *SUBSET],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rep = json.loads((tmp_path / "suite_time.json").read_text())
    assert rep["exit_status"] == 0 and "5 passed" in rep["summary"], rep["summary"]
    assert len(rep["import_torch_walls_s"]) == 2 and rep["import_torch_wall_s"] > 0
    assert rep["suite_wall_s"] > 0 and rep["ratio_wall"] > 0 and rep["ratio_cpu"] > 0
    # every test that ran is in the per-test record, by its node id, with both clocks
    assert rep["tests_recorded"] == 5 and all(
        k.startswith("tests/hip/test_hip_build.py::test_lint_catches") and v["cpu_s"] >= 0 and v["wall_s"] >= 0
        for k, v in rep["slowest_by_cpu"].items())


def test_an_existing_report_is_never_overwritten(tmp_path):
    (tmp_path / "suite_time.json").write_text("{}")
    r = subprocess.run([sys.executable, str(BENCH), str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "already exists" in r.stderr
    assert (tmp_path / "suite_time.json").read_text() == "{}"
