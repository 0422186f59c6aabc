"""Reads named tensors from a checkpoint directory, lazily, through its safetensors index.

A released checkpoint is 48 shards; the vision tensors are a few hundred MB of the first one, so
only the names asked for are read (safetensors' `safe_open` maps the file and slices by key).

Two tensors of the released shards are not stored the way the official modules hold them, and
are converted on load as the official loader converts them (upstream `convert.py`):
- `layers.N.attn.wo_a.weight` is stored FP8 (e4m3) beside a block scale `layers.N.attn.wo_a.scale`
  (e8m0); the weight is cut into blocks of (rows / scale rows) x (columns / scale columns), each
  block multiplied by its scale in fp32, the product cast to bf16, and the scale dropped;
- a routed expert's `layers.N.ffn.experts.E.w{1,2,3}.weight` holds packed FP4 (two e2m1 codes a
  byte, the even element in the low nibble) in a tensor stored as int8; its bytes are viewed as
  float4_e2m1fn_x2, unchanged.
The converted layout (bf16 `wo_a` without a scale, FP4 experts stored as float4) reads as is.
Anything else is refused naming the tensor, its stored dtype and what was expected.
"""
from __future__ import annotations

import re
from contextlib import contextmanager
from pathlib import Path

import torch

from tensordiff.errors import BadInput

from .. import shards

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def weight_map(checkpoint: Path) -> dict[str, str]:
    """Tensor name -> shard file name, from the index (or a lone `model.safetensors`)."""
    return shards.weight_map(checkpoint)


def load_tensors(checkpoint: str | Path, names: list[str],
                 shapes: dict[str, tuple[int, ...]] | None = None) -> dict[str, torch.Tensor]:
    """Exactly `names`, as stored (no dtype change), through the oracle's strict reader: a bad
    checkpoint (missing name or shard, escaping or pickle shard, truncated file, wrong shape)
    is one BadInput."""
    return shards.load(checkpoint, names, shapes, what="DeepSeek V4.1 Flash")


@contextmanager
def default_dtype(dtype: torch.dtype):
    """Linear weights take the default dtype, as under the official `set_dtype`; RMSNorm
    weights stay fp32 because they are created fp32 explicitly."""
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(prev)


# Stored as they are, never converted: the low-precision weight formats and their scales.
QUANTISED = (torch.float8_e4m3fn, torch.float4_e2m1fn_x2, torch.float8_e8m0fnu)
# What a plain (bf16 / fp32) parameter may be read from: a float cast loses nothing it declares.
PLAIN = (torch.bfloat16, torch.float16, torch.float32)


def check_stored(name: str, stored: torch.dtype, declared: torch.dtype, checkpoint: Path) -> None:
    """A quantised parameter takes exactly its format; a plain one only a float dtype. Anything
    else would be a silent cast (an FP8 weight read without its scale), so it is bad input."""
    if declared in QUANTISED:
        if stored != declared:
            also = " (or int8 holding its packed bytes)" if declared == torch.float4_e2m1fn_x2 and ROUTED_EXPERT.match(name) else ""
            raise BadInput(f"{name} in {checkpoint} is stored as {dtype_name(stored)}, but the config's dtype / "
                           f"expert_dtype make it {dtype_name(declared)}{also}: not converted")
    elif stored not in PLAIN:
        raise BadInput(f"{name} in {checkpoint} is stored as {dtype_name(stored)}, but the config makes it a plain "
                       f"{dtype_name(declared)} tensor (a quantised weight under a bf16 config?): not cast silently")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# The release's two stored-differently tensors (see the module docstring).
WO_A = re.compile(r"^layers\.\d+\.attn\.wo_a\.weight$")
ROUTED_EXPERT = re.compile(r"^layers\.\d+\.ffn\.experts\.\d+\.w[123]\.weight$")


def wo_a_scale(name: str) -> str:
    return name[: -len("weight")] + "scale"


def released_scales(wmap: dict[str, str], names: list[str]) -> list[str]:
    """The block scales stored beside the `wo_a` weights among `names` (the released layout)."""
    return [wo_a_scale(n) for n in names if WO_A.match(n) and wo_a_scale(n) in wmap]


