"""Validation of user images before any model runs: one clear line, never a traceback.

Decoding itself is each side's business (the oracle does what the official code does, the
engine its own decode); this only refuses what neither should be handed.
"""
from __future__ import annotations

import hashlib
import re
import warnings
from pathlib import Path

from tensordiff.errors import BadInput

URL_RE = re.compile(r"\A[A-Za-z][A-Za-z0-9+.\-]*:/")
ORIENTATION = 0x0112  # EXIF tag
ORIENTATIONS = {1: "upright", 2: "mirrored", 3: "rotated 180°", 4: "flipped vertically", 5: "transposed",
                6: "rotated 90° clockwise", 7: "transversed", 8: "rotated 90° counter-clockwise"}
MAX_PIXELS = 64 * 1024 * 1024  # far above any budget; beyond this a file is a decompression bomb
MIN_SIDE = 1
# (path, sha256 of its bytes) -> check_image's facts: a full decode (30 ms for a 1024x701 PNG) is
# done once per content, however often a command checks the file (gate file, request, provenance);
# keyed by the bytes themselves, not a stat, so a file rewritten within a timestamp tick is decoded
# again. The oldest entry goes first beyond CHECKED_KEPT.
_CHECKED: dict[tuple[str, str], dict] = {}
CHECKED_KEPT = 64


def check_image(path: str | Path) -> dict:
    """Refuse unreadable, corrupt, truncated, degenerate or bomb images; return a fingerprint."""
    from PIL import Image, UnidentifiedImageError

    p = Path(path)
    if URL_RE.match(str(path)):  # Path() has already folded "https://" into "https:/"
        raise BadInput(f"--image {path}: URLs are not fetched; download the image first and pass its file")
    if not p.exists():
        raise BadInput(f"image {p} does not exist")
    if not p.is_file():
        raise BadInput(f"image {p} is not a file")
    data = p.read_bytes()
    if not data:
        raise BadInput(f"image {p} is empty (0 bytes)")
    sha = hashlib.sha256(data).hexdigest()
    known = _CHECKED.get((str(p), sha))
    if known is not None:  # these very bytes passed already (a gate checks each image 3 times)
        return dict(known)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Pillow's notes on damaged tags: the verdict below says it once
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(p) as im:
                w, h = im.size
                mode = im.mode
                fmt = im.format
                frames = int(getattr(im, "n_frames", 1) or 1)
                orientation = im.getexif().get(ORIENTATION)
                if w * h > MAX_PIXELS:
                    raise BadInput(f"image {p} is {w}x{h} = {w * h} pixels, over the {MAX_PIXELS} limit (decompression bomb?)")
                im.load()  # a truncated file fails here, not later inside a model
    except BadInput:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise BadInput(f"image {p} is too large to decode safely (decompression bomb)") from None
    except UnidentifiedImageError:
        raise BadInput(f"image {p} is not an image Pillow can read (corrupt or unknown format)") from None
    except Exception as e:  # noqa: BLE001 - a damaged file makes Pillow raise IndexError, struct.error, ...
        raise BadInput(f"image {p} is corrupt or truncated ({type(e).__name__}: {str(e)[:200]})".replace("\n", " ")) from None
    if min(w, h) < MIN_SIDE:
        raise BadInput(f"image {p} is {w}x{h}: too small to plan a patch grid (at least {MIN_SIDE} px each side)")
    facts = {"path": str(p), "sha256": sha, "width": w, "height": h, "mode": mode, "format": fmt,
             **file_facts(frames, orientation)}
    if len(_CHECKED) >= CHECKED_KEPT:
        _CHECKED.pop(next(iter(_CHECKED)))
    _CHECKED[(str(p), sha)] = facts
    return dict(facts)


def file_facts(frames: int, orientation) -> dict:
    """What a dump's run.inputs.image records (`provenance.describe_image`) about the picture beyond its pixels: how many frames
    it has (both sides decode the first only) and its EXIF orientation tag (DeepSeek ignores it,
    as the official code does; Qwen3-VL applies it, as transformers does)."""
    return {"frames": frames, "frame_used": 0,
            "exif_orientation": int(orientation) if isinstance(orientation, int) else None}


def notes(run: dict) -> list[str]:
    """Report notes about the picture a run recorded (`file_facts`)."""
    f = ((run or {}).get("inputs") or {}).get("image")
    if not isinstance(f, dict):
        return []
    out = []
    if isinstance(f.get("frames"), int) and f["frames"] > 1:
        out.append(f"the image has {f['frames']} frames (animated GIF / multi-frame TIFF); only the first was used")
    o = f.get("exif_orientation")
    if isinstance(o, int) and o != 1:
        out.append(f"the image has EXIF orientation {o} ({ORIENTATIONS.get(o, 'unknown')}): DeepSeek V4.1 Flash ignores "
                   "it (as the official code does), Qwen3-VL rotates the picture (as transformers does), so their "
                   "patch grids can differ")
    return out


def default_image_path() -> Path:
    """The embedded default picture (generated once, deterministic, no download)."""
    here = Path(__file__).resolve().parents[1] / "data" / "default.png"
    if not here.exists():
        raise BadInput(f"the embedded default image is missing from the install ({here})")
    return here
