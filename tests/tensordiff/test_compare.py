import math

import pytest
import torch
from helpers_dumps import pipeline, write

import tensordiff.judge.walk as compare
from tensordiff.judge import stream
from tensordiff.pipeline.compare import compare_dumps
from tensordiff.judge.contract import Boundary, Contract, TensorRule
from tensordiff.errors import BadInput, IncomparableDumps

TOY = Contract("toy", (
    Boundary("patches", layout="grid", probes=("within-unit",)),
    Boundary("rope", probes=("unit-circle",)),
    Boundary("block0", inputs=("patches", "rope"), layout="grid"),
    Boundary("final_norm", inputs=("block0",)),
    Boundary("aligner", inputs=("final_norm",), layout="cells"),
), rules=(TensorRule("*.ids", "topk-sets"),))


def pair(tmp_path, change=None, **kw):
    a = pipeline()
    b = {k: v.clone() for k, v in a.items()}
    if change:
        change(b)
    return write(tmp_path / "a", a, **kw), write(tmp_path / "b", b, **kw)


def test_identical_dumps_match(tmp_path):
    r = compare_dumps(*pair(tmp_path), contract=TOY)
    assert r.verdict == "match" and r.earliest == [] and bool(r)
    assert [b.status for b in r.boundaries] == ["match"] * 5


def test_planted_difference_names_the_root_and_consequents(tmp_path):
    def bug(b):
        b["block0"][3, 5] += 1.0
        b["final_norm"] += 0.5
        b["aligner"] += 0.5

    r = compare_dumps(*pair(tmp_path, bug), contract=TOY)
    assert r.verdict == "diverged" and r.earliest == ["block0"]
    st = {b.name: b.status for b in r.boundaries}
    assert st == {"patches": "match", "rope": "match", "block0": "diverged", "final_norm": "consequent",
                  "aligner": "consequent"}
    b0 = r.boundary("block0")
    assert "`patches`" in b0.look_between and "`rope`" in b0.look_between
    assert b0.tensors[0].worst["index"] == [3, 5]


def test_worst_element_meaning_on_the_patch_grid(tmp_path):
    def bug(b):
        b["block0"][13, 2] += 9.0

    a, b = pair(tmp_path, bug, run={"inputs": {"grid": [4, 6]}})
    t = compare_dumps(a, b, contract=TOY).boundary("block0").tensors[0]
    assert t.worst["meaning"] == "patch (y=2, x=1), channel 2"
    assert t.row_error[13] == pytest.approx(9.0) and max(t.row_error[:13]) == 0


def test_two_independent_roots(tmp_path):
    def bug(b):
        b["patches"] += 0.01
        b["rope.cos"] += 0.01

    r = compare_dumps(*pair(tmp_path, bug), contract=TOY)
    assert sorted(r.earliest) == ["patches", "rope"]
    assert r.boundary("block0").status == "match"  # block0 happens to match: not consequent


def test_without_a_contract_manifest_order_is_the_chain(tmp_path):
    def bug(b):
        b["final_norm"] += 1
        b["aligner"] += 1

    r = compare_dumps(*pair(tmp_path, bug))
    assert r.earliest == ["final_norm"] and r.boundary("aligner").status == "consequent"


def test_mixed_precision_judged_in_the_narrower_unit(tmp_path):
    x = torch.randn(64, 32)
    a = write(tmp_path / "a", {"block0": x})
    b = write(tmp_path / "b", {"block0": x.to(torch.bfloat16)})
    t = compare_dumps(a, b).boundary("block0").tensors[0]
    assert t.status == "match" and t.dtype == {"a": "float32", "b": "bfloat16", "unit": "bfloat16"}
    assert 0 < t.metrics["ulp_max"] <= 0.5 + 1e-9  # rounding to bf16 is at most half an ulp
    c = write(tmp_path / "c", {"block0": (x * 1.05).to(torch.bfloat16)})
    assert compare_dumps(a, c).verdict == "diverged"


def test_shape_and_kind_mismatch_are_incomparable_not_crashes(tmp_path):
    a = write(tmp_path / "a", {"x": torch.ones(3, 4), "y": torch.ones(3)})
    b = write(tmp_path / "b", {"x": torch.ones(4, 3), "y": torch.ones(3, dtype=torch.int32)})
    r = compare_dumps(a, b)
    assert r.boundary("x").status == "incomparable" and "shape" in r.boundary("x").reason
    assert "float vs integer" in r.boundary("y").reason
    assert r.earliest == ["x"]


