"""The resize plan: the pixel size a picture is resampled to before it is cut into patches.

Qwen2-VL's smart_resize, as the image processor of the pinned transformers runs it: both sides
are rounded (Python's round, half to even) to a multiple of `factor` = patch x merge; if the area
leaves [min_pixels, max_pixels], both are rescaled by one factor beta, floored when shrinking,
ceiled when growing. (qwen-vl-utils differs: its own min of 4096 px and max(factor, round(..)).)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import EngineInputError
from ..runtime.sizing import Rounding, ceil_to, floor_to, to_int

MAX_ASPECT = 200


@dataclass(frozen=True)
class ResizePlan:
    height: int  # source
    width: int
    resized_height: int
    resized_width: int
    patch_size: int
    merge_size: int

    @property
    def grid(self) -> tuple[int, int]:  # patches (gh, gw)
        return self.resized_height // self.patch_size, self.resized_width // self.patch_size

    shrunk: bool = False  # the max_pixels branch ran
    grown: bool = False  # the min_pixels branch ran

    @property
    def cells(self) -> tuple[int, int]:  # merged tokens (gh/m, gw/m)
        gh, gw = self.grid
        return gh // self.merge_size, gw // self.merge_size

    def record(self) -> dict:
        """The decisions as int64 tensors, the `plan` boundary (one temporal patch group)."""
        import torch

        def ints(*v):
            return torch.tensor(v, dtype=torch.int64)

        (gh, gw), (ch, cw) = self.grid, self.cells
        return {"plan.size": ints(self.width, self.height, self.resized_width, self.resized_height),
                "plan.grid": ints(1, gh, gw, ch, cw),
                "plan.tokens": ints(gh * gw, ch * cw),
                "plan.flags": ints(int(self.shrunk), int(self.grown))}


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int,
                 sides: Rounding = "round") -> tuple[int, int]:
    """`sides` is "round" (the official rule); "ceil" is the planted `resize-ceil-sides` bug."""
    if min(height, width) <= 0:
        raise EngineInputError(f"image of {width}x{height} pixels has no area")
    if max(height, width) / min(height, width) > MAX_ASPECT:
        raise EngineInputError(f"image of {width}x{height} pixels has an aspect ratio over {MAX_ASPECT}:1, which "
                               f"Qwen3-VL refuses; crop or pad it to under {MAX_ASPECT}:1")
    h, w = rounded(height, width, factor, sides)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, floor_to(height / beta, factor))
        w = max(factor, floor_to(width / beta, factor))
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = ceil_to(height * beta, factor)
        w = ceil_to(width * beta, factor)
    return h, w


def rounded(height: int, width: int, factor: int, sides: Rounding = "round") -> tuple[int, int]:
    """Both sides to the nearest multiple of `factor`: the size before any pixel limit."""
    return to_int(height / factor, sides) * factor, to_int(width / factor, sides) * factor


def plan(height: int, width: int, patch_size: int, merge_size: int, min_pixels: int, max_pixels: int,
         sides: Rounding = "round") -> ResizePlan:
    h, w = smart_resize(height, width, patch_size * merge_size, min_pixels, max_pixels, sides)
    fh, fw = rounded(height, width, patch_size * merge_size, sides)
    return ResizePlan(height, width, h, w, patch_size, merge_size, shrunk=h * w < fh * fw, grown=h * w > fh * fw)
