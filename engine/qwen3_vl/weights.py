"""Loading the tower's `model.visual.*` tensors from a checkpoint directory (sharded or not)."""
from __future__ import annotations

from pathlib import Path

import torch

from ..errors import EngineInputError
from ..runtime import shards
from .config import VisionConfig

PREFIX = "model.visual."

# The last few checkpoints' tensors as cast for a CPU run: a process running the engine again on
# the same files (the test suite, a calibration, `gate` over many images) would otherwise convert
# the stored bf16 to fp32 on every run, a 151,936-row embedding each time. Keyed by the files'
# identity (path, size, mtime, inode), so a rewritten checkpoint is read again; a hit skips the
# reads' checks only because the same files passed them before. CPU only: a device copy held
# after its run would keep accelerator memory a later model needs. The tensors are shared:
# the engine only reads its weights.
_CAST: dict[tuple, dict[str, torch.Tensor]] = {}
_CAST_KEEP = 4  # the tower's and the decoder's tensors of two checkpoints


def _stamp(ckpt: Path) -> tuple | None:
    """The checkpoint files' identity, or None when they cannot all be seen (then no cache)."""
    root = Path(ckpt)
    try:
        names = set(shards.weight_map(root).values())
    except EngineInputError:  # `shards.read` says what is wrong
        return None
    if any(Path(f).is_absolute() or ".." in Path(f).parts for f in names):
        return None  # an escaping shard: refused by the read, never looked at here
    try:
        files = sorted({root / f for f in names} | {root / shards.INDEX, root / shards.LONE})
        return tuple((str(f), st.st_size, st.st_mtime_ns, st.st_ino)
                     for f in files if f.exists() for st in [f.stat()])
    except OSError:
        return None


def read_cast(ckpt: Path, want: dict[str, tuple[int, ...]], dtype: torch.dtype,
              device="cpu") -> dict[str, torch.Tensor]:
    """`shards.read(ckpt, names, shapes=want)` with every tensor cast to `dtype` on `device`
    (name -> tensor, a new dict each call), from `_CAST` when the same files were read before."""
    stamp = _stamp(ckpt) if str(device) == "cpu" else None
    key = (stamp, tuple(sorted(want.items())), dtype)
    if stamp is not None and key in _CAST:
        return dict(_CAST[key])
    stored = shards.read(ckpt, list(want), "cpu", shapes=want)
    out = {k: t.to(device=device, dtype=dtype) for k, t in stored.items()}
    if stamp is not None:
        while len(_CAST) >= _CAST_KEEP:
            _CAST.pop(next(iter(_CAST)))
        _CAST[key] = dict(out)
    return out


def visual_shapes(vc: VisionConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the tower reads (name without the prefix) -> the shape its config implies."""
    h, f, o, m = vc.hidden_size, vc.intermediate_size, vc.out_hidden_size, vc.spatial_merge_size
    hm = h * m * m
    out: dict[str, tuple[int, ...]] = {
        "patch_embed.proj.weight": (h, vc.in_channels, vc.temporal_patch_size, vc.patch_size, vc.patch_size),
        "patch_embed.proj.bias": (h,),
        "pos_embed.weight": (vc.num_position_embeddings, h),
    }
    for i in range(vc.depth):
        b = f"blocks.{i}."
        out.update({b + "norm1.weight": (h,), b + "norm1.bias": (h,), b + "norm2.weight": (h,), b + "norm2.bias": (h,),
                    b + "attn.qkv.weight": (3 * h, h), b + "attn.qkv.bias": (3 * h,),
                    b + "attn.proj.weight": (h, h), b + "attn.proj.bias": (h,),
                    b + "mlp.linear_fc1.weight": (f, h), b + "mlp.linear_fc1.bias": (f,),
                    b + "mlp.linear_fc2.weight": (h, f), b + "mlp.linear_fc2.bias": (h,)})
    mergers = [("merger.", h)] + [(f"deepstack_merger_list.{k}.", hm) for k in range(len(vc.deepstack_visual_indexes))]
    for pre, norm in mergers:  # the DeepStack mergers normalise after the 2x2 shuffle
        out.update({pre + "norm.weight": (norm,), pre + "norm.bias": (norm,),
                    pre + "linear_fc1.weight": (hm, hm), pre + "linear_fc1.bias": (hm,),
                    pre + "linear_fc2.weight": (o, hm), pre + "linear_fc2.bias": (o,)})
    return out


def load_visual(ckpt: Path, vc: VisionConfig, dtype: torch.dtype, device: str = "cpu") -> dict[str, torch.Tensor]:
    """{name without 'model.visual.': tensor in `dtype` on `device`}: exactly the tensors the
    config implies, each of the implied shape, or one EngineInputError."""
    want = {PREFIX + k: s for k, s in visual_shapes(vc).items()}
    return {k[len(PREFIX):]: t for k, t in read_cast(ckpt, want, dtype, device).items()}

