"""Which safetensors shard of a checkpoint directory holds which tensor: the checkpoint format's
own index (`model.safetensors.index.json`, or one lone `model.safetensors`). Read once here, so
the oracle and the engine (which share no code but the format and errors) both use it."""
from __future__ import annotations

import json
from pathlib import Path

from .errors import BadInput

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def shard_map(ckpt: str | Path, prefix: str = "") -> dict[str, str]:
    """tensor name -> shard file name, for the tensors whose name starts with `prefix`."""
    ckpt = Path(ckpt)
    index = ckpt / INDEX
    if index.exists():
        try:
            wm = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise BadInput(f"{index} is not a safetensors index ({e})") from None
    elif (ckpt / SINGLE).exists():
        from safetensors import safe_open

        with safe_open(str(ckpt / SINGLE), "pt") as f:
            wm = {k: SINGLE for k in f.keys()}
    else:
        raise BadInput(f"{ckpt} holds neither {INDEX} nor {SINGLE}")
    return {k: v for k, v in wm.items() if k.startswith(prefix)}
