"""The worked example of examples/patch_model: clean it matches, with the planted layout bug it
names `patches` (and only there is the root),
with the layout diagnosis that explains it."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "examples" / "patch_model" / "run.py"


def run(tmp_path, *args):
    p = subprocess.run([sys.executable, str(RUN), "--out", str(tmp_path / "out"), "--json", str(tmp_path / "r.json"),
                        *args], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    r = json.loads((tmp_path / "r.json").read_text()) if (tmp_path / "r.json").exists() else None
    return p, r


def test_the_clean_reimplementation_matches(tmp_path):
    p, r = run(tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert r["verdict"] == "match" and [b["name"] for b in r["boundaries"]] == [
        "patches", "embed", "block.0", "block.1", "final_norm"]
    assert r["producers"]["b"]["name"] == "plain safetensors" and r["model"] == "patch-model"


@pytest.mark.parametrize("bug, hypothesis", [("transposed-grid", "transposed-grid"), ("channels-last", "flatten-order")])
def test_a_planted_layout_bug_is_named_at_patches_with_its_diagnosis(tmp_path, bug, hypothesis):
    p, r = run(tmp_path, "--bug", bug)
    assert p.returncode == 1, p.stdout + p.stderr
    assert r["earliest"] == ["patches"] and "earliest divergence at `patches`" in p.stdout
    assert all(b["status"] == "consequent" for b in r["boundaries"][1:])
    # the layout diagnosis says what kind of wrong, and that it explains (nearly) all of the error
    (found,) = r["diagnosis"]["patches"]
    assert found["name"] == hypothesis and found["explained"] >= 0.95 and "diagnosis: patches:" in p.stdout


def test_an_existing_out_is_never_overwritten(tmp_path):
    (tmp_path / "out").mkdir()
    p, _ = run(tmp_path)
    assert p.returncode == 2 and "already exists" in p.stderr and len(p.stderr.strip().splitlines()) == 1
