"""Integer geometry of image preprocessing: multiples, minimum-area upscales, contain and centring.

Pure functions of their arguments (no images), so a preprocessing plan can be computed, printed
and tested before a pixel is touched. Rounding is explicit because it is where engines drift:
`round` is Python's round (halves to even), as Pillow uses it.
"""
from __future__ import annotations

import math
from typing import Literal

Rounding = Literal["round", "ceil", "floor", "trunc"]

_ROUND = {"round": round, "ceil": math.ceil, "floor": math.floor, "trunc": int}


def to_int(x: float, rounding: Rounding = "round") -> int:
    return int(_ROUND[rounding](x))


def ceil_to(x: float, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= x."""
    return math.ceil(x / multiple) * multiple


def floor_to(x: float, multiple: int) -> int:
    return math.floor(x / multiple) * multiple


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def below_min_pixels(width: int, height: int, min_pixels: int) -> bool:
    return 0 < width * height < min_pixels


def upscale_to_min_pixels(width: int, height: int, min_pixels: int) -> tuple[int, int]:
    """Scale (width, height) up, keeping the aspect, until the area reaches about `min_pixels`;
    each side is truncated (so the result may fall just short). Larger images pass unchanged."""
    area = width * height
    if not below_min_pixels(width, height, min_pixels):
        return width, height
    ratio = (min_pixels / area) ** 0.5
    return int(width * ratio), int(height * ratio)


def contain_size(width: int, height: int, box_w: int, box_h: int,
                 rounding: Rounding = "round") -> tuple[int, int]:
    """The largest (w, h) with the source aspect inside box_w x box_h; the long side fills the box.

    The short side is computed in floating point exactly as Pillow's `ImageOps.contain` does it
    (`h / w * box_w` for a source wider than the box, else `w / h * box_h`), because at a tie
    the order of the float operations decides the rounding.
    """
    src_ratio, box_ratio = width / height, box_w / box_h
    if src_ratio == box_ratio:
        return box_w, box_h
    if src_ratio > box_ratio:
        return box_w, to_int(height / width * box_w, rounding)
    return to_int(width / height * box_h, rounding), box_h


def centre_offset(box: int, inner: int, centering: float = 0.5, rounding: Rounding = "round") -> int:
    """Where an `inner`-long run starts inside `box` to sit at `centering` (0 left, 1 right)."""
    return to_int((box - inner) * max(0.0, min(centering, 1.0)), rounding)
