"""One judge on both routes: a tensor is judged alike end to end and locally; contracts that name
an unknown probe, layout or mode are refused when built; every probe trips on its fault and
stays quiet on a clean case."""
from __future__ import annotations

import pytest
import torch
from helpers_dumps import write

from tensordiff.pipeline.adapter import ModelAdapter
from tensordiff.pipeline.compare import compare_dumps
from tensordiff.judge.contract import Boundary, Contract, ContractError, TensorRule
from tensordiff.judge.judge import Judge
from tensordiff.pipeline.local_error import local_error
import tensordiff.models.deepseek_v41_flash.contract as C
from tensordiff.pipeline.runs import make_request
from tensordiff.judge.tolerance import Tolerances

# The language contract's own rules for the indexer ids: top-k sets, judged tie-aware against the
# scores recorded beside them (no blanket fraction of rows allowed to differ).
LANG = Contract("toy-lang", (Boundary("embeddings", (), "rows", layout="tokens"),
                             Boundary("index.0.ids", ("embeddings",), "top-k ids", layout="tokens")),
                C.RULES, boundary_of=C.boundary_of)
ROWS, K, W = 200, 8, 128
B = {"index.0.ids": "index.0.ids", "index.0.scores": "index.0.ids"}


def _ids(flip_rows: int, near_tie: bool):
    ids = torch.stack([torch.randperm(64, generator=torch.Generator().manual_seed(r))[:K] for r in range(ROWS)])
    scores = torch.zeros(ROWS, W)
    scores.scatter_(1, ids, 1.0 + torch.arange(K, dtype=torch.float32).flip(0).repeat(ROWS, 1))  # column 0 best
    out = ids.clone()
    out[:flip_rows, K - 1] = 100 + torch.arange(flip_rows)  # the row's weakest pick replaced
    eng = scores.clone()
    if near_tie:  # the replacement scored a hair under the weakest pick: a rounding flips them
        for r in range(flip_rows):
            scores[r, 100 + r] = scores[r, ids[r, K - 1]] - 1e-7
            eng[r, 100 + r] = scores[r, ids[r, K - 1]] + 1e-7
    return ids, out, scores, eng


def _both_routes(tmp_path, flip_rows, near_tie):
    ids, eng, s_ref, s_eng = _ids(flip_rows, near_tie)
    emb = torch.randn(ROWS, 16, generator=torch.Generator().manual_seed(3))
    run = {"dtype": "float32"}
    odir = write(tmp_path / "oracle", {"embeddings": emb, "index.0.ids": ids, "index.0.scores": s_ref},
                 model="toy-lang", run=run, boundaries=B)
    edir = write(tmp_path / "engine", {"embeddings": emb, "index.0.ids": eng, "index.0.scores": s_eng},
                 model="toy-lang", run=run, boundaries=B)
    adapter = ModelAdapter("toy-lang", LANG, (), oracle=lambda: None, engine=lambda: None)
    tols = Tolerances({}, {})
    report = compare_dumps(odir, edir, tols, contract=LANG)
    make_stages = lambda req, run: {"index.0.ids": lambda inputs: {"index.0.ids": eng,  # noqa: E731
                                                                   "index.0.scores": s_eng}}
    _, req = make_request("deepseek-v4.1-flash")
    local = local_error(adapter, req, odir, report, tols, tmp_path, make_stages=make_stages)
    return report.boundary("index.0.ids").tensors[0], local.get("index.0.ids").tensors[0]


@pytest.mark.parametrize("flips,near_tie,status", [(1, True, "benign"), (5, True, "benign"), (1, False, "diverged")])
def test_index_ids_are_judged_alike_end_to_end_and_locally(tmp_path, flips, near_tie, status):
    # near-tied flips are benign on both routes however many; one choice the scores do not explain
    # diverges on both. Before the judge, local error used other tolerances than end to end.
    e2e, loc = _both_routes(tmp_path, flips, near_tie)
    assert e2e.status == loc.status == status
    assert e2e.tolerance == loc.tolerance and e2e.tolerance["max_mismatch"] == 0.0
    assert e2e.mode == loc.mode == "topk-sets"
    assert e2e.metrics["ties"]["rows_differ"] == loc.metrics["ties"]["rows_differ"] == flips


