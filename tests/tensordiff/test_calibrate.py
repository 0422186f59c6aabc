"""Calibration: the oracle against itself gives finite, positive floors; the file it writes is a
tolerance file whose tolerances are the stated multiple of the floor; reports show "× floor"."""
from __future__ import annotations

import math
import tomllib

import pytest

from tensordiff.pipeline import registry
from tensordiff.commands.calibrate import calibrate, parse_variant
from tensordiff.pipeline.calibration import write
from tensordiff.errors import BadInput
from tensordiff.commands.gate import load_gate, run_gate
from tensordiff.pipeline.inputs import default_image_path
from tensordiff.reports.text import render_text
from tensordiff.judge.tolerance import load as load_tolerances

import test_gate_toy as toy


@pytest.fixture
def toys(monkeypatch, tmp_path):
    monkeypatch.setenv("TENSORDIFF_CACHE", str(tmp_path / "cache"))
    toy.install(monkeypatch)


def test_toy_floors_are_finite_positive_and_tolerances_are_the_multiple(toys, tmp_path):
    cal = calibrate(toy.NAME, [default_image_path()], variants=["dtype=bfloat16"], multiple=3.0)
    measured = {f.boundary: f for f in cal.measured()}
    assert set(measured) == {"block0", "final_norm", "aligner"}
    for f in measured.values():
        assert f.unit == "bfloat16" and 0 < f.max_abs < math.inf and f.variant == "dtype=bfloat16"
        assert 0 < f.cosine < 1
    # patches (bf16 on both sides) and rope (fp32 tables) do not move: no floor, and said so
    un = cal.unmeasured()
    assert set(un) == {"patches", "rope"} and all("dtype default applies" in v for v in un.values())
    path = write(cal, tmp_path / "cal.toml")
    data = tomllib.loads(path.read_text())
    assert data["calibration"]["multiple"] == 3.0 and "patches" in data["calibration"]["unmeasured"]
    tols = load_tolerances(path)
    for b, f in measured.items():
        t = tols.for_(b, "bfloat16")
        assert t.atol == pytest.approx(3.0 * f.max_abs) and t.floor == pytest.approx(f.max_abs)
        assert t.rtol == 0 and t.max_mismatch == 0
        assert t.min_cosine == pytest.approx(min(1 - 3.0 * (1 - f.cosine), 0.999))  # never above the default
    assert tols.for_("patches", "bfloat16").floor is None  # the default stays
    assert tols.for_("block0", "float32").floor is None  # a floor applies to its own unit only


def test_calibrated_gate_reports_errors_as_multiples_of_the_floor(toys, tmp_path):
    cal = calibrate(toy.NAME, [default_image_path()], variants=["dtype=bfloat16"])
    write(cal, tmp_path / "cal.toml")
    cfg = load_gate(toy.write_gate(tmp_path, 'dtype = "bfloat16"\noracle_dtype = "float32"\n'
                                              'tolerances = "cal.toml"\n'))
    res = run_gate(cfg, progress=False, echo=lambda s: None)
    (c,) = res.cases
    text = render_text(c.report)
    assert "× floor" in text
    t = c.report.boundary("block0").tensors[0]
    assert t.tolerance["floor"] > 0 and "cal.toml" in t.tolerance["source"]
    # the engine in bf16 against the fp32 oracle IS the floor's own experiment: within 10x of it
    assert c.passed, c.summary_line()
    # and a real bug is still far outside
    bad = run_gate(cfg, fault="aligner-bias", progress=False, echo=lambda s: None)
    assert not bad.passed and bad.cases[0].report.earliest == ["aligner"]


def test_a_variant_that_changes_nothing_measures_no_floor(toys):
    cal = calibrate(toy.NAME, [default_image_path()], variants=["sdpa=math"])  # the toy has no attention
    assert cal.measured() == []
    assert set(cal.unmeasured()) == {"patches", "rope", "block0", "final_norm", "aligner"}
    assert "[tolerances" not in cal.to_toml()


@pytest.mark.parametrize("spec, needle", [("dtype", "KEY=VALUE"), ("dtype=float64", "float32 or bfloat16"),
                                          ("sdpa=fast", "sdpa must be one of"), ("=x", "KEY=VALUE")])
def test_bad_variant_is_bad_input(spec, needle):
    with pytest.raises(BadInput, match=needle):
        parse_variant(spec)


def test_reference_as_its_own_variant_is_bad_input(toys):
    with pytest.raises(BadInput, match="the reference itself"):
        calibrate(toy.NAME, [default_image_path()], variants=["dtype=float32"])


def test_cli_calibrate_writes_a_loadable_file(toys, tmp_path, capsys):
    from tensordiff.commands.cli import main

    cfg = toy.write_gate(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["calibrate", str(cfg), "--out", str(tmp_path / "cal.toml"), "--multiple", "5"])
    out = capsys.readouterr().out
    assert e.value.code == 0, out
    assert "block0" in out and "no floor" in out and "wrote" in out
    assert load_tolerances(tmp_path / "cal.toml").for_("block0", "bfloat16").floor > 0
    two = tmp_path / "two.toml"
    two.write_text(f'[[model]]\nname = "{toy.NAME}"\n[[model]]\nname = "toy-nostages"\n')
    with pytest.raises(SystemExit) as e:
        main(["calibrate", str(two), "--out", str(tmp_path / "cal.toml")])
    assert e.value.code == 2 and "{model}" in capsys.readouterr().err


