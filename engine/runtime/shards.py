"""Strict reads of named tensors from a checkpoint directory's safetensors shards.

Every engine model reads its weights here, so a bad checkpoint is refused the same way for all:
an index that is not JSON, a shard it names that is missing, lies outside the directory or is
not a safetensors file (a `.bin` may hold a pickle: never opened), a shard that is truncated or
corrupt, a tensor the index places in a shard that lacks it, or a shape the config does not
imply. Each is one `EngineInputError` naming the file and the tensor.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from ..errors import EngineInputError

INDEX = "model.safetensors.index.json"
LONE = "model.safetensors"


# safetensors dtype names in torch's words, for messages
_NAMES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16", "I32": "int32",
          "U32": "uint32", "I64": "int64", "U64": "uint64", "F16": "float16", "BF16": "bfloat16", "F32": "float32",
          "F64": "float64", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu",
          "F4": "float4_e2m1fn_x2"}


def _plain(dtype: str) -> str:
    return _NAMES.get(dtype, dtype)


def _open(path: Path, device="cpu"):
    try:
        return safe_open(str(path), framework="pt", device=str(device))
    except (SafetensorError, OSError) as e:  # truncated, corrupt, unreadable
        raise EngineInputError(f"shard {path} is not a readable safetensors file ({e})") from None


def weight_map(root: str | Path) -> dict[str, str]:
    """Tensor name -> shard file name, from the index (or the keys of a lone model.safetensors)."""
    root = Path(root)
    index = root / INDEX
    if index.is_file():
        try:
            wmap = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise EngineInputError(f"{index} is not a valid safetensors index ({e})") from None
        if not isinstance(wmap, dict) or not all(isinstance(v, str) for v in wmap.values()):
            raise EngineInputError(f"{index}: weight_map is not a map of tensor names to shard files")
        return dict(wmap)
    lone = root / LONE
    if lone.is_file():
        with _open(lone) as f:
            return dict.fromkeys(f.keys(), LONE)
    raise EngineInputError(f"{root} has neither {INDEX} nor {LONE}: not a checkpoint directory")


def shard_path(root: Path, shard: str, tensor: str) -> Path:
    """The shard's file, refused when it escapes `root`, is no safetensors file, or is absent."""
    # lexical, not resolved: a hub cache's shards are symlinks into its blob store, which is fine;
    # an index naming "../x" or "/x" is not
    if Path(shard).is_absolute() or ".." in Path(shard).parts:
        raise EngineInputError(f"{root / INDEX}: shard {shard!r} (holding {tensor}) escapes the checkpoint directory")
    path = root / shard
    if path.suffix != ".safetensors":
        raise EngineInputError(f"shard {root / shard} (holding {tensor}) is not a .safetensors file; "
                               "pickled checkpoints are never opened")
    if not path.is_file():
        raise EngineInputError(f"shard {root / shard} (holding {tensor}) named by the index is missing")
    return path


def read(root: str | Path, names: list[str], device="cpu",
         shapes: dict[str, tuple[int, ...]] | None = None, packed: frozenset[str] = frozenset()) -> dict[str, torch.Tensor]:
    """{name: tensor as stored, on `device`}. All names absent from the index are reported
    together; `shapes` (name -> the shape the config implies) is checked before any data is read.
    `packed`: names whose 4-bit values may be stored two a byte in an int8 tensor, whose last
    dimension is then half the implied one."""
    root = Path(root)
    wmap = weight_map(root)
    absent = [n for n in names if n not in wmap]
    if absent:
        more = f" (+{len(absent) - 6} more)" if len(absent) > 6 else ""
        raise EngineInputError(f"checkpoint {root} is missing {', '.join(absent[:6])}{more}")
    groups: dict[str, list[str]] = defaultdict(list)
    for n in names:
        groups[wmap[n]].append(n)
    out = {}
    for shard, keys in groups.items():
        path = shard_path(root, shard, keys[0])
        with _open(path, device) as f:
            present = set(f.keys())
            for k in keys:
                if k not in present:
                    raise EngineInputError(f"shard {root / shard} lacks {k}, which the index places there")
                want = (shapes or {}).get(k)
                sl = f.get_slice(k)
                got, stored = tuple(sl.get_shape()), sl.get_dtype()
                if want is not None and k in packed:
                    halved = (*want[:-1], want[-1] // 2)
                    if got != (halved if stored == "I8" else tuple(want)):
                        raise EngineInputError(
                            f"{k} in {root / shard} is stored as {_plain(stored)} {list(got)}; expected "
                            f"{list(want)} of packed 4-bit values (float4_e2m1fn_x2) or their {list(halved)} bytes as int8")
                elif want is not None and got != tuple(want):
                    raise EngineInputError(f"{k} in {root / shard} has shape {list(got)}, the config implies {list(want)}")
                try:
                    out[k] = f.get_tensor(k)
                except SafetensorError as e:
                    raise EngineInputError(f"cannot read {k} from {root / shard}: {e}") from None
    return out
