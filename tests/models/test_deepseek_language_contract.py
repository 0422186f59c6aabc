"""The language contract's per-layer DAG and names, and the synthetic language weights."""
import subprocess
import sys

import torch

from tensordiff.judge.contract import ancestors, topological
import tensordiff.models.deepseek_v41_flash.contract as C
import tensordiff.models.deepseek_v41_flash.synthetic_language as S

DUMPED = ["patches", "rope.cos", "aligner", "embeddings", "attn.0", "router.0.ids", "router.0.weights", "hidden.0",
          "engram.1.gate", "attn.1", "router.1.ids", "router.1.weights", "hidden.1", "logits", "logits.step.1",
          "logits.step.2"]


def test_boundary_names():
    assert C.boundary_of("router.3.ids") == "router.3.ids"
    assert C.boundary_of("router.3.weights") == "router.3.weights"
    assert C.boundary_of("engram.14.gate") == "engram.14"
    assert C.boundary_of("hidden.2") == "hidden.2"
    assert C.boundary_of("logits.step.4") == "logits.step.4"
    assert C.boundary_of("rope.cos") == "rope"  # the vision side keeps the first-dot rule


def test_dag_is_per_layer_and_stage():
    present = [C.boundary_of(n) for n in DUMPED]
    bounds = C.language_boundaries(present)
    names = [b.name for b in topological(bounds)]
    assert names.index("embeddings") < names.index("attn.0") < names.index("router.0.ids") \
        < names.index("router.0.weights") < names.index("hidden.0") < names.index("engram.1") \
        < names.index("attn.1") < names.index("logits") < names.index("logits.step.1") < names.index("logits.step.2")
    by = {b.name: b for b in bounds}
    assert by["embeddings"].inputs == ("aligner",)
    assert "hidden.0" in by["attn.1"].inputs and "engram.1" in by["attn.1"].inputs
    assert by["router.1.ids"].inputs[0] == "attn.1"
    assert "hidden.0" in ancestors(bounds, "router.1.weights")
    assert by["logits"].inputs == ("hidden.1",)


def test_resolver_puts_the_vision_path_first():
    from tensordiff.judge.contract import Boundary

    base = (Boundary("patches"), Boundary("aligner", ("patches",)))
    out = C.make_resolver(base)([C.boundary_of(n) for n in DUMPED])
    assert [b.name for b in out[:3]] == ["patches", "aligner", "embeddings"]
    assert C.make_resolver(())(["embeddings", "attn.0"])[0].inputs == ()


def test_rules_compare_router_ids_as_sets():
    from tensordiff.judge.contract import Contract

    c = Contract("m", (), C.RULES)
    assert c.mode_for("router.7.ids") == "topk-sets" and c.mode_for("router.7.weights") is None


def test_contract_module_needs_no_torch():
    code = ("import sys; import tensordiff.models.deepseek_v41_flash.contract; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_language_weights_are_seeded_per_tensor_name():
    small = dict(S.language_config(64), n_layers=2, compress_ratios=[0, 0], kv_source_layers=[],
                 index_source_layers=[], candidate_source_layer=-1, engram_layer_ids=[1],
                 engram_num_embeddings=S.language_config(64)["engram_num_embeddings"][:1])
    a, b = S.language_tensors(small), S.language_tensors(S.language_config(64))
    for name in ("layers.1.ffn.experts.3.w1.weight", "layers.0.attn.wq_a.weight", "layers.1.engram.wkv.weight"):
        assert torch.equal(a[name], b[name])
    assert a["layers.0.ffn.gate.bias"].dtype == torch.float32 and a["embed.weight"].dtype == torch.bfloat16
    assert not torch.equal(b["layers.0.ffn.gate.bias"], b["layers.0.ffn.gate.bias_vl"])


def test_engram_table_rows_match_the_official_prime_layout():
    from oracle.deepseek_v41_flash.config import ModelArgs
    from oracle.deepseek_v41_flash.engram import EngramLayout

    layout = EngramLayout.from_args(ModelArgs(**S.language_config(64)))
    assert list(layout.num_embeddings) == [sum(p for size in layer for p in size) for layer in layout.primes]


def test_released_sizes_write_no_language_units():
    from tensordiff.models.deepseek_v41_flash.synthetic import FULL

    assert list(S.language_units(FULL)) == []
    names = {n for _, t in S.language_units(S.language_config(256)) for n in t}
    assert "layers.5.ffn.experts.7.w2.weight" in names and "image_start" not in names


def test_logits_declare_the_tensor_scaled_atol_which_is_inert_at_rms_one(tmp_path):
    """fp32 logits are judged with atol x max(1, RMS); the synthetic head's logits have RMS ~1
    (H200: 1.007), where that is the plain atol: an error of 5x atol on one element still trips."""
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parents[1] / "tensordiff"))
    from helpers_dumps import write

    from tensordiff.pipeline import registry
    from tensordiff.pipeline.compare import compare_dumps
    from tensordiff.judge.judge import Judge
    from tensordiff.judge.tolerance import Tolerances

    contract = registry.contract("deepseek-v4.1-flash")
    j = Judge.build(contract, Tolerances({}, {}))
    assert j.tolerance("logits", "float32").atol_scale == j.tolerance("logits.step.2", "float32").atol_scale == "rms"
    assert j.tolerance("logits", "bfloat16").atol_scale is None
    a = torch.randn(16, 512, generator=torch.Generator().manual_seed(0)) * 0.9
    b = a.clone()
    k = int(a[3].abs().argmin())
    b[3, k] += 5e-4
    o = write(tmp_path / "o", {"logits": a}, model="deepseek-v4.1-flash")
    e = write(tmp_path / "e", {"logits": b}, model="deepseek-v4.1-flash")
    t = compare_dumps(o, e, Tolerances({}, {})).boundary("logits").tensors[0]
    assert t.tolerance["scale"] < 1 and t.status == "diverged" and t.worst["index"] == [3, k], t.reason
