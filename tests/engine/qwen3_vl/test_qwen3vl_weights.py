"""engine/qwen3_vl/weights.py's cast cache: a second run on the same checkpoint files reuses the
cast tensors; a rewritten file, another dtype or a device other than the CPU reads them again."""
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.qwen3_vl import weights as W
from engine.qwen3_vl.config import load_config
from engine.qwen3_vl.weights import load_visual, visual_shapes
from engine.runtime import shards
from tensordiff.models.qwen3_vl.adapter import ADAPTER


@pytest.fixture
def ckpt(tmp_path, monkeypatch):
    d = tmp_path / "ckpt"
    shutil.copytree(ADAPTER.weights("synthetic:tiny"), d)
    monkeypatch.setattr(W, "_CAST", {})
    reads = []
    read = shards.read
    monkeypatch.setattr(shards, "read", lambda *a, **k: reads.append(a[0]) or read(*a, **k))
    return d, reads


def _shard_of(d, name):
    return d / shards.weight_map(d)[name]


def test_a_second_run_reuses_the_cast_and_equals_a_fresh_one(ckpt):
    d, reads = ckpt
    vc = load_config(d).vision
    a = load_visual(d, vc, torch.float32)
    b = load_visual(d, vc, torch.float32)
    assert len(reads) == 1
    assert a is not b and a.keys() == b.keys() and all(a[k] is b[k] for k in a)
    stored = shards.read(d, [W.PREFIX + k for k in visual_shapes(vc)])
    assert all(torch.equal(a[k], stored[W.PREFIX + k].float()) and a[k].dtype == torch.float32 for k in a)


def test_a_rewritten_checkpoint_is_read_again(ckpt):
    d, reads = ckpt
    vc = load_config(d).vision
    name = W.PREFIX + "patch_embed.proj.bias"
    before = load_visual(d, vc, torch.float32)["patch_embed.proj.bias"].clone()
    shard = _shard_of(d, name)
    tensors = load_file(shard)
    tensors[name] = tensors[name] + 1
    save_file(tensors, shard, metadata={"format": "pt"})
    after = load_visual(d, vc, torch.float32)["patch_embed.proj.bias"]
    assert len(reads) == 2
    assert torch.equal(after, tensors[name].float()) and not torch.equal(after, before)


def test_another_dtype_or_device_is_its_own_read(ckpt):
    d, reads = ckpt
    vc = load_config(d).vision
    load_visual(d, vc, torch.float32)
    assert load_visual(d, vc, torch.bfloat16)["pos_embed.weight"].dtype == torch.bfloat16
    assert len(reads) == 2
    load_visual(d, vc, torch.float32, device="meta")
    load_visual(d, vc, torch.float32, device="meta")
    assert len(reads) == 4  # never cached off the CPU


def test_a_bad_checkpoint_is_still_refused_after_a_good_one(ckpt, tmp_path):
    d, _ = ckpt
    vc = load_config(d).vision
    load_visual(d, vc, torch.float32)
    bad = tmp_path / "bad"
    shutil.copytree(d, bad)
    shard = _shard_of(bad, W.PREFIX + "patch_embed.proj.bias")
    shard.write_bytes(shard.read_bytes()[:100])
    from engine.errors import EngineInputError

    with pytest.raises(EngineInputError):
        load_visual(bad, vc, torch.float32)
