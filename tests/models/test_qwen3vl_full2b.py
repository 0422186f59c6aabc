"""The Qwen3-VL language path at Qwen3-VL-2B's dimensions (synthetic:full-2b), fp32: the clean
engine matches transformers on four photographs and three chunk sizes with decode.

Skipped unless TENSORDIFF_FULL2B=1: each side holds about 9 GB of fp32 weights (more than the CI
machine may use). TENSORDIFF_FULL2B_DEVICE picks the device (default cpu)."""
from __future__ import annotations

import dataclasses
import os

import pytest

from qwen3vl_images import make_images
from tensordiff.pipeline.adapter import RunRequest
from tensordiff.format.capture import Recorder
from tensordiff.pipeline.compare import compare_dumps
from tensordiff.models.qwen3_vl.adapter import ADAPTER

pytestmark = pytest.mark.skipif(os.environ.get("TENSORDIFF_FULL2B") != "1",
                                reason="full-2b needs ~9 GB per side: set TENSORDIFF_FULL2B=1 to run it")

PROMPT = "Here is a photo: <image> What does it show?"


@pytest.fixture(scope="module")
def setup(module_tmp):
    root = module_tmp("qwen3vl-full2b")
    return root, make_images(root / "images"), ADAPTER.weights("synthetic:full-2b")


def dump(root, side, req, tag):
    out = root / f"{tag}-{side}"
    if not out.exists():
        rec = Recorder(out, model=ADAPTER.name, producer={"name": f"test-{side}", "side": side})
        ADAPTER.runner(side)(req, rec)
        rec.close()
    return out


@pytest.mark.parametrize("chunk", (1, 16, 64))
@pytest.mark.parametrize("name", ("astronaut", "chelsea", "coffee", "wide"))
def test_full_2b_matches_transformers(setup, name, chunk):
    root, images, wdir = setup
    req = RunRequest(weights="synthetic:full-2b", weights_dir=wdir, image=images[name], prompt=PROMPT, decode=2,
                     device=os.environ.get("TENSORDIFF_FULL2B_DEVICE", "cpu"))
    a = dump(root, "oracle", req, name)
    report = compare_dumps(a, dump(root, "engine", dataclasses.replace(req, chunk=chunk), f"{name}-c{chunk}"))
    assert report.verdict == "match", str(report)
    assert {"hidden.27", "deepstack_add.2", "logits.step.2"} <= {b.name for b in report.boundaries}
