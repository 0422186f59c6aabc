"""`tensordiff import sglang`: SGLang dumper files into a dump, one rank dump per rank.

tests/data/import/sglang/ is a real sample in the dumper's layout, written on first use
(make_sglang_sample.py, `tests.samples.sglang_sample`: one MLP
layer, a 3-token prompt and one decode step, on one rank (tp1) and tensor-parallel over two (tp2),
the same weights): `mlp_up` [t, i] split by columns ("t i[tp]"), `mlp_down_partial` a partial sum
("t h[tp:partial]"), `mlp_out` after the all-reduce, `input_ids` without dims, `rids` a list."""
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tensordiff.format.dump import open_dump
from tensordiff.errors import BadInput
from tensordiff.format.importers.sglang import layout_of, module_boundary, parse_name, read
from tests.cli_runner import run_cli
from tests.samples import sglang_sample

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = sglang_sample()
TP1, TP2 = SAMPLE / "tp1", SAMPLE / "tp2"


def dumper_cls():
    sys.path.insert(0, str(ROOT / "examples" / "sglang_dump"))
    try:
        from sglang_style import Dumper
    finally:
        sys.path.pop(0)
    return Dumper


def value(d: Path, step: int, rank: int, name: str) -> torch.Tensor:
    """One file's tensor, read independently of the importer."""
    (f,) = [p for p in (d / "exp").glob(f"step={step}___rank={rank}___*name={name}___*.pt")]
    return torch.load(f, weights_only=True)["value"]


def rewrite(f: Path, edit) -> None:
    obj = torch.load(f, weights_only=True)
    edit(obj)
    torch.save(obj, f)


def one_line_exit_2(code, err):
    return code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err


# ----------------------------------------------------------------------------- one rank


def test_a_single_rank_dump_round_trips_in_the_dumpers_order(tmp_path, capsys):
    code, out, err = run_cli(["import", "sglang", TP1, "--out", tmp_path / "d"], capsys)
    assert code in (0, None), err
    d = open_dump(tmp_path / "d")
    assert d.world is None and d.model == "plain" and d.producer["name"] == "sglang dumper"
    # the prompt under the plain names, the decode step as .step.1; layer_id kept as a name part
    assert d.names == ["input_ids", "embed", "mlp_up.layer_id.0", "mlp_down_partial.layer_id.0", "mlp_out.layer_id.0",
                       "input_ids.step.1", "embed.step.1", "mlp_up.layer_id.0.step.1",
                       "mlp_down_partial.layer_id.0.step.1", "mlp_out.layer_id.0.step.1"]
    for step, suffix in ((0, ""), (1, ".step.1")):
        for name, dname in (("input_ids", "input_ids"), ("mlp_up", "mlp_up.layer_id.0"), ("mlp_out", "mlp_out.layer_id.0")):
            want = value(TP1, step, 0, name)
            got = d.load(dname + suffix)
            assert got.dtype == want.numpy().dtype and np.array_equal(got, want.numpy()), dname + suffix
    assert d.entry("mlp_up.layer_id.0.step.1").boundary == "mlp_up.layer_id.0.step.1"
    imp = d.run["import"]
    assert imp["steps"] == [0, 1] and imp["ranks"] == [0] and imp["dims"]["mlp_up.layer_id.0"] == "t i[tp]"
    assert imp["renamed"]["mlp_up.layer_id.0.step.1"] == "mlp_up"
    # the request ids are a list, not a tensor: said, not silently dropped
    assert "rids (list) x2" in err and "not imported" in err


def test_one_step_one_rank_and_a_name_filter(tmp_path, capsys):
    assert run_cli(["import", "sglang", TP1, "--out", tmp_path / "s", "--step", "1"], capsys)[0] in (0, None)
    d = open_dump(tmp_path / "s")
    assert "mlp_up.layer_id.0" in d.names and not any(".step." in n for n in d.names)
    assert d.entry("mlp_up.layer_id.0").shape == (1, 6)  # the decode step's one token
    code, _, err = run_cli(["import", "sglang", TP2, "--out", tmp_path / "r", "--rank", "1"], capsys)
    assert code in (0, None) and "rank 1 of a 2-rank run" in err
    d = open_dump(tmp_path / "r")
    assert d.world is None and d.entry("mlp_up.layer_id.0").shape == (3, 3)  # rank 1's own columns
    assert np.array_equal(d.load("mlp_up.layer_id.0"), value(TP2, 0, 1, "mlp_up").numpy())
    assert run_cli(["import", "sglang", TP1, "--out", tmp_path / "n", "--name", "mlp_*"], capsys)[0] in (0, None)
    assert {n.split(".")[0] for n in open_dump(tmp_path / "n").names} == {"mlp_up", "mlp_down_partial", "mlp_out"}


