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
from pathlib import Path

from tensordiff.errors import BadInput


def available() -> str:
    return "torchvision" if importlib.util.find_spec("torchvision") is not None else "pil"


def build(ckpt: Path, processor: str):
    """-> (image processor, backend name) for the named processor ("pil" or "torchvision")."""
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
