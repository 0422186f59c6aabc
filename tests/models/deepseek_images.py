"""Test pictures for the DeepSeek V4.1 Flash vision path, written into a directory on demand.

Photographs from scikit-image (astronaut 512x512, chelsea 451x300, coffee 600x400: all three
trigger the minimum-pixel upscale) and generated pictures for each branch and decode mode.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def _smooth(h: int, w: int, seed: int) -> np.ndarray:
    """A deterministic picture with gradients and texture (bicubic has something to do)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = np.stack([x / max(w - 1, 1), y / max(h - 1, 1), (x + y) / max(h + w - 2, 1)], -1) * 200
    noise = rng.normal(0, 25, (h, w, 3))
    return np.clip(base + noise + 20 * np.sin(x / 7)[..., None], 0, 255).astype(np.uint8)


def _photo(name: str) -> Image.Image:
    import skimage.data

    return Image.fromarray(getattr(skimage.data, name)())


IMAGES = {
    # name: (maker, what it exercises)
    "astronaut": (lambda: _photo("astronaut"), "photograph, square, min-pixel upscale"),
    "chelsea": (lambda: _photo("chelsea"), "photograph, min-pixel upscale"),
    "coffee": (lambda: _photo("coffee"), "photograph, min-pixel upscale"),
    "tiny": (lambda: Image.fromarray(_smooth(14, 20, 1)), "20x14: large upscale"),
    "over-budget": (lambda: Image.fromarray(_smooth(1400, 2000, 2)), "2000x1400: token budget solve"),
    "wide": (lambda: Image.fromarray(_smooth(40, 1200, 3)), "1200x40: wide, upscaled"),
    "tall": (lambda: Image.fromarray(_smooth(1200, 40, 4)), "40x1200: tall, upscaled"),
    "gray": (lambda: Image.fromarray(_smooth(200, 300, 5)[..., 0], "L"), "grayscale L"),
    "rgba": (lambda: Image.fromarray(np.dstack([_smooth(210, 290, 6), _smooth(210, 290, 7)[..., :1]]), "RGBA"),
             "RGBA with varying alpha (dropped, not composited)"),
    "palette": (lambda: Image.fromarray(_smooth(180, 320, 8)).quantize(64), "palette P"),
    "gray16": (lambda: Image.fromarray(_smooth(200, 260, 9)[..., 1].astype(np.uint16) * 257),
               "16-bit grayscale"),
    "default": (None, "the embedded 1024x701 default"),
}

# Degenerate aspects: the collapse branches of the budget solve (about 9,000 patches each).
COLLAPSE = {
    "very-wide": (lambda: Image.fromarray(_smooth(40, 50000, 10)), "50000x40: one token row"),
    "very-tall": (lambda: Image.fromarray(_smooth(50000, 40, 11)), "40x50000: one token column"),
}


def image_path(name: str, directory: Path) -> Path:
    if name == "default":
        from tensordiff.pipeline.inputs import default_image_path

        return default_image_path()
    maker = (IMAGES.get(name) or COLLAPSE[name])[0]
    path = Path(directory) / f"{name}.png"
    if not path.exists():
        maker().save(path)
    return path
