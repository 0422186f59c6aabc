"""The oracle's strict checkpoint reader: named tensors from a directory of safetensors shards.

Both oracle models read their weights through `load`, so every way a checkpoint can be wrong is
one `BadInput` (one line, exit 2) naming the file and the tensor: a malformed index; a shard
name that escapes the directory (`../x`, `/x`) or is not `.safetensors` (a `.bin` may be a
pickle, and nothing here unpickles); a missing, truncated or corrupt shard; a tensor the index
places in a shard that lacks it; a shape other than the one the config implies.
"""
from __future__ import annotations

import json
from pathlib import Path, PurePosixPath

import torch
from safetensors import SafetensorError, safe_open

from tensordiff.errors import BadInput

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def _opened(path: Path):
    try:
        return safe_open(str(path), framework="pt")
    except (SafetensorError, OSError) as e:
        raise BadInput(f"shard {path} is truncated, corrupt or unreadable ({e})") from None


def weight_map(checkpoint: Path) -> dict[str, str]:
    """Tensor name -> shard file name, from the index (or a lone `model.safetensors`)."""
    checkpoint = Path(checkpoint)
    index = checkpoint / INDEX
    if index.is_file():
        try:
            wmap = dict(json.loads(index.read_text())["weight_map"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise BadInput(f"{index} is not a valid safetensors index ({e})") from None
        bad = [k for k, v in wmap.items() if not isinstance(v, str)]
        if bad:
            raise BadInput(f"{index}: the shard of {bad[0]} is not a file name")
        return wmap
    single = checkpoint / SINGLE
    if single.is_file():
        with _opened(single) as f:
            return {k: SINGLE for k in f.keys()}
    raise BadInput(f"{checkpoint} has neither {INDEX} nor {SINGLE}: not a checkpoint directory")


def _shard(checkpoint: Path, name: str, first: str) -> Path:
    rel = PurePosixPath(name)
    # checked on the name, not the resolved path: hub caches store shards as symlinks to blobs
    if rel.is_absolute() or ".." in rel.parts:
        raise BadInput(f"{checkpoint / INDEX} places {first} in {name!r}, outside the checkpoint directory")
    if rel.suffix != ".safetensors":
        raise BadInput(f"{checkpoint / INDEX} places {first} in {name!r}, not a .safetensors file "
                       "(tensordiff never unpickles)")
    path = checkpoint / rel
    if not path.is_file():
        raise BadInput(f"shard {path} named by the index is missing (needed for {first})")
    return path


def load(checkpoint: str | Path, names: list[str], shapes: dict[str, tuple[int, ...]] | None = None,
         what: str = "the run") -> dict[str, torch.Tensor]:
    """Exactly `names`, as stored (no dtype change). Names the index lacks are one BadInput
    naming them; each tensor's shape is checked against `shapes` (name -> the config's) as it is read."""
    checkpoint = Path(checkpoint)
    wmap = weight_map(checkpoint)
    missing = [n for n in names if n not in wmap]
    if missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise BadInput(f"checkpoint {checkpoint} is missing {len(missing)} tensor(s) {what} needs: {shown}")
    by_shard: dict[str, list[str]] = {}
    for n in names:
        by_shard.setdefault(wmap[n], []).append(n)
    out: dict[str, torch.Tensor] = {}
    for shard, keys in by_shard.items():
        path = _shard(checkpoint, shard, keys[0])
        with _opened(path) as f:
            present = set(f.keys())
            for k in keys:
                if k not in present:
                    raise BadInput(f"shard {path} lacks {k}, which the index places there")
                t = f.get_tensor(k)
                # torch's shape, not the header's: a packed FP4 tensor (two per byte) has half the
                # header's last dimension, as the module that takes it declares it
                if shapes and k in shapes and list(t.shape) != list(shapes[k]):
                    raise BadInput(f"{k} in {checkpoint} has shape {list(t.shape)}, the config implies "
                                   f"{list(shapes[k])}")
                out[k] = t
    return out
