"""bench/release_checkpoint.py on the CPU (synthetic:tiny-fp8, the release's storage): prepare
describes the checkpoint, check and gate pass the clean engine on the default route, the gate
reuses the check's cached oracle, and the report has what the GPU run's note quotes. Called in
this process."""
from __future__ import annotations

import json


def test_release_checkpoint_smoke(tmp_path, bench):
    out = tmp_path / "out"
    assert bench("release_checkpoint").main(["--out", str(out), "--layers", "0-2"]) == 0
    rep = json.loads((out / "release_checkpoint.json").read_text())
    prep, check, gate = (rep["steps"][k] for k in ("prepare", "check", "gate"))
    assert prep["problems"] == [] and prep["run_layers"] == [0, 1, 2] and len(prep["conversions"]) == 2
    assert check["exit"] == 0 and check["verdict"] == "match" and check["boundaries"] > 15
    assert gate["exit"] == 0 and gate["verdict"] == "pass" and gate["local_error_origin"] == [None]
    assert gate["oracle_cache"] == ["hit"]
    for step in (prep, check, gate):
        assert step["wall_s"] > 0 and step["peak_gpu_gib"] is None  # no GPU here
    assert rep["layers"] == "0-2" and rep["exit"] == 0
    assert "layers = \"0-2\"" in (out / "release_checkpoint_gate.toml").read_text()
