"""Local error: engine stages on the oracle's tensors name the stage that broke."""
from __future__ import annotations

import pytest

from tensordiff.pipeline.compare import compare_dumps
from tensordiff.commands.gate import load_gate, run_gate
from tensordiff.pipeline.inputs import default_image_path
from tensordiff.pipeline.local_error import local_error
from tensordiff.pipeline.runs import make_request, run_side
from tensordiff.judge.tolerance import Tolerances

import test_gate_toy as toy


@pytest.fixture(autouse=True)
def _toys(monkeypatch, tmp_path):
    monkeypatch.setenv("TENSORDIFF_CACHE", str(tmp_path / "cache"))
    toy.install(monkeypatch)


def _case(tmp_path, fault=None, adapter=toy.ADAPTER, make_stages=None):
    _, req = make_request(adapter.name, image=default_image_path(), fault=fault)
    from dataclasses import replace

    odir = run_side(adapter, "oracle", replace(req, fault=None), tmp_path / "oracle")
    edir = run_side(adapter, "engine", req, tmp_path / "engine")
    tols = Tolerances({}, {})
    report = compare_dumps(odir, edir, tols)
    return report, local_error(adapter, req, odir, report, tols, tmp_path, make_stages=make_stages)


def test_local_error_localises_a_fault_behind_a_drift_within_tolerance(tmp_path):
    # block0 drifts within tolerance; GAIN makes final_norm exceed it end to end, so the DAG walk
    # blames final_norm. The aligner carries the real bug. Local error: final_norm's stage is
    # exact on the oracle's block0, the aligner's is not -> origin aligner.
    report, local = _case(tmp_path, "drift-and-aligner-bias")
    assert report.boundary("block0").status == "match"
    assert report.earliest == ["final_norm"]
    assert local.get("block0").status == "match"  # the drift is within tolerance there too
    assert local.get("final_norm").status == "match"
    assert local.get("aligner").status == "diverged"
    assert local.origin == "aligner"
    assert "end-to-end names `final_norm`" in local.summary()


def test_drift_alone_has_no_origin_and_says_it_is_accumulated(tmp_path):
    report, local = _case(tmp_path, "oracle-like-drift")
    assert report.earliest == ["final_norm"]
    assert local.origin is None
    assert "drift accumulated upstream within tolerance" in local.summary()


@pytest.mark.parametrize("fault, origin", [("rope-flip", "rope"), ("aligner-bias", "aligner"),
                                           ("patches-shift", "patches")])
def test_origin_is_the_faulty_stage(tmp_path, fault, origin):
    report, local = _case(tmp_path, fault)
    assert local.origin == origin
    # a stage fed the oracle's inputs is clean downstream of a first-boundary fault
    if origin in ("rope", "patches"):
        assert local.get("aligner").status == "match"
        assert report.boundary("aligner").status == "consequent"


def test_clean_engine_every_stage_matches(tmp_path):
    report, local = _case(tmp_path)
    assert local.available and local.origin is None
    assert [r.status for r in local.boundaries] == ["match"] * 5
    assert local.get("patches").reason.startswith("first boundary")
    assert local.as_json()["origin"] is None


def test_adapter_without_stages_is_reported_not_failed(tmp_path):
    report, local = _case(tmp_path, adapter=toy.NO_STAGES)
    assert not local.available and local.origin is None
    assert "exposes no engine stages" in local.summary()
    res = run_gate(load_gate(toy.write_gate(tmp_path, model="toy-nostages")), progress=False, echo=lambda s: None)
    assert res.passed and not res.cases[0].local.available
    assert "local: n/a" in res.cases[0].summary_line()


def test_a_raising_stage_is_an_error_at_its_boundary_and_others_still_run(tmp_path):
    def make(req, run):
        st = toy.engine_stages(req, run)

        def boom(inputs):
            raise RuntimeError("kernel exploded")

        st["final_norm"] = boom
        return st

    _, local = _case(tmp_path, make_stages=make)
    assert local.get("final_norm").status == "error"
    assert "kernel exploded" in local.get("final_norm").reason
    assert local.get("aligner").status == "match"
    assert local.origin == "final_norm"


