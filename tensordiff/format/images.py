"""Several images per prompt: how each image's vision boundaries are named in one dump.

The first image keeps the single-image names (`plan.size`, `patches`, `rope.cos`, `block0`,
`final_norm`, `aligner`), so a one-image dump, its contract and every tool reading it are what
they were. Image K (0-based, in prompt order, K >= 1) records the same tensors under the prefix
`image.K.`: `image.1.patches`, `image.1.rope.cos` (boundary `image.1.rope`), ... The language
boundaries see every span at once and keep their names.

Both sides wrap their recorder in `ImageRecorder` for image K; nothing here imports torch.
"""
from __future__ import annotations

import re
from typing import Any

PREFIX = "image"
_NAME = re.compile(r"^image\.([1-9]\d*)\.(.+)$")


def prefix(k: int) -> str:
    """The name prefix of image k's vision tensors: none for the first image."""
    if k < 0:
        raise ValueError(f"image index {k} < 0")
    return "" if k == 0 else f"{PREFIX}.{k}."


def split(name: str) -> tuple[int, str]:
    """`image.2.rope.cos` -> (2, `rope.cos`); an unprefixed name is image 0's (or no image's)."""
    m = _NAME.match(name)
    return (int(m.group(1)), m.group(2)) if m else (0, name)


class ImageRecorder:
    """A recorder for image k's vision taps: names and boundaries get `prefix(k)`. Run facts
    (`update_run`) are not an image's to write and go to the wrapped recorder unchanged."""

    def __init__(self, rec, k: int):
        self.rec, self.pre = rec, prefix(k)

    @property
    def enabled(self) -> bool:
        return getattr(self.rec, "enabled", True)

    def record(self, name: str, tensor: Any, *, boundary: str | None = None) -> None:
        # the dump's default boundary (the name before its first '.') would be `image` for all of them
        b = boundary if boundary is not None else name.split(".", 1)[0]
        self.rec.record(self.pre + name, tensor, boundary=self.pre + b)

    def update_run(self, **fields: Any) -> None:
        self.rec.update_run(**fields)
