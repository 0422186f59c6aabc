"""A safetensors checkpoint directory as the toolkit reads it: its index, its shards.

The toolkit's one reader of the index (`INDEX`, `weight_map`), its check of the shards an index
names (`check_shard`) and its writer (`write_index`, for the synthetic checkpoints). The oracle and
the engine each read the checkpoint with their own strict readers (oracle/shards.py,
engine/runtime/shards.py): they are independent routes and share no code with this.
"""
from __future__ import annotations

import json
from pathlib import Path

from tensordiff.errors import BadInput
from tensordiff.format.storage import PICKLE_EXT, read_safetensors_layout


INDEX = "model.safetensors.index.json"  # the safetensors index: {"weight_map": {tensor: shard}}


def weight_map(ckpt: str | Path) -> dict[str, str]:
    """A safetensors checkpoint directory's {tensor name: shard file}: from its index, or from
    the header of its one `model.safetensors` (any dtypes). The core's check of a checkpoint
    before a run; raises BadInput naming the file."""
    ckpt = Path(ckpt)
    index = ckpt / INDEX
    if index.is_file():
        try:
            wm = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
                raise TypeError("weight_map must map tensor names to shard file names")
        except (ValueError, KeyError, TypeError, RecursionError) as e:
            raise BadInput(f"{index} is not a valid safetensors index ({e})") from None
        return wm
    if (ckpt / "model.safetensors").is_file():
        return dict.fromkeys(read_safetensors_layout(ckpt / "model.safetensors")[0], "model.safetensors")
    raise BadInput(f"{ckpt} holds neither {INDEX} nor model.safetensors")


def check_shard(ckpt: Path, shard: str) -> Path:
    """The path of a shard an index names: a .safetensors file inside the checkpoint directory
    that exists (never a pickle). The core checks this before a run; each side's strict reader
    (oracle/shards.py, engine/runtime/shards.py) checks it again as it loads."""
    # checked on the name, not the resolved path: a hub cache's shards are symlinks into its blobs
    if Path(shard).is_absolute() or ".." in Path(shard).parts:
        raise BadInput(f"{ckpt / INDEX}: shard {shard!r} lies outside the checkpoint directory")
    if Path(shard).suffix.lower() in PICKLE_EXT:
        raise BadInput(f"{ckpt / INDEX} points to {shard}, a {Path(shard).suffix} file that may hold "
                       "a pickle; tensordiff never unpickles: convert the checkpoint to safetensors")
    if Path(shard).suffix.lower() != ".safetensors":
        raise BadInput(f"{ckpt / INDEX} points to {shard}, which is not a .safetensors file")
    if not (ckpt / shard).is_file():
        raise BadInput(f"{ckpt / INDEX} points to {shard}, which is missing from {ckpt}")
    return ckpt / shard


def write_index(directory: Path, weight_map: dict[str, str], total_size: int | None = None) -> Path:
    """Write `directory`'s index: {"metadata": {"total_size": ...}, "weight_map": {tensor: shard}}."""
    meta = {"total_size": total_size} if total_size is not None else {}
    path = Path(directory) / INDEX
    path.write_text(json.dumps({"metadata": meta, "weight_map": weight_map}, indent=1) + "\n")
    return path
