import pytest
import torch
from helpers_dumps import write

from tensordiff.pipeline.compare import compare_dumps
from tensordiff.errors import BadInput
from tensordiff.judge.tolerance import DEFAULTS, load


def test_defaults_follow_the_unit_roundoff():
    assert DEFAULTS["bfloat16"].rtol == pytest.approx(4 * 2 ** -8, rel=0.03)
    assert DEFAULTS["float32"].rtol < DEFAULTS["float16"].rtol * 1.0 or DEFAULTS["float32"].atol < DEFAULTS["bfloat16"].atol


def test_boundary_override_wins_over_dtype(tmp_path):
    p = tmp_path / "t.toml"
    p.write_text("""
[tolerances.float32]
atol = 0.5
[tolerances.boundaries.aligner]
atol = 0.01
[tolerances.boundaries."router.*".float32]
max_mismatch = 0.25
""")
    t = load(p)
    assert t.for_("block0", "float32").atol == 0.5
    assert t.for_("aligner", "float32").atol == 0.01
    assert t.for_("aligner", "bfloat16").atol == 0.01
    assert t.for_("router.3", "float32").max_mismatch == 0.25 and t.for_("router.3", "float32").atol == 0.5
    assert t.for_("block0", "bfloat16") == DEFAULTS["bfloat16"]


def test_override_changes_the_verdict(tmp_path):
    x = torch.randn(50)
    a, b = write(tmp_path / "a", {"x": x}), write(tmp_path / "b", {"x": x + 0.05})
    assert compare_dumps(a, b).verdict == "diverged"
    p = tmp_path / "t.toml"
    p.write_text("[tolerances.boundaries.x]\natol = 0.06\nmin_cosine = 0.99\n")
    assert compare_dumps(a, b, p).verdict == "match"


