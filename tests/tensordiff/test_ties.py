"""Tie-aware top-k: a differing set is benign only when the reference's own margin is within the
scores' error, and a flip's cascade downstream does not fail the run; every other difference is
named at the choice itself."""
import torch

from tensordiff.pipeline.compare import compare_dumps
from tensordiff.judge.contract import Boundary, Contract, TensorRule

from helpers_dumps import write

RULES = (TensorRule("*.ids", "topk-sets"), TensorRule("*.scores", "scores"))
CONTRACT = Contract("toy", (Boundary("pick", ()), Boundary("out", ("pick",))), rules=RULES,
                    boundary_of=lambda n: "pick" if n.startswith("pick.") else n.split(".")[0])


def scores(rows=16, width=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    # well separated per row: column c scores c + noise, so the top-2 is {6, 7} by a clear margin
    return torch.arange(width, dtype=torch.float32).repeat(rows, 1) + 0.01 * torch.rand(rows, width, generator=g)


def top2(s):
    return s.topk(2, dim=-1).indices.sort(dim=-1).values


def case(tmp_path, sa, sb, ib=None, out_b=None):
    ia = top2(sa)
    ib = top2(sb) if ib is None else ib
    out = torch.randn(sa.shape[0], 4, generator=torch.Generator().manual_seed(1))
    a = write(tmp_path / "a", {"pick.ids": ia, "pick.scores": sa, "out": out})
    b = write(tmp_path / "b", {"pick.ids": ib, "pick.scores": sb, "out": out if out_b is None else out_b})
    return compare_dumps(a, b, contract=CONTRACT)


def near_tie(sa):
    """Columns 5 and 6 of row 3 a hair apart in the reference; the candidate's rounding swaps them."""
    sa = sa.clone()
    sa[3, 5] = sa[3, 6] - 2e-6
    sb = sa.clone()
    sb[3, 5] += 3e-6
    sb += 1e-7 * torch.randn(sb.shape, generator=torch.Generator().manual_seed(2))  # a second route's rounding
    sb[3, 7] = sa[3, 7]
    return sa, sb


def test_a_near_tie_flip_is_benign_with_its_margin(tmp_path):
    sa, sb = near_tie(scores())
    r = case(tmp_path, sa, sb)
    t = r.boundary("pick").tensors[0]
    assert t.status == "benign" and r.boundary("pick").status == "benign" and r.verdict == "match"
    ties = t.metrics["ties"]
    assert ties["rows_differ"] == ties["benign"] == 1
    flip = ties["flips"][0]
    assert flip["row"] == 3 and flip["ref_only"] == [6] and flip["cand_only"] == [5]
    assert 0 < flip["margin"] <= flip["floor"]


def test_its_cascade_downstream_is_information_not_a_failure(tmp_path):
    sa, sb = near_tie(scores())
    out_b = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
    out_b[3] += 1.0  # the row that took the other choice computes something else downstream
    r = case(tmp_path, sa, sb, out_b=out_b)
    assert r.boundary("out").status == "cascade" and not r.boundary("out").root
    assert r.verdict == "match" and r.earliest == []


def test_the_same_downstream_difference_without_a_flip_is_a_root(tmp_path):
    sa = scores()
    out_b = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
    out_b[3] += 1.0
    r = case(tmp_path, sa, sa.clone(), out_b=out_b)
    assert r.earliest == ["out"] and r.verdict == "diverged"


def test_a_choice_the_scores_do_not_explain_is_named_at_the_choice(tmp_path):
    sa = scores()
    ib = top2(sa)
    ib[5] = torch.tensor([0, 7])  # keeps the worst expert: the reference leads by ~6
    out_b = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
    out_b[5] += 1.0
    r = case(tmp_path, sa, sa.clone(), ib=ib, out_b=out_b)
    assert r.earliest == ["pick"] and r.boundary("out").status == "consequent"
    t = r.boundary("pick").tensors[0]
    assert t.status == "diverged" and "row 5" in t.reason and "ignores them" in t.reason


def test_with_a_floor_run_the_tie_must_be_within_the_oracles_own_rounding(tmp_path):
    sa = scores()
    sa[3, 5] = sa[3, 6] - 5e-5  # a clear lead at fp32 rounding, inside the fp32 tolerance band
    sb = sa.clone()
    sb[3, 5] += 8e-5  # the candidate's error (within tolerance) closes it and flips the row
    ia, ib = top2(sa), top2(sb)
    assert (ia[3] != ib[3]).any()
    fl = sa + 1e-7 * torch.randn(sa.shape, generator=torch.Generator().manual_seed(3))  # the oracle's own rounding
    a = write(tmp_path / "a", {"pick.ids": ia, "pick.scores": sa})
    b = write(tmp_path / "b", {"pick.ids": ib, "pick.scores": sb})
    f = write(tmp_path / "f", {"pick.ids": ia, "pick.scores": fl})
    assert compare_dumps(a, b, contract=CONTRACT).boundary("pick").status == "benign"  # the candidate's own error
    t = compare_dumps(a, b, contract=CONTRACT, floor=f).boundary("pick").tensors[0]
    assert t.status == "diverged" and "exceeds the tie floor" in t.reason


def test_wrong_scores_are_no_tie_even_when_they_explain_the_flip(tmp_path):
    sa = scores()
    sb = sa.clone()
    sb[2, 4] += 10.0  # a score bug: the candidate ranks column 4 first, consistently with its own scores
    r = case(tmp_path, sa, sb)
    t = r.boundary("pick").tensors[0]
    assert t.status == "diverged" and "scores themselves diverge" in t.reason


def test_a_top_k_that_ignores_its_own_scores_is_no_tie(tmp_path):
    sa, sb = near_tie(scores())
    ib = top2(sa)
    ib[3] = torch.tensor([5, 7])  # the tie row, but the candidate's scores put 6 ahead of 5 ...
    sb[3, 5] = sa[3, 5] - 1e-3  # ... by more than rounding: its top-k did not follow them
    sb[3, 6] = sa[3, 6]
    r = case(tmp_path, sa, sb, ib=ib)
    t = r.boundary("pick").tensors[0]
    assert t.status == "diverged" and "ignores them" in t.reason


def test_an_id_not_eligible_on_one_side_is_no_tie(tmp_path):
    sa, sb = near_tie(scores())
    sb[3, 5] = float("inf")  # stands in for a candidate mask that differs (eligible on one side only)
    sa[3, 5] = float("-inf")
    ia = top2(sa)
    ib = ia.clone()
    ib[3] = torch.tensor([5, 7])
    r = case(tmp_path, sa, sb, ib=ib)
    t = r.boundary("pick").tensors[0]
    assert t.status == "diverged" and "not eligible on both sides" in t.reason


def test_without_scores_a_differing_set_stays_a_divergence(tmp_path):
    sa, sb = near_tie(scores())
    a = write(tmp_path / "a", {"pick.ids": top2(sa)})
    b = write(tmp_path / "b", {"pick.ids": top2(sb)})
    t = compare_dumps(a, b, contract=CONTRACT).boundary("pick").tensors[0]
    assert t.status == "diverged" and "no scores recorded" in t.reason


def test_the_cascade_follows_every_path_from_the_flip(tmp_path):
    """pick -> mix -> out: `mix` happens to match (a lenient tolerance), `out` does not; it is
    still the flip's cascade, not a root."""
    contract = Contract("toy", (Boundary("pick", ()), Boundary("mix", ("pick",)), Boundary("out", ("mix",))),
                        rules=RULES, boundary_of=CONTRACT.boundary_of)
    sa, sb = near_tie(scores())
    mix = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
    out_b = mix.clone()
    out_b[3] += 1.0
    a = write(tmp_path / "a", {"pick.ids": top2(sa), "pick.scores": sa, "mix": mix, "out": mix})
    b = write(tmp_path / "b", {"pick.ids": top2(sb), "pick.scores": sb, "mix": mix, "out": out_b})
    r = compare_dumps(a, b, contract=contract)
    assert [r.boundary(n).status for n in ("pick", "mix", "out")] == ["benign", "match", "cascade"]
    assert r.verdict == "match" and r.earliest == []


def test_the_numeric_pass_judges_a_flip_by_the_tie_rule_with_the_floor_runs_error(tmp_path):
    """floor.three_way (the gate's numeric pass) reads the tie rule as the direct comparison does,
    the near-tie floor being the floor run's own error of the scores: a flip inside it is benign,
    the same flip where the floor run barely moves the scores is a divergence of the choice."""
    from tensordiff.pipeline.compare import three_way

    sa, sb = near_tie(scores())
    ia, ib = top2(sa), top2(sb)
    a = write(tmp_path / "a", {"pick.ids": ia, "pick.scores": sa})
    b = write(tmp_path / "b", {"pick.ids": ib, "pick.scores": sb})
    noisy = write(tmp_path / "f1", {"pick.ids": ia, "pick.scores": sa + 1e-5 * torch.randn(
        sa.shape, generator=torch.Generator().manual_seed(4))})
    r = three_way(a, noisy, b, contract=CONTRACT)
    t = r.boundary("pick").tensors[0]
    assert t.status == "benign" and r.verdict == "match", t.reason
    assert t.metrics["ties"]["flips"][0]["row"] == 3
    quiet = write(tmp_path / "f2", {"pick.ids": ia, "pick.scores": sa + 1e-9})
    t = three_way(a, quiet, b, contract=CONTRACT).boundary("pick").tensors[0]
    assert t.status == "diverged" and "exceeds the tie floor" in t.reason, t.reason
