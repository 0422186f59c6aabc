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
    # --as-is: the environment's bytecode (the private cache starts empty in the suite's fresh
    # TENSORDIFF_CACHE: every module torch imports would be compiled for this one round); the
    # private cache's environment is checked by test_the_children_get_a_private_bytecode_cache
    r = subprocess.run([sys.executable, str(BENCH), str(tmp_path), "--rounds", "1", "--only", "compare", "--as-is"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "command_time.json").read_text())
    assert rep["bytecode"].startswith("the environment's")
    assert rep["import torch"]["median_s"] > 0 and len(rep["import torch"]["walls_s"]) == 1
    # the second baseline: torch imported as check and gate import it (collector paused, frozen)
    assert rep["import torch (collector paused, frozen)"]["median_s"] > 0
    assert set(rep["commands"]) == {"compare samples"}
    c = rep["commands"]["compare samples"]
    assert c["median_s"] > 0 and c["target"] == "<= 0.25 s" and isinstance(c["met"], bool)
    # compare stays torch-free: the import report tells the two apart
    assert not c["imports"]["torch"] and c["imports"]["numpy"]


def test_a_deepseek_check_imports_no_transformers_scipy_or_sympy(tmp_path):
    code = ("import sys\nfrom tensordiff.commands.cli import main\n"
            "try:\n    main(['check', 'deepseek-v4.1-flash'])\n"
            "finally:\n    print(sorted(m for m in ('torch', 'transformers', 'scipy', 'sympy') if m in sys.modules))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "['torch']"


def test_the_children_get_a_private_bytecode_cache(tmp_path, bench, monkeypatch):
    """Without --as-is the children write and read bytecode in a folder of their own, whatever the
    shell says; with it, the shell's setting stands. The oracle cache is private either way."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    ct = bench("command_time")
    env = ct._env(tmp_path / "cache", tmp_path / "pycache")
    assert "PYTHONDONTWRITEBYTECODE" not in env and env["PYTHONPYCACHEPREFIX"] == str(tmp_path / "pycache")
    assert env["TENSORDIFF_CACHE"] == str(tmp_path / "cache") and env["PYTHONPATH"].split(os.pathsep)[0] == str(ROOT)
    env = ct._env(tmp_path / "cache", None)
    assert env["PYTHONDONTWRITEBYTECODE"] == "1" and "PYTHONPYCACHEPREFIX" not in env
    assert env["TENSORDIFF_CACHE"] == str(tmp_path / "cache")
