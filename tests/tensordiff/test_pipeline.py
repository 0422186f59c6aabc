"""The one pipeline of a case: the oracle request, where the dumps go and what the report says
about them, the output-directory and weights checks."""
from __future__ import annotations

from pathlib import Path

import pytest

from tensordiff.errors import BadInput
from tensordiff.commands.gate import load_gate, run_gate
from tensordiff.pipeline.case import CaseSpec, check, check_weights, oracle_request, prepare_out
from tensordiff.pipeline.runs import make_request

import test_gate_toy as toy


@pytest.fixture(autouse=True)
def _toys(monkeypatch, tmp_path):
    monkeypatch.setenv("TENSORDIFF_CACHE", str(tmp_path / "cache"))
    toy.install(monkeypatch)


def test_the_oracle_request_drops_what_only_the_engine_has():
    _, req = make_request(toy.NAME, fault="rope-flip", chunk=3, dtype="bfloat16")
    o = oracle_request(req)
    assert (o.fault, o.backend, o.chunk, o.dtype) == (None, "torch", None, "bfloat16")
    assert oracle_request(req, "float32").dtype == "float32" and o.image == req.image


def test_without_out_the_report_says_its_dumps_were_temporary(tmp_path):
    case = check(CaseSpec(toy.NAME, fault="aligner-bias"))
    assert case.report.verdict == "diverged" and not case.kept
    assert not Path(case.report.b).exists()  # the engine's dump went with the temporary directory
    assert Path(case.report.a).exists()  # the oracle's is the cache entry, which stays
    note = next(n for n in case.report.notes if "temporary" in n)
    assert "--out" in note and str(case.report.a) in note
    nocache = check(CaseSpec(toy.NAME), use_cache=False)
    assert not Path(nocache.report.a).exists()
    assert any("were temporary and are gone; pass --out" in n for n in nocache.report.notes)


def test_with_out_every_dump_the_report_names_exists(tmp_path):
    case = check(CaseSpec(toy.NAME), out=tmp_path / "run")
    assert case.kept and case.report.verdict == "match"
    assert Path(case.report.a) == tmp_path / "run" / "oracle" and Path(case.report.b) == tmp_path / "run" / "engine"
    assert (Path(case.report.a) / "manifest.json").is_file() and (Path(case.report.b) / "manifest.json").is_file()
    assert not any("temporary" in n for n in case.report.notes)
    with pytest.raises(BadInput, match="exists and is not empty"):
        check(CaseSpec(toy.NAME), out=tmp_path / "run")


def test_the_gate_keeps_or_says(tmp_path):
    cfg = load_gate(toy.write_gate(tmp_path))
    res = run_gate(cfg, progress=False, echo=lambda s: None)
    assert all(any("temporary" in n for n in c.report.notes) for c in res.cases)
    kept = run_gate(cfg, out=tmp_path / "kept", progress=False, echo=lambda s: None)
    (c,) = kept.cases
    assert c.kept and all(Path(p).is_dir() for p in c.dumps.values())
    assert Path(c.dumps["oracle"]).is_relative_to(tmp_path / "kept")


def test_the_output_directory_and_weights_checks(tmp_path):
    assert prepare_out(None) is None and prepare_out(tmp_path / "new") == tmp_path / "new"
    (tmp_path / "empty").mkdir()
    assert prepare_out(tmp_path / "empty") == tmp_path / "empty"
    (tmp_path / "file").write_text("x")
    with pytest.raises(BadInput, match="is a file; give a directory"):
        prepare_out(tmp_path / "file")
    assert check_weights("synthetic:tiny", tmp_path, "w") == "synthetic:tiny"
    (tmp_path / "ck").mkdir()
    assert check_weights("ck", tmp_path, "w") == str((tmp_path / "ck").resolve())
    with pytest.raises(BadInput, match="w: weights 'nope' is neither synthetic"):
        check_weights("nope", tmp_path, "w")


def test_the_passes_a_case_runs_when_none_are_asked_for():
    from tensordiff.pipeline.case import default_passes, parse_passes

    assert default_passes("bfloat16") == parse_passes("auto", "bfloat16") == ("semantic", "numeric")
    assert default_passes("float32") == parse_passes(None, "float32") == ("semantic",)  # the run itself
    assert parse_passes("auto", "bfloat16", "float32") == ("direct",)  # a pinned oracle dtype: one comparison
    assert parse_passes("direct", "bfloat16") == ("direct",)
    assert parse_passes(" numeric ", "bfloat16") == ("numeric",)


@pytest.mark.parametrize("text, dtype, oracle, says", [
    ("semantics", "bfloat16", None, "expected auto or"), ("", "bfloat16", None, "expected auto or"),
    ("semantic,direct", "bfloat16", None, "not both"), ("numeric,numeric", "bfloat16", None, "each pass once"),
    ("numeric", "float32", None, "low-precision"), ("semantic,numeric", "bfloat16", "float32", "no direct pass")])
def test_bad_passes_are_bad_input(text, dtype, oracle, says):
    from tensordiff.pipeline.case import parse_passes

    with pytest.raises(BadInput, match=says):
        parse_passes(text, dtype, oracle)


def test_the_exact_reference_sets_the_models_exact_numerics():
    """DeepSeek's language half runs official bf16 + kernel rounding whatever --dtype: its float32
    reference is the semantic numerics without rounding; a model without exact options is only
    cast to float32."""
    from tensordiff.pipeline import registry
    from tensordiff.pipeline.case import exact_request

    ds = registry.adapter("deepseek-v4.1-flash")
    _, req = make_request(ds.name, dtype="bfloat16", prompt="Describe <image>.", adapter=ds)
    assert req.options["language_numerics"] == "official"
    ref = exact_request(ds, req)
    assert ref.dtype == "float32" and ref.options["language_numerics"] == "semantic"
    assert ref.options["kernel_quant"] is False and req.options["language_numerics"] == "official"
    _, toy_req = make_request(toy.NAME, dtype="bfloat16")
    assert exact_request(registry.adapter(toy.NAME), toy_req).options == toy_req.options
