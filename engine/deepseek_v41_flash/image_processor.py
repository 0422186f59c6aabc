"""Preprocessing as an explicit plan: every size, offset and count decided before any pixel moves.

    plan = plan_image(width, height, cfg)      # pure integers, printable, testable
    pixels = render(image, plan)               # bicubic resize, paste on 127 gray: uint8 [H, W, 3]
    patches = patch_rows(pixels, cfg, device)  # [N, 588] bf16, raster order, (c, y, x) per row

Semantics (the official processor, restated): small images scale up to about
`vision_min_pixels` (sides truncated); sides round up to whole patches; if the image span
(start, end, one newline per token row) would exceed `vision_max_n_token`, the size is solved
again in closed form for the largest fitting token grid; the picture is then contained (long side
fills, short side rounded as Pillow does), centred on a 127-gray canvas, normalised to [-1, 1] and
cast to bf16 before patching.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from engine.errors import EngineInputError
from engine.runtime import image as rimage
from engine.runtime import patches as rpatches
from engine.runtime import sizing
from engine.deepseek_v41_flash.config import Config

GRAY = (127, 127, 127)
MEAN, STD = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)


@dataclass(frozen=True)
class ImagePlan:
    source: tuple[int, int]  # (w, h) as decoded
    target: tuple[int, int]  # (w, h) canvas in pixels, whole patches
    content: tuple[int, int]  # (w, h) of the resized picture on the canvas
    offset: tuple[int, int]  # (x, y) where it is pasted
    grid: tuple[int, int]  # (h, w) patches
    cells: tuple[int, int]  # (h, w) tokens after the aligner
    budget_solved: bool  # the token budget forced a second sizing
    upscaled: bool = False  # scaled up to about vision_min_pixels first

    def record(self) -> dict[str, torch.Tensor]:
        """The decisions as int64 tensors, the `plan` boundary (names and layout in
        tensordiff's contract): size, grid, token counts, the two sizing branches taken."""
        def ints(*v):
            return torch.tensor(v, dtype=torch.int64)

        return {"plan.size": ints(*self.source, *self.target, *self.content, *self.offset),
                "plan.grid": ints(*self.grid, *self.cells),
                "plan.tokens": ints(self.n_patches, self.span),
                "plan.flags": ints(int(self.upscaled), int(self.budget_solved))}

    @property
    def n_patches(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def span(self) -> int:
        return span_length(*self.cells)


def span_length(cells_h: int, cells_w: int) -> int:
    return cells_h * (cells_w + 1) + 2


def token_grid(px_h: int, px_w: int, cfg: Config) -> tuple[int, int]:
    r, p = cfg.vision_downsample_ratio, cfg.vision_patch_size
    return sizing.ceil_div(px_h // p, r), sizing.ceil_div(px_w // p, r)


def fit_budget(height: int, width: int, cfg: Config) -> tuple[int, int]:
    """(px_h, px_w) of the largest aspect-keeping token grid whose span fits the budget.

    A grid of w tokens across has about w * r rows (r = h / w), and costs h_tok * (w + 1) + 2
    positions, so the widest grid solves r * w * (w + 1) = budget - 2. Degenerate aspects collapse
    to a single token column or row.
    """
    budget, cell, p = cfg.vision_max_n_token, cfg.cell, cfg.vision_patch_size
    aspect = height / width
    w_tok = math.sqrt((budget - 2) / aspect + 0.25) - 0.5
    h_tok = w_tok * aspect
    if w_tok < 1.0:
        return (budget - 2) // 2 * cell, cell
    if h_tok < 1.0:
        return cell, (budget - 3) * cell
    scale = min(math.floor(w_tok) * cell / width, math.floor(h_tok) * cell / height)
    return sizing.floor_to(height * scale, p), sizing.floor_to(width * scale, p)


def plan_image(width: int, height: int, cfg: Config, *, contain_rounding: sizing.Rounding = "round") -> ImagePlan:
    """The whole plan for a decoded width x height picture (a pure function)."""
    if width < 1 or height < 1:
        raise EngineInputError(f"cannot plan a {width}x{height} image")
    if cfg.vision_max_wh_ratio is not None:
        raise EngineInputError("vision_max_wh_ratio is set in the config; this engine implements only the "
                               "released setting (null)")
    p = cfg.vision_patch_size
    w, h = sizing.upscale_to_min_pixels(width, height, cfg.vision_min_pixels)
    px_w, px_h = sizing.ceil_to(w, p), sizing.ceil_to(h, p)
    cells = token_grid(px_h, px_w, cfg)
    solved = span_length(*cells) > cfg.vision_max_n_token
    if solved:
        px_h, px_w = fit_budget(h, w, cfg)
        cells = token_grid(px_h, px_w, cfg)
        if span_length(*cells) > cfg.vision_max_n_token:
            raise AssertionError(f"budget solve left {span_length(*cells)} tokens for {width}x{height}")
    cw, ch = sizing.contain_size(width, height, px_w, px_h, contain_rounding)
    if (cw, ch) == (px_w, px_h):
        offset = (0, 0)
    elif cw != px_w:
        offset = (sizing.centre_offset(px_w, cw), 0)
    else:
        offset = (0, sizing.centre_offset(px_h, ch))
    return ImagePlan(source=(width, height), target=(px_w, px_h), content=(cw, ch), offset=offset,
                     grid=(px_h // p, px_w // p), cells=cells, budget_solved=solved,
                     upscaled=sizing.below_min_pixels(width, height, cfg.vision_min_pixels))


def render(picture, plan: ImagePlan) -> np.ndarray:
    """RGB PIL picture -> uint8 [H, W, 3] canvas per the plan."""
    if tuple(picture.size) != plan.source:
        raise ValueError(f"plan is for {plan.source}, picture is {picture.size}")
    if plan.content[0] <= 0 or plan.content[1] <= 0:
        raise EngineInputError(f"image {plan.source} collapses to {plan.content} pixels in a {plan.target} canvas")
    resized = rimage.to_array(rimage.resize(picture, plan.content, "bicubic"))
    if plan.content == plan.target:
        return resized
    return rimage.paste_on_canvas(resized, plan.target, plan.offset, GRAY)


_TABLES: dict = {}


def patch_rows(pixels: np.ndarray, cfg: Config, device="cpu") -> torch.Tensor:
    """uint8 [H, W, 3] -> bf16 [N, 3*p*p]: cut on the device, normalised by table."""
    dev = torch.device(device)
    key = str(dev)
    if key not in _TABLES:  # bf16 table: the cast happens before patching, as the official path
        _TABLES[key] = rpatches.normalize_table(MEAN, STD, 1 / 255, torch.bfloat16, dev)
    rows = rpatches.patchify(rpatches.to_device_pixels(pixels, dev), cfg.vision_patch_size)
    return rpatches.apply_table(rows, _TABLES[key], 3)
