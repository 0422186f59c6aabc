"""Naming several images' vision boundaries in one dump (`tensordiff.format.images`), and the DeepSeek
contract built from them."""
import pytest

from tensordiff.format import images
from tensordiff.judge.contract import ancestors
from tensordiff.models.deepseek_v41_flash.adapter import CONTRACT


def test_the_first_image_keeps_the_single_image_names():
    assert images.prefix(0) == "" and images.prefix(2) == "image.2."
    assert images.split("patches") == (0, "patches")
    assert images.split("image.2.rope.cos") == (2, "rope.cos")
    # not an image prefix: a 0 index (the first image has none) or a non-number
    assert images.split("image.0.patches") == (0, "image.0.patches")
    assert images.split("image.x.patches") == (0, "image.x.patches")
    with pytest.raises(ValueError):
        images.prefix(-1)


class Seen:
    enabled = True

    def __init__(self):
        self.boundaries, self.run = {}, {}

    def record(self, name, tensor, *, boundary=None):
        self.boundaries[name] = boundary

    def update_run(self, **fields):
        self.run.update(fields)


def test_image_recorder_prefixes_names_and_boundaries():
    rec = Seen()
    r1 = images.ImageRecorder(rec, 1)
    r1.record("rope.cos", None)
    r1.record("plan.size", None, boundary="plan")
    images.ImageRecorder(rec, 0).record("rope.sin", None)
    r1.update_run(inputs={"x": 1})  # run facts are not an image's: unprefixed
    assert rec.boundaries == {"image.1.rope.cos": "image.1.rope", "image.1.plan.size": "image.1.plan",
                              "rope.sin": "rope"}
    assert rec.run == {"inputs": {"x": 1}}


def test_contract_resolves_per_image_vision_boundaries():
    names = ["plan.size", "patches", "rope.cos", "block0", "final_norm", "aligner",
             "image.1.plan.size", "image.1.patches", "image.1.rope.cos", "image.1.block0", "image.1.final_norm",
             "image.1.aligner", "image.2.aligner", "embeddings", "attn.0", "logits"]
    present = [CONTRACT.boundary_of(n) for n in names]
    assert present[6:9] == ["image.1.plan", "image.1.patches", "image.1.rope"]
    bs = CONTRACT.resolve(present)
    by = {b.name: b for b in bs}
    assert by["image.1.block0"].inputs == ("image.1.patches", "image.1.rope")
    assert by["image.1.aligner"].layout == "plain"  # run.inputs.grid is the first image's
    assert set(by["embeddings"].inputs) == {"aligner", "image.1.aligner", "image.2.aligner"}
    assert "image.1.plan" in ancestors(bs, "logits") and "plan" in ancestors(bs, "logits")
    assert "plan" not in ancestors(bs, "image.1.aligner")  # one image's path is its own


def test_single_image_contract_is_unchanged():
    present = ["plan", "patches", "rope", "block0", "final_norm", "aligner", "embeddings", "attn.0"]
    bs = CONTRACT.resolve(present)
    assert not any(b.name.startswith("image.") for b in bs)
    assert {b.name: b for b in bs}["embeddings"].inputs == ("aligner",)
