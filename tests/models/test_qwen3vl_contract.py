"""The Qwen3-VL contract, faults, weights resolver and synthetic checkpoints; per-model contracts
really are per model (a DeepSeek dump cannot be compared with a Qwen3-VL dump)."""
import fnmatch
import subprocess
import sys

import numpy as np
import pytest

from tensordiff.pipeline import registry
from tensordiff.format.capture import Recorder
from tensordiff.pipeline.compare import compare_dumps
from tensordiff.judge.contract import ancestors, topological
from tensordiff.errors import BadInput, IncomparableDumps
import tensordiff.models.deepseek_v41_flash.faults as D
from tensordiff.models.qwen3_vl.adapter import ADAPTER, CONTRACT
import tensordiff.models.qwen3_vl.synthetic as S


def test_registry_finds_the_adapter():
    assert registry.adapter("qwen3-vl").name == "qwen3-vl"


def test_dag():
    bs = CONTRACT.resolve(["patches", "deepstack.0", "deepstack.1", "deepstack.2", "deepstack.3", "positions"])
    names = [b.name for b in topological(bs)]
    assert names.index("block0") > max(names.index(n) for n in ("patches", "pos_embed", "rope"))
    # the preprocessing plan (smart_resize's decisions) feeds every boundary computed from the grid
    assert ancestors(bs, "aligner") == {"final_norm", "block0", "patches", "pos_embed", "rope", "plan"}
    assert ancestors(bs, "deepstack.3") >= {"deepstack.2", "deepstack.0", "block0"}
    assert ancestors(bs, "positions") == {"plan"}
    assert {b.name: b.layout for b in bs}["aligner"] == "merged"


def test_boundary_of_and_rules():
    bo = CONTRACT.boundary_of
    assert bo("rope.cos") == "rope" and bo("deepstack.2") == "deepstack.2" and bo("positions.ids") == "positions"
    assert CONTRACT.mode_for("positions.decode") == "exact"
    assert CONTRACT.mode_for("block0") is None


# what a language run (prompt, 4 text layers, DeepStack on 3 of them, 2 decode steps) dumps
LANGUAGE_RUN = ["plan", "patches", "pos_embed", "rope", "block0", "final_norm", "aligner", "deepstack.0",
                "deepstack.1", "deepstack.2", "positions", "embeddings", "text_rope", "hidden.0", "deepstack_add.0",
                "hidden.1", "deepstack_add.1", "hidden.2", "deepstack_add.2", "hidden.3", "logits", "logits.step.1",
                "logits.step.2"]


def test_every_fault_names_a_boundary():
    # the language boundaries exist per run (per layer, per decode step): resolved for a language run
    names = [b.name for b in CONTRACT.resolve(LANGUAGE_RUN)]
    assert len(ADAPTER.faults) >= 5
    for f in ADAPTER.faults:
        assert any(fnmatch.fnmatchcase(n, f.boundary) for n in names), f


def test_adapter_module_imports_no_torch():
    code = "import sys, tensordiff.models.qwen3_vl.adapter; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_weights_resolver_refuses_bad_specs(tmp_path):
    with pytest.raises(BadInput, match="variant"):
        ADAPTER.weights("synthetic:huge")
    with pytest.raises(BadInput):
        ADAPTER.weights(str(tmp_path / "nope"))
    with pytest.raises(BadInput, match="config.json"):
        ADAPTER.weights(str(tmp_path))


def _dump(path, model):
    with Recorder(path, model=model) as rec:
        rec.record("patches", np.zeros((4, 8), np.float32))
    return path


def test_deepseek_dump_is_not_comparable_with_qwen3vl(tmp_path):
    a = _dump(tmp_path / "ds", "deepseek-v4.1-flash")
    b = _dump(tmp_path / "qw", "qwen3-vl")
    with pytest.raises(IncomparableDumps, match="contracts differ"):
        compare_dumps(a, b)
    r = subprocess.run([sys.executable, "-m", "tensordiff.commands.cli", "compare", str(a), str(b)], capture_output=True, text=True)
    assert r.returncode == 2
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("tensordiff: error")]
    assert len(errors) == 1 and "qwen3-vl" in errors[0] and "deepseek" in errors[0]
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("variant,depth,hidden,deep,out", [("full", 27, 1152, [8, 16, 24], 4096),
                                                            ("full-2b", 24, 1024, [5, 11, 17], 2048),
                                                            ("tiny", 4, 64, [0, 1, 2], 96)])