# ----------------------------------------------------------------------------- two ranks


def test_two_ranks_become_rank_dumps_whose_dims_merge_the_shards(tmp_path, capsys):
    code, out, err = run_cli(["import", "sglang", TP2, "--out", tmp_path / "b"], capsys)
    assert code in (0, None), err
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["rank0", "rank1"]
    m = json.loads((tmp_path / "b" / "rank1" / "manifest.json").read_text())
    lay = {t["name"]: {k: t[k] for k in ("shard", "partial", "replicated") if k in t} for t in m["tensors"]}
    assert m["run"]["parallel"] == {"rank": 1, "world": 2}
    assert lay["mlp_up.layer_id.0"] == {"shard": {"axis": 1, "index": 1, "count": 2}}
    assert lay["mlp_down_partial.layer_id.0"] == {"partial": "sum"}
    assert lay["mlp_out.layer_id.0"] == {"replicated": True} == lay["embed"]  # "# tp:replicated", "t h"
    assert lay["input_ids"] == {"replicated": True} and "carry no dims" in err  # no dims: taken for copies, said
    d = open_dump(tmp_path / "b")
    assert d.world == 2 and d.entry("mlp_up.layer_id.0").shape == (3, 6)
    # the merged tensors are the rank files' slices put together and summed, read independently
    up = torch.cat([value(TP2, 0, r, "mlp_up") for r in (0, 1)], dim=1)
    assert np.array_equal(d.load("mlp_up.layer_id.0"), up.numpy())
    part = value(TP2, 0, 0, "mlp_down_partial").double() + value(TP2, 0, 1, "mlp_down_partial").double()
    assert np.array_equal(d.load("mlp_down_partial.layer_id.0"), part.float().numpy())
    # and they are the one-rank run's tensors (the same weights), up to float32 rounding
    assert np.allclose(d.load("mlp_up.layer_id.0"), value(TP1, 0, 0, "mlp_up").numpy(), rtol=1e-6, atol=1e-6)


def test_the_merged_two_rank_dump_matches_the_one_rank_dump_on_compare(tmp_path, capsys):
    for src, out in ((TP1, "a"), (TP2, "b")):
        assert run_cli(["import", "sglang", src, "--out", tmp_path / out], capsys)[0] in (0, None)
    code, out, err = run_cli(["compare", tmp_path / "a", tmp_path / "b", "--json", tmp_path / "r.json"], capsys)
    r = json.loads((tmp_path / "r.json").read_text())
    assert code == 0 and r["verdict"] == "match", out + err
    assert len(r["boundaries"]) == 10 and any("sharded run of 2 ranks" in n for n in r["notes"])


@pytest.mark.parametrize("fault", ["shard", "order"])
def test_a_planted_shard_fault_is_named_at_its_tensor_and_rank(tmp_path, capsys, fault):
    bad = tmp_path / "tp2"
    shutil.copytree(TP2, bad)
    files = {r: next((bad / "exp").glob(f"step=0___rank={r}___*name=mlp_up___*.pt")) for r in (0, 1)}
    if fault == "shard":  # rank 1's columns off
        rewrite(files[1], lambda o: o["value"].__setitem__((1, 2), o["value"][1, 2] + 1.0))
    else:  # each rank says it holds the other's columns
        for r, f in files.items():
            rewrite(f, lambda o, r=r: o["meta"]["sglang_parallel_info"].__setitem__("tp_rank", 1 - r))
    for src, out in ((TP1, "a"), (bad, "b")):
        assert run_cli(["import", "sglang", src, "--out", tmp_path / out], capsys)[0] in (0, None)
    code, out, err = run_cli(["compare", tmp_path / "a", tmp_path / "b", "--json", tmp_path / "r.json"], capsys)
    r = json.loads((tmp_path / "r.json").read_text())
    assert code == 1 and r["earliest"] == ["mlp_up.layer_id.0"], r["earliest"]
    (t,) = [b for b in r["boundaries"] if b["name"] == "mlp_up.layer_id.0"][0]["tensors"]
    if fault == "shard":
        assert t["ranks"]["disagree"] == [1] and not t["ranks"]["misplaced"]
    else:
        assert {m["rank"] for m in t["ranks"]["misplaced"]} == {0, 1}


