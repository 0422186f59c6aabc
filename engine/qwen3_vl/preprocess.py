"""Picture -> `pixel_values` rows: decode, smart_resize, bicubic resample, normalise, patchify.

The rows are patches of P x P pixels over T = temporal_patch_size frames (a still picture repeats
its one frame), columns ordered (c, t, py, px) -- the flattening of the Conv3d kernel -- and rows
in 2x2-merge order (the four patches of one merged token are adjacent).

Two processor semantics, as transformers has two Qwen2-VL image processors:
- "pil" (slow): Pillow BICUBIC on uint8, then float32(x * (1/255) in float64), then (x - mean) / std.
- "torchvision" (fast, what the checkpoint asks for): torch's antialiased uint8 bicubic (CPU),
  then (x - 255·mean) / (255·std) in float32.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import EngineInputError
from ..runtime import interpolate, patches
from .config import ProcessorConfig
from .smart_resize import ResizePlan, plan

PROCESSORS = ("pil", "torchvision")


@dataclass(frozen=True)
class Pixels:
    pixel_values: torch.Tensor  # [N, C*T*P*P] float32, rows in merge order
    plan: ResizePlan
    processor: str

    @property
    def grid_thw(self) -> tuple[int, int, int]:
        return (1, *self.plan.grid)


def decode(path: Path) -> np.ndarray:
    """[H, W, 3] uint8 RGB, EXIF orientation applied (as transformers' load_image does)."""
    from PIL import Image, ImageOps

    try:
        with Image.open(path) as im:
            im = ImageOps.exif_transpose(im)
            return np.asarray(im.convert("RGB"), dtype=np.uint8).copy()
    except OSError as e:
        raise EngineInputError(f"cannot decode image {path}: {e}") from None


def normalise(img: np.ndarray, cfg: ProcessorConfig, processor: str) -> torch.Tensor:
    """[H, W, 3] uint8 -> [3, H, W] float32."""
    x = torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1)
    mean = torch.tensor(cfg.image_mean, dtype=torch.float32).view(-1, 1, 1)
    std = torch.tensor(cfg.image_std, dtype=torch.float32).view(-1, 1, 1)
    if processor == "pil":
        x = (x.double() * cfg.rescale_factor).float()  # rescale in float64, then float32
        return (x - mean) / std
    # the fast processor folds the rescale into mean and std: mean·(1/scale), 127.5 exactly
    # (mean / scale in fp32 would round the divisor first and land one ulp below)
    return (x.float() - mean * (1.0 / cfg.rescale_factor)) / (std * (1.0 / cfg.rescale_factor))


def patchify(image: torch.Tensor, cfg: ProcessorConfig, raster: bool = False) -> torch.Tensor:
    """image: [C, H, W] -> [gh*gw, C*T*P*P]; rows in merge order (raster order if `raster`,
    the planted `merge-order-raster` bug)."""
    c = image.shape[0]
    p, t, m = cfg.patch_size, cfg.temporal_patch_size, cfg.merge_size
    rows = patches.patchify(image.permute(1, 2, 0), p, merge=1 if raster else m)  # [N, C*P*P], (c, y, x)
    n = rows.shape[0]
    # a still picture is T identical frames: columns (c, t, py, px)
    rows = rows.view(n, c, 1, p * p).expand(n, c, t, p * p)
    return rows.reshape(n, c * t * p * p).contiguous()


def preprocess(img: np.ndarray, cfg: ProcessorConfig, processor: str, raster: bool = False,
               ceil_sides: bool = False) -> Pixels:
    """`raster` / `ceil_sides`: the planted `merge-order-raster` / `resize-ceil-sides` bugs."""
    if processor not in PROCESSORS:
        raise EngineInputError(f"unknown image processor {processor!r} ({' or '.join(PROCESSORS)})")
    height, width = img.shape[:2]
    rp = plan(height, width, cfg.patch_size, cfg.merge_size, cfg.shortest_edge, cfg.longest_edge,
              "ceil" if ceil_sides else "round")
    if (rp.resized_height, rp.resized_width) != (height, width):
        resize = interpolate.resize_bicubic_pil if processor == "pil" else interpolate.resize_bicubic_aa_torch
        img = resize(img, rp.resized_height, rp.resized_width)
    x = normalise(img, cfg, processor)
    return Pixels(patchify(x, cfg, raster=raster), rp, processor)
