"""The route a user meets first: the run's dtype (the model's official one when none is asked
for), how a comparison judged its low-precision tensors (three-way, or two-way and what that
cannot see), the headline when generated tokens differ, and a stage that reads a tensor its
boundary does not declare."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from helpers_dumps import write
from tensordiff.errors import BadInput
from tensordiff.judge.contract import Boundary, Contract
from tensordiff.judge.tolerance import Tolerances
from tensordiff.models import decode_tokens
from tensordiff.pipeline import registry
from tensordiff.pipeline.compare import compare_dumps, three_way
from tensordiff.pipeline.local_error import ENGINE_READS, MISSING_EDGE, NO_DEPENDENCE, local_error
from tensordiff.pipeline.runs import run_dtype
from tensordiff.reports.text import headline, render_text, tokens_changed

import test_gate_toy as toy

DS, QW = "deepseek-v4.1-flash", "qwen3-vl"


# ----------------------------------------------------------------------------- the run's dtype

def test_with_no_dtype_a_run_computes_in_the_models_official_dtype(monkeypatch, tmp_path):
    monkeypatch.setenv("TENSORDIFF_CACHE", str(tmp_path / "cache"))
    toy.install(monkeypatch)
    assert run_dtype(registry.adapter(DS), "synthetic:tiny") == "bfloat16"  # the whole model, officially
    assert run_dtype(registry.adapter(toy.NAME), "synthetic:tiny") == "float32"  # an adapter that declares none
    assert run_dtype(registry.adapter(DS), "synthetic:tiny", "float32") == "float32"  # asked for: kept


def _qwen_dir(tmp_path, **cfg):
    d = tmp_path / "ck"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "preprocessor_config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"")
    return str(d)


def test_qwen3_vl_runs_in_the_dtype_its_checkpoint_declares(tmp_path):
    qw = registry.adapter(QW)
    assert run_dtype(qw, "synthetic:tiny") == "bfloat16"  # the synthetic config declares it, as the released one
    assert run_dtype(qw, _qwen_dir(tmp_path / "a", text_config={"dtype": "float32"})) == "float32"
    assert run_dtype(qw, _qwen_dir(tmp_path / "b", torch_dtype="bfloat16")) == "bfloat16"  # the older key
    with pytest.raises(BadInput, match="declares no dtype"):
        run_dtype(qw, _qwen_dir(tmp_path / "c"))
    with pytest.raises(BadInput, match="float16.*give --dtype"):
        run_dtype(qw, _qwen_dir(tmp_path / "d", dtype="float16"))


def test_a_case_with_nothing_asked_is_the_gate_case(monkeypatch, tmp_path):
    from tensordiff.pipeline.case import CaseSpec

    monkeypatch.setenv("TENSORDIFF_CACHE", str(tmp_path / "cache"))
    _, spec = CaseSpec(DS).resolved()
    assert (spec.dtype, spec.passes) == ("bfloat16", ("semantic", "numeric"))
    _, spec = CaseSpec(DS, dtype="float32").resolved()
    assert (spec.dtype, spec.passes) == ("float32", ("semantic",))
    _, spec = CaseSpec(DS, passes=("numeric",)).resolved()  # one pass, picked
    assert (spec.dtype, spec.passes) == ("bfloat16", ("numeric",))
    with pytest.raises(BadInput, match="flat tolerance"):
        CaseSpec(DS, passes=("direct",)).resolved()


def test_deepseek_language_numerics_follow_the_dtype():
    from tensordiff.models.deepseek_v41_flash.options import OPTIONS, mixed_route, numerics_mode

    opts = OPTIONS.resolve({})
    assert numerics_mode(opts, "bfloat16") == "official" and numerics_mode(opts, "float32") == "semantic"
    asked = OPTIONS.resolve({"language_numerics": "official"})
    assert mixed_route(asked, "float32") and not mixed_route(asked, "bfloat16") and not mixed_route(opts, "float32")


# ----------------------------------------------------------------------------- how it was judged

def _pair(tmp_path, dtype, run_dtype_=True, scale=1.0):
    g = torch.Generator().manual_seed(5)
    ref = {"block0": torch.randn(16, 32, generator=g)}
    low = {"block0": (ref["block0"] * scale).to(getattr(torch, dtype))}  # stored as computed
    run = {"dtype": dtype} if run_dtype_ else {}
    return (write(tmp_path / "a", ref, run={"dtype": "float32"} if run_dtype_ else {}),
            write(tmp_path / f"b-{dtype}", low, run=run), ref)


def test_a_low_precision_comparison_without_a_floor_says_it_is_two_way(tmp_path):
    a, b, _ = _pair(tmp_path, "bfloat16")
    rep = compare_dumps(a, b)
    assert rep.judgement["kind"] == "two-way" and rep.judgement["low_precision"] == ["bfloat16"]
    assert rep.judgement["cannot_see"] and rep.judgement["note"] in rep.notes
    assert rep.as_json()["judgement"]["kind"] == "two-way"
    assert render_text(rep).splitlines()[0] == headline(rep)


def test_undeclared_low_precision_tensors_that_differ_are_two_way_and_exact_ones_are_not(tmp_path):
    a, b, ref = _pair(tmp_path, "bfloat16", run_dtype_=False)
    rep = compare_dumps(a, b)
    assert rep.judgement["kind"] == "two-way" and rep.judgement["tensors"] == ["block0"]
    # a bit-exact bf16 route stays exact: nothing there needs a floor
    same = {"block0": ref["block0"].to(torch.bfloat16)}
    rep = compare_dumps(write(tmp_path / "x", same), write(tmp_path / "y", same))
    assert rep.judgement == {"kind": "direct"} and rep.verdict == "match"


def test_with_a_floor_the_same_comparison_is_three_way(tmp_path):
    a, b, ref = _pair(tmp_path, "bfloat16")
    floor = write(tmp_path / "floor", {"block0": ref["block0"].to(torch.bfloat16)}, run={"dtype": "bfloat16"})
    rep = three_way(a, floor, b)
    assert rep.judgement == {"kind": "three-way", "floor": str(floor)}
    assert all(t.mode == "floor" for bd in rep.boundaries for t in bd.tensors)
    assert not any("two-way" in n for n in rep.notes) and rep.verdict == "match"


def test_float32_is_direct(tmp_path):
    a, b, _ = _pair(tmp_path, "float32")
    assert compare_dumps(a, b).judgement == {"kind": "direct"}


PLUGIN = """
from pathlib import Path
def test_engine(tensordiff_baseline):
    tensordiff_baseline.check(Path(r"{produced}"), baseline=Path(r"{baseline}"){floor})
