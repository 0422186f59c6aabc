"""Image token span and M-RoPE positions, by hand."""
import torch

from engine.qwen3_vl.config import ProcessorConfig, Qwen3VLConfig, VisionConfig
from engine.qwen3_vl.positions import decode_positions, mrope_positions, tokenize

CFG = Qwen3VLConfig(VisionConfig(spatial_merge_size=2), ProcessorConfig())


def test_span_and_positions_by_hand():
    # "ab<image>c" with a 4x6 patch grid: 2x3 merged cells, 6 pads
    p = tokenize("ab<image>c", (1, 4, 6), CFG)
    ids = p.input_ids.tolist()
    assert ids == [97, 98, 151652] + [151655] * 6 + [151653, 99]
    pos, delta = mrope_positions(p, 2)
    t, h, w = pos.tolist()
    # text a b <vs> at 0 1 2; pads start at 3: h over rows, w over cols; <ve> at 3 + max(2, 3) = 6
    assert t == [0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7]
    assert h == [0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7]
    assert w == [0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7]
    assert delta == 8 - 11
    assert decode_positions(11, 2, delta).tolist() == [[8, 9]] * 3


def test_two_images_and_default_marker():
    p = tokenize("<image> and <image>", (1, 4, 4), CFG)
    assert (p.input_ids == 151655).sum() == 8
    pos, delta = mrope_positions(p, 2)
    assert pos.shape == (3, p.input_ids.shape[0])
    assert int(pos.max()) + 1 - pos.shape[1] == delta
    q = tokenize("describe", (1, 4, 4), CFG)  # no marker: the picture goes first
    assert q.input_ids[0].item() == 151652


def test_single_cell_image_has_no_delta():
    pos, delta = mrope_positions(tokenize("x<image>y", (1, 2, 2), CFG), 2)
    assert delta == 0
    assert torch.equal(pos[0], torch.arange(pos.shape[1]))


def test_config_needs_the_preprocessor_config(tmp_path):
    import json
    import shutil

    import pytest

    from engine.errors import EngineInputError
    from engine.qwen3_vl.config import load_config
    from tensordiff.models.qwen3_vl.synthetic import ensure

    ckpt = tmp_path / "c"
    shutil.copytree(ensure("tiny"), ckpt)
    cfg = load_config(ckpt)
    assert cfg.vision.deepstack_visual_indexes == (0, 1, 2) and cfg.processor.longest_edge == 256 * 256
    (ckpt / "preprocessor_config.json").unlink()
    with pytest.raises(EngineInputError, match="preprocessor_config.json"):
        load_config(ckpt)
    (ckpt / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(EngineInputError, match="not a Qwen3-VL"):
        load_config(ckpt)
