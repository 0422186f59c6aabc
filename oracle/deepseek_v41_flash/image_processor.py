"""Image preprocessing as the official `inference/image_processor.py` does it.

An image becomes a patch grid (`n_vit_h x n_vit_w`, 14 px patches) for the ViT, and a token grid
(`n_llm_h x n_llm_w`) after the aligner's 3x3 downsample. The language model sees the token grid
as the span

    [IMAGE_START] + ([IMAGE] * n_llm_w + [IMAGE_NEW_LINE]) * n_llm_h + [IMAGE_END]

with `image_token_id` at every position; only the token types tell the positions apart.

Pillow does the resize and the gray padding (`ImageOps.pad`), as upstream: the oracle inherits
Pillow's rounding, so the Pillow version is recorded in every dump.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from PIL import Image, ImageOps

TEXT = -1
IMAGE_START, IMAGE, IMAGE_NEW_LINE, IMAGE_END = 0, 1, 2, 3
PAD_COLOR = (127, 127, 127)


def num_image_tokens(n_llm_h: int, n_llm_w: int) -> int:
    """Span length: one start, one end, and a newline closing every token row."""
    return n_llm_h * (n_llm_w + 1) + 2


def llm_grid(best_height: int, best_width: int, patch_size: int, downsample_ratio: int) -> tuple[int, int]:
    """The aligner's token grid for a pixel size (a partial 3x3 cell still makes a token)."""
    n_h = math.ceil((best_height // patch_size) / downsample_ratio)
    n_w = math.ceil((best_width // patch_size) / downsample_ratio)
    return n_h, n_w


def solve_resize_ratio(height, width, patch_size, downsample_ratio, max_n_token) -> tuple[int, int]:
    """The largest aspect-keeping pixel size (height, width) whose span fits `max_n_token`.

    With r = h/w and a w_tok x h_tok token grid, the span costs h_tok * (w_tok + 1) + 2; solving
    r * w^2 + r * w = N - 2 for w gives the float bound below.
    """
    r = height / width
    max_w = math.sqrt((max_n_token - 2) / r + 0.25) - 0.5
    max_h = max_w * r
    cell = patch_size * downsample_ratio
    if max_w < 1.0:  # too tall for even one token column at full height
        return (max_n_token - 2) // 2 * cell, cell
    if max_h < 1.0:  # too wide for even one token row
        return cell, (max_n_token - 3) * cell
    beta = min(math.floor(max_w) * cell / width, math.floor(max_h) * cell / height)
    new_h = math.floor(height * beta / patch_size) * patch_size
    new_w = math.floor(width * beta / patch_size) * patch_size
    return new_h, new_w


def safe_resize(height, width, best_height, best_width, patch_size, downsample_ratio, max_n_token):
    """(n_llm_h, n_llm_w, best_height, best_width), shrunk when the span would exceed the budget."""
    n_llm_h, n_llm_w = llm_grid(best_height, best_width, patch_size, downsample_ratio)
    if num_image_tokens(n_llm_h, n_llm_w) > max_n_token:
        best_height, best_width = solve_resize_ratio(height, width, patch_size, downsample_ratio, max_n_token)
        n_llm_h, n_llm_w = llm_grid(best_height, best_width, patch_size, downsample_ratio)
        assert num_image_tokens(n_llm_h, n_llm_w) <= max_n_token, (n_llm_h, n_llm_w)
    return n_llm_h, n_llm_w, best_height, best_width


def plan_image_grid(width: int, height: int, args) -> tuple[int, int, int, int]:
    """Resize plan for an image of this size: (n_llm_h, n_llm_w, best_height, best_width).

    A pure function of its arguments. Small images are first scaled up (truncating) to reach
    `vision_min_pixels`; the pixel size is then rounded up to whole patches.
    """
    return plan_with_decisions(width, height, args)[0]


def plan_with_decisions(width: int, height: int, args) -> tuple[tuple[int, int, int, int], bool, bool]:
    """`plan_image_grid`'s result and the two branches it took: (plan, scaled up to the minimum
    pixels, re-solved for the token budget). The tensordiff `plan` boundary records them."""
    p = args.vision_patch_size
    if args.vision_max_wh_ratio is not None and width > height * args.vision_max_wh_ratio:
        width = height * args.vision_max_wh_ratio
    upscaled = 0 < width * height < args.vision_min_pixels
    if upscaled:
        ratio = (args.vision_min_pixels / (width * height)) ** 0.5
        width = int(width * ratio)
        height = int(height * ratio)
    best_width = math.ceil(width / p) * p
    best_height = math.ceil(height / p) * p
    solved = num_image_tokens(*llm_grid(best_height, best_width, p, args.vision_downsample_ratio)) > args.vision_max_n_token
    return (safe_resize(height, width, best_height, best_width, p, args.vision_downsample_ratio,
                        args.vision_max_n_token), upscaled, solved)


def plan_record(path, args) -> dict[str, torch.Tensor]:
    """The discrete preprocessing decisions of one image as int64 tensors (the `plan` boundary):
    plan.size [src_w, src_h, canvas_w, canvas_h, content_w, content_h, offset_x, offset_y],
    plan.grid [patch_h, patch_w, cell_h, cell_w], plan.tokens [patches, span],
    plan.flags [scaled up to vision_min_pixels, re-solved for vision_max_n_token].
    The content size is what Pillow's contain (inside `ImageOps.pad`) gives; the offset is pad's
    centring, round((canvas - content) / 2) on the short side."""
    image = open_rgb(path)
    (n_llm_h, n_llm_w, best_height, best_width), upscaled, solved = plan_with_decisions(image.width, image.height, args)
    p = args.vision_patch_size
    if args.vision_max_wh_ratio is not None and image.width >= args.vision_max_wh_ratio * image.height:
        cw, ch, ox, oy = best_width, best_height, 0, 0  # stretched, no pad
    else:
        cw, ch = ImageOps.contain(image, (best_width, best_height)).size
        ox, oy = (round((best_width - cw) * 0.5), 0) if cw != best_width else (0, round((best_height - ch) * 0.5))
    def ints(*v):
        return torch.tensor(v, dtype=torch.int64)

    return {"plan.size": ints(image.width, image.height, best_width, best_height, cw, ch, ox, oy),
            "plan.grid": ints(best_height // p, best_width // p, n_llm_h, n_llm_w),
            "plan.tokens": ints((best_height // p) * (best_width // p), num_image_tokens(n_llm_h, n_llm_w)),
            "plan.flags": ints(int(upscaled), int(solved))}


def open_rgb(path) -> Image.Image:
    """Every mode goes through Pillow's own `convert("RGB")`: alpha is dropped, not composited."""
    with Image.open(path) as source:
        return source.convert("RGB")


def load_image(path, args):
    """One image file -> (patches [N, 3, p, p] bf16, n_vit_h, n_vit_w, n_llm_h, n_llm_w).

    The patches are bf16 whatever dtype the tower runs in: the cast happens here, before patching.
    """
    p = args.vision_patch_size
    image = open_rgb(path)
    n_llm_h, n_llm_w, best_height, best_width = plan_image_grid(image.width, image.height, args)
    n_vit_h, n_vit_w = best_height // p, best_width // p
    if args.vision_max_wh_ratio is not None and image.width >= args.vision_max_wh_ratio * image.height:
        image = image.resize((best_width, best_height))
    else:
        image = ImageOps.pad(image, (best_width, best_height), color=PAD_COLOR)
    x = torch.from_numpy(np.asarray(image, dtype=np.float32)).permute(2, 0, 1) / 255  # [3, H, W]
    x = ((x - 0.5) / 0.5).to(torch.bfloat16)
    # [3, gh*p, gw*p] -> [gh, gw, 3, p, p]: raster order over the grid, (c, y, x) inside a patch
    patches = x.reshape(3, n_vit_h, p, n_vit_w, p).permute(1, 3, 0, 2, 4).reshape(n_vit_h * n_vit_w, 3, p, p)
    return patches, n_vit_h, n_vit_w, n_llm_h, n_llm_w


def image_token_types(n_llm_h: int, n_llm_w: int) -> torch.Tensor:
    """Token types of one image span, the token grid in reading order."""
    row = [IMAGE] * n_llm_w + [IMAGE_NEW_LINE]
    return torch.tensor([IMAGE_START] + row * n_llm_h + [IMAGE_END], dtype=torch.int64)
