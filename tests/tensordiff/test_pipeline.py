"""The one pipeline of a case: the oracle request, where the dumps go and what the report says
about them, the output-directory and weights checks."""
from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

import pytest
from cli_runner import run_cli

from tensordiff.pipeline import case as pipeline
from tensordiff.errors import BadInput
from tensordiff.commands.gate import load_gate, run_gate
from tensordiff.pipeline.case import LAST_MARK, CaseSpec, check, check_weights, last_dir, oracle_request, prepare_out
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


def _named_paths(text: str) -> list[Path]:
    """Every absolute path under the temporary directory that `text` names (the test's cache and
    outputs live there, as the old temporary dumps did)."""
    root = re.escape(tempfile.gettempdir())
    return [Path(m.rstrip(":.")) for m in re.findall(root + r"/[^\s<>\"'`;,()]+", text)]


def test_without_out_every_path_a_report_names_exists(tmp_path, capsys):
    """`check` without --out: the text, JSON and HTML reports name the last-run directory (and the
    cached oracle), all of which exist after the command; the text says where, under A and B."""
    code, out, _ = run_cli(["check", toy.NAME, "--fault", "aligner-bias", "--json", tmp_path / "r.json",
                            "--html", tmp_path / "r.html"], capsys)
    assert code == 1
    rep = json.loads((tmp_path / "r.json").read_text())
    last = last_dir("check", toy.NAME)
    assert Path(rep["b"]) == last / "engine" and (last / "engine" / "manifest.json").is_file()
    assert Path(rep["a"]).is_relative_to(tmp_path / "cache" / "oracle")  # the cached oracle, used in place
    assert str(last) in rep["where"]
    for text in (out, (tmp_path / "r.json").read_text(), (tmp_path / "r.html").read_text()):
        named = _named_paths(text)
        assert any(p == last / "engine" for p in named)
        missing = [p for p in named if not p.exists()]
        assert not missing, missing
    lines = out.splitlines()
    assert lines[1:4] == [f"A (reference): {rep['a']}", f"B (candidate): {rep['b']}", f"dumps: {rep['where']}"]
    # nothing of the run is left beside the last-run directory (no staging, no previous run)
    assert sorted(p.name for p in last.parent.iterdir()) == [toy.NAME]


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_the_next_run_replaces_the_last_and_a_failed_run_leaves_it(tmp_path, monkeypatch):
    first = check(CaseSpec(toy.NAME, fault="aligner-bias"))
    last = last_dir("check", toy.NAME)
    assert Path(first.report.b) == last / "engine" and (last / LAST_MARK).is_file()
    assert last.stat().st_mode & 0o777 == 0o777 & ~_umask()  # readable as the rest of the cache, not private
    assert json.loads((last / "engine" / "manifest.json").read_text())["run"]["fault"] == "aligner-bias"
    second = check(CaseSpec(toy.NAME))
    assert second.report.verdict == "match" and Path(second.report.b) == last / "engine"
    assert json.loads((last / "engine" / "manifest.json").read_text())["run"]["fault"] is None
    with pytest.raises(BadInput, match="no-such-fault"):  # refused after the workspace opened
        check(CaseSpec(toy.NAME, fault="no-such-fault"))
    assert json.loads((last / "engine" / "manifest.json").read_text())["run"]["fault"] is None
    # where the system has no atomic exchange: moved aside, the new one renamed in, the old removed
    monkeypatch.setattr(pipeline, "_exchange", lambda a, b: False)
    check(CaseSpec(toy.NAME, fault="rope-flip"))
    assert json.loads((last / "engine" / "manifest.json").read_text())["run"]["fault"] == "rope-flip"
    assert sorted(p.name for p in last.parent.iterdir()) == [toy.NAME]
    nocache = check(CaseSpec(toy.NAME), use_cache=False)  # the oracle's dump is in the last run's too
    assert Path(nocache.report.a) == last / "oracle" and Path(nocache.report.a).is_dir()