def test_the_runs_compute_dtypes_set_the_unit_on_both_routes(tmp_path):
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(0))
    contract = Contract("toy-dt", (Boundary("a"), Boundary("b", ("a",))))
    odir = write(tmp_path / "o", {"a": x, "b": x}, model="toy-dt", run={"dtype": "float32"})
    edir = write(tmp_path / "e", {"a": x, "b": x * (1 + 2 ** -8)}, model="toy-dt", run={"dtype": "bfloat16"})
    report = compare_dumps(odir, edir, Tolerances({}, {}), contract=contract)
    adapter = ModelAdapter("toy-dt", contract, (), oracle=lambda: None, engine=lambda: None)
    _, req = make_request("deepseek-v4.1-flash", dtype="bfloat16")
    stage = {"b": lambda inputs: {"b": x * (1 + 2 ** -8)}}
    local = local_error(adapter, req, odir, report, Tolerances({}, {}), tmp_path, make_stages=lambda r, run: stage)
    e2e, loc = report.boundary("b").tensors[0], local.get("b").tensors[0]
    # fp32 stored, bf16 computed: judged in bf16 on both routes (2^-8 relative is within bf16, not fp32)
    assert e2e.dtype["unit"] == loc.dtype["unit"] == "bfloat16"
    assert e2e.status == loc.status == "match"
    # the same change judged as fp32 (both runs fp32) diverges: the unit is what decides
    fp32 = Judge.build(contract, Tolerances({}, {}), ("float32", "float32"))
    assert compare_dumps(odir, edir, fp32).boundary("b").status == "diverged"


def test_the_user_wins_over_the_contract():
    lenient = Contract("toy-lenient", LANG.boundaries, LANG.rules, tolerances={"index.*": {"max_mismatch": 0.01}})
    user = Tolerances({}, {"index.*": {"max_mismatch": 0.0}}, "user.toml")
    j = Judge.build(lenient, user)
    assert j.tolerance("index.0.ids", "int").max_mismatch == 0.0
    assert Judge.build(lenient, Tolerances({}, {})).tolerance("index.0.ids", "int").max_mismatch == 0.01


@pytest.mark.parametrize("make,match", [
    (lambda: Boundary("x", probes=("unit-norm",)), "unknown probe 'unit-norm'"),
    (lambda: Boundary("x", layout="pixels"), "unknown layout 'pixels'"),
    (lambda: TensorRule("*.ids", "sets"), "unknown mode 'sets'"),
])
def test_a_contract_naming_the_unknown_is_refused_when_built(make, match):
    with pytest.raises(ContractError, match=match):
        make()


RMS = Contract("toy-rms", (Boundary("norm", probes=("unit-rms",)),))


def _unit_rows(n=16, d=32, seed=0):
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(seed))
    return x / x.pow(2).mean(-1, keepdim=True).sqrt()


def test_unit_rms_probe_catches_a_norm_scaled_within_tolerance(tmp_path):
    a = _unit_rows()
    b = a * (1 + 5e-4)  # within fp32 atol + rtol*|a| and cosine 1: only the probe sees it
    r = compare_dumps(write(tmp_path / "a", {"norm": a}), write(tmp_path / "b", {"norm": b}), contract=RMS)
    t = r.boundary("norm").tensors[0]
    assert t.status == "diverged" and "unit-rms" in t.reason
    assert t.probes["unit-rms"]["a"] is True and t.probes["unit-rms"]["b"] is False


def test_unit_rms_probe_is_quiet_on_a_clean_norm_and_when_the_reference_fails_too(tmp_path):
    a = _unit_rows()
    r = compare_dumps(write(tmp_path / "a", {"norm": a}), write(tmp_path / "b", {"norm": a.clone()}), contract=RMS)
    assert r.verdict == "match" and r.boundary("norm").tensors[0].probes["unit-rms"]["b"] is True
    raw = torch.randn(16, 32, generator=torch.Generator().manual_seed(1))  # no norm: A fails it too
    r = compare_dumps(write(tmp_path / "c", {"norm": raw}), write(tmp_path / "d", {"norm": raw * (1 + 5e-4)}),
                      contract=RMS)
    assert r.verdict == "match"


# ---------------------------------------------------------------- magnitude-aware atol

SCALED = Contract("toy-scaled", (Boundary("logits"),), tolerances={"logits": {"float32": {"atol_scale": "rms"}}})
PLAIN = Contract("toy-scaled", (Boundary("logits"),))