def test_force_replaces_a_set_of_rank_dumps_and_nothing_else(tmp_path, capsys):
    out = tmp_path / "b"
    assert run_cli(["import", "sglang", TP2, "--out", out], capsys)[0] in (0, None)
    code, _, err = run_cli(["import", "sglang", TP2, "--out", out], capsys)
    assert one_line_exit_2(code, err) and "already exists" in err
    assert run_cli(["import", "sglang", TP2, "--out", out, "--step", "1", "--force"], capsys)[0] in (0, None)
    assert open_dump(out).entry("mlp_up.layer_id.0").shape == (1, 6)
    (out / "mine.txt").write_text("keep")  # no longer only rank dumps
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "rank0").mkdir()  # a rank directory that is not a dump
    for target in (out, mine):
        code, _, err = run_cli(["import", "sglang", TP2, "--out", target, "--force"], capsys)
        assert one_line_exit_2(code, err) and "only replaces" in err, err
    assert (mine / "rank0").is_dir() and (out / "mine.txt").read_text() == "keep" and (out / "rank1").is_dir()


# ----------------------------------------------------------------------------- pickles that would run code


class _Marker:
    """Unpickled by plain pickle, this creates the file at `path`: code a dump file must never run."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_pickle_that_would_run_code_is_refused_before_anything_runs(tmp_path, capsys):
    src = tmp_path / "tp1"
    shutil.copytree(TP1, src)
    marker = tmp_path / "ran"
    evil = src / "exp" / "step=0___rank=0___dump_index=3___name=embed___recompute_status=disabled.pt"
    rewrite(evil, lambda o: o.__setitem__("value", _Marker(marker)))
    code, out, err = run_cli(["import", "sglang", src, "--out", tmp_path / "out"], capsys)
    assert one_line_exit_2(code, err) and "refused" in err and "io.open" in err and evil.name in err, err
    assert not marker.exists() and not (tmp_path / "out").exists()
    # the planted payload is live: the ordinary unpickler runs it
    torch.load(evil, weights_only=False)
    assert marker.exists()


# ----------------------------------------------------------------------------- bad input


def _bad_dir(tmp_path, case):
    d = tmp_path / "src"
    if case == "not-a-dir":
        d.write_text("x")
        return d, "not a directory"
    shutil.copytree(TP2 if case in ("zigzag", "two-axes", "dp", "groups") else TP1, d)
    exp = d / "exp"
    up0 = next(exp.glob("step=0___rank=0___*name=mlp_up___*.pt"))
    if case == "empty":
        shutil.rmtree(exp)
        exp.mkdir()
        return d, "holds no SGLang dumper files"
    if case == "two-experiments":
        shutil.copytree(exp, d / "exp2")
        return d, "holds 2 experiments"
    if case == "bad-name":
        (exp / "hidden.pt").write_bytes(up0.read_bytes())
        return d, "not named like an SGLang dumper file"
    if case == "not-torch":
        up0.write_bytes(b"not a zip file at all")
        return d, "not a readable torch.save file"
    if case == "renamed":
        up0.rename(exp / up0.name.replace("name=mlp_up", "name=mlp_upx"))
        return d, "its meta says name='mlp_up'"
    if case == "dims-count":
        rewrite(up0, lambda o: o["meta"].__setitem__("dims", "t"))
        return d, "names 1 axes but the tensor has 2"
    if case == "dims-token":
        rewrite(up0, lambda o: o["meta"].__setitem__("dims", "t i[tp:sideways]"))
        return d, "is not axis[:qualifier]"
    ups = sorted(exp.glob("step=0___rank=*___*name=mlp_up___*.pt"))
    if case == "zigzag":
        for f in ups:
            rewrite(f, lambda o: o["meta"].__setitem__("dims", "t i[tp:zigzag]"))
        return d, "zigzag"
    if case == "two-axes":
        for f in ups:
            rewrite(f, lambda o: (o["meta"].__setitem__("dims", "t[cp] i[tp]"),
                                  o["meta"]["sglang_parallel_info"].update(cp_rank=0, cp_size=2)))
        return d, "splits 2 axes"
    if case == "dp":
        for f in ups:
            rewrite(f, lambda o: o["meta"].__setitem__("dims", "t i # dp:=attn_dp"))
        return d, "data-parallel"
    if case == "groups":  # both ranks claim tp rank 0 (they differ along another axis)
        for f in ups:
            rewrite(f, lambda o: o["meta"]["sglang_parallel_info"].__setitem__("tp_rank", 0))
        return d, "not each shard once"
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["not-a-dir", "empty", "two-experiments", "bad-name", "not-torch", "renamed",
                                  "dims-count", "dims-token", "zigzag", "two-axes", "dp", "groups"])
def test_bad_dumps_are_one_line_exit_2_and_write_nothing(tmp_path, capsys, case):
    src, words = _bad_dir(tmp_path, case)
    code, out, err = run_cli(["import", "sglang", src, "--out", tmp_path / "out"], capsys)
    assert one_line_exit_2(code, err) and words in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args,words", [
    (["--step", "7"], "has no step 7 (steps: 0, 1)"),
    (["--rank", "3"], "has no rank 3 (ranks: 0)"),
    (["--name", "nothing*"], "no file of"),
    (["--step", "-1"], "usage error"),
])
def test_bad_options_are_one_line_exit_2(tmp_path, capsys, args, words):
    code, out, err = run_cli(["import", "sglang", TP1, "--out", tmp_path / "out", *args], capsys)
    assert one_line_exit_2(code, err) and words in err, err
    assert not (tmp_path / "out").exists()


def test_an_existing_out_is_not_overwritten(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    code, out, err = run_cli(["import", "sglang", TP1, "--out", tmp_path / "out"], capsys)
    assert one_line_exit_2(code, err) and "already exists" in err
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"


# ----------------------------------------------------------------------------- names and layouts


def test_file_names_of_every_dumper_generation_parse():
    f = parse_name(Path("step=2___rank=1___dump_index=7___name=a___b___recompute_status=disabled___layer_id=3.pt"))
    assert (f.step, f.rank, f.index, f.name) == (2, 1, 7, "a___b")  # a name holding ___ stays whole
    assert f.tags == (("recompute_status", "disabled"), ("layer_id", "3"))
    old = parse_name(Path("forward_pass_id=4___rank=0___dump_index=1___name=x.pt"))
    assert (old.step, old.name) == (4, "x")
    assert parse_name(Path("curr_step=5___rank=0___dump_index=2___name=y.pt")).step == 5
    for bad in ("hidden.pt", "step=x___rank=0___dump_index=1___name=a.pt", "step=0___rank=0___name=a.pt",
                "step=0___step=1___rank=0___dump_index=1___name=a.pt"):
        assert parse_name(Path(bad)) is None, bad


@pytest.mark.parametrize("name,want", [
    ("non_intrusive__model.layers.0.mlp.output", "model.layers.0.mlp"),
    ("non_intrusive__model.layers.0.mlp.output.1", "model.layers.0.mlp"),
    ("non_intrusive__model.layers.0.self_attn.inputs.hidden_states", "model.layers.0.self_attn.inputs"),
    ("non_intrusive__encoder.output.dense.output", "encoder.output.dense"),  # a module named `output`
    ("non_intrusive__output.next_token_logits", "output"),
    ("non_intrusive__inputs.0", "inputs"),
    ("hidden_states", None),
])
def test_non_intrusive_names_give_their_modules_boundary(name, want):
    assert module_boundary(name) == want


def _meta(tp_rank, tp_size=2, dims=None, **info):
    m = {"sglang_parallel_info": {"tp_rank": tp_rank, "tp_size": tp_size, **info}}
    return {**m, "dims": dims} if dims is not None else m


def test_dims_map_to_the_shard_notation():
    t = torch.zeros(3, 4)
    held = lambda dims, **kw: [(r, _meta(r, dims=dims, **kw), t) for r in (0, 1)]  # noqa: E731
    assert layout_of("x", held("t h[tp]"), 2)[0] == {r: {"shard": {"axis": 1, "index": r, "count": 2}} for r in (0, 1)}
    assert layout_of("x", held("(heads*dim)[tp] h"), 2)[0][1] == {"shard": {"axis": 0, "index": 1, "count": 2}}
    assert layout_of("x", held("t h(tp)"), 2)[0][0] == {"shard": {"axis": 1, "index": 0, "count": 2}}  # older notation
    assert layout_of("x", held("t h[tp:partial]"), 2)[0][1] == {"partial": "sum"}
    assert layout_of("x", held("t h(tp,partial)"), 2)[0][1] == {"partial": "sum"}
    assert layout_of("x", held("t h # tp:replicated"), 2)[0][0] == {"replicated": True}
    assert layout_of("x", held("t[cp] h"), 2)[0][0] == {"replicated": True}  # cp is not split here: whole
    assert layout_of("x", held(None), 2) == ({0: {"replicated": True}, 1: {"replicated": True}}, True)
    # expert parallel on SGLang: moe_ep_rank / moe_ep_size
    ep = [(r, {"sglang_parallel_info": {"tp_rank": 0, "tp_size": 1, "moe_ep_rank": r, "moe_ep_size": 2},
               "dims": "e[ep] h"}, t) for r in (0, 1)]
    assert layout_of("x", ep, 2)[0][1] == {"shard": {"axis": 0, "index": 1, "count": 2}}
    with pytest.raises(BadInput, match="every imported rank"):  # a partial sum held by 2 of 3 ranks
        layout_of("x", held("t h[tp:partial]"), 3)


def test_names_modules_calls_and_steps_of_a_non_intrusive_dump(tmp_path):
    Dumper = dumper_cls()

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.proj(self.proj(x))  # one module called twice

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([Block(), Block()])

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    torch.manual_seed(0)
    net, d = Net(), Dumper(tmp_path / "dumps", "exp")
    with torch.no_grad(), d.non_intrusive(net):
        for n in (3, 1):
            net(torch.randn(n, 4))
            d.step()
    (imp,) = read(tmp_path / "dumps")
    names = [n for _, n, *_ in imp.tensors]
    bounds = dict((n, b) for _, n, _, b in imp.tensors)
    # layer_id (the dumper's context inside layers.N) is not repeated in the name
    assert "non_intrusive__layers.1.proj.output.call.1" in names and not any("layer_id" in n for n in names)
    assert bounds["non_intrusive__layers.1.proj.output.call.1"] == "layers.1.proj.call.1"
    assert bounds["non_intrusive__layers.0.inputs.0.step.1"] == "layers.0.inputs.step.1"
    assert bounds["non_intrusive__output.step.1"] == "output.step.1"
    # the dumper's order: a module's inputs, its children, its output
    order = names[:names.index("non_intrusive__layers.0.output") + 1]
    assert order[0] == "non_intrusive__inputs.0" and order.index("non_intrusive__layers.0.inputs.0") \
        < order.index("non_intrusive__layers.0.proj.output.call.1") < order.index("non_intrusive__layers.0.output")


def test_element_types_bf16_exact_fp8_left_out_with_a_note(tmp_path):
    Dumper = dumper_cls()
    d = Dumper(tmp_path / "dumps", "exp")
    h = torch.randn(3, 5).to(torch.bfloat16)
    d.dump("hidden", h, dims="t h")
    d.dump("scales", torch.randn(3).to(torch.float8_e4m3fn))
    (imp,) = read(tmp_path / "dumps")
    (only,) = imp.tensors
    assert only[1] == "hidden" and only[2].dtype == torch.bfloat16 and torch.equal(only[2], h)
    assert any("element types float8_e4m3fn" in n and "scales" in n for n in imp.notes)


def test_undimmed_tensors_of_different_shapes_on_the_ranks_are_left_out_with_a_note(tmp_path, capsys):
    # a non-intrusive dump of a tensor-parallel run: a column-parallel output has no dims, and its
    # ranks hold different slices; neither copies nor shards it can say, so it is not imported
    src = tmp_path / "tp2"
    shutil.copytree(TP2, src)
    f = next((src / "exp").glob("step=0___rank=1___*name=input_ids___*.pt"))
    rewrite(f, lambda o: o.__setitem__("value", o["value"][:2]))
    code, out, err = run_cli(["import", "sglang", src, "--out", tmp_path / "b"], capsys)
    assert code in (0, None) and "hold different shapes on different ranks" in err and "input_ids" in err
    d = open_dump(tmp_path / "b")
    assert "input_ids" not in d.names and "input_ids.step.1" in d.names and "mlp_up.layer_id.0" in d.names
