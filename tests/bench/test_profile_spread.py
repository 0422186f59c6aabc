"""bench/profile_spread.py in its CPU smoke mode (synthetic:tiny, two small pictures), called in
this process: every step runs and writes its part of the JSON. No timing is asserted; the verdicts
are: the eager profile is refused on the compiled engine, the compiled gate passes clean and
catches each numeric fault (on the first picture: the clean gate runs on both). The shell wrapper
the H200 run uses is checked to parse."""
import json
import signal
import subprocess
from pathlib import Path

from tensordiff.models.deepseek_v41_flash.faults import NORM_EPS, RESIDUAL_SCALE, SPLITK_BF16, TAIL_ROW_SCALE

ROOT = Path(__file__).resolve().parents[2]


def test_the_wrapper_parses():
    r = subprocess.run(["bash", "-n", str(ROOT / "bench" / "profile_spread.sh")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_no_fault_picture_is_refused(tmp_path, bench, capsys):
    assert bench("profile_spread").main([str(tmp_path / "out"), "--smoke", "--fault-images", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--fault-images must be at least 1" in err[0]
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_profile_spread_smoke_runs_every_step(tmp_path, bench, capsys):
    alarm = signal.getsignal(signal.SIGALRM)  # the bench's step budget takes SIGALRM: given back after
    try:
        rc = bench("profile_spread").main([str(tmp_path / "out"), "--smoke", "--fault-images", "1"])
    finally:
        signal.signal(signal.SIGALRM, alarm)
    assert rc == 0, capsys.readouterr().out[-3000:]
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
    assert res["fault_images"] == 1 and len(g["clean"]["cases"]) == 2 and all(
        len(g[f]["cases"]) == 1 for f in g["faults_caught"])  # the faults on the first picture only
    # what the "compiled" engine really ran is recorded (on the CPU: eager, with the reason)
    assert any(sp["vision"]["block"]["asked"] == "on" for sp in g["speed_path"])
    assert not (tmp_path / "out" / "gate-work").exists()  # the gate's dumps are not left in OUTDIR
    assert res["seed"]["weights"] == "synthetic:tiny-s2" and isinstance(res["seed"]["transfers"], bool)
    assert res["seed"]["gate_seed0_calibration_on_seed2"].startswith("refused:")
    assert "weights synthetic:tiny (calibrated) vs synthetic:tiny-s2" in res["seed"]["gate_seed0_calibration_on_seed2"]