def _logits_pair(tmp_path, b_of=lambda a, b: b, dtype=torch.float32):
    from helpers_dumps import reduction_pair

    a, b = reduction_pair()
    b = b_of(a, b.clone())
    return (write(tmp_path / "o", {"logits": a}, model="toy-scaled"),
            write(tmp_path / "e", {"logits": b.to(dtype)}, model="toy-scaled"))


def test_a_clean_large_reduction_needs_the_scaled_atol(tmp_path):
    # two right fp32 routes (upstream fp32 noise, split-K order): a fixed atol false-alarms on the
    # elements near zero, the tensor-scaled one does not
    o, e = _logits_pair(tmp_path)
    plain = compare_dumps(o, e, Tolerances({}, {}), contract=PLAIN).boundary("logits").tensors[0]
    assert plain.status == "diverged" and 0 < plain.metrics.mismatches < 1e-3 * plain.metrics.numel
    scaled = compare_dumps(o, e, Tolerances({}, {}), contract=SCALED).boundary("logits").tensors[0]
    assert scaled.status == "match", scaled.reason
    assert scaled.tolerance["atol_scale"] == "rms" and scaled.tolerance["scale"] == pytest.approx(45, rel=0.05)
    # the headroom is real but bounded: the worst element uses a fraction of the scaled atol
    assert scaled.metrics.max_abs < 0.2 * 1e-4 * scaled.tolerance["scale"]


def _row_noise(a, b):
    # one row off by 1e-3 of the tensor's RMS (random signs): an error 5x the scaled atol
    g = torch.Generator().manual_seed(7)
    b[3] = a[3] + 1e-3 * a.pow(2).mean().sqrt() * torch.randn(a.shape[1], generator=g).sign()
    return b


def _column_flip(a, b):
    b[:, 1234] = -b[:, 1234]
    return b


@pytest.mark.parametrize("fault", [_row_noise, _column_flip])
def test_faults_still_trip_the_scaled_atol(tmp_path, fault):
    o, e = _logits_pair(tmp_path, fault)
    t = compare_dumps(o, e, Tolerances({}, {}), contract=SCALED).boundary("logits").tensors[0]
    assert t.status == "diverged" and "×max(1, rms(A)" in t.reason, t.reason
    assert t.worst["index"][0 if fault is _row_noise else 1] == (3 if fault is _row_noise else 1234)


def test_the_scale_is_float32_only_so_bf16_logits_are_judged_as_before(tmp_path):
    o, e = _logits_pair(tmp_path, dtype=torch.bfloat16)
    judge = Judge.build(SCALED, Tolerances({}, {}), ("float32", "bfloat16"))
    t = compare_dumps(o, e, judge).boundary("logits").tensors[0]
    plain = compare_dumps(o, e, Judge.build(PLAIN, Tolerances({}, {}), ("float32", "bfloat16"))).boundary("logits")
    assert t.dtype["unit"] == "bfloat16" and t.tolerance["atol_scale"] is None and t.tolerance["scale"] is None
    assert t.status == plain.tensors[0].status and t.metrics.mismatches == plain.tensors[0].metrics.mismatches


def test_the_report_shows_the_scaled_atol(tmp_path):
    from tensordiff.reports.text import render_text

    o, e = _logits_pair(tmp_path)
    text = render_text(compare_dumps(o, e, Tolerances({}, {}), contract=SCALED))
    assert "atol 0.0001×max(1, rms(A) 4" in text, text


def test_the_bf16_numeric_pass_on_logits_is_unchanged_by_the_scale(tmp_path):
    from helpers_dumps import reduction_pair

    from tensordiff.pipeline.compare import three_way

    a, b = reduction_pair()
    floor_run, cand = a.bfloat16().float(), (b + 0.01 * b.std() * torch.randn_like(b)).bfloat16().float()
    o = write(tmp_path / "o", {"logits": a}, model="toy-scaled", run={"dtype": "float32"})
    f = write(tmp_path / "f", {"logits": floor_run}, model="toy-scaled", run={"dtype": "bfloat16"})
    e = write(tmp_path / "e", {"logits": cand}, model="toy-scaled", run={"dtype": "bfloat16"})
    scaled, plain = (three_way(o, f, e, contract=c).boundary("logits").tensors[0] for c in (SCALED, PLAIN))
    assert scaled.mode == plain.mode == "floor" and scaled.status == plain.status
    assert scaled.metrics == plain.metrics and scaled.tolerance == plain.tolerance
