"""Seeded synthetic DeepSeek weights (`synthetic:<size>-s<N>`): the same config and names, other
vision values; the language backbone and seed 0 (the plain name) unchanged."""
import pytest
from safetensors import safe_open

from tensordiff.errors import BadInput
from tensordiff.synthetic.deepseek_v41_flash import INDEX, resolve, split_seed


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
