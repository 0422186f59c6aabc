"""The whole DeepSeek V4.1 Flash path in one `check`: image -> vision tower -> aligner -> image span
-> language backbone (chunked prefill + decode), vision and language boundaries in one report."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from tensordiff.pipeline.case import CaseSpec
from tensordiff.pipeline.case import check as check_case
import tensordiff.models.deepseek_v41_flash.faults as D


def check(model: str, *, tolerances=None, out=None, oracle_dtype=None, use_cache=True, **kw):
    """Both sides of one case, compared: its Report."""
    return check_case(CaseSpec(model, oracle_dtype=oracle_dtype, **kw), out=out, tolerances=tolerances,
                      use_cache=use_cache).report

PROMPT = "Look: <image> What is in the picture?"


@pytest.fixture(scope="module")
def picture(module_tmp):
    # 600x386: upscaled to a 32x49 patch grid (49 is not a multiple of 3: the aligner pad matters)
    y, x = np.mgrid[0:386, 0:600]
    img = np.stack([x * 255 // 600, y * 255 // 386, (x ^ y) & 255], -1).astype(np.uint8)
    p = module_tmp("pic") / "p.png"
    Image.fromarray(img).save(p)
    return p


def run(picture, **kw):
    # the language half in its fp32 semantic numerics, as the fp32 vision half (the official bf16
    # default drifts by rounding: test_deepseek_language_quantised.py)
    return check("deepseek-v4.1-flash", image=picture, prompt=PROMPT, chunk=16, decode=2,
                 extra=("language_numerics=semantic",), **kw)


def test_clean_whole_model_matches_with_a_chunk_cutting_the_span(picture):
    r = run(picture)
    names = [b.name for b in r.boundaries]
    assert r.verdict == "match", r.earliest
    assert names[:7] == ["plan", "patches", "rope", "block0", "final_norm", "aligner", "embeddings"]
    assert "logits" in names and "logits.step.2" in names and any(n.startswith("router.") for n in names)
    # the language runs once per prompt on the engine side, and the tower ran once
    assert r.runs["b"]["language"]["vision_calls"] == 1


@pytest.mark.parametrize("fault,boundary", [
    (D.ROUTER_TEXT_BIAS_FOR_IMAGES, "router.0.ids"),
    (D.ROUTER_BIASED_WEIGHTS, "router.0.weights"),
    (D.ENGRAM_NGRAM_ACROSS_IMAGE, "engram.1"),
    (D.OVERLAY_CHUNK_SHIFT, "embeddings"),
    (D.ALIGNER_FLAT_PAD, "aligner"),
])
def test_faults_localised_across_vision_and_language(picture, fault, boundary):
    r = run(picture, fault=fault)
    assert r.earliest == [boundary]


def test_unknown_fault_names_both_halves(picture):
    from tensordiff.errors import BadInput

    with pytest.raises(BadInput, match=D.ROUTER_BIASED_WEIGHTS):
        run(picture, fault="no-such-fault")
