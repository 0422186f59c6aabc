"""Synthetic weights in each model's official layout (names, shapes, shards, index).

Every unit (a block, a merger, a patch embedding) draws from a generator seeded by its own
name, so a small config's `blocks.3` holds the same numbers as the full config's `blocks.3`
for the shapes they share, and the oracle and the engine always load the same bytes.
Written once into the cache directory (`tensordiff.cache`) and reused.
"""
from __future__ import annotations

import hashlib



def unit_seed(unit: str, seed: int = 0) -> int:
    """A 63-bit seed from a unit's name (stable across Python runs, unlike hash())."""
    digest = hashlib.sha256(f"{seed}:{unit}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def generator(unit: str, seed: int = 0):
    import torch

    g = torch.Generator()
    g.manual_seed(unit_seed(unit, seed))
    return g
