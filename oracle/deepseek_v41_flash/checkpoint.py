"""Reads named tensors from a checkpoint directory, lazily, through its safetensors index.

A released checkpoint is 48 shards; the vision tensors are a few hundred MB of the first one, so
only the names asked for are read (safetensors' `safe_open` maps the file and slices by key).
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import torch

from tensordiff.errors import BadInput

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


# Stored as they are, never converted: the low-precision weight formats and their scales.
QUANTISED = (torch.float8_e4m3fn, torch.float4_e2m1fn_x2, torch.float8_e8m0fnu)
# What a plain (bf16 / fp32) parameter may be read from: a float cast loses nothing it declares.
PLAIN = (torch.bfloat16, torch.float16, torch.float32)


def check_stored(name: str, stored: torch.dtype, declared: torch.dtype, checkpoint: Path) -> None:
    """A quantised parameter takes exactly its format; a plain one only a float dtype. Anything
    else would be a silent cast (an FP8 weight read without its scale), so it is bad input."""
    if declared in QUANTISED:
        if stored != declared:
            raise BadInput(f"{name} in {checkpoint} is stored as {stored}, but the config's dtype / expert_dtype "
                           f"make it {declared}: not converted")
    elif stored not in PLAIN:
        raise BadInput(f"{name} in {checkpoint} is stored as {stored}, but the config makes it a plain {declared} "
                       f"tensor (a quantised weight under a bf16 config?): not cast silently")


def missing_scales(wmap: dict[str, str], names: list[str]) -> list[str]:
    """The `<module>.scale` names absent whose `<module>.weight` is present."""
    return [n for n in names if n.endswith(".scale") and n not in wmap and n[: -len("scale")] + "weight" in wmap]


def load_into(model: torch.nn.Module, checkpoint: Path, device=None) -> torch.nn.Module:
    """Fill a module built on the meta device with the checkpoint's tensors, by parameter name,
    each cast to its parameter's dtype (the activation dtype, or fp32 where the official module
    declares fp32) unless it is quantised (see `check_stored`); a shape that disagrees with the
    config is bad input, and so is a quantised weight without its scale."""
    params = dict(model.named_parameters())
    no_scale = missing_scales(weight_map(checkpoint), list(params))
    if no_scale:
        s = no_scale[0]
        more = f" (and {len(no_scale) - 1} more)" if len(no_scale) > 1 else ""
        raise BadInput(f"checkpoint {checkpoint} lacks {s}{more}: the config's dtype / expert_dtype make "
                       f"{s[: -len('scale')]}weight quantised, and it is not read without its block scale")
    stored = load_tensors(checkpoint, list(params))
    state = {}
    for name, p in params.items():
        t = stored[name]
        check_stored(name, t.dtype, p.dtype, checkpoint)  # the format first: it explains a shape
        if tuple(t.shape) != tuple(p.shape):
            raise BadInput(f"{name} in {checkpoint} has shape {list(t.shape)}, the config implies {list(p.shape)}")
        state[name] = t.to(device=device, dtype=p.dtype)
    model.load_state_dict(state, assign=True)
    return model.eval()


def table(rows: int, dim: int) -> torch.nn.Embedding:
    """`nn.Embedding(rows, dim)` without its random initialisation. Every module here is built on
    the meta device and `load_into` assigns the checkpoint's tensors, so the initial values are
    never read; the first `normal_` of a process on a meta tensor costs about 1.2 s on the CPU
    (torch imports its Python decompositions for it), a third of a tiny language run."""
    return torch.nn.Embedding(rows, dim, _weight=torch.empty(rows, dim))