def test_missing_on_one_side(tmp_path):
    a = write(tmp_path / "a", {"x": torch.ones(2), "y": torch.ones(2)})
    b = write(tmp_path / "b", {"x": torch.ones(2)})
    r = compare_dumps(a, b)
    assert r.boundary("y").status == "missing" and r.earliest == ["y"] and r.verdict == "diverged"


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_nonfinite_on_one_side(tmp_path, bad):
    x = torch.randn(10)
    y = x.clone()
    y[4] = bad
    r = compare_dumps(write(tmp_path / "a", {"x": x}), write(tmp_path / "b", {"x": y}))
    t = r.boundary("x").tensors[0]
    assert t.status == "diverged" and "one side" in t.reason and t.worst["index"] == [4]
    assert t.metrics["nan"]["b"] + t.metrics["inf"]["b"] == 1


def test_nan_on_both_sides_in_the_same_place_matches(tmp_path):
    x = torch.randn(10)
    x[2] = math.nan
    assert compare_dumps(write(tmp_path / "a", {"x": x}), write(tmp_path / "b", {"x": x.clone()})).verdict == "match"


def test_empty_tensors_match(tmp_path):
    r = compare_dumps(write(tmp_path / "a", {"x": torch.zeros(0, 3)}), write(tmp_path / "b", {"x": torch.zeros(0, 3)}))
    assert r.verdict == "match"


def test_integers_exact_and_topk_as_sets(tmp_path):
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    a = write(tmp_path / "a", {"r.ids": ids, "pos": torch.arange(6)})
    b = write(tmp_path / "b", {"r.ids": ids.flip(-1), "pos": torch.arange(6)})
    assert compare_dumps(a, b, contract=TOY).verdict == "match"
    c = write(tmp_path / "c", {"r.ids": torch.tensor([[1, 2, 3], [4, 5, 7]]), "pos": torch.arange(6) + (torch.arange(6) == 5)})
    r = compare_dumps(a, c, contract=TOY)
    assert r.boundary("r").tensors[0].metrics["rows_differ"] == 1
    assert r.boundary("pos").tensors[0].metrics["mismatches"] == 1


def test_streaming_in_chunks_gives_the_same_metrics(tmp_path, monkeypatch):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(300, 37, generator=g)
    y = x + 1e-3 * torch.randn(300, 37, generator=g)
    a, b = write(tmp_path / "a", {"x": x}), write(tmp_path / "b", {"x": y})
    whole = compare_dumps(a, b).boundary("x").tensors[0].metrics
    # the streaming step lives in tensordiff.judge.stream (compare's old CHUNK only sized a probe's reads)
    monkeypatch.setattr(stream, "CHUNK", 100)
    chunked = compare_dumps(a, b).boundary("x").tensors[0].metrics
    for k in ("max_abs", "mismatches", "ulp_max", "ulp_p50"):  # maxima and counts: exact whatever the chunks
        assert chunked[k] == pytest.approx(whole[k], rel=1e-9), k
    # sums: the native kernel adds float32 partial sums per 1024-element block (metrics.FloatMetrics),
    # and other chunk edges make other blocks: ~1e-7 relative, as documented there
    for k in ("mean_abs", "rmse", "cosine", "sqnr_db"):
        assert chunked[k] == pytest.approx(whole[k], rel=1e-6), k


def test_metric_values(tmp_path):
    a = torch.tensor([1.0, 2.0, 3.0, 4.0])
    b = torch.tensor([1.0, 2.0, 3.0, 4.5])
    m = compare_dumps(write(tmp_path / "a", {"x": a}), write(tmp_path / "b", {"x": b})).boundary("x").tensors[0].metrics
    assert m["max_abs"] == 0.5 and m["mean_abs"] == 0.125 and m["max_rel"] == 0.125
    assert m["rmse"] == pytest.approx(0.25)
    assert m["sqnr_db"] == pytest.approx(10 * math.log10(30 / 0.25))
    assert m["cosine"] == pytest.approx(float(a @ b / (a.norm() * b.norm())))
    assert m["ulp_max"] == pytest.approx(0.5 / 2 ** -21)  # spacing at 4.0 in fp32 is 2**-21
    assert m["mismatches"] == 1 and m["mismatch_fraction"] == 0.25


