"""Validation of user images before any model runs: one clear line, never a traceback.

Decoding itself is each side's business (the oracle does what the official code does, the
engine its own decode); this only refuses what neither should be handed.
"""
from __future__ import annotations

import hashlib
import warnings
from pathlib import Path

from .errors import BadInput

MAX_PIXELS = 64 * 1024 * 1024  # far above any budget; beyond this a file is a decompression bomb
MIN_SIDE = 1


def check_image(path: str | Path) -> dict:
    """Refuse unreadable, corrupt, truncated, degenerate or bomb images; return a fingerprint."""
    from PIL import Image, UnidentifiedImageError

    p = Path(path)
    if not p.exists():
        raise BadInput(f"image {p} does not exist")
    if not p.is_file():
        raise BadInput(f"image {p} is not a file")
    data = p.read_bytes()
    if not data:
        raise BadInput(f"image {p} is empty (0 bytes)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(p) as im:
                w, h = im.size
                mode = im.mode
                fmt = im.format
                if w * h > MAX_PIXELS:
                    raise BadInput(f"image {p} is {w}x{h} = {w * h} pixels, over the {MAX_PIXELS} limit (decompression bomb?)")
                im.load()  # a truncated file fails here, not later inside a model
    except BadInput:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise BadInput(f"image {p} is too large to decode safely (decompression bomb)") from None
    except UnidentifiedImageError:
        raise BadInput(f"image {p} is not an image Pillow can read (corrupt or unknown format)") from None
    except (OSError, SyntaxError, ValueError) as e:
        raise BadInput(f"image {p} is corrupt or truncated ({e})") from None
    if min(w, h) < MIN_SIDE:
        raise BadInput(f"image {p} is {w}x{h}: too small to plan a patch grid (at least {MIN_SIDE} px each side)")
    return {"path": str(p), "sha256": hashlib.sha256(data).hexdigest(), "width": w, "height": h,
            "mode": mode, "format": fmt}


def default_image_path() -> Path:
    """The embedded default picture (generated once, deterministic, no download)."""
    here = Path(__file__).parent / "data" / "default.png"
    if not here.exists():
        raise BadInput(f"the embedded default image is missing from the install ({here})")
    return here
