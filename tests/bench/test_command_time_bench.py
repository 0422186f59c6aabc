"""bench/command_time.py runs a command against torch's import in the same run and writes the
figures the closing note quotes (no timing is asserted); and the import facts it reports hold: a
DeepSeek check imports torch but neither transformers nor scipy nor sympy, and compare no torch."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "command_time.py"


def test_one_round_of_compare_against_the_torch_import(tmp_path):
    r = subprocess.run([sys.executable, str(BENCH), str(tmp_path), "--rounds", "1", "--only", "compare"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "command_time.json").read_text())
    assert rep["import torch"]["median_s"] > 0 and len(rep["import torch"]["walls_s"]) == 1
    # the second baseline: torch imported as check and gate import it (collector paused, frozen)
    assert rep["import torch (collector paused, frozen)"]["median_s"] > 0
    assert set(rep["commands"]) == {"compare samples"}
    c = rep["commands"]["compare samples"]
    assert c["median_s"] > 0 and c["target"] == "<= 0.25 s" and isinstance(c["met"], bool)
    # compare stays torch-free: the import report tells the two apart
    assert not c["imports"]["torch"] and c["imports"]["numpy"]


def test_a_deepseek_check_imports_no_transformers_scipy_or_sympy(tmp_path):
    code = ("import sys\nfrom tensordiff.cli import main\n"
            "try:\n    main(['check', 'deepseek-v4.1-flash'])\n"
            "finally:\n    print(sorted(m for m in ('torch', 'transformers', 'scipy', 'sympy') if m in sys.modules))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "['torch']"
