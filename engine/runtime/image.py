"""Image decode: a file to an RGB picture, the way Pillow's `convert("RGB")` defines it.

Every model we serve takes RGB. Pillow's conversion is the semantics (the official DeepSeek and
Qwen preprocessors both call it): an alpha channel is dropped, not composited over a background;
palette images expand through their palette; grayscale is replicated; 16-bit images go through
Pillow's own mode conversion. Decoding stays in Pillow so that those rules are not re-derived.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from ..errors import EngineInputError


def open_rgb(path: str | Path) -> Image.Image:
    """Decode `path` fully into an RGB `PIL.Image`; unreadable input raises EngineInputError."""
    p = Path(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(p) as source:
                source.load()
                return source.convert("RGB")
    except FileNotFoundError:
        raise EngineInputError(f"image {p} does not exist") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise EngineInputError(f"image {p} is too large to decode safely (decompression bomb)") from None
    except UnidentifiedImageError:
        raise EngineInputError(f"image {p} is not an image Pillow can read") from None
    except (OSError, SyntaxError, ValueError) as e:
        raise EngineInputError(f"image {p} is corrupt or truncated ({e})") from None


def resize(image: Image.Image, size: tuple[int, int], resample: str = "bicubic") -> Image.Image:
    """Pillow resize to `size` = (width, height); `resample` by name (bicubic, bilinear, nearest)."""
    filters = {"bicubic": Image.Resampling.BICUBIC, "bilinear": Image.Resampling.BILINEAR,
               "nearest": Image.Resampling.NEAREST, "lanczos": Image.Resampling.LANCZOS}
    return image.resize(tuple(size), resample=filters[resample])


def to_array(image: Image.Image) -> np.ndarray:
    """An RGB picture as uint8 [H, W, 3] (C-contiguous)."""
    return np.array(image, dtype=np.uint8, copy=True, order="C")  # writable: torch shares it


def paste_on_canvas(pixels: np.ndarray, size: tuple[int, int], offset: tuple[int, int],
                    fill: tuple[int, ...]) -> np.ndarray:
    """`pixels` [h, w, C] placed at offset (x, y) on a [H, W, C] canvas of `fill`, size = (W, H)."""
    width, height = size
    h, w, c = pixels.shape
    x, y = offset
    if x < 0 or y < 0 or x + w > width or y + h > height:
        raise ValueError(f"a {w}x{h} picture at {offset} does not fit a {width}x{height} canvas")
    canvas = np.empty((height, width, c), dtype=pixels.dtype)
    canvas[...] = np.asarray(fill, dtype=pixels.dtype)
    canvas[y:y + h, x:x + w] = pixels
    return canvas
