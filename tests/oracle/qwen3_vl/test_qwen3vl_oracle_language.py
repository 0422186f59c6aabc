"""The oracle's language taps are what transformers computes, and are gone after `close`."""
import json
import shutil

import pytest
import torch

from oracle.qwen3_vl import config as C
import oracle.qwen3_vl.model as L
from oracle.qwen3_vl import positions as POS
from tensordiff.errors import BadInput
from tensordiff.models.qwen3_vl.synthetic import ensure


@pytest.fixture(scope="module")
def tiny():
    ckpt = ensure("tiny")
    cfg = C.load_config(ckpt)
    return ckpt, cfg, L.build(cfg, ckpt, torch.float32)


def test_taps_match_transformers_outputs(tiny):
    ckpt, cfg, model = tiny
    g = torch.Generator().manual_seed(0)
    px, grid = torch.rand(24, 1536, generator=g) * 2 - 1, torch.tensor([[1, 4, 6]])
    ids = POS.input_ids("A <image> b", grid, cfg)
    mm = POS.mm_token_type_ids(ids, cfg)
    got, logits, steps, generated, stop = L.run(model, cfg, ids, mm, px, grid, 1, 2, "cpu")
    with torch.inference_mode():
        ref = model(input_ids=ids, mm_token_type_ids=mm, pixel_values=px, image_grid_thw=grid,
                    output_hidden_states=True)
        feats = model.model.get_image_features(px, grid, return_dict=True)
    assert torch.equal(logits, ref.logits[0])
    for k in range(3):  # transformers' own captured layer outputs
        assert torch.equal(got[f"hidden.{k}"], ref.hidden_states[k + 1][0]), k
    # the last entry transformers returns is after the final norm: the tap is the layer's output before it
    assert torch.equal(model.model.language_model.norm(got["hidden.3"]), ref.hidden_states[4][0])
    visual = ids[0] == cfg.image_token_id
    for k in range(3):  # deepstack_add.k - hidden.k: the feature on the visual rows, nothing elsewhere
        delta = got[f"deepstack_add.{k}"] - got[f"hidden.{k}"]
        assert torch.allclose(delta[visual], feats.deepstack_features[k], atol=1e-6)
        assert torch.count_nonzero(delta[~visual]) == 0
    assert "deepstack_add.3" not in got  # three features: layer 3 is the clean one
    assert torch.equal(got["embeddings"][visual], feats.pooler_output[0])
    assert len(steps) == 2 and len(generated) == 3 and stop == "steps"
    # the hooks and the wrapped method are gone
    text = model.model.language_model
    assert "_deepstack_process" not in text.__dict__
    assert not text._forward_pre_hooks and not text.rotary_emb._forward_hooks


def test_a_checkpoint_without_text_weights_is_refused(tiny, tmp_path):
    ckpt, cfg, _ = tiny
    dst = tmp_path / "ckpt"
    shutil.copytree(ckpt, dst)
    index = dst / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"] = {k: v for k, v in data["weight_map"].items() if not k.startswith("model.language_model.")}
    index.write_text(json.dumps(data))
    with pytest.raises(BadInput, match="no text model weights"):
        L.build(C.load_config(dst), dst, torch.float32)
