"""Reads named tensors from a checkpoint directory, lazily, through its safetensors index.

A released checkpoint is 48 shards; the vision tensors are a few hundred MB of the first one, so
only the names asked for are read (safetensors' `safe_open` maps the file and slices by key).
"""
from __future__ import annotations

import hashlib
from contextlib import contextmanager
from pathlib import Path

import torch


from .. import shards

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def weight_map(checkpoint: Path) -> dict[str, str]:
    """Tensor name -> shard file name, from the index (or a lone `model.safetensors`)."""
    return shards.weight_map(checkpoint)


def load_tensors(checkpoint: str | Path, names: list[str],
                 shapes: dict[str, tuple[int, ...]] | None = None) -> dict[str, torch.Tensor]:
    """Exactly `names`, as stored (no dtype change), through the oracle's strict reader: a bad
    checkpoint (missing name or shard, escaping or pickle shard, truncated file, wrong shape)
    is one BadInput."""
    return shards.load(checkpoint, names, shapes, what="DeepSeek V4.1 Flash")


def fingerprint(checkpoint: str | Path) -> str:
    """sha256 of config.json and the index (or the lone shard's header): cheap, and the same
    formula on both sides, so two dumps from one checkpoint carry one fingerprint."""
    checkpoint = Path(checkpoint)
    h = hashlib.sha256()
    for name in ("config.json", INDEX):
        p = checkpoint / name
        h.update(name.encode() + b"\0")
        h.update(p.read_bytes() if p.is_file() else b"")
    if not (checkpoint / INDEX).is_file() and (checkpoint / SINGLE).is_file():
        with open(checkpoint / SINGLE, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            h.update(f.read(n))
    return "sha256:" + h.hexdigest()


@contextmanager
def default_dtype(dtype: torch.dtype):
    """Linear weights take the default dtype, as under the official `set_dtype`; RMSNorm
    weights stay fp32 because they are created fp32 explicitly."""
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(prev)


def load_into(model: torch.nn.Module, checkpoint: Path, device=None) -> torch.nn.Module:
    """Fill a module built on the meta device with the checkpoint's tensors, by parameter name,
    each cast to its parameter's dtype (the activation dtype, or fp32 where the official module
    declares fp32); a shape that disagrees with the config is bad input."""
    params = dict(model.named_parameters())
    stored = load_tensors(checkpoint, list(params), {n: tuple(p.shape) for n, p in params.items()})
    state = {name: stored[name].to(device=device, dtype=p.dtype) for name, p in params.items()}
    model.load_state_dict(state, assign=True)
    return model.eval()