def test_probes_catch_a_mislabelled_rope(tmp_path):
    def swap(b):  # engine writes sin under cos: values differ and the probe still holds
        b["rope.cos"], b["rope.sin"] = b["rope.sin"], b["rope.cos"]

    r = compare_dumps(*pair(tmp_path, swap), contract=TOY)
    assert r.earliest == ["rope"]

    def not_unit(b):
        b["rope.cos"] *= 1.0 + 1e-5  # within tolerance numerically, but cos²+sin² != 1

    r = compare_dumps(*pair(tmp_path / "p", not_unit), contract=TOY)
    assert r.boundary("rope").tensors[0].probes["unit-circle"]["b"] is False
    assert r.earliest == ["rope"]


def test_within_unit_probe(tmp_path):
    a = {"patches": torch.rand(8, 4) * 2 - 1}
    b = {"patches": a["patches"].clone()}
    b["patches"][0, 0] = 1.00001
    a["patches"][0, 0] = 0.99999
    r = compare_dumps(write(tmp_path / "a", a), write(tmp_path / "b", b), contract=TOY)
    assert r.boundary("patches").status == "diverged" and "within-unit" in r.boundary("patches").reason


def test_fail_fast_skips_the_rest(tmp_path):
    def bug(b):
        b["patches"] += 1

    r = compare_dumps(*pair(tmp_path, bug), contract=TOY, fail_fast=True)
    assert r.earliest == ["patches"]
    assert r.boundary("aligner").status == "skipped"


def test_different_models_are_refused(tmp_path):
    a = write(tmp_path / "a", {"x": torch.ones(1)}, model="deepseek-v4.1-flash")
    b = write(tmp_path / "b", {"x": torch.ones(1)}, model="qwen3-vl")
    with pytest.raises(IncomparableDumps, match="cannot be compared"):
        compare_dumps(a, b)


def test_same_directory_twice_is_refused(tmp_path):
    a = write(tmp_path / "a", {"x": torch.ones(1)})
    with pytest.raises(BadInput, match="twice"):
        compare_dumps(a, a)


def test_verify_catches_flipped_bytes(tmp_path):
    a, b = pair(tmp_path)
    p = b / "block0.safetensors"
    data = bytearray(p.read_bytes())
    data[-3] ^= 0xFF
    p.write_bytes(bytes(data))
    with pytest.raises(BadInput, match="sha256"):
        compare_dumps(a, b, contract=TOY, verify=True)


def test_hdf5_against_safetensors(tmp_path):
    a = write(tmp_path / "a", pipeline(), fmt="hdf5")
    b = write(tmp_path / "b", pipeline())
    assert compare_dumps(a, b, contract=TOY).verdict == "match"


def test_contract_tolerances_apply_and_the_user_file_wins(tmp_path):
    ids = torch.arange(400).reshape(100, 4)
    other = ids.clone()
    other[7] = torch.tensor([900, 901, 902, 903])  # one row in a hundred picks another set
    a, b = write(tmp_path / "a", {"index.ids": ids}), write(tmp_path / "b", {"index.ids": other})
    strict = Contract("toy", (), rules=(TensorRule("*.ids", "topk-sets"),))
    assert compare_dumps(a, b, contract=strict).verdict == "diverged"
    lenient = Contract("toy", (), rules=strict.rules, tolerances={"index*": {"max_mismatch": 0.01}})
    assert compare_dumps(a, b, contract=lenient).verdict == "match"
    p = tmp_path / "t.toml"
    p.write_text("[tolerances.boundaries.index]\nmax_mismatch = 0.0\n")
    assert compare_dumps(a, b, p, contract=lenient).verdict == "diverged"


def test_fp32_tensors_of_a_bf16_run_are_judged_in_bf16(tmp_path):
    x = torch.randn(64, 32)
    y = x * (1 + 4e-3)  # about one bf16 ulp: far outside fp32 tolerance
    run = {"dtype": "bfloat16"}
    a, b = write(tmp_path / "a", {"w": x}, run=run), write(tmp_path / "b", {"w": y}, run=run)
    t = compare_dumps(a, b).boundary("w").tensors[0]
    assert t.status == "match" and t.dtype["unit"] == "bfloat16"
    a32, b32 = write(tmp_path / "c", {"w": x}), write(tmp_path / "d", {"w": y})
    assert compare_dumps(a32, b32).verdict == "diverged"


