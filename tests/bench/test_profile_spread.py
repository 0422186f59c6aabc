"""bench/profile_spread.sh in its CPU smoke mode (synthetic:tiny, two small pictures): every step
runs and writes its part of the JSON. No timing is asserted; the verdicts are: the eager profile
is refused on the compiled engine, the compiled gate passes clean and catches each numeric fault."""
import json
import os
import subprocess
import sys
from pathlib import Path

from tensordiff.models.deepseek_faults import NORM_EPS, RESIDUAL_SCALE, SPLITK_BF16, TAIL_ROW_SCALE

ROOT = Path(__file__).resolve().parents[2]


def test_profile_spread_smoke_runs_every_step(tmp_path):
    env = {**os.environ, "SMOKE": "1", "PYTHON": sys.executable, "TENSORDIFF_CACHE": str(tmp_path / "cache")}
    r = subprocess.run(["bash", str(ROOT / "bench" / "profile_spread.sh"), str(tmp_path / "out")], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((tmp_path / "out" / "profile_spread.json").read_text())
    assert res["smoke"] and res["skipped"] == [] and set(res["steps"]) == {"eager", "compiled", "gate", "seed"}
    assert res["eager"]["engine"]["fuse"] == "off" and res["compiled"]["engine"]["graphs"] == "on"
    for part in ("eager", "compiled"):
        prof = res[part]["profile"]
        assert {"block0", "final_norm", "aligner"} <= set(prof)
        for stat in ("rmse", "row", "cosine"):
            v = prof["aligner"][stat]
            assert v["images"] == 2 and v["repeats"] == 2 and v["n"] == 4 and v["min"] <= v["median"] <= v["max"]
            assert v["run_spread"] >= 0 and v["image_spread"] >= 0
            assert sorted(v["per_image"]) == ["noise-a.png", "noise-b.png"] and all(
                len(r) == 2 and v["min"] <= min(r) and max(r) <= v["max"] for r in v["per_image"].values())
    assert set(res["shift"]["aligner"]["rmse"]) >= {"median_shift", "compiled_inside_eager_band"}
    g = res["gate"]
    assert g["eager_profile_on_compiled"].startswith("refused:") and "fuse off (calibrated)" in g["eager_profile_on_compiled"]
    assert g["clean_passes"] and g["faults_caught"] == {f: True for f in (RESIDUAL_SCALE, NORM_EPS, SPLITK_BF16,
                                                                         TAIL_ROW_SCALE)}
    # what the "compiled" engine really ran is recorded (on the CPU: eager, with the reason)
    assert any(sp["vision"]["block"]["asked"] == "on" for sp in g["speed_path"])
    assert not (tmp_path / "out" / "gate-work").exists()  # the gate's dumps are not left in OUTDIR
    assert res["seed"]["weights"] == "synthetic:tiny-s2" and isinstance(res["seed"]["transfers"], bool)
    assert res["seed"]["gate_seed0_calibration_on_seed2"].startswith("refused:")
    assert "weights synthetic:tiny (calibrated) vs synthetic:tiny-s2" in res["seed"]["gate_seed0_calibration_on_seed2"]
