"""The image processor transformers picks for the checkpoint, and which one ran.

transformers 5.x has a torchvision backend (`Qwen2VLImageProcessor`, what the checkpoint asks
for) and a PIL/NumPy one (`Qwen2VLImageProcessorPil`); its `AutoImageProcessor` picks torchvision
where it imports, else PIL (`use_fast` is only a deprecated spelling of that choice). The run names
its processor (the `processor` option, "pil" by default) and this module builds that class by
name, so the same option runs the same code with torchvision installed or not; the name of what
ran goes into the dump.
"""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

from tensordiff.errors import BadInput

from oracle.qwen3_vl.config import read_object, refusal


def available() -> str:
    return "torchvision" if importlib.util.find_spec("torchvision") is not None else "pil"


def check_preprocessor(path: Path) -> None:
    """The values of preprocessor_config.json the processor computes with, before it is built:
    BadInput naming the file and the key (transformers takes them as they come)."""
    raw = read_object(path)

    def want(key: str, value, what: str):
        return refusal(path, key, value, what)

    size = raw.get("size", {})
    if not isinstance(size, dict):
        raise want("size", size, "a JSON object {shortest_edge, longest_edge}")
    pixels = {"shortest_edge": raw.get("min_pixels", size.get("shortest_edge")),
              "longest_edge": raw.get("max_pixels", size.get("longest_edge"))}
    for key, v in (("patch_size", raw.get("patch_size")), ("merge_size", raw.get("merge_size")),
                   ("temporal_patch_size", raw.get("temporal_patch_size")), *pixels.items()):
        if v is not None and not (type(v) is int and v >= 1):
            raise want(key, v, "a whole number >= 1")
    if None not in pixels.values() and pixels["shortest_edge"] > pixels["longest_edge"]:
        raise want("shortest_edge", pixels["shortest_edge"], f"at most longest_edge {pixels['longest_edge']}")
    for key in ("image_mean", "image_std"):
        v = raw.get(key)
        if v is None:
            continue
        if not (isinstance(v, list) and len(v) == 3 and all(type(x) in (int, float) and math.isfinite(x) for x in v)):
            raise want(key, v, "3 finite numbers (R, G, B)")
        if key == "image_std" and min(v) <= 0:
            raise want(key, v, "3 numbers > 0 (each channel is divided by its std)")
    v = raw.get("rescale_factor")
    if v is not None and not (type(v) in (int, float) and math.isfinite(v) and v > 0):
        raise want("rescale_factor", v, "a finite number > 0")
    for key in ("do_resize", "do_rescale", "do_normalize", "do_convert_rgb"):
        if key in raw and type(raw[key]) is not bool:
            raise want(key, raw[key], "true or false")


def build(ckpt: Path, processor: str):
    """-> (image processor, backend name) for the named processor ("pil" or "torchvision")."""
    check_preprocessor(Path(ckpt) / "preprocessor_config.json")
    backend = processor
    if backend not in ("torchvision", "pil"):
        raise BadInput(f"unknown image processor {backend!r} (torchvision or pil)")
    if backend == "torchvision" and available() != "torchvision":
        raise BadInput("the torchvision image processor was asked for, but torchvision is not installed "
                       "(install one built for your torch, or use the default processor=pil)")
    try:
        # (AutoImageProcessor itself requires torchvision in this release, so name the class)
        if backend == "torchvision":
            from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor as cls
        else:
            from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil as cls
        proc = cls.from_pretrained(str(ckpt), local_files_only=True)
    except (OSError, ValueError) as e:
        raise BadInput(f"cannot build the image processor from {ckpt}: {e}") from None
    ran = getattr(proc, "backend", backend)
    return proc, ran


def load_image(path: Path):
    """The official loader: EXIF orientation applied, converted to RGB."""
    from transformers.image_utils import load_image as hf_load

    try:
        return hf_load(str(path))
    except (OSError, ValueError) as e:
        raise BadInput(f"cannot load image {path}: {e}") from None
