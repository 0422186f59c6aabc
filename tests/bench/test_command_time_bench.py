"""bench/command_time.py runs a command against torch's import in the same run and writes the
figures the closing note quotes; and what it records about imports is true: a DeepSeek check
imports torch but neither transformers nor scipy nor sympy (no timing is asserted)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "command_time.py"


def test_one_round_of_the_deepseek_check_and_compare(tmp_path):
    r = subprocess.run([sys.executable, str(BENCH), str(tmp_path), "--rounds", "1", "--only", "check deepseek",
                        "--only", "compare"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "command_time.json").read_text())
    assert rep["import torch"]["median_s"] > 0
    assert set(rep["commands"]) == {"check deepseek-v4.1-flash", "compare samples"}
    check = rep["commands"]["check deepseek-v4.1-flash"]
    assert check["median_s"] > 0 and "over_torch_s" in check and check["target"].startswith("<= torch import")
    assert check["imports"]["torch"] and not check["imports"]["transformers"]
    assert not check["imports"]["scipy"] and not check["imports"]["sympy"]
    # compare stays torch-free: the import report sees the difference
    assert not rep["commands"]["compare samples"]["imports"]["torch"]
    assert rep["commands"]["compare samples"]["imports"]["numpy"]
