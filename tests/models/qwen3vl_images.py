"""Test pictures for the Qwen3-VL differential tests (written into a tmp dir, deterministic)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def _photo(name: str) -> np.ndarray:
    import skimage.data

    a = getattr(skimage.data, name)()
    return np.stack([a] * 3, -1) if a.ndim == 2 else a[..., :3]


def make_images(root: Path) -> dict[str, Path]:
    """name -> PNG path. Sizes chosen against the tiny budget (64x64 .. 256x256 px, factor 32)."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    pics = {
        "astronaut": _photo("astronaut"),  # 512x512: shrinks to 256x256, a 16x16 grid
        "chelsea": _photo("chelsea"),  # 451x300 photo, non-square grid
        "coffee": _photo("coffee"),
        "tiny": rng.integers(0, 256, (21, 27, 3), dtype=np.uint8),  # grows to the 64x64 floor
        "wide": _photo("rocket")[150:230, :],  # 640x80: a 4x22 grid
        "tall": _photo("astronaut")[:, 200:260],  # 60x512
        # 112x80: 80/32 = 2.5 rounds down (half to even) to 64, 112/32 = 3.5 rounds up to 128
        "rounding": np.asarray(Image.fromarray(_photo("coffee")).resize((112, 80), Image.Resampling.LANCZOS)),
    }
    out = {}
    for name, arr in pics.items():
        p = root / f"{name}.png"
        Image.fromarray(np.ascontiguousarray(arr)).save(p)
        out[name] = p
    # a camera JPEG stored sideways: EXIF orientation 6 turns 200x120 into 120x200 on load
    exif = Image.Exif()
    exif[0x0112] = 6
    p = root / "exif.jpg"
    Image.fromarray(_photo("chelsea")[50:170, 100:300]).save(p, quality=90, exif=exif)
    out["exif"] = p
    # RGBA and palette pictures: both sides take Pillow's convert("RGB") (alpha dropped)
    rgba = np.concatenate([_photo("coffee")[:200, :300], rng.integers(0, 256, (200, 300, 1), dtype=np.uint8)], -1)
    Image.fromarray(rgba, "RGBA").save(root / "rgba.png")
    Image.fromarray(_photo("chelsea")).quantize(64).save(root / "palette.png")
    out["rgba"], out["palette"] = root / "rgba.png", root / "palette.png"
    return out