def test_pyproject_tool_table(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text("[tool.tensordiff.tolerances.float32]\natol = 0.125\n")
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    t = load()
    assert t.for_("x", "float32").atol == 0.125 and "pyproject" in t.origin


@pytest.mark.parametrize("text,match", [
    ("[tolerances.float32]\natol = -1\n", "non-negative"),
    ("[tolerances.float32]\nbogus = 1\n", "unknown key"),
    ("[tolerances.nonsense]\natol = 1\n", "unknown tolerance table"),
    ("[tolerances\n", "not valid TOML"),
])
def test_bad_tolerance_files(tmp_path, text, match):
    p = tmp_path / "t.toml"
    p.write_text(text)
    with pytest.raises(BadInput, match=match):
        load(p)


def test_missing_tolerance_file(tmp_path):
    with pytest.raises(BadInput, match="does not exist"):
        load(tmp_path / "nope.toml")


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-0.5", "-1e-30"])
@pytest.mark.parametrize("field", ["atol", "rtol"])
def test_nan_infinite_and_negative_tolerances_refused(tmp_path, field, value):
    p = tmp_path / "t.toml"
    p.write_text(f"[tolerances.boundaries.rope]\n{field} = {value}\n")
    with pytest.raises(BadInput, match="finite non-negative"):
        load(p)


def test_a_tolerance_file_that_is_not_utf8(tmp_path):
    p = tmp_path / "t.toml"
    p.write_bytes(b"# caf\xe9\n[tolerances.float32]\natol = 1e-3\n")
    with pytest.raises(BadInput, match=r"t.toml is not UTF-8 text \(byte 5\)"):
        load(p)


@pytest.mark.parametrize("content", [b"[tool.tensordiff\n", b"\xff\xfe[tool]\n"])
def test_a_broken_parent_pyproject_is_named_in_a_warning(tmp_path, monkeypatch, capsys, content):
    (tmp_path / "pyproject.toml").write_bytes(content)
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    t = load()
    err = capsys.readouterr().err
    assert f"warning: {tmp_path / 'pyproject.toml'} cannot be read" in err and "defaults apply" in err
    assert t.for_("x", "float32") == DEFAULTS["float32"]


def test_atol_scale_in_a_tolerance_file(tmp_path):
    p = tmp_path / "t.toml"
    p.write_text('[tolerances.boundaries.logits.float32]\natol_scale = "rms"\n'
                 '[tolerances.boundaries.other]\natol_scale = "none"\n')
    t = load(p)
    assert t.for_("logits", "float32").atol_scale == "rms" and t.for_("logits", "bfloat16").atol_scale is None
    assert t.for_("other", "float32").atol_scale is None


def test_a_scale_named_in_a_file_overrides_the_contracts():
    from tensordiff.judge.tolerance import Tolerances, with_contract

    user = Tolerances({}, {"logits": {"float32": {"atol_scale": None}}}, "user.toml")
    merged = with_contract(user, {"logits": {"float32": {"atol_scale": "rms"}}})
    assert merged.for_("logits", "float32").atol_scale is None
    assert with_contract(Tolerances({}, {}), {"logits": {"atol_scale": "rms"}}).for_("logits", "float32").atol_scale == "rms"


@pytest.mark.parametrize("value", ['"max"', "1", '"RMS"'])
def test_an_unknown_atol_scale_is_refused(tmp_path, value):
    p = tmp_path / "t.toml"
    p.write_text(f"[tolerances.float32]\natol_scale = {value}\n")
    with pytest.raises(BadInput, match="atol_scale must be one of rms, none"):
        load(p)


def test_effective_atol_and_its_text():
    from tensordiff.judge.tolerance import Tolerance

    t = Tolerance(atol=1e-4, rtol=1e-3, atol_scale="rms")
    assert t.effective_atol == 1e-4 and t.atol_text() == "0.0001×max(1, rms(A))"  # not measured yet
    m = Tolerance(atol=1e-4, rtol=1e-3, atol_scale="rms", scale=45.7)
    assert m.effective_atol == pytest.approx(4.57e-3)
    assert m.atol_text() == "0.0001×max(1, rms(A) 45.7) = 0.00457"
    assert Tolerance.from_dict(m.as_dict()) == m and Tolerance(1e-4, 1e-3).atol_text() == "0.0001"


def test_a_calibrated_atol_is_never_scaled():
    # `tensordiff calibrate` writes `logits.step.1` with an absolute atol from a measured floor; the
    # contract's `logits.step.*` scale must not multiply it by the logits' RMS
    from tensordiff.judge.tolerance import Tolerances, with_contract

    cal = Tolerances({}, {"logits.step.1": {"float32": {"atol": 3e-4, "rtol": 0.0, "floor": 1e-4}}}, "cal.toml")
    t = with_contract(cal, {"logits.step.*": {"float32": {"atol_scale": "rms"}}}).for_("logits.step.1", "float32")
    from dataclasses import replace

    measured = replace(t, scale=45.0)
    assert measured.atol_scale == "rms" and measured.effective_atol == 3e-4
    assert measured.atol_text() == "0.0003 (calibrated: not scaled)"


def test_every_value_says_where_it_came_from(tmp_path):
    """Each value carries its source: the dtype default, the user's file (dtype and boundary
    tables), the contract; a user's table of the same pattern wins over the contract's."""
    from tensordiff.judge.tolerance import with_contract

    p = tmp_path / "t.toml"
    p.write_text("[tolerances.float32]\natol = 0.5\n[tolerances.boundaries.aligner]\nrtol = 0.01\n")
    merged = with_contract(load(p), {"index.*": {"max_mismatch": 0.1}, "aligner": {"max_mismatch": 0.2}},
                           "contract toy")
    t = merged.for_("index.3", "float32")
    assert dict(t.origins) == {"atol": f"{p} [float32]", "max_mismatch": "contract toy [boundaries.index.*]"}
    assert t.source == (f"{p} [float32] (atol) + contract toy [boundaries.index.*] (max_mismatch) "
                        "over default (float32)")
    a = merged.for_("aligner", "float32")  # the user's `aligner` table replaces the contract's
    assert a.max_mismatch == 0.0 and dict(a.origins) == {"atol": f"{p} [float32]", "rtol": f"{p} [boundaries.aligner]"}
    d = merged.for_("block0", "bfloat16")
    assert d == DEFAULTS["bfloat16"] and d.origins == () and d.source == "default (bfloat16)"
    from tensordiff.judge.tolerance import Tolerance

    assert Tolerance.from_dict(t.as_dict()) == t  # a report's stored tolerance reads back with its sources


def test_a_calibration_files_values_are_labelled_calibration(tmp_path):
    from tensordiff.judge.floor import DEFAULT_RULE
    from tensordiff.pipeline.calibration import rule_of

    cal, plain = tmp_path / "cal.toml", tmp_path / "plain.toml"
    body = '[tolerances.boundaries.block0.float32]\natol = 3e-4\nfloor = 1e-4\n[floor_rule]\nrmse = 1.2\n'
    cal.write_text('[calibration]\nmodel = "toy"\n' + body)
    plain.write_text(body)
    assert load(cal).for_("block0", "float32").source == (
        f"calibration {cal} [boundaries.block0.float32] (atol, floor) over default (float32)")
    assert load(plain).for_("block0", "float32").source.startswith(f"{plain} [boundaries.block0.float32]")
    assert rule_of(cal).source == f"calibration {cal} [floor_rule]" and rule_of(plain).source == f"{plain} [floor_rule]"
    assert DEFAULT_RULE.source == "default" and "source" not in rule_of(cal).as_dict()


def test_the_reports_tolerances_line_names_each_source(tmp_path):
    """The line a report prints counts the tensors each source judged: a contract's tables are
    named as the contract's (not "defaults"), a file none of whose tables applies is said so."""
    from helpers_dumps import pipeline, write

    from tensordiff.pipeline.compare import compare_dumps
    from tensordiff.judge.contract import Boundary, Contract

    a, b = write(tmp_path / "a", pipeline()), write(tmp_path / "b", pipeline())
    bounds = (Boundary("patches"), Boundary("rope"), Boundary("block0", ("patches", "rope")),
              Boundary("final_norm", ("block0",)), Boundary("aligner", ("final_norm",)))
    plain = compare_dumps(a, b, contract=Contract("toy", bounds))
    assert plain.tolerances == "default (float32): 6 tensors"
    ruled = compare_dumps(a, b, contract=Contract("toy", bounds, tolerances={"aligner": {"rtol": 0.5}}))
    assert ruled.tolerances == ("default (float32): 5 tensors; contract toy [boundaries.aligner] (rtol) over "
                                "default (float32): 1 tensor (aligner)")
    aligner = ruled.as_json()["boundaries"][-1]["tolerance"]["aligner"]
    assert aligner["origins"] == [["rtol", "contract toy [boundaries.aligner]"]]
    unused = tmp_path / "u.toml"
    unused.write_text("[tolerances.boundaries.nothing_here]\natol = 1.0\n")
    rep = compare_dumps(a, b, unused, contract=Contract("toy", bounds))
    assert rep.tolerances == f"default (float32): 6 tensors; {unused}: no table of it applies here"
