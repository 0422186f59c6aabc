"""User contract files: patterns over either side's tensor names, the DAG, layout, modes, tolerances."""
import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from tensordiff.pipeline.compare import compare_dumps
from tensordiff.judge.contract_file import load
from tensordiff.errors import BadInput
from tensordiff.format.plain import open_any
from tests.cli_runner import run_cli

CONTRACT = """
model = "toy"

[boundaries.embed]
tensors = ["embed", "tok_emb"]
layout = "tokens"
inputs = []

[boundaries."hidden.{L}"]
tensors = ["layers.{L}.output", "blk{L}"]
inputs = ["hidden.{L-1}", "embed"]
layout = "tokens"
tolerance = { atol = 1e-3, rtol = 0.0 }

[boundaries.rope]
tensors = { "rope.cos" = "rotary.cos", "rope.sin" = ["rotary.sin", "sin"] }
inputs = ["embed"]

[boundaries.ids]
tensors = ["ids", "choice"]
mode = "exact"
"""


def sides(tmp_path, *, fault=None, extra=False):
    g = np.random.default_rng(0)
    emb, hs = g.standard_normal((5, 4)).astype(np.float32), [g.standard_normal((5, 4)).astype(np.float32)
                                                             for _ in range(3)]
    cos, sin, ids = np.cos(emb), np.sin(emb), np.arange(5, dtype=np.int64)
    a = {"embed": emb, **{f"layers.{i}.output": h for i, h in enumerate(hs)}, "rotary.cos": cos,
         "rotary.sin": sin, "ids": ids}
    b_hs = [h.copy() for h in hs]
    if fault == "hidden":  # planted at layer 1; layer 2 reads it
        b_hs[1], b_hs[2] = b_hs[1] + 5e-2, b_hs[2] + 5e-2
    if fault == "small":  # within the boundary's own atol 1e-3, beyond the fp32 default's 1e-4 + 1e-3|a|
        b_hs[1] = b_hs[1] + 8e-4
    b = {"tok_emb": emb.copy(), **{f"blk{i}": h for i, h in enumerate(b_hs)}, "rotary.cos": cos.copy(),
         "sin": sin.copy(), "choice": ids.copy()}
    if extra:
        b["scratch"] = np.zeros(2, np.float32)
    save_file(a, str(tmp_path / "a.safetensors"))
    save_file(b, str(tmp_path / "b.safetensors"))
    (tmp_path / "toy.toml").write_text(CONTRACT)
    return tmp_path / "a.safetensors", tmp_path / "b.safetensors", tmp_path / "toy.toml"


def bound(tmp_path, **kw):
    a, b, c = sides(tmp_path, **kw)
    da, db, contract, notes = load(c).bind(open_any(a), open_any(b))
    return da, db, contract, notes


def test_both_sides_names_map_to_one_contract(tmp_path):
    da, db, contract, notes = bound(tmp_path)
    assert sorted(da.names) == sorted(db.names) == sorted(
        ["embed", "hidden.0", "hidden.1", "hidden.2", "rope.cos", "rope.sin", "ids"])
    by = {b.name: b for b in contract.boundaries}
    assert by["hidden.0"].inputs == ("embed",)  # hidden.-1 names no boundary
    assert by["hidden.2"].inputs == ("hidden.1", "embed")
    assert by["rope"].inputs == ("embed",) and by["ids"].inputs == ("rope",)  # no inputs: the one before
    assert by["hidden.1"].layout == "tokens" and contract.mode_for("ids") == "exact"
    assert contract.tolerances["hidden.1"] == {"atol": 1e-3, "rtol": 0.0}
    assert compare_dumps(da, db, contract=contract).verdict == "match" and not notes


def test_a_planted_fault_is_named_at_its_boundary_and_feeds_its_consumers(tmp_path):
    da, db, contract, _ = bound(tmp_path, fault="hidden")
    r = compare_dumps(da, db, contract=contract)
    assert r.earliest == ["hidden.1"]
    assert r.boundary("hidden.2").status == "consequent" and r.boundary("hidden.0").status == "match"


