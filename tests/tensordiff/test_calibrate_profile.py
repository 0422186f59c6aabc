"""The engine's profile across repeated runs and engine options (`calibrate --repeats`,
`[calibration.engine]`): run-to-run variation is measured and recorded apart from the images'
spread, and a gate refuses a profile measured under other engine options.

The jitter toy is the toy model (test_gate_toy) with one engine option, `fuse` (off|on|auto), and
an engine whose runs are not bit-reproducible: each call rounds block0's input through a
slightly different scale (like a kernel whose accumulation order varies between runs), and
`fuse=on` adds a systematic excess in bf16 (a compiled path with its own, larger error).
"""
from __future__ import annotations

import itertools
import tomllib
from dataclasses import replace

import numpy as np
import pytest
import torch

from tensordiff.pipeline.adapter import Fault
from tensordiff.commands.calibrate import calibrate
from tensordiff.pipeline.calibration import engine_mismatch, engine_of, engine_record, write
from tensordiff.errors import BadInput
from tensordiff.judge.floor import profile_band
from tensordiff.pipeline.calibration import profile_of
from tensordiff.commands.gate import load_gate, run_gate
from tensordiff.pipeline.options import Option, OptionTable

import test_gate_toy as toy

JITTER = "toy-jitter"
_calls = itertools.count()
RUN_SCALE = 4e-4  # relative run-to-run change of block0's input: inside the floor's multipliers
FUSED_SCALE = 4e-3  # the "compiled" path's excess: outside the eager profile's band


def _engine(req, rec):
    p = toy.patches_of(req.image)
    cos, sin = toy.rope()
    k = next(_calls) % 3  # runs cycle through three "accumulation orders"
    # the compiled path's excess is bf16-only (within fp32's tolerance there, as a fused kernel is)
    fused = req.options.get("fuse") == "on" and req.dtype == "bfloat16"
    scale = 1 + RUN_SCALE * (k - 1) + (FUSED_SCALE if fused else 0.0)
    dt = toy._dtype(req)
    w1, _ = toy.weights()
    x = (p.to(dt) @ w1.to(dt)).float() * scale  # the scale acts before the output's rounding
    a, b = x[:, :8], x[:, 8:]
    b0 = torch.cat([a * cos - b * sin, b * cos + a * sin], -1).to(dt)
    fn = toy.final_norm(b0)
    al = toy.aligner(fn, bias=req.fault == "aligner-bias")
    toy._record_all(rec, {"patches": p, "rope.cos": cos, "rope.sin": sin, "block0": b0, "final_norm": fn,
                          "aligner": al})


OPTIONS = OptionTable((Option("fuse", "switch", "auto", "the toy's compiled path", side="engine"),))
ADAPTER = replace(toy.ADAPTER, name=JITTER, contract=replace(toy.CONTRACT, model=JITTER), options=OPTIONS,
                  engine=lambda: _engine, faults=(Fault("aligner-bias", "aligner", "a bias added in the aligner"),))


@pytest.fixture
def toys(monkeypatch, tmp_path):
    monkeypatch.setenv("TENSORDIFF_CACHE", str(tmp_path / "cache"))
    toy.install(monkeypatch)
    import sys

    from tensordiff.pipeline import registry

    monkeypatch.setattr(sys.modules[__name__], "_calls", itertools.count())  # every test sees the same runs

    inner_adapter, inner_names, inner_contract = registry.adapter, registry.names, registry.contract
    monkeypatch.setattr(registry, "adapter", lambda n: ADAPTER if n == JITTER else inner_adapter(n))
    monkeypatch.setattr(registry, "names", lambda: sorted(set(inner_names()) | {JITTER}))
    monkeypatch.setattr(registry, "contract", lambda m: ADAPTER.contract if m == JITTER else inner_contract(m))


def _pictures(tmp_path):
    from PIL import Image

    from tensordiff.pipeline.inputs import default_image_path

    d = tmp_path / "pics"
    d.mkdir(exist_ok=True)
    (d / "a.png").write_bytes(default_image_path().read_bytes())
    rng = np.random.default_rng(3)  # a fixed picture: every run of the test sees the same ratios
    Image.fromarray(rng.integers(0, 256, (64, 96, 3), dtype=np.uint8)).save(d / "b.png")
    return sorted(d.iterdir())


