"""Lazy checkpoint reads for the engine: only the named tensors, through the safetensors index.
(The weights' content identity is the core's: `tensordiff.provenance.weights_fingerprint`.)
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import torch
from safetensors import safe_open

from ..errors import EngineInputError

INDEX = "model.safetensors.index.json"


def _weight_map(root: Path) -> dict[str, str]:
    index = root / INDEX
    if index.is_file():
        try:
            return json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise EngineInputError(f"{index} is not a valid safetensors index ({e})") from None
    lone = root / "model.safetensors"
    if lone.is_file():
        with safe_open(str(lone), framework="pt") as f:
            return dict.fromkeys(f.keys(), lone.name)
    raise EngineInputError(f"{root} has no {INDEX} (nor a single model.safetensors)")


def read(root: str | Path, names: list[str], device="cpu") -> dict[str, torch.Tensor]:
    """{name: tensor as stored, on `device`}; all missing names are reported together."""
    root = Path(root)
    wmap = _weight_map(root)
    absent = [n for n in names if n not in wmap]
    if absent:
        more = f" (+{len(absent) - 6} more)" if len(absent) > 6 else ""
        raise EngineInputError(f"checkpoint {root} is missing {', '.join(absent[:6])}{more}")
    groups: dict[str, list[str]] = defaultdict(list)
    for n in names:
        groups[wmap[n]].append(n)
    out = {}
    for shard, keys in groups.items():
        try:
            with safe_open(str(root / shard), framework="pt", device=str(device)) as f:
                for k in keys:
                    out[k] = f.get_tensor(k)
        except FileNotFoundError:
            raise EngineInputError(f"shard {root / shard} (holding {keys[0]}) is missing") from None
        except Exception as e:  # safetensors raises its own error types for a bad file or key
            raise EngineInputError(f"cannot read {keys[0]} from {root / shard}: {e}") from None
    return out
