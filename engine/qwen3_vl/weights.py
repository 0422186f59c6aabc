"""Loading the tower's `model.visual.*` tensors from a checkpoint directory (sharded or not)."""
from __future__ import annotations

from pathlib import Path

import torch

from tensordiff.errors import BadInput
from tensordiff.shards import shard_map

from ..errors import EngineInputError

PREFIX = "model.visual."


def shard_files(ckpt: Path) -> dict[str, str]:
    """tensor name -> shard file name, for the `model.visual.*` tensors."""
    try:
        return shard_map(ckpt, PREFIX)
    except BadInput as e:
        raise EngineInputError(str(e)) from None


def load_visual(ckpt: Path, dtype: torch.dtype, device: str = "cpu") -> dict[str, torch.Tensor]:
    """{name without 'model.visual.': tensor in `dtype` on `device`}."""
    from safetensors import safe_open

    files = shard_files(ckpt)
    if not files:
        raise EngineInputError(f"{ckpt} has no model.visual.* tensors")
    out: dict[str, torch.Tensor] = {}
    by_file: dict[str, list[str]] = {}
    for k, f in files.items():
        by_file.setdefault(f, []).append(k)
    for fname, keys in by_file.items():
        path = Path(ckpt) / fname
        if not path.exists():
            raise EngineInputError(f"shard {fname} listed in the index is missing from {ckpt}")
        with safe_open(str(path), "pt", device="cpu") as f:
            for k in keys:
                out[k[len(PREFIX):]] = f.get_tensor(k).to(device=device, dtype=dtype)
    return out
