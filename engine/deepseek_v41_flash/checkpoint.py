"""Lazy checkpoint reads for the engine: only the named tensors, through the safetensors index.
(The weights' content identity is the core's: `tensordiff.pipeline.provenance.weights_fingerprint`.)
"""
from __future__ import annotations

from pathlib import Path

import torch

from engine.runtime import shards

INDEX = "model.safetensors.index.json"


def read(root: str | Path, names: list[str], device="cpu",
         shapes: dict[str, tuple[int, ...]] | None = None) -> dict[str, torch.Tensor]:
    """{name: tensor as stored, on `device`}; a bad checkpoint (or a shape other than `shapes`
    says) is one EngineInputError, from the strict reader every engine model shares."""
    return shards.read(root, names, device, shapes)