def test_synthetic_layout_is_transformers_layout(variant, depth, hidden, deep, out):
    import torch
    from transformers import Qwen3VLConfig, Qwen3VLVisionModel

    cj = S.config_json(variant)
    vc = cj["vision_config"]
    assert (vc["depth"], vc["hidden_size"], vc["deepstack_visual_indexes"], vc["out_hidden_size"]) == (depth, hidden, deep, out)
    ours = {n: s for u in S.unit_shapes(vc).values() for n, s in u.items()}
    cfg = Qwen3VLConfig(**{k: v for k, v in cj.items() if k != "synthetic"})
    with torch.device("meta"):
        model = Qwen3VLVisionModel(cfg.vision_config)
    theirs = {f"model.visual.{k}": tuple(v.shape) for k, v in model.state_dict().items()}
    assert ours == theirs


def test_units_are_seeded_by_their_own_name():
    import torch

    g = S.generator("model.visual.blocks.2")
    shapes = S.unit_shapes(S.config_json("tiny")["vision_config"])["model.visual.blocks.2"]
    first = sorted(shapes)[0]
    alone = S._init(first, shapes[first], g).to(torch.bfloat16)
    built = dict(S.build_tensors("tiny"))
    assert torch.equal(built[first], alone)
    assert not torch.equal(built["model.visual.blocks.1.attn.qkv.weight"], built["model.visual.blocks.2.attn.qkv.weight"])


@pytest.mark.parametrize("side", ["oracle", "engine"])
def test_extreme_aspect_ratio_is_bad_input_on_both_sides(tmp_path, side):
    from PIL import Image

    img = tmp_path / "strip.png"
    Image.new("RGB", (700, 3), (10, 20, 30)).save(img)
    out = tmp_path / "dump"
    r = subprocess.run([sys.executable, "-m", "tensordiff.commands.cli", "dump", "qwen3-vl", "--side", side, "--image", str(img),
                        "--out", str(out)], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("tensordiff: error")]
    assert len(errors) == 1 and "aspect ratio" in errors[0], r.stderr
    assert "Traceback" not in r.stderr and not out.exists()


def test_engine_carries_exactly_the_adapter_faults():
    from engine.errors import EngineInputError
    from engine.qwen3_vl import faults

    assert set(faults.ALL) == {f.name for f in ADAPTER.faults}
    with pytest.raises(EngineInputError, match="unknown qwen3-vl fault"):
        faults.check(D.CONTAIN_CEIL)  # another model's fault


@pytest.mark.parametrize("variant", ["tiny", "full-2b"])
def test_language_dag_has_every_read_as_an_edge(variant):
    """From the config transformers builds: the text model adds DeepStack feature k after layer k
    for k < len(deepstack_visual_indexes) (`Qwen3VLTextModel.forward`), every layer reads the
    shared rotary tables, decode reads the positions; each read is an edge of the contract."""
    from transformers import Qwen3VLConfig

    cfg = Qwen3VLConfig(**{k: v for k, v in S.config_json(variant).items() if k != "synthetic"})
    n, n_deep = cfg.text_config.num_hidden_layers, len(cfg.vision_config.deepstack_visual_indexes)
    present = (["aligner", "positions", "embeddings", "text_rope"] + [f"deepstack.{k}" for k in range(n_deep)]
               + [x for L in range(n) for x in [f"hidden.{L}"] + ([f"deepstack_add.{L}"] if L < n_deep else [])]
               + ["logits", "logits.step.1", "logits.step.2"])
    by = {b.name: b for b in CONTRACT.resolve(present)}
    assert by["embeddings"].inputs == ("aligner",)
    assert by["text_rope"].inputs == ("positions",)
    for L in range(n):
        entering = "embeddings" if L == 0 else (f"deepstack_add.{L - 1}" if L - 1 < n_deep else f"hidden.{L - 1}")
        assert set(by[f"hidden.{L}"].inputs) == {entering, "text_rope"}, L
    for k in range(n_deep):
        assert set(by[f"deepstack_add.{k}"].inputs) == {f"hidden.{k}", f"deepstack.{k}"}
    assert f"deepstack_add.{n_deep}" not in by  # the layers after the injections are clean
    last = f"deepstack_add.{n - 1}" if n - 1 < n_deep else f"hidden.{n - 1}"
    assert by["logits"].inputs == (last,)
    assert {"logits", "positions", "text_rope"} <= set(by["logits.step.1"].inputs)
    assert "logits.step.1" in by["logits.step.2"].inputs
    assert ancestors(list(by.values()), "logits.step.2") >= {"deepstack.2", "aligner", "plan", "positions"}
    assert CONTRACT.boundary_of("deepstack_add.1") == "deepstack_add.1"
    assert CONTRACT.boundary_of("text_rope.cos") == "text_rope" and CONTRACT.boundary_of("logits.step.3") == "logits.step.3"