def dequantise_wo_a(name: str, w: torch.Tensor, s: torch.Tensor, checkpoint: Path) -> torch.Tensor:
    """The official conversion of an FP8 `wo_a`: blocks of (rows / scale rows) x (columns / scale
    columns), each times its e8m0 scale in fp32, then bf16."""
    sname = wo_a_scale(name)
    if s.dtype != torch.float8_e8m0fnu:
        raise BadInput(f"{sname} in {checkpoint} is stored as {dtype_name(s.dtype)}, expected float8_e8m0fnu "
                       f"(the power-of-two block scale of {name})")
    if w.dim() != 2 or s.dim() != 2 or 0 in s.shape or w.size(0) % s.size(0) or w.size(1) % s.size(1):
        raise BadInput(f"{sname} in {checkpoint} has shape {list(s.shape)}, which does not cut {name} "
                       f"{list(w.shape)} into whole blocks")
    rows, cols = w.size(0) // s.size(0), w.size(1) // s.size(1)
    blocks = w.unflatten(0, (s.size(0), rows)).unflatten(-1, (s.size(1), cols)).float()
    return (blocks * s.float()[:, None, :, None]).flatten(2, 3).flatten(0, 1).to(torch.bfloat16)


def as_declared(name: str, stored: dict[str, torch.Tensor], declared: torch.dtype, checkpoint: Path) -> torch.Tensor:
    """The tensor `name` as its module declares it: the release's FP8 `wo_a` (with its scale in
    `stored`) dequantised to bf16, an int8-stored routed expert viewed as FP4; anything else as
    stored (then checked by `check_stored`)."""
    t = stored[name]
    if WO_A.match(name):
        sname = wo_a_scale(name)
        if t.dtype == torch.float8_e4m3fn and declared in PLAIN:
            if sname not in stored:
                raise BadInput(f"{name} in {checkpoint} is stored as float8_e4m3fn without its block scale {sname}: "
                               f"expected FP8 with that scale (the release) or bfloat16 (converted); not cast silently")
            return dequantise_wo_a(name, t, stored[sname], checkpoint)
        if sname in stored:
            raise BadInput(f"{name} in {checkpoint} is stored as {dtype_name(t.dtype)} beside a block scale {sname}: "
                           "expected float8_e4m3fn with that scale (the release) or bfloat16 without one (converted)")
    if ROUTED_EXPERT.match(name) and t.dtype == torch.int8 and declared == torch.float4_e2m1fn_x2:
        return t.view(torch.float4_e2m1fn_x2)  # the same bytes: two e2m1 codes each, low nibble first
    return t


def missing_scales(wmap: dict[str, str], names: list[str]) -> list[str]:
    """The `<module>.scale` names absent whose `<module>.weight` is present."""
    return [n for n in names if n.endswith(".scale") and n not in wmap and n[: -len("scale")] + "weight" in wmap]


def load_into(model: torch.nn.Module, checkpoint: Path, device=None) -> torch.nn.Module:
    """Fill a module built on the meta device with the checkpoint's tensors, by parameter name,
    each cast to its parameter's dtype (the activation dtype, or fp32 where the official module
    declares fp32) unless it is quantised (see `check_stored`); a shape that disagrees with the
    config is bad input, and so is a quantised weight without its scale."""
    params = dict(model.named_parameters())
    wmap = weight_map(checkpoint)
    no_scale = missing_scales(wmap, list(params))
    if no_scale:
        s = no_scale[0]
        more = f" (and {len(no_scale) - 1} more)" if len(no_scale) > 1 else ""
        raise BadInput(f"checkpoint {checkpoint} lacks {s}{more}: the config's dtype / expert_dtype make "
                       f"{s[: -len('scale')]}weight quantised, and it is not read without its block scale")
    stored = load_tensors(checkpoint, list(params) + released_scales(wmap, list(params)))
    state = {}
    for name, p in params.items():
        t = as_declared(name, stored, p.dtype, checkpoint)  # the release's conversions
        check_stored(name, t.dtype, p.dtype, checkpoint)  # the format first: it explains a shape
        if tuple(t.shape) != tuple(p.shape):
            raise BadInput(f"{name} in {checkpoint} has shape {list(t.shape)}, the config implies {list(p.shape)}")
        state[name] = t.to(device=device, dtype=p.dtype)
    model.load_state_dict(state, assign=True)
    return model.eval()


def table(rows: int, dim: int) -> torch.nn.Embedding:
    """`nn.Embedding(rows, dim)` without its random initialisation. Every module here is built on
    the meta device and `load_into` assigns the checkpoint's tensors, so the initial values are
    never read; the first `normal_` of a process on a meta tensor costs about 1.2 s on the CPU
    (torch imports its Python decompositions for it), a third of a tiny language run."""
    return torch.nn.Embedding(rows, dim, _weight=torch.empty(rows, dim))
