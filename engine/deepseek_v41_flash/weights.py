"""Lazy checkpoint reads for the engine: only the named tensors, through the safetensors index.

`fingerprint` hashes config.json and the index (the same formula the oracle uses, written
down in the dump format notes), so both sides' dumps name the same weights.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from ..runtime import shards

INDEX = "model.safetensors.index.json"


def read(root: str | Path, names: list[str], device="cpu",
         shapes: dict[str, tuple[int, ...]] | None = None) -> dict[str, torch.Tensor]:
    """{name: tensor as stored, on `device`}; a bad checkpoint (or a shape other than `shapes`
    says) is one EngineInputError, from the strict reader every engine model shares."""
    return shards.read(root, names, device, shapes)


def fingerprint(root: str | Path) -> str:
    root = Path(root)
    h = hashlib.sha256()
    for name in ("config.json", INDEX):
        h.update(name.encode() + b"\0")
        p = root / name
        h.update(p.read_bytes() if p.is_file() else b"")
    lone = root / "model.safetensors"
    if not (root / INDEX).is_file() and lone.is_file():
        with open(lone, "rb") as f:
            h.update(f.read(int.from_bytes(f.read(8), "little")))
    return "sha256:" + h.hexdigest()