def test_missing_stage_and_missing_output_tensor(tmp_path):
    def make(req, run):
        st = toy.engine_stages(req, run)
        del st["block0"]
        st["aligner"] = lambda i: {"aligner_typo": toy.aligner(i["final_norm"])}
        return st

    _, local = _case(tmp_path, make_stages=make)
    assert local.get("block0").status == "no-stage"
    assert local.get("aligner").status == "missing"
    assert local.origin == "aligner"
    assert "no stage for block0" in local.summary()


def test_stage_gets_the_oracle_tensors_in_their_stored_dtype(tmp_path):
    seen = {}

    def make(req, run):
        st = toy.engine_stages(req, run)
        inner = st["block0"]

        def spy(inputs):
            seen.update({k: v.dtype for k, v in inputs.items()})
            return inner(inputs)

        st["block0"] = spy
        return st

    _case(tmp_path, make_stages=make)
    import torch

    assert seen == {"patches": torch.bfloat16, "rope.cos": torch.float32, "rope.sin": torch.float32}


def test_gate_fails_on_a_local_origin_even_if_end_to_end_passes(tmp_path):
    # a stage error that the end-to-end comparison cannot see (a stage only the local run uses)
    def make(req, run):
        st = toy.engine_stages(req, run)
        st["final_norm"] = lambda i: {"final_norm": toy.final_norm(i["block0"]) + 1.0}
        return st

    report, local = _case(tmp_path, make_stages=make)
    assert report.verdict == "match" and local.origin == "final_norm"
    from tensordiff.commands.gate import CaseResult

    case = CaseResult(toy.NAME, default_image_path(), None, "float32", "x", report=report, local=local)
    assert not case.passed and "local origin `final_norm`" in case.summary_line()


def test_later_stages_also_get_everything_upstream(tmp_path):
    seen = {}

    def make(req, run):
        st = toy.engine_stages(req, run)
        inner = st["final_norm"]
        st["final_norm"] = lambda i: (seen.update(i), inner(i))[1]
        return st

    _case(tmp_path, make_stages=make)
    assert set(seen) == {"patches", "rope.cos", "rope.sin", "block0"}


def _replaying(calls: list, replays: bool = True):
    """The toy's stages, each declaring `replays_run` and logging its calls."""
    def make(req, run):
        out = {}
        for name, stage in toy.engine_stages(req, run).items():
            def call(i, name=name, stage=stage):
                calls.append(name)
                return stage(i)
            call.replays_run = replays
            out[name] = call
        return out
    return make


def _with_engine(tmp_path, fault, make_stages):
    _, req = make_request(toy.NAME, image=default_image_path(), fault=fault)
    from dataclasses import replace

    odir = run_side(toy.ADAPTER, "oracle", replace(req, fault=None), tmp_path / "oracle")
    edir = run_side(toy.ADAPTER, "engine", req, tmp_path / "engine")
    tols = Tolerances({}, {})
    report = compare_dumps(odir, edir, tols)
    ran = local_error(toy.ADAPTER, req, odir, report, tols, tmp_path / "ran")
    return report, ran, local_error(toy.ADAPTER, req, odir, report, tols, tmp_path / "skip", make_stages=make_stages,
                                    engine_dir=edir)


def _verdicts(local):
    return [(r.boundary, r.status, [t.metrics.get("max_abs") for t in r.tensors]) for r in local.boundaries]


def test_a_stage_replaying_the_run_is_not_run_on_the_engines_own_inputs(tmp_path):
    # block0's inputs (patches, rope) are bit for bit the engine's: its local error is its
    # end-to-end one, taken without running it; final_norm's input (block0) drifted, so it runs
    calls = []
    report, ran, local = _with_engine(tmp_path, "drift-and-aligner-bias", _replaying(calls))
    assert calls == ["final_norm", "aligner"]
    assert "bit for bit the engine's own" in local.get("block0").reason
    assert _verdicts(local) == _verdicts(ran) and local.origin == ran.origin == "aligner"


def test_an_input_that_differs_runs_the_stage(tmp_path):
    # the fault that proves the rule reads the tensors: rope-flip's engine rope differs from the
    # oracle's, so block0's stage must run on the oracle's (and is clean there)
    calls = []
    report, ran, local = _with_engine(tmp_path, "rope-flip", _replaying(calls))
    assert "block0" in calls and local.get("block0").status == "match"
    assert _verdicts(local) == _verdicts(ran) and local.origin == "rope"