"""


def test_the_plugin_judges_against_a_floor_and_warns_when_it_has_none(pytester, tmp_path):
    a, b, ref = _pair(tmp_path, "bfloat16")
    floor = write(tmp_path / "floor", {"block0": ref["block0"].to(torch.bfloat16)}, run={"dtype": "bfloat16"})
    pytester.makepyfile(PLUGIN.format(produced=b, baseline=a, floor=f", floor=Path(r'{floor}')"))
    r = pytester.runpytest("-W", "error::UserWarning")
    r.assert_outcomes(passed=1)
    # a stray scale of one part in 64: within the flat bf16 tolerance, 10x over the floor
    _, bad, _ = _pair(tmp_path / "bad", "bfloat16", scale=1 + 2 ** -6)
    pytester.makepyfile(PLUGIN.format(produced=bad, baseline=a, floor=f", floor=Path(r'{floor}')"))
    pytester.runpytest().assert_outcomes(failed=1)
    pytester.makepyfile(PLUGIN.format(produced=bad, baseline=a, floor=""))
    r = pytester.runpytest()
    r.assert_outcomes(passed=1, warnings=1)
    r.stdout.fnmatch_lines(["*TwoWayWarning*two-way verdict*"])


# ----------------------------------------------------------------------------- generated tokens

TOK = Contract("toy-tok", (Boundary("logits"), decode_tokens.token_boundary(1, "logits"),
                           Boundary("logits.step.1", ("token.step.1", "logits")),
                           decode_tokens.token_boundary(2, "logits.step.1"),
                           Boundary("logits.step.2", ("token.step.2", "logits.step.1"))),
               rules=decode_tokens.RULES, boundary_of=lambda n: decode_tokens.boundary_of(n) or n,
               scores_source=decode_tokens.scores_source)


def _tokens(tmp_path, name, step1_row):
    """A two-step decode whose step-1 logits row is `step1_row` (token 2 its argmax)."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 8, generator=g)
    logits[-1, 4] = 9.0
    t = {"logits": logits, "token.step.1.ids": torch.tensor([[4]]), "token.step.1.scores": logits[-1:].clone(),
         "logits.step.1": step1_row[None], "token.step.2.ids": torch.tensor([[int(step1_row.argmax())]]),
         "token.step.2.scores": step1_row[None].clone(), "logits.step.2": torch.ones(1, 8)}
    return write(tmp_path / name, t, model="toy-tok", run={"dtype": "float32"},
                 boundaries={k: TOK.boundary_of(k) for k in t})