def test_a_last_run_directory_that_is_not_ours_is_never_touched(tmp_path):
    last = last_dir("check", toy.NAME)
    last.mkdir(parents=True)
    (last / "mine.txt").write_text("a user's file")
    with pytest.raises(BadInput, match="not a tensordiff last-run directory"):
        check(CaseSpec(toy.NAME))
    assert (last / "mine.txt").read_text() == "a user's file" and sorted(p.name for p in last.parent.iterdir()) == [
        toy.NAME]
    # one that appears while a run is under way: the run's dumps stay in its staging directory
    last.rename(tmp_path / "aside")
    ws_paths = []
    real = pipeline.run_case

    def run_then_squat(spec, work, **kw):
        ws_paths.append(work)
        case = real(spec, work, **kw)
        last.mkdir()
        (last / "mine.txt").write_text("a user's file")
        return case

    pipeline.run_case = run_then_squat
    try:
        case = check(CaseSpec(toy.NAME))
    finally:
        pipeline.run_case = real
    assert (last / "mine.txt").read_text() == "a user's file" and not (last / "engine").exists()
    assert Path(case.report.b) == ws_paths[0] / "engine" and Path(case.report.b).is_dir()
    assert str(ws_paths[0]) in case.report.where and "left as it is" in case.report.where


def test_with_out_every_dump_the_report_names_exists(tmp_path):
    case = check(CaseSpec(toy.NAME), out=tmp_path / "run")
    assert case.kept and case.report.verdict == "match"
    assert Path(case.report.a) == tmp_path / "run" / "oracle" and Path(case.report.b) == tmp_path / "run" / "engine"
    assert (Path(case.report.a) / "manifest.json").is_file() and (Path(case.report.b) / "manifest.json").is_file()
    assert not any("temporary" in n for n in case.report.notes) and str(tmp_path / "run") in case.report.where
    assert not last_dir("check", toy.NAME).exists()
    with pytest.raises(BadInput, match="exists and is not empty"):
        check(CaseSpec(toy.NAME), out=tmp_path / "run")


def test_the_gate_keeps_its_last_run_or_out(tmp_path):
    cfg = load_gate(toy.write_gate(tmp_path))
    res = run_gate(cfg, progress=False, echo=lambda s: None)
    (c,) = res.cases
    last = last_dir("gate", cfg.name)
    assert last.name == "toy_gate" and Path(c.dumps["engine"]).is_relative_to(last)
    assert all(Path(p).is_dir() for p in c.dumps.values()) and Path(c.report.b).is_dir()
    assert not any("temporary" in n for n in c.report.notes) and str(last) in c.report.where
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
    # the float32 oracle is every pass's reference: pinning it changes nothing
    assert parse_passes("auto", "bfloat16", "float32") == ("semantic", "numeric")
    assert parse_passes("direct", "float32") == ("direct",)  # a float32 run alone, its own options
    assert parse_passes(" numeric ", "bfloat16") == ("numeric",)
    assert parse_passes("semantic", "bfloat16") == ("semantic",)  # one pass, picked


@pytest.mark.parametrize("text, dtype, oracle, says", [
    ("semantics", "bfloat16", None, "expected auto or"), ("", "bfloat16", None, "expected auto or"),
    ("semantic,direct", "bfloat16", None, "not both"), ("numeric,numeric", "bfloat16", None, "each pass once"),
    ("numeric", "float32", None, "low-precision"),
    # no tensor computed in bf16 is judged by a flat tolerance: no direct pass, no bf16 reference
    ("direct", "bfloat16", None, "flat tolerance"), ("auto", "bfloat16", "bfloat16", "floor run"),
    ("semantic", "float32", "bfloat16", "floor run")])
def test_bad_passes_are_bad_input(text, dtype, oracle, says):
    from tensordiff.pipeline.case import parse_passes

    with pytest.raises(BadInput, match=says):
        parse_passes(text, dtype, oracle)


def test_the_exact_reference_sets_the_models_exact_numerics():
    """DeepSeek's language half runs official bf16 + kernel rounding in a bf16 run (its numerics
    follow the dtype unless asked for): its float32 reference is the semantic numerics without
    rounding; a model without exact options is only cast to float32."""
    from tensordiff.models.deepseek_v41_flash.options import numerics_mode
    from tensordiff.pipeline import registry
    from tensordiff.pipeline.case import exact_request

    ds = registry.adapter("deepseek-v4.1-flash")
    _, req = make_request(ds.name, dtype="bfloat16", prompt="Describe <image>.", adapter=ds)
    assert req.options["language_numerics"] is None and numerics_mode(req.options, req.dtype) == "official"
    ref = exact_request(ds, req)
    assert ref.dtype == "float32" and ref.options["language_numerics"] == "semantic"
    assert ref.options["kernel_quant"] is False and numerics_mode(req.options, req.dtype) == "official"
    _, toy_req = make_request(toy.NAME, dtype="bfloat16")
    assert exact_request(registry.adapter(toy.NAME), toy_req).options == toy_req.options