def test_a_stage_that_does_not_replay_the_run_always_runs(tmp_path):
    calls = []
    _, ran, local = _with_engine(tmp_path, None, _replaying(calls, replays=False))
    assert calls == ["block0", "final_norm", "aligner"] and _verdicts(local) == _verdicts(ran)


def _decode_dumps(tmp_path):
    """Reference (fp32) and floor run (bf16) dumps of a toy model with prompt logits [32, 256]
    and two decode steps [1, 256]; the floor run's error 0.15 of the logits' RMS, the size a
    whole bf16 network leaves (tiny config: 0.08-0.35 on the H200 and the CPU)."""
    import torch

    from helpers_dumps import write

    g = torch.Generator().manual_seed(3)
    ref = {"hidden": torch.randn(32, 64, generator=g), "logits": torch.randn(32, 256, generator=g),
           "logits.step.1": torch.randn(1, 256, generator=g), "logits.step.2": torch.randn(1, 256, generator=g)}
    floor = {k: (v + 0.15 * torch.randn(v.shape, generator=g)).to(torch.bfloat16).float() for k, v in ref.items()}
    names = {k: k for k in ref}
    return (write(tmp_path / "ref", ref, model="toy-decode", run={"dtype": "float32"}, boundaries=names),
            write(tmp_path / "floor", floor, model="toy-decode", run={"dtype": "bfloat16"}, boundaries=names), ref)


def _decode_adapter(ref, scale: float):
    """An adapter whose decode stage is a bf16 route of the reference's step: its own rounding
    `scale` times the floor run's typical row error (1: another right bf16 route, a GPU's)."""
    from types import SimpleNamespace

    import torch

    from tensordiff.judge.contract import Boundary, Contract

    contract = Contract("toy-decode", (Boundary("hidden"), Boundary("logits", ("hidden",)),
                                       Boundary("logits.step.1", ("logits",)),
                                       Boundary("logits.step.2", ("logits.step.1",))), boundary_of=lambda n: n)

    def stage(name, s):
        def run(inputs):
            g = torch.Generator().manual_seed(hash(name) % 1000)
            v = ref[name]
            return {name: (v + s * 0.15 * torch.randn(v.shape, generator=g)).to(torch.bfloat16).float()}
        return run

    def make_stages(req, run):
        return {"logits.step.1": stage("logits.step.1", scale), "logits.step.2": stage("logits.step.2", 1.0)}

    return SimpleNamespace(name="toy-decode", contract=contract, stages=lambda: make_stages)


def test_a_decode_step_of_the_numeric_pass_is_judged_three_way(tmp_path):
    """The numeric pass's decode stages: a right bf16 route of a decode step differs from the
    floor run's by about the floor itself, far past the bf16 direct tolerance (the H200's false
    alarms at logits.step.2 / .4); judged three-way (its error against the reference as a row of
    the logits' floor) it passes, and a step 3x as wrong is the origin."""
    from tensordiff.judge.floor import DEFAULT_RULE
    from tensordiff.pipeline.local_error import LocalReport, LocalResult, decode_three_way

    r, f, ref = _decode_dumps(tmp_path)
    req = type("Req", (), {"dtype": "bfloat16"})()

    def local_report():
        return LocalReport(True, [LocalResult("logits", "match"), LocalResult("logits.step.1", "diverged", "direct"),
                                  LocalResult("logits.step.2", "diverged", "direct")])

    from tensordiff.judge.judge import Judge
    from tensordiff.judge.tolerance import Tolerances

    judge = Judge.build(_decode_adapter(ref, 1.0).contract, Tolerances({}, {}), ("bfloat16",), floor_rule=DEFAULT_RULE)
    clean = local_report()
    decode_three_way(_decode_adapter(ref, 1.0), req, r, f, clean, tmp_path / "clean", judge)
    assert clean.origin is None, clean.summary()
    t = clean.get("logits.step.1").tensors[0]
    assert t.metrics["family"]["of"] == "logits" and t.metrics["family"]["x_floor"] < 1.1, t.metrics["family"]
    # the old judgement of the same step: bf16 against the floor run's bf16, the direct tolerance
    from tensordiff.pipeline.compare import compare_dumps

    from helpers_dumps import write

    stage_out = _decode_adapter(ref, 1.0).stages()(req, {})["logits.step.1"]({})
    direct = compare_dumps(f, write(tmp_path / "direct", stage_out, model="toy-decode", run={"dtype": "bfloat16"},
                                    boundaries={"logits.step.1": "logits.step.1"}))
    assert direct.boundary("logits.step.1").tensors[0].status == "diverged"
    bad = local_report()
    decode_three_way(_decode_adapter(ref, 3.0), req, r, f, bad, tmp_path / "bad", judge)
    assert bad.origin == "logits.step.1", bad.summary()
    assert "three-way" in bad.get("logits.step.1").reason and "largest row of `logits`" in bad.summary()
    assert bad.get("logits").status == "match"  # a prompt stage keeps its own verdict