def test_the_headline_says_when_the_generated_tokens_differ(tmp_path):
    row = torch.linspace(0, 1, 8)
    a_row = row.clone()
    a_row[5], a_row[2] = 5.0 + 1e-6, 5.0  # the reference picks 5 by a hair
    b_row = row.clone()
    b_row[5], b_row[2] = 5.0, 5.0 + 2e-6  # a right route that rounds the other way picks 2
    a = _tokens(tmp_path, "a", a_row)
    rep = compare_dumps(a, _tokens(tmp_path, "b", b_row), contract=TOK)
    assert rep.verdict == "match" and rep.boundary("token.step.2").status == "benign"
    g = rep.generated
    assert (g["steps"], g["differ"], g["first"], g["benign"]) == ([1, 2], [2], 2, True)
    first = render_text(rep).splitlines()[0]
    assert first == headline(rep) and tokens_changed(rep) and tokens_changed(rep) in first
    assert rep.as_json()["generated"]["first"] == 2
    # a choice the scores do not explain: the step's logits themselves are wrong
    c_row = row.clone()
    c_row[5], c_row[0] = 5.0 + 1e-6, 9.0
    bad = compare_dumps(a, _tokens(tmp_path, "c", c_row), contract=TOK)
    assert bad.verdict == "diverged" and bad.generated["first"] == 2 and bad.generated["benign"] is False
    assert tokens_changed(bad) in render_text(bad).splitlines()[0]
    same = compare_dumps(a, _tokens(tmp_path, "d", a_row.clone()), contract=TOK)
    assert same.generated["first"] is None and not tokens_changed(same)
    assert compare_dumps(write(tmp_path / "x", {"a": torch.ones(2)}), write(tmp_path / "y", {"a": torch.ones(2)})
                         ).generated is None  # no decode steps: nothing said


# ----------------------------------------------------------------------------- undeclared reads

# c declares only a; b is recorded before c (dump order), d after it
READS = Contract("toy-reads", (Boundary("a"), Boundary("b"), Boundary("c", ("a",)), Boundary("d", ("c",))),
                 boundary_of=lambda n: n)


def _reads_case(tmp_path, official, engine, stage):
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)
    o = {"a": a, "b": b, "c": official(a, b)}
    o["d"] = o["c"] * 3
    e = {"a": a, "b": b, "c": engine(a, b)}
    e["d"] = e["c"] * 3
    odir = write(tmp_path / "o", o, model="toy-reads", run={"dtype": "float32"})
    edir = write(tmp_path / "e", e, model="toy-reads", run={"dtype": "float32"})
    report = compare_dumps(odir, edir, contract=READS)
    offered = {}

    def make(req, run):
        def c(i):
            offered["c"] = sorted(i)
            return {"c": stage(i)}
        return {"c": c, "d": lambda i: {"d": i["c"] * 3}}

    adapter = SimpleNamespace(name="toy-reads", contract=READS, stages=lambda: make)
    loc = local_error(adapter, SimpleNamespace(dtype="float32"), odir, report, Tolerances({}, {}), tmp_path)
    return report, loc, offered


def test_a_stage_is_offered_what_the_reference_recorded_before_it(tmp_path):
    _, loc, offered = _reads_case(tmp_path, lambda a, b: 2 * a, lambda a, b: 2 * a, lambda i: 2 * i["a"])
    assert offered["c"] == ["a", "b"]  # b (recorded before c) too; not c itself, not d after it
    assert loc.origin is None and loc.get("c").undeclared is None and not loc.undeclared


def test_a_stage_that_matches_only_with_an_undeclared_input_is_the_contracts_missing_edge(tmp_path):
    report, loc, _ = _reads_case(tmp_path, lambda a, b: a + b, lambda a, b: a + b, lambda i: i["a"] + i["b"])
    r = loc.get("c")
    assert r.status == "match" and r.undeclared == {"read": ["b"], "depends": True, "finding": MISSING_EDGE}
    assert loc.origin is None and [x.boundary for x in loc.undeclared] == ["c"]
    assert r.undeclared_text() in loc.summary() and loc.as_json()["undeclared"] == ["c"]


def test_a_stage_that_diverges_by_an_undeclared_input_is_the_engines_bug(tmp_path):
    # the engine adds b where the official stage does not: end to end c diverges, and its stage,
    # offered b as the engine reads it, reproduces that (fed a alone it could not)
    report, loc, _ = _reads_case(tmp_path, lambda a, b: 2 * a, lambda a, b: 2 * a + b, lambda i: 2 * i["a"] + i["b"])
    assert report.earliest == ["c"]
    r = loc.get("c")
    assert loc.origin == "c" and r.undeclared["finding"] == ENGINE_READS and r.flagged


def test_a_read_the_result_does_not_depend_on_is_not_flagged(tmp_path):
    def stage(i):
        b = i.get("b")
        assert b is None or b.shape == i["a"].shape
        return 2 * i["a"]

    _, loc, _ = _reads_case(tmp_path, lambda a, b: 2 * a, lambda a, b: 2 * a, stage)
    r = loc.get("c")
    assert r.undeclared == {"read": ["b"], "depends": False, "finding": NO_DEPENDENCE}
    assert not r.flagged and not loc.undeclared and loc.origin is None
