"""Lazy checkpoint reads for the engine: only the named tensors, through the safetensors index.
(The weights' content identity is the core's: `tensordiff.pipeline.provenance.weights_fingerprint`.)
"""
from __future__ import annotations

from pathlib import Path

import torch

from engine.runtime import shards

INDEX = "model.safetensors.index.json"


def read(root: str | Path, names: list[str], device="cpu",
         shapes: dict[str, tuple[int, ...]] | None = None, packed: frozenset[str] = frozenset()) -> dict[str, torch.Tensor]:
    """{name: tensor as stored, on `device`}; a bad checkpoint (or a shape other than `shapes`
    says) is one EngineInputError, from the strict reader every engine model shares. `packed`:
    the names that may be stored as int8 bytes of two 4-bit values (the release's FP4 experts)."""
    return shards.read(root, names, device, shapes, packed)


def stored_beside(root: str | Path, names: list[str], suffix: str, scale: str) -> list[str]:
    """The tensors the checkpoint stores beside those of `names` ending in `suffix`: each one's
    name with `suffix` replaced by `scale`, where the index holds it (the release's block scale
    of an FP8 `wo_a`, absent in the converted layout)."""
    wmap = shards.weight_map(Path(root))
    beside = (n[: -len(suffix)] + scale for n in names if n.endswith(suffix))
    return [n for n in beside if n in wmap]