def test_repeats_record_run_spread_apart_from_the_images(toys, tmp_path):
    imgs = _pictures(tmp_path)
    cal = calibrate(JITTER, imgs, variants=["dtype=bfloat16"], repeats=3, options=("fuse=off",))
    assert cal.profile.images == 2 and not cal.profile.failed
    rmse = cal.profile.summary()["block0"]["rmse"]
    assert rmse["n"] == 6 and rmse["images"] == 2 and rmse["repeats"] == 3
    assert rmse["run_spread"] > 0  # the jitter is seen run to run, not only across images
    assert rmse["max"] - rmse["min"] >= rmse["run_spread"]  # the band's spread covers it
    path = write(cal, tmp_path / "cal.toml")
    data = tomllib.loads(path.read_text())
    assert data["calibration"]["engine"] == {"backend": "torch", "device": "cpu", "fuse": "off", "repeats": 3}
    assert profile_of(path)["block0"]["rmse"]["run_spread"] == pytest.approx(rmse["run_spread"])
    assert "runs ±" in cal.render_text() and "3 runs per image" in cal.render_text()


def test_one_run_per_image_keeps_the_old_profile_fields(toys, tmp_path):
    cal = calibrate(JITTER, _pictures(tmp_path), variants=["dtype=bfloat16"])
    rmse = cal.profile.summary()["block0"]["rmse"]
    assert rmse["n"] == 2 and "run_spread" not in rmse and "images" not in rmse


def test_band_needs_two_images_even_with_repeats():
    one = {"rmse": {"min": 1.0, "max": 1.01, "n": 3, "images": 1, "repeats": 3, "run_spread": 0.01}}
    assert profile_band(one) == {}  # one image run three times says nothing of the images' spread
    two = {"rmse": {"min": 1.0, "max": 1.01, "n": 6, "images": 2, "repeats": 3, "run_spread": 0.01}}
    assert profile_band(two)["rmse"] == pytest.approx((0.99, 1.02))


def _gate(tmp_path, fuse: str):
    return load_gate(toy.write_gate(tmp_path, f'dtype = "bfloat16"\ntolerances = "cal.toml"\nlocal_error = false\n'
                                              f'images = ["pics"]\noptions = {{ fuse = "{fuse}" }}\n',
                                    model=JITTER))


def test_calibrated_under_repeats_the_clean_jittery_engine_passes_and_a_fault_trips(toys, tmp_path):
    imgs = _pictures(tmp_path)
    write(calibrate(JITTER, imgs, variants=["dtype=bfloat16"], repeats=3, options=("fuse=off",)), tmp_path / "cal.toml")
    cfg = _gate(tmp_path, "off")
    for _ in range(3):  # whichever run-to-run draw the gate gets
        clean = run_gate(cfg, progress=False, echo=lambda s: None)
        assert clean.passed, [c.summary_line() for c in clean.cases]
    bad = run_gate(cfg, fault="aligner-bias", progress=False, echo=lambda s: None)
    assert not bad.passed


def test_without_repeats_the_band_can_miss_the_run_to_run_variation(toys, tmp_path):
    # the premise of --repeats: one run per image leaves the band too narrow for this engine,
    # so some later clean run departs from it (a false alarm that --repeats removes)
    imgs = _pictures(tmp_path)
    write(calibrate(JITTER, imgs, variants=["dtype=bfloat16"], options=("fuse=off",)), tmp_path / "cal.toml")
    cfg = _gate(tmp_path, "off")
    runs = [run_gate(cfg, progress=False, echo=lambda s: None) for _ in range(3)]
    assert not all(r.passed for r in runs)
    assert any("departs from the clean engine's profile" in (b.reason or "")
               for r in runs for c in r.cases if c.numeric is not None for b in c.numeric.boundaries)


def test_a_gate_refuses_a_profile_measured_under_other_engine_options(toys, tmp_path, capsys):
    from tensordiff.commands.cli import main

    imgs = _pictures(tmp_path)
    write(calibrate(JITTER, imgs, variants=["dtype=bfloat16"], options=("fuse=off",)), tmp_path / "cal.toml")
    with pytest.raises(BadInput, match=r"calibrated under another engine setup \(fuse off \(calibrated\) vs on"):
        run_gate(_gate(tmp_path, "on"), progress=False, echo=lambda s: None)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["gate", str(tmp_path / "gate.toml")])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "fuse off (calibrated) vs on (this gate)" in err[0]
    # a device override is an engine change too
    with pytest.raises(BadInput, match="device cpu"):
        run_gate(_gate(tmp_path, "off"), overrides={"device": "cuda"}, progress=False, echo=lambda s: None)


def test_a_gate_refuses_a_profile_measured_on_other_weights(toys, tmp_path):
    write(calibrate(JITTER, _pictures(tmp_path), variants=["dtype=bfloat16"], options=("fuse=off",)),
          tmp_path / "cal.toml")
    cfg = load_gate(toy.write_gate(tmp_path, 'dtype = "bfloat16"\ntolerances = "cal.toml"\nimages = ["pics"]\n'
                                             'weights = "synthetic:tiny-s2"\noptions = { fuse = "off" }\n',
                                   model=JITTER))
    with pytest.raises(BadInput, match=r"weights synthetic:tiny \(calibrated\) vs synthetic:tiny-s2 \(this gate\)"):
        run_gate(cfg, progress=False, echo=lambda s: None)


