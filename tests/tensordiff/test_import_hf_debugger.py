"""`tensordiff import hf-debugger`: transformers' model-addition debugger output, round trip.

tests/data/import/hf-debugger/ is a real sample (make_hf_debugger_sample.py: transformers
5.17.0's debugger on a one-layer random Llama)."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tensordiff.format.dump import open_dump
from tensordiff.errors import BadInput
from tensordiff.format.importers.hf_debugger import read
from tests.cli_runner import run_cli

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "import" / "hf-debugger"
TRACE = SAMPLE / "LlamaForCausalLM_debug_tree_FULL_TENSORS.json"


def referenced(tree):
    """Every (file) the trace names, read independently of the importer."""
    out = []

    def walk(x):
        if isinstance(x, dict):
            if isinstance(x.get("value"), str) and x["value"].endswith(".safetensors"):
                out.append(x["value"])
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(tree)
    return out


def test_round_trip_every_named_tensor_exactly(tmp_path, capsys):
    code, out, err = run_cli(["import", "hf-debugger", SAMPLE, "--out", tmp_path / "d"], capsys)
    assert code in (0, None), err
    d = open_dump(tmp_path / "d")
    assert d.model == "LlamaForCausalLM" and d.producer["name"] == "transformers model-addition debugger"
    files = set(referenced(json.loads(TRACE.read_text())))
    assert len(d.entries) == len(files) + 1 > 30  # every file the trace names, once, and the model's logits
    # in call order: the embedding before the layer, the layer's attention before its MLP, lm_head, the logits
    names = d.names
    assert names.index("model.embed_tokens.out") < names.index("model.layers.0.self_attn.q_proj.out") \
        < names.index("model.layers.0.mlp.down_proj.out") < names.index("lm_head.out") == len(names) - 2
    got = d.load("model.layers.0.mlp.down_proj.out")
    want = load_file(str(SAMPLE / "LlamaForCausalLM.model.layers.0.mlp.down_proj_outputs.safetensors"))["data"]
    assert got.dtype == want.dtype and np.array_equal(got, want)
    assert d.entry("model.layers.0.mlp.down_proj.out").boundary == "model.layers.0.mlp.down_proj"
    assert d.entry("model.rotary_emb.out.1").shape == (1, 3, 4)
    assert "pruned" not in err and "not imported" not in err  # every file of the sample is in the dump


def test_the_models_own_outputs_are_imported_last_as_their_boundary(tmp_path, capsys):
    # the tree prunes the outputs of modules with children, the model's too: its logits file is
    # named by no node, and must still reach the dump
    tree = json.loads(TRACE.read_text())
    assert "outputs" not in tree and "LlamaForCausalLM_outputs_logits.safetensors" not in referenced(tree)
    assert run_cli(["import", "hf-debugger", SAMPLE, "--out", tmp_path / "d"], capsys)[0] in (0, None)
    d = open_dump(tmp_path / "d")
    assert d.names[-1] == "out.logits" and d.entry("out.logits").boundary == "outputs"
    want = load_file(str(SAMPLE / "LlamaForCausalLM_outputs_logits.safetensors"))["data"]
    assert want.shape == (1, 3, 32) and np.array_equal(d.load("out.logits"), want)
    # the logits are lm_head's output: the same numbers under the model's name
    assert np.array_equal(d.load("out.logits"), d.load("lm_head.out"))


def test_a_planted_change_in_the_logits_alone_is_named_at_outputs(tmp_path, capsys):
    bad = tmp_path / "bad"
    shutil.copytree(SAMPLE, bad)
    f = bad / "LlamaForCausalLM_outputs_logits.safetensors"
    t = load_file(str(f))["data"]
    t[0, 2, 5] += 1.0
    save_file({"data": t}, str(f))
    for src, out in ((SAMPLE, "a"), (bad, "b")):
        assert run_cli(["import", "hf-debugger", src, "--out", tmp_path / out], capsys)[0] in (0, None)
    code, out, err = run_cli(["compare", tmp_path / "a", tmp_path / "b", "--json", tmp_path / "r.json"], capsys)
    assert code == 1 and json.loads((tmp_path / "r.json").read_text())["earliest"] == ["outputs"]


def test_tuple_outputs_of_a_live_model_are_each_imported(tmp_path):
    torch = pytest.importorskip("torch")
    from transformers.model_debugging_utils import model_addition_debugger_context

    class Two(torch.nn.Module):  # a model with a child, returning a tuple: its outputs are pruned from the tree
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 2)

        def forward(self, x):
            y = self.lin(x)
            return y, y * 2

    m, x = Two(), torch.randn(2, 3)
    with torch.no_grad(), model_addition_debugger_context(m, debug_path=str(tmp_path / "dbg"), use_repr=False):
        a, b = m(x)
    imp = read(tmp_path / "dbg")
    got = {n: (arr, bd) for _, n, arr, bd in imp.tensors}
    assert [n for _, n, *_ in imp.tensors][-2:] == ["out.0", "out.1"]
    assert np.array_equal(got["out.0"][0], a.numpy()) and np.array_equal(got["out.1"][0], b.numpy())
    assert got["out.1"][1] == "outputs" and not imp.notes


def test_two_imports_match_and_a_planted_change_is_named_at_its_module(tmp_path, capsys):
    bad = tmp_path / "bad"
    shutil.copytree(SAMPLE, bad)
    f = bad / "LlamaForCausalLM.model.layers.0.mlp.up_proj_outputs.safetensors"
    t = load_file(str(f))["data"]
    t[0, 1, 2] += 0.5
    save_file({"data": t}, str(f))
    for src, out in ((SAMPLE, "a"), (SAMPLE, "b"), (bad, "c")):
        assert run_cli(["import", "hf-debugger", src, "--out", tmp_path / out], capsys)[0] in (0, None)
    assert run_cli(["compare", tmp_path / "a", tmp_path / "b"], capsys)[0] == 0
    code, out, err = run_cli(["compare", tmp_path / "a", tmp_path / "c", "--json", tmp_path / "r.json"], capsys)
    assert code == 1
    assert json.loads((tmp_path / "r.json").read_text())["earliest"] == ["model.layers.0.mlp.up_proj"]


def test_a_live_bf16_trace_round_trips(tmp_path):
    torch = pytest.importorskip("torch")
    from transformers.model_debugging_utils import model_addition_debugger_context

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 3).to(torch.bfloat16)

        def forward(self, x):
            return self.lin(x)

    m, x = Tiny(), torch.randn(2, 4, dtype=torch.bfloat16)
    with model_addition_debugger_context(m, debug_path=str(tmp_path / "dbg"), use_repr=False):
        want = m(x)
    imp = read(tmp_path / "dbg")
    got = dict((n, a) for _, n, a, _ in imp.tensors)
    assert got["lin.out"].dtype == torch.bfloat16 and torch.equal(got["lin.out"], want)


@pytest.mark.parametrize("case,msg", [
    ("empty", "no \\*_debug_tree_FULL_TENSORS.json"),
    ("repr", "use_repr=True"),
    ("escape", "outside"),
    ("missing", "which is missing"),
    ("json", "is not valid JSON"),
])
def test_bad_debugger_dirs_are_one_line_exit_2(tmp_path, capsys, case, msg):
    d = tmp_path / "dbg"
    d.mkdir()
    tree = {"module_path": "M", "inputs": {"args": [{"shape": "[1]", "dtype": "torch.float32",
                                                      "value": "./M_inputs_args_0.safetensors"}]}}
    if case != "empty":
        if case == "repr":
            tree["inputs"]["args"][0]["value"] = ["tensor([1.])"]
        elif case == "escape":
            tree["inputs"]["args"][0]["value"] = "../../etc/x.safetensors"
        (d / "M_debug_tree_FULL_TENSORS.json").write_text("{" if case == "json" else json.dumps(tree))
    code, out, err = run_cli(["import", "hf-debugger", d, "--out", tmp_path / "out"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and msg.replace("\\", "") in err.replace("\\", ""), err
    assert not (tmp_path / "out").exists()


def test_an_existing_out_is_not_overwritten(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    code, out, err = run_cli(["import", "hf-debugger", SAMPLE, "--out", tmp_path / "out"], capsys)
    assert code == 2 and "already exists" in err and (tmp_path / "out" / "keep.txt").read_text() == "mine"


def test_a_module_called_twice_keeps_its_last_call_with_a_note(tmp_path):
    torch = pytest.importorskip("torch")
    from transformers.model_debugging_utils import model_addition_debugger_context

    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)

        def forward(self, x):
            return self.lin(self.lin(x))

    m, x = Twice(), torch.randn(1, 2)
    with model_addition_debugger_context(m, debug_path=str(tmp_path / "dbg"), use_repr=False):
        with torch.no_grad():
            y = m(x)
    imp = read(tmp_path / "dbg")
    got = dict((n, a) for _, n, a, _ in imp.tensors)
    assert np.array_equal(got["lin.out"], y.numpy())  # the file holds the last call
    assert any("called more than once" in n for n in imp.notes)


def test_a_debugger_trace_against_a_tapped_engine_through_a_contract(tmp_path, capsys):
    # the whole route for someone else's engine: the reference traced by transformers' debugger,
    # the candidate (the same model with a planted fault in layer 1's MLP) recorded by
    # tensordiff.tap under its own names, a contract mapping the two
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.model_debugging_utils import model_addition_debugger_context

    from tensordiff import Recorder, tap

    cfg = LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=3, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=16)
    torch.manual_seed(0)
    ref = LlamaForCausalLM(cfg).eval()
    ids = torch.tensor([[1, 5, 7, 2]])
    with torch.no_grad(), model_addition_debugger_context(ref, debug_path=str(tmp_path / "dbg"), use_repr=False,
                                                          do_prune_layers=False):
        ref(ids)
    assert run_cli(["import", "hf-debugger", tmp_path / "dbg", "--out", tmp_path / "ref", "--model", "llama"],
                   capsys)[0] in (0, None)
    (tmp_path / "c.toml").write_text('''model = "llama"
[boundaries.embed]
tensors = ["model.embed_tokens.out", "emb"]
layout = "tokens"
[boundaries."mlp.{L}"]
tensors = ["model.layers.{L}.mlp.down_proj.out", "ffn{L}"]
layout = "tokens"
[boundaries.norm]
tensors = ["model.norm.out", "final"]
''')
    for fault, want in ((False, "match"), (True, ["mlp.1"])):
        eng = LlamaForCausalLM(cfg).eval()
        eng.load_state_dict(ref.state_dict())
        if fault:
            with torch.no_grad():
                eng.model.layers[1].mlp.up_proj.weight[0, 0] += 0.5
        points = {"emb": "model.embed_tokens", "final": "model.norm",
                  **{f"ffn{i}": f"model.layers.{i}.mlp.down_proj" for i in range(3)}}
        out = tmp_path / f"eng-{fault}"
        with torch.no_grad(), Recorder(out, model="llama") as rec, tap(eng, points, rec):
            eng(ids)
        code, _, err = run_cli(["compare", tmp_path / "ref", out, "--contract", tmp_path / "c.toml",
                                "--json", tmp_path / f"r-{fault}.json"], capsys)
        r = json.loads((tmp_path / f"r-{fault}.json").read_text())
        assert (r["verdict"] if not fault else r["earliest"]) == want, (code, err, r["earliest"])
        assert [b["name"] for b in r["boundaries"]] == ["embed", "mlp.0", "mlp.1", "mlp.2", "norm"]
        assert any("left out" in n for n in r["notes"])  # the trace's other tensors, said not hidden