def test_two_dumps_with_no_tensors_are_not_a_match(tmp_path):
    from tensordiff import Recorder

    for side in ("a", "b"):
        Recorder(tmp_path / side, model="toy").close()
    with pytest.raises(BadInput, match="nothing to compare"):
        compare_dumps(tmp_path / "a", tmp_path / "b")


def test_a_run_declares_the_compute_dtype_of_some_boundaries(tmp_path):
    """A half of a model that computes in bf16 behind an fp32 run (the DeepSeek language backbone
    behind the fp32 vision tower) declares it per boundary pattern; the others stay fp32."""
    x = torch.randn(64, 32)
    y = x * (1 + 4e-3)
    run = {"dtype": "float32", "boundary_dtypes": {"lang*": "bfloat16"}}
    a = write(tmp_path / "a", {"lang0": x, "vis": x}, run=run)
    b = write(tmp_path / "b", {"lang0": y, "vis": y}, run=run)
    rep = compare_dumps(a, b)
    assert rep.boundary("lang0").status == "match" and rep.boundary("lang0").tensors[0].dtype["unit"] == "bfloat16"
    assert rep.boundary("vis").status == "diverged"  # not declared: judged in fp32


def test_the_gc_runs_less_often_during_a_comparison_and_as_before_after_it(tmp_path):
    import gc

    seen = []
    before = gc.get_threshold()
    r = compare_dumps(*pair(tmp_path), contract=TOY, progress=lambda n: seen.append(gc.get_threshold()))
    assert r.verdict == "match" and seen and all(t[0] >= 50_000 for t in seen)
    assert gc.get_threshold() == before
    with pytest.raises(IncomparableDumps):  # also restored when the comparison fails
        a, b = pair(tmp_path / "x")
        compare_dumps(a, b, contract=TOY, progress=lambda n: (_ for _ in ()).throw(IncomparableDumps("stop")))
    assert gc.get_threshold() == before


def test_the_worst_element_values_are_read_from_both_sides(tmp_path):
    def bug(b):
        b["block0"][3, 5] += 1.0

    a, b = pair(tmp_path, bug)
    t = compare_dumps(a, b, contract=TOY).boundary("block0").tensors[0]
    assert t.worst["index"] == [3, 5] and t.worst["b"] - t.worst["a"] == pytest.approx(1.0)


def test_overlapping_comparisons_restore_the_gc_thresholds_when_the_last_ends():
    import gc

    before = gc.get_threshold()
    outer, inner = compare._few_collections(), compare._few_collections()
    outer.__enter__()
    inner.__enter__()
    outer.__exit__(None, None, None)  # the first to start ends first (two threads)
    assert gc.get_threshold()[0] >= 50_000  # the other is still running
    inner.__exit__(None, None, None)
    assert gc.get_threshold() == before


@pytest.mark.parametrize("drift", [False, True])
def test_a_large_tensor_reports_the_full_histograms_percentiles(tmp_path, monkeypatch, drift):
    # past metrics.CUT_MIN the comparator counts bins in full for a first chunk only; where the rest
    # moved a percentile away (drift: the first chunks equal), the judge measures it again in full
    from tensordiff.judge import metrics

    g = torch.Generator().manual_seed(5)
    a = torch.randn(400, 200, generator=g)  # above batch.SMALL: streamed
    b = a * (1 + 1e-5 * torch.randn(400, 200, generator=g))
    if drift:
        b[:100] = a[:100]
    A, B = write(tmp_path / "a", {"x": a}), write(tmp_path / "b", {"x": b})
    monkeypatch.setattr(stream, "CHUNK", 4000)
    full = compare_dumps(A, B).boundaries[0].tensors[0].metrics
    monkeypatch.setattr(metrics, "CUT_MIN", 20_000)
    again = []
    real = metrics.FloatMetrics.again
    monkeypatch.setattr(metrics.FloatMetrics, "again", lambda self: (again.append(1), real(self))[1])
    cut = compare_dumps(A, B).boundaries[0].tensors[0].metrics
    assert cut == full and full.ulp_p50 > 0
    assert len(again) == int(drift)