def test_the_boundarys_own_tolerance_is_used(tmp_path):
    da, db, contract, _ = bound(tmp_path, fault="small")
    r = compare_dumps(da, db, contract=contract)
    t = r.boundary("hidden.1").tensors[0]
    assert r.verdict == "match" and t.tolerance["atol"] == 1e-3 and t.tolerance["rtol"] == 0.0
    # the same file without the tolerance: the fp32 default finds the 8e-4 shift
    (tmp_path / "toy.toml").write_text(CONTRACT.replace("tolerance = { atol = 1e-3, rtol = 0.0 }\n", ""))
    da, db, contract, _ = load(tmp_path / "toy.toml").bind(open_any(tmp_path / "a.safetensors"),
                                                           open_any(tmp_path / "b.safetensors"))
    assert compare_dumps(da, db, contract=contract).earliest == ["hidden.1"]


def test_unnamed_tensors_are_left_out_with_a_note(tmp_path, capsys):
    a, b, c = sides(tmp_path, extra=True)
    code, out, err = run_cli(["compare", a, b, "--contract", c, "--json", tmp_path / "r.json"], capsys)
    assert code == 0, out + err
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["model"] == "toy" and any("scratch" in n for n in r["notes"])


def test_cli_names_the_earliest_with_the_contract(tmp_path, capsys):
    a, b, c = sides(tmp_path, fault="hidden")
    code, out, err = run_cli(["compare", a, b, "--contract", c], capsys)
    assert code == 1 and "hidden.1" in out, out + err


BAD = [
    ('model = "toy"\n', "needs a \\[boundaries.NAME\\] table"),
    ('colour = 1\n[boundaries.a]\ntensors = "a"\n', "unknown key 'colour'"),
    ('[boundaries.a]\ntensors = "a"\nlayuot = "grid"\n', r"boundaries.a: unknown key 'layuot'"),
    ('[boundaries.a]\ntensors = "a"\nlayout = "rows"\n', r"boundaries.a.layout: unknown layout 'rows'"),
    ('[boundaries.a]\ntensors = "a"\nmode = "fuzzy"\n', r"boundaries.a.mode: unknown mode 'fuzzy'"),
    ('[boundaries.a]\ntensors = "a"\ntolerance = { atol = -1 }\n', r"boundaries.a.tolerance.atol must be a finite"),
    ('[boundaries.a]\ntensors = "a"\ntolerance = { atl = 1 }\n', r"unknown key 'atl'"),
    ('[boundaries.a]\ntensors = "a"\ninputs = ["b"]\n', r"boundaries.a.inputs: 'b' names no boundary"),
    ('[boundaries.a]\ntensors = "a"\ninputs = "b"\n', r"boundaries.a.inputs: must be a list"),
    ('[boundaries."h.{L}"]\ntensors = "layers.out"\n', r"pattern 'layers.out' must hold \{L\}"),
    ('[boundaries."h.{L}"]\ntensors = "l.{L}"\ninputs = ["h.{K-1}"]\n', r"uses \{K\}"),
    ('[boundaries.a]\ntensors = "a"\ninputs = ["b"]\n[boundaries.b]\ntensors = "b"\ninputs = ["a"]\n',
     "the inputs form a cycle: a -> b -> a"),
    ('[boundaries.a]\n', "boundaries.a.tensors: must be a pattern"),
    ('[boundaries."a/b"]\ntensors = "x"\n', "a boundary name is letters"),
    ('[boundaries.a]\ntensors = "a"\nprobes = ["magic"]\n', "boundaries.a.probes"),
    ('[boundaries.a]\ntensors = "a"\nprobes = [[1]]\n', "boundaries.a.probes"),
    ('[boundaries.a]\ntensors = "a"\nlayout = [1]\n', "boundaries.a.layout"),
    ('[boundaries.a]\ntensors = "a"\nmode = {x = 1}\n', "boundaries.a.mode"),
    ('[boundaries.a]\ntensors = "a"\ntolerance = 3\n', "must be a table"),
    ('[boundaries.a]\ntensors = { "a" = [] }\n', "needs one or more non-empty patterns"),
    ('model = 3\n[boundaries.a]\ntensors = "a"\n', "model: must be a non-empty"),
    ('inputs = { grid = [3] }\n[boundaries.a]\ntensors = "a"\n', r"inputs.grid: must be \[height, width\]"),
    ('inputs = { size = [3, 4] }\n[boundaries.a]\ntensors = "a"\n', "inputs: unknown key 'size'"),
    ('inputs = 3\n[boundaries.a]\ntensors = "a"\n', "inputs: must be a table"),
    ('[boundaries.a\n', "is not valid TOML"),
]


