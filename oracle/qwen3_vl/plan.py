"""The `plan` boundary of the oracle: the discrete decisions the official image processor made.

Sizes and grid come from what the processor returned (`image_grid_thw`); which branch of the
official `smart_resize` ran (shrunk to `max_pixels`, grown to `min_pixels`) is read off the
official function itself, called once more without limits: a clamped area differs from the
unclamped one exactly when a branch ran.
"""
from __future__ import annotations

import importlib
import math

import torch


def plan_record(proc, image, grid_thw) -> dict[str, torch.Tensor]:
    """plan.size [src_w, src_h, resized_w, resized_h], plan.grid [t, patch_h, patch_w, cell_h,
    cell_w], plan.tokens [patch rows, merged tokens], plan.flags [shrunk to max_pixels, grown to
    min_pixels], int64."""
    smart_resize = importlib.import_module(type(proc).__module__).smart_resize
    t, gh, gw = (int(v) for v in grid_thw[0])
    p, m = int(proc.patch_size), int(proc.merge_size)
    rh, rw = gh * p, gw * p
    free_h, free_w = smart_resize(image.height, image.width, factor=p * m, min_pixels=0, max_pixels=math.inf)

    def ints(*v):
        return torch.tensor(v, dtype=torch.int64)

    return {"plan.size": ints(image.width, image.height, rw, rh),
            "plan.grid": ints(t, gh, gw, gh // m, gw // m),
            "plan.tokens": ints(gh * gw, (gh // m) * (gw // m)),
            "plan.flags": ints(int(rh * rw < free_h * free_w), int(rh * rw > free_h * free_w))}