@pytest.mark.skipif("deepseek-v4.1-flash" not in registry.names(), reason="DeepSeek adapter not installed")
def test_deepseek_tiny_floors_are_finite_and_positive_and_fused_sdpa_is_reported():
    # the official tower calls SDPA with 3-D tensors: no fused kernel accepts that, so an
    # `sdpa=flash` variant cannot run on it; calibrate says so instead of failing
    cal = calibrate("deepseek-v4.1-flash", [default_image_path()], variants=["dtype=bfloat16", "sdpa=flash"])
    measured = {f.boundary: f for f in cal.measured()}
    assert {"block0", "final_norm", "aligner"} <= set(measured)
    assert all(0 < f.max_abs < math.inf for f in measured.values())
    assert "sdpa=flash" in cal.failed
    assert "failed_variants" in cal.to_toml()


@pytest.mark.parametrize("model,variant,needle", [
    ("qwen3-vl", "attn=nonsense", "not one of sdpa, eager"),
    ("qwen3-vl", "warp=9", "not dtype, sdpa or an option of qwen3-vl"),
    ("deepseek-v4.1-flash", "attention=math", "engine only"),  # the oracle would not move: no floor
    (toy.NAME, "attn=eager", "this model takes no options"),
])
def test_a_runner_option_variant_is_checked_against_the_models_table(toys, model, variant, needle):
    # refused before any run (no weights resolved, no oracle started)
    with pytest.raises(BadInput, match=needle):
        calibrate(model, [default_image_path()], variants=[variant])


def test_a_variant_value_reaches_the_oracle_typed(toys):
    from tensordiff.commands.calibrate import variant_request
    from tensordiff.pipeline.runs import make_request

    ad, req = make_request("qwen3-vl")
    v = variant_request(req, parse_variant("attn=eager"), ad)
    assert v.options["attention"] == "eager" and "attn" not in v.options


def _two_pictures(tmp_path):
    from PIL import Image

    other = tmp_path / "other.png"
    Image.effect_noise((96, 64), 40).convert("RGB").save(other)
    return [default_image_path(), other]


def test_calibrate_records_the_clean_engines_profile_and_multipliers(toys, tmp_path):
    from tensordiff.judge.floor import DEFAULT_RULE
    from tensordiff.pipeline.calibration import profile_of, rule_of

    cal = calibrate(toy.NAME, _two_pictures(tmp_path), variants=["dtype=bfloat16"])
    assert cal.profile is not None and cal.profile.images == 2 and not cal.profile.failed
    summary = cal.profile.summary()
    assert set(summary) == {"block0", "final_norm", "aligner"}  # patches and rope are bit-exact: no ratio
    for per in summary.values():
        # the toy engine is the oracle's own arithmetic: bit-equal to the floor run, so kept exact
        assert set(per) == {"rmse", "row", "cosine", "equals_floor_run"} and per["equals_floor_run"]["all"]
        assert all(v["n"] == 2 and v["min"] <= v["median"] <= v["max"] for k, v in per.items()
                   if k != "equals_floor_run")
    path = write(cal, tmp_path / "cal.toml")
    prof = profile_of(path)
    assert prof["block0"]["rmse"]["n"] == 2
    rule = rule_of(path)
    # the toy engine is the oracle's own code: its ratios are 1, so the defaults stand
    assert rule == DEFAULT_RULE
    assert "clean bfloat16 engine over 2 image(s)" in cal.render_text()
    load_tolerances(path)  # still a tolerance file


def test_profile_from_calibrate_flags_a_drift_the_gate_used_to_pass(toys, tmp_path):
    imgs = _two_pictures(tmp_path)
    cal = calibrate(toy.NAME, imgs, variants=["dtype=bfloat16"])
    write(cal, tmp_path / "cal.toml")
    (tmp_path / "pics").mkdir()
    for p in imgs:
        (tmp_path / "pics" / p.name).write_bytes(p.read_bytes())
    cfg = load_gate(toy.write_gate(tmp_path, 'dtype = "bfloat16"\ntolerances = "cal.toml"\nlocal_error = false\n'
                                              'images = ["pics"]\n'))
    clean = run_gate(cfg, progress=False, echo=lambda s: None)
    assert clean.passed and all(c.numeric is not None and c.numeric.verdict == "match" for c in clean.cases)
    drift = run_gate(cfg, fault="oracle-like-drift", progress=False, echo=lambda s: None)
    assert not drift.passed
    assert any(c.numeric.earliest == ["block0"] for c in drift.cases)


def test_no_engine_profile(toys, tmp_path):
    cal = calibrate(toy.NAME, [default_image_path()], variants=["dtype=bfloat16"], engine_profile=False)
    assert cal.profile is None and "floor_rule" not in tomllib.loads(cal.to_toml())
    ref16 = calibrate(toy.NAME, [default_image_path()], variants=["dtype=float32"], dtype="bfloat16")
    assert ref16.profile is None and "reference must be float32" in ref16.profile_note
