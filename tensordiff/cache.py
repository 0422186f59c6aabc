"""The cache directory: synthetic checkpoints, oracle dumps, file digests and the native kernel.

`TENSORDIFF_CACHE` when set, else `$XDG_CACHE_HOME/tensordiff` (`~/.cache/tensordiff`). Every
writer into it stages under a unique name and renames, so concurrent processes never see half an
entry.
"""
from __future__ import annotations

import os
from pathlib import Path

from tensordiff.errors import BadInput


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
