"""Synthetic weights in each model's official layout (names, shapes, shards, index).

Every unit (a block, a merger, a patch embedding) draws from a generator seeded by its own
name, so a small config's `blocks.3` holds the same numbers as the full config's `blocks.3`
for the shapes they share, and the oracle and the engine always load the same bytes.
Written once into a cache directory and reused.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ..errors import BadInput


def cache_root() -> Path:
    root = os.environ.get("TENSORDIFF_CACHE")
    base = Path(root) if root else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tensordiff"
    var = "TENSORDIFF_CACHE" if root else "the cache directory"
    if base.exists() and not base.is_dir():
        raise BadInput(f"{var} {base} is a file; point TENSORDIFF_CACHE at a directory")
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BadInput(f"cannot create {var} {base}: {e.strerror}; point TENSORDIFF_CACHE at a writable directory") from None
    if not os.access(base, os.W_OK | os.X_OK):
        raise BadInput(f"{var} {base} is not writable; point TENSORDIFF_CACHE at a writable directory")
    return base


def share(directory: Path) -> None:
    """Make a freshly written cache directory readable by everyone the umask allows (mkdtemp makes
    it 0700 and safetensors writes 0600 files; a shared cache must stay readable)."""
    mask = os.umask(0o022)
    os.umask(mask)
    os.chmod(directory, 0o777 & ~mask)
    for p in directory.rglob("*"):
        os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~mask)


def unit_seed(unit: str, seed: int = 0) -> int:
    """A 63-bit seed from a unit's name (stable across Python runs, unlike hash())."""
    digest = hashlib.sha256(f"{seed}:{unit}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def generator(unit: str, seed: int = 0):
    import torch

    g = torch.Generator()
    g.manual_seed(unit_seed(unit, seed))
    return g