@pytest.mark.parametrize("variant", ["tiny", "full-2b"])
def test_synthetic_text_layout_is_transformers_layout(variant):
    """Every tensor of Qwen3VLForConditionalGeneration, by name and shape (the tied head of
    full-2b is the embedding table: not stored); the 2B's published text dimensions."""
    import torch
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    cj = S.config_json(variant)
    cfg = Qwen3VLConfig(**{k: v for k, v in cj.items() if k != "synthetic"})
    with torch.device("meta"):
        model = Qwen3VLForConditionalGeneration(cfg)
    theirs = {k: tuple(v.shape) for k, v in model.state_dict().items() if not k.startswith("model.visual.")}
    ours = {n: s for u in S.all_unit_shapes(variant).values() for n, s in u.items() if not n.startswith("model.visual.")}
    if cfg.tie_word_embeddings:
        assert theirs.pop("lm_head.weight") == ours["model.language_model.embed_tokens.weight"]
    assert ours == theirs
    if variant == "full-2b":
        t = cfg.text_config
        assert (t.hidden_size, t.num_hidden_layers, t.num_attention_heads, t.num_key_value_heads, t.head_dim,
                t.intermediate_size, t.vocab_size) == (2048, 28, 16, 8, 128, 6144, 151936)
        assert t.rope_parameters["mrope_section"] == [24, 20, 20] and t.rope_parameters["mrope_interleaved"]
        assert t.rope_parameters["rope_theta"] == 5e6 and cfg.tie_word_embeddings


def test_logits_declare_a_tensor_scaled_atol_in_float32_only(tmp_path):
    """The LM head's fp32 reordering noise is in units of the logits' RMS (H200: max|d| 7.2e-4 at
    RMS 45.7): the contract says so for `logits` and every `logits.step.K`, and only in fp32."""
    import torch

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parents[1] / "tensordiff"))
    from helpers_dumps import reduction_pair, write

    from tensordiff.judge.judge import Judge
    from tensordiff.judge.tolerance import Tolerances

    j = Judge.build(CONTRACT, Tolerances({}, {}))
    for b in ("logits", "logits.step.1", "logits.step.12"):
        assert j.tolerance(b, "float32").atol_scale == "rms"
        assert j.tolerance(b, "bfloat16").atol_scale is None
    assert j.tolerance("hidden.27", "float32").atol_scale is None
    a, b = reduction_pair()
    for k, x in (("clean", b), ("flip", torch.cat([b[:, :5], -b[:, 5:6], b[:, 6:]], 1))):
        o = write(tmp_path / k / "o", {"logits": a, "logits.step.1": a[:1]}, model="qwen3-vl")
        e = write(tmp_path / k / "e", {"logits": x, "logits.step.1": x[:1]}, model="qwen3-vl")
        r = compare_dumps(o, e, Tolerances({}, {}))
        assert r.boundary("logits").status == ("match" if k == "clean" else "diverged"), str(r)
        assert r.boundary("logits.step.1").status == ("match" if k == "clean" else "consequent"), str(r)