def test_the_fused_profile_judges_the_fused_engine(toys, tmp_path):
    # calibrated on the compiled path, the compiled engine passes its own gate; the eager profile
    # is what would have judged it wrongly (refused above), not a looser tolerance
    imgs = _pictures(tmp_path)
    fused = calibrate(JITTER, imgs, variants=["dtype=bfloat16"], repeats=3, options=("fuse=on",))
    eager = calibrate(JITTER, imgs, variants=["dtype=bfloat16"], repeats=3, options=("fuse=off",))
    # the profile shifts with the compiled path: its ratios lie outside the eager band
    lo, hi = profile_band(eager.profile.summary()["block0"])["rmse"]
    assert fused.profile.summary()["block0"]["rmse"]["min"] > hi
    write(fused, tmp_path / "cal.toml")
    res = run_gate(_gate(tmp_path, "on"), progress=False, echo=lambda s: None)
    assert res.passed, [c.summary_line() for c in res.cases]


def test_semantic_only_gates_do_not_use_the_profile_and_are_not_refused(toys, tmp_path):
    imgs = _pictures(tmp_path)
    write(calibrate(JITTER, imgs, variants=["dtype=bfloat16"], options=("fuse=off",)), tmp_path / "cal.toml")
    cfg = load_gate(toy.write_gate(tmp_path, 'dtype = "bfloat16"\ntolerances = "cal.toml"\nlocal_error = false\n'
                                             'images = ["pics"]\noptions = { fuse = "on" }\npasses = ["semantic"]\n',
                                   model=JITTER))
    run_gate(cfg, progress=False, echo=lambda s: None)  # runs (its verdict is the semantic pass's)


def test_engine_record_and_mismatch_with_the_deepseek_table():
    from tensordiff.pipeline import registry

    ad = registry.adapter("deepseek-v4.1-flash")
    rec = engine_record(ad, "torch", "cuda:0", ("fuse=on", "graphs=on"))
    assert rec["device"] == "cuda" and rec["fuse"] == "on" and rec["graphs"] == "on" and rec["attention"] == "default"
    assert "language_numerics" not in rec or rec["language_numerics"] == "official"  # both-side: recorded too
    assert engine_mismatch(rec, dict(rec)) is None
    assert engine_mismatch(None, rec) is None  # an older file without the record is not checked
    eager = engine_record(ad, "torch", "cuda", ("fuse=off", "graphs=off"))
    why = engine_mismatch(eager, rec)
    assert "fuse off (calibrated) vs on (this gate)" in why and "graphs" in why
    with pytest.raises(BadInput, match="unknown option"):
        engine_record(ad, "torch", "cpu", ("warp=9",))


def test_bad_repeats_is_bad_input(toys, tmp_path):
    for bad in (0, -1, 1.5, True):
        with pytest.raises(BadInput, match="--repeats"):
            calibrate(JITTER, _pictures(tmp_path), variants=["dtype=bfloat16"], repeats=bad)


def test_engine_of_reads_the_record(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[calibration]\nmodel = "x"\n[calibration.engine]\nbackend = "torch"\nfuse = "on"\nrepeats = 3\n')
    assert engine_of(p) == {"backend": "torch", "fuse": "on"}
    p.write_text('[calibration]\nmodel = "x"\n')
    assert engine_of(p) is None
    p.write_text('[calibration]\nengine = 3\n')
    with pytest.raises(BadInput, match="calibration.engine"):
        engine_of(p)


def test_cli_calibrate_repeats_under_the_gates_options(toys, tmp_path, capsys):
    from tensordiff.commands.cli import main

    _pictures(tmp_path)
    gate = toy.write_gate(tmp_path, 'images = ["pics"]\noptions = { fuse = "on" }\n', model=JITTER)
    with pytest.raises(SystemExit) as e:
        main(["calibrate", str(gate), "--out", str(tmp_path / "cal.toml"), "--repeats", "2"])
    out = capsys.readouterr().out
    assert e.value.code == 0, out
    assert "engine: backend=torch, device=cpu, fuse=on; 2 runs per image" in out
    data = tomllib.loads((tmp_path / "cal.toml").read_text())
    assert data["calibration"]["engine"]["fuse"] == "on" and data["calibration"]["engine"]["repeats"] == 2
    assert data["profile"]["block0"]["rmse"]["repeats"] == 2
    with pytest.raises(SystemExit) as e:
        main(["calibrate", str(gate), "--out", str(tmp_path / "cal2.toml"), "--repeats", "0"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--repeats must be a positive integer" in err and "Traceback" not in err
    assert not (tmp_path / "cal2.toml").exists()
