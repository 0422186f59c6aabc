"""Broken copies of a good checkpoint directory, one per way a real one goes wrong.

Each maker copies `src` into `dst`, breaks the shard holding `victim` (a tensor the run needs)
and returns what the one-line error must mention."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

INDEX = "model.safetensors.index.json"


def _copy(src: Path, dst: Path) -> dict:
    shutil.copytree(src, dst)
    return json.loads((dst / INDEX).read_text())


def _write_index(dst: Path, index: dict) -> None:
    (dst / INDEX).write_text(json.dumps(index))


def _tensors(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


def _save(tensors: dict, path: Path) -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(path))


def shard_lacks_tensor(src, dst, victim):
    index = _copy(src, dst)
    shard = dst / index["weight_map"][victim]
    t = _tensors(shard)
    del t[victim]
    _save(t, shard)
    return victim


def index_lacks_tensor(src, dst, victim):
    index = _copy(src, dst)
    del index["weight_map"][victim]
    _write_index(dst, index)
    return victim


def wrong_shape(src, dst, victim):
    index = _copy(src, dst)
    shard = dst / index["weight_map"][victim]
    t = _tensors(shard)
    t[victim] = t[victim].flatten()[:-1].clone()  # one element short, one dimension fewer
    _save(t, shard)
    return "shape"


def truncated_shard(src, dst, victim):
    index = _copy(src, dst)
    shard = dst / index["weight_map"][victim]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 64])  # the header survives, the last tensor's bytes do not
    return shard.name


def corrupt_shard(src, dst, victim):
    index = _copy(src, dst)
    shard = dst / index["weight_map"][victim]
    data = bytearray(shard.read_bytes())
    data[8:40] = b"\xff" * 32  # the JSON header is no longer JSON
    shard.write_bytes(bytes(data))
    return shard.name


def missing_shard(src, dst, victim):
    index = _copy(src, dst)
    index["weight_map"][victim] = "model-00099-of-00099.safetensors"
    _write_index(dst, index)
    return "model-00099-of-00099.safetensors"


def escaping_shard(src, dst, victim):
    index = _copy(src, dst)
    outside = dst.parent / f"{dst.name}-outside.safetensors"
    shutil.copy(dst / index["weight_map"][victim], outside)  # readable, and still must not be read
    index["weight_map"][victim] = f"../{outside.name}"
    _write_index(dst, index)
    return "outside"


def pickle_shard(src, dst, victim):
    import torch

    index = _copy(src, dst)
    torch.save(_tensors(dst / index["weight_map"][victim]), dst / "pytorch_model.bin")
    index["weight_map"][victim] = "pytorch_model.bin"
    _write_index(dst, index)
    return "pytorch_model.bin"


CASES = {f.__name__: f for f in (shard_lacks_tensor, index_lacks_tensor, wrong_shape, truncated_shard,
                                 corrupt_shard, missing_shard, escaping_shard, pickle_shard)}