def test_a_choice_taken_from_another_boundarys_output_has_no_stage_of_its_own(tmp_path):
    """A generated token (`Contract.scores_source`: its scores are the logits it is the argmax
    of) is derived, not a stage that is missing: the summary does not list it as one."""
    from types import SimpleNamespace

    import torch

    from helpers_dumps import write
    from tensordiff.judge.contract import Boundary, Contract
    from tensordiff.pipeline.local_error import local_error

    names = {"logits": "logits", "token.step.1.ids": "token.step.1", "token.step.1.scores": "token.step.1"}
    t = {"logits": torch.randn(2, 8), "token.step.1.ids": torch.tensor([[3]]), "token.step.1.scores": torch.randn(1, 8)}
    odir = write(tmp_path / "o", t, model="toy-tok", boundaries=names)
    contract = Contract("toy-tok", (Boundary("logits"), Boundary("token.step.1", ("logits",))),
                        boundary_of=lambda n: names[n],
                        scores_source=lambda n: "logits" if n == "token.step.1.scores" else None)
    adapter = SimpleNamespace(name="toy-tok", contract=contract, stages=lambda: None)
    report = compare_dumps(odir, write(tmp_path / "e", t, model="toy-tok", boundaries=names), contract=contract)
    loc = local_error(adapter, SimpleNamespace(dtype="float32"), odir, report, Tolerances({}, {}), tmp_path,
                      make_stages=lambda req, run: {})
    r = loc.get("token.step.1")
    assert r.status == "derived" and "chosen from `logits`" in r.reason and not r.failing
    assert "no stage for" not in loc.summary(), loc.summary()


def test_a_stage_converts_only_the_inputs_it_reads(tmp_path, monkeypatch):
    """Offered everything upstream, a stage reads a few: only those are read from the dump and
    converted (a decode step is offered the prompt's logits and never reads them)."""
    import tensordiff.pipeline.local_error as le

    made, real = [], le._to_torch
    monkeypatch.setattr(le, "_to_torch", lambda d, e: made.append(e.name) or real(d, e))
    offered, read = {}, []

    def make(req, run):
        st = toy.engine_stages(req, run)
        inner = st["final_norm"]

        def spy(i):
            offered.update({k: k in i for k in i})
            made.clear()
            out = inner(i)
            read.extend(made)
            return out

        st["final_norm"] = spy
        return st

    report, local = _case(tmp_path, make_stages=make)
    assert set(offered) == {"patches", "rope.cos", "rope.sin", "block0"} and all(offered.values())
    assert read == ["block0"]  # the toy's final_norm reads block0 alone
    assert local.origin is None and local.get("final_norm").status == "match"


def test_what_a_stage_does_to_its_inputs_never_reaches_another_stage(tmp_path):
    import torch

    later = {}

    def make(req, run):
        st = toy.engine_stages(req, run)
        b0, fn = st["block0"], st["final_norm"]

        def scribbler(i):
            out = b0(i)
            i["patches"].mul_(0)  # an engine bug writing into what it was handed
            return out

        st["block0"] = scribbler
        st["final_norm"] = lambda i: (later.update(patches=i["patches"].clone()), fn(i))[1]
        return st

    _, local = _case(tmp_path, make_stages=make)
    assert later["patches"].abs().sum() > 0 and not torch.equal(later["patches"], torch.zeros_like(later["patches"]))
    assert local.origin is None
