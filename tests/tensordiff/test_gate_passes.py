"""The gate's two passes on the real models (synthetic:tiny, CPU, bfloat16): the clean engine
passes both, each numeric fault is caught by the numeric pass alone at its boundary, and the
approximation faults that bf16 hides are caught by the semantic pass."""
from __future__ import annotations

from dataclasses import replace

import pytest

from tensordiff.errors import BadInput
from tensordiff.commands.gate import ModelCase, GateConfig, case_passes, from_mapping, run_gate
from tensordiff.pipeline.inputs import default_image_path
import tensordiff.models.deepseek_v41_flash.faults as D
import tensordiff.models.qwen3_vl.faults as Q

DS, QW = "deepseek-v4.1-flash", "qwen3-vl"


def _cfg(model=DS, **kw) -> GateConfig:
    m = ModelCase(model, "synthetic:tiny", (default_image_path(),), dtype="bfloat16", local_error=False, **kw)
    return GateConfig(None, "passes", (m,))


_RUNS: dict = {}  # (config, fault) -> its one case: read, never changed, by the tests that ask for the same run


def _run(cfg, fault=None):
    if (cfg, fault) not in _RUNS:
        res = run_gate(cfg, fault=fault, echo=lambda s: None, progress=False)
        assert len(res.cases) == 1 and res.cases[0].error is None
        _RUNS[cfg, fault] = res.cases[0]
    return _RUNS[cfg, fault]


def test_default_passes():
    base = ModelCase(DS, "synthetic:tiny", (default_image_path(),))
    assert case_passes(base) == ("semantic",)
    assert case_passes(replace(base, dtype="bfloat16")) == ("semantic", "numeric")
    assert case_passes(replace(base, dtype="bfloat16", oracle_dtype="float32")) == ("direct",)
    assert case_passes(replace(base, dtype="bfloat16", passes=("numeric",))) == ("numeric",)


@pytest.mark.parametrize("model", [DS, QW])
def test_clean_engine_passes_both_passes_in_bfloat16(model):
    c = _run(_cfg(model))
    assert c.passes == ("semantic", "numeric")
    assert c.report.verdict == "match", str(c.report)
    assert c.numeric.verdict == "match", str(c.numeric)
    assert c.passed
    assert c.report.runs["b"]["dtype"] == "float32" and c.numeric.runs["b"]["dtype"] == "bfloat16"
    assert all(t.mode == "floor" for b in c.numeric.boundaries for t in b.tensors if t.dtype.get("a") != "int64"
               and "ids" not in t.name and "deltas" not in t.name)


@pytest.mark.parametrize("fault, boundary", [(D.RESIDUAL_SCALE, "block0"), (D.TAIL_ROW_SCALE, "block0"),
                                             (D.NORM_EPS, "final_norm"), (D.SPLITK_BF16, "aligner")])
def test_numeric_faults_are_caught_by_the_numeric_pass_alone(fault, boundary):
    c = _run(_cfg(passes=("numeric",)), fault)
    assert c.report.verdict == "diverged" and c.report.earliest == [boundary], str(c.report)
    t = c.report.boundary(boundary).tensors[0]
    r = t.metrics["ratios"]
    # each fault is between 1x and 5x the floor on the statistic that catches it
    worst = max(r["rmse"], r["row"], t.metrics["worst_rows"][0]["x_floor"])
    assert 1.0 < worst < 5.0, (fault, r, t.metrics["worst_rows"][0])


def test_one_wrong_row_passes_the_tensor_wide_bf16_tolerance_but_not_the_numeric_pass():
    direct = _run(_cfg(passes=("direct",), oracle_dtype="float32"), D.TAIL_ROW_SCALE)
    assert direct.report.verdict == "match"  # the seed's bf16 default: one row of 3774 is inside 10%
    c = _run(_cfg(passes=("numeric",)), D.TAIL_ROW_SCALE)
    t = c.report.boundary("block0").tensors[0]
    assert t.metrics["outliers"] == 1 and t.metrics["worst_rows"][0]["row"] == t.metrics["rows"] - 1
    assert t.worst["meaning"].startswith("patch (y=")


@pytest.mark.parametrize("model, fault, boundary", [(DS, D.GELU_TANH, "aligner"), (QW, Q.VISION_GELU_ERF, "block0"),
                                                    (QW, Q.MERGER_GELU_TANH, "aligner")])
def test_approximations_are_caught_by_the_semantic_pass_of_a_bfloat16_gate(model, fault, boundary):
    c = _run(_cfg(model), fault)
    assert c.report.earliest == [boundary], str(c.report)
    assert not c.passed
    assert c.numeric is not None  # both ran; the numeric pass states what it could see
    for b in c.numeric.boundaries:
        for t in b.tensors:
            if t.mode == "floor" and not t.metrics["exact_floor"]:
                assert t.metrics["detectable"]["tensor"] > 0 and t.metrics["detectable"]["row"] > 0


def test_reports_show_both_passes(tmp_path):
    from tensordiff.reports.html import render_html
    from tensordiff.reports.junit import render_junit

    res = run_gate(_cfg(), fault=D.RESIDUAL_SCALE, echo=lambda s: None, progress=False, html=True)
    xml = render_junit(res.cases)
    assert 'name="numeric: block0"' in xml and 'name="block0"' in xml and 'name="passes"' in xml
    html = render_html(res.cases)
    assert "Numeric pass" in html and "detectable" in html
    js = res.as_json()["cases"][0]
    assert js["passes"] == ["semantic", "numeric"] and js["numeric"]["earliest"] == ["block0"]


def test_numeric_pass_in_float32_is_bad_input(tmp_path):
    (tmp_path / "a.png").write_bytes(default_image_path().read_bytes())
    cfg = from_mapping({"gate": {"images": ["a.png"], "passes": ["numeric"]}, "model": [{"name": DS}]},
                       tmp_path / "g.toml")
    with pytest.raises(BadInput, match="numeric pass"):
        run_gate(cfg, echo=lambda s: None, progress=False)
    with pytest.raises(BadInput, match="passes"):
        from_mapping({"gate": {"images": ["a.png"], "passes": ["fast"]}, "model": [{"name": DS}]}, tmp_path / "g.toml")


@pytest.mark.parametrize("fault, boundary", [(D.RESIDUAL_SCALE, "block0"), (D.TAIL_ROW_SCALE, "block0"),
                                             (D.NORM_EPS, "final_norm"), (D.SPLITK_BF16, "aligner")])
def test_local_error_and_the_numeric_pass_agree_on_the_origin(fault, boundary):
    m = ModelCase(DS, "synthetic:tiny", (default_image_path(),), dtype="bfloat16", local_error=True)
    c = _run(GateConfig(None, "passes", (m,)), fault)
    assert c.numeric.earliest == [boundary], str(c.numeric)
    assert c.local is not None and c.local.origin == boundary, c.local.summary()
