"""Seeded synthetic DeepSeek weights (`synthetic:<size>-s<N>`): the same config and names, other
vision values; the language backbone and seed 0 (the plain name) unchanged."""
import pytest
from safetensors import safe_open

from tensordiff.errors import BadInput
from tensordiff.models.deepseek_v41_flash.synthetic import INDEX, resolve, split_seed


@pytest.mark.parametrize("variant, expect", [("full-s2", ("full", 2)), ("tiny-fp8-s3", ("tiny-fp8", 3)),
                                             ("tiny", ("tiny", 0)), ("tiny-s0", ("tiny-s0", 0)),
                                             ("tiny-s02", ("tiny-s02", 0)), ("huge-s2", ("huge-s2", 0))])
def test_split_seed(variant, expect):
    assert split_seed(variant) == expect


def _tensors(d):
    import json

    wm = json.loads((d / INDEX).read_text())["weight_map"]
    out = {}
    for shard in sorted(set(wm.values())):
        with safe_open(str(d / shard), "pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})
    return out


def test_a_seed_changes_the_vision_values_only(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORDIFF_CACHE", str(tmp_path))
    d0, d2 = resolve("synthetic:tiny"), resolve("synthetic:tiny-s2")
    assert d0 != d2 and "-s2-" in d2.name and "-s" not in d0.name.removeprefix("synthetic-tiny")
    assert (d0 / "config.json").read_text() == (d2 / "config.json").read_text()
    a, b = _tensors(d0), _tensors(d2)
    assert a.keys() == b.keys()
    vision = [k for k in a if k.startswith(("vision.", "aligner.", "image_"))]
    assert vision and all(a[k].shape == b[k].shape and a[k].dtype == b[k].dtype for k in a)
    assert all(not a[k].equal(b[k]) for k in vision)
    assert all(a[k].equal(b[k]) for k in a if k not in vision)  # the language backbone keeps its seeding
    assert resolve("synthetic:tiny-s2") == d2  # written once, reused


@pytest.mark.parametrize("spec", ["synthetic:tiny-s0", "synthetic:huge-s2", "synthetic:tiny-sx"])
def test_a_bad_seed_or_size_is_bad_input(spec, tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORDIFF_CACHE", str(tmp_path))
    with pytest.raises(BadInput, match="unknown synthetic size"):
        resolve(spec)


def test_qwen_seeds_change_every_unit_and_keep_the_config(tmp_path, monkeypatch):
    import tensordiff.models.qwen3_vl.synthetic as q

    monkeypatch.setenv("TENSORDIFF_CACHE", str(tmp_path))
    assert q.split_seed("full-s2") == ("full", 2) and q.split_seed("full-2b") == ("full-2b", 0)
    assert q.split_seed("full-2b-s3") == ("full-2b", 3) and q.split_seed("tiny-s0") == ("tiny-s0", 0)
    d0, d2 = q.ensure("tiny"), q.ensure("tiny-s2")
    assert d0 != d2
    import json

    c0, c2 = (json.loads((d / "config.json").read_text()) for d in (d0, d2))
    assert c2.pop("synthetic") == {"variant": "tiny-s2", "schema": q.SCHEMA}  # the config says which seed
    c0.pop("synthetic")
    assert c0 == c2
    assert (d0 / "preprocessor_config.json").read_text() == (d2 / "preprocessor_config.json").read_text()
    a, b = _tensors_qwen(d0), _tensors_qwen(d2)
    assert a.keys() == b.keys() and all(a[k].shape == b[k].shape for k in a)
    assert all(not a[k].equal(b[k]) for k in a)
    with pytest.raises(BadInput, match="seed suffix"):
        q.ensure("tiny-s0")


def _tensors_qwen(d):
    import json

    wm = json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]
    out = {}
    for shard in sorted(set(wm.values())):
        with safe_open(str(d / shard), "pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})
    return out