@pytest.mark.parametrize("text,msg", BAD)
def test_bad_contracts_are_one_line_naming_file_and_key(tmp_path, capsys, text, msg):
    import re

    a, b, _ = sides(tmp_path)
    c = tmp_path / "bad.toml"
    c.write_text(text)
    code, out, err = run_cli(["compare", a, b, "--contract", c], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert str(c) in err and re.search(msg, err), err


def test_a_contract_naming_nothing_of_a_dump_is_refused(tmp_path):
    a, b, _ = sides(tmp_path)
    c = tmp_path / "c.toml"
    c.write_text('[boundaries.x]\ntensors = "nothing.here"\n')
    with pytest.raises(BadInput, match="names any tensor of"):
        load(c).bind(open_any(a), open_any(b))


def test_two_tensors_of_one_side_for_one_name_are_refused(tmp_path):
    a, b, _ = sides(tmp_path)
    c = tmp_path / "c.toml"
    c.write_text('[boundaries.h]\ntensors = ["layers.*.output"]\n')
    with pytest.raises(BadInput, match="both stand for 'h'"):
        load(c).bind(open_any(a), open_any(b))


def test_a_dump_of_another_model_is_refused(tmp_path):
    from tensordiff import Recorder

    a, b, c = sides(tmp_path)
    with Recorder(tmp_path / "d", model="qwen3-vl") as rec:
        rec.record("embed", np.zeros((5, 4), np.float32))
    with pytest.raises(BadInput, match="contract .* is for 'toy'"):
        load(c).bind(open_any(tmp_path / "d"), open_any(b))


def test_a_missing_contract_file(tmp_path, capsys):
    a, b, _ = sides(tmp_path)
    code, out, err = run_cli(["compare", a, b, "--contract", tmp_path / "nope.toml"], capsys)
    assert code == 2 and "does not exist" in err


def test_an_input_may_name_one_instance_of_a_template(tmp_path):
    a, b, _ = sides(tmp_path)
    c = tmp_path / "c.toml"
    c.write_text(CONTRACT.replace('inputs = ["embed"]\n', 'inputs = ["hidden.2"]\n'))
    da, db, contract, _ = load(c).bind(open_any(a), open_any(b))
    assert {x.name: x for x in contract.boundaries}["rope"].inputs == ("hidden.2",)
    c.write_text(CONTRACT.replace('inputs = ["embed"]\n', 'inputs = ["hidden.x"]\n'))
    with pytest.raises(BadInput, match="'hidden.x' names no boundary"):
        load(c)


def test_a_boundarys_mode_is_applied(tmp_path):
    # 1e-7 on a float tensor is within the fp32 default; with mode "exact" it diverges
    a, b, c = sides(tmp_path)
    g = np.random.default_rng(3)
    x = g.standard_normal((5, 4)).astype(np.float32)
    save_file({"embed": x}, str(tmp_path / "a.safetensors"))
    save_file({"tok_emb": x + np.float32(1e-7)}, str(tmp_path / "b.safetensors"))
    for mode, want in (("values", "match"), ("exact", "diverged")):
        c.write_text(f'[boundaries.embed]\ntensors = ["embed", "tok_emb"]\nmode = "{mode}"\n')
        da, db, contract, _ = load(c).bind(open_any(a), open_any(b))
        assert compare_dumps(da, db, contract=contract).verdict == want, mode


def test_the_layout_places_the_worst_element(tmp_path):
    da, db, contract, _ = bound(tmp_path, fault="hidden")
    r = compare_dumps(da, db, contract=contract)
    worst = r.boundary("hidden.1").tensors[0].worst
    assert worst["meaning"].startswith("position ")  # layout "tokens": row r is sequence position r


def test_any_structure_is_a_contract_or_one_clear_error(tmp_path):
    # structural fuzz: TOML-shaped values of every type in every key a contract reads
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from tensordiff.judge.contract_file import parse

    atoms = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=True),
                      st.sampled_from(["a", "b", "hidden.{L}", "hidden.{L-1}", "x.{K}", "*", "", "grid", "exact",
                                       "unit-rms", "layers.{L}.out", "{L}", "a/b"]))
    values = st.recursive(atoms, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(st.sampled_from(
                                                             ["a", "rope.cos", "atol", "float32"]), inner, max_size=2)),
                          max_leaves=6)
    good = {"inputs": st.lists(st.sampled_from(["embed", "hidden.{L-1}", "hidden.{L+1}", "rope", "hidden.0"]),
                               max_size=2),
            "layout": st.sampled_from(["tokens", "grid", "plain"]), "mode": st.sampled_from(["values", "exact"]),
            "meaning": st.text(max_size=5), "probes": st.lists(st.sampled_from(["unit-rms", "within-unit"]), max_size=1),
            "tolerance": st.dictionaries(st.sampled_from(["atol", "rtol", "min_cosine"]),
                                         st.floats(0, 1), max_size=2)}

    good["tensors"] = None

    def boundary(tensors):  # valid values but for one key, so every key is reached with a bad value
        def build(bad):
            fields = {k: (values if k == bad else (st.just(tensors) if k == "tensors" else g))
                      for k, g in good.items()}
            return st.fixed_dictionaries({"tensors": fields.pop("tensors")}, optional=fields)

        return st.sampled_from(sorted(good) + ["none"]).flatmap(build)

    named = {"embed": ["embed", "tok_emb"], "hidden.{L}": ["layers.{L}.output", "blk{L}"], "rope": {
        "rope.cos": "rotary.cos", "rope.sin": ["rotary.sin", "sin"]}, "x.{K}": "x{K}", "bad/name": "a"}
    contract = st.fixed_dictionaries({"boundaries": st.lists(st.sampled_from(sorted(named)), min_size=1, max_size=3,
                                                             unique=True).flatmap(
        lambda ns: st.fixed_dictionaries({n: boundary(named[n]) for n in ns}))},
        optional={"model": values, "inputs": st.one_of(st.just({"grid": [3, 5]}), values)})
    a, b, _ = sides(tmp_path)
    da, db = open_any(a), open_any(b)

    @settings(max_examples=300, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(contract)
    def prop(data):
        try:
            parse(data, tmp_path / "c.toml").bind(da, db)
        except BadInput as e:
            assert "\n" not in str(e).strip()

    prop()


def test_the_contracts_grid_places_rows_of_plain_dumps(tmp_path):
    a, b, c = sides(tmp_path, fault="hidden")
    c.write_text("inputs = { grid = [5, 1] }\n" + CONTRACT.replace('layout = "tokens"\ntolerance', 'layout = "grid"\ntolerance'))
    da, db, contract, _ = load(c).bind(open_any(a), open_any(b))
    assert da.run["inputs"]["grid"] == [5, 1] == db.run["inputs"]["grid"]
    worst = compare_dumps(da, db, contract=contract).boundary("hidden.1").tensors[0].worst
    assert worst["meaning"].startswith("patch (y=")  # without the grid a row is only an index
