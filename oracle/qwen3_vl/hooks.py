"""Taps on transformers' Qwen3VLVisionModel, named by boundary.

The module outputs are tapped by tensordiff's generic route (`tensordiff.tap`: forward hooks
that record into a recorder), the same one a user's own engine or reference model uses.

`pos_embed` (the interpolated learned table as added to the patch embedding) is no module's
output: the forward computes it inline between `patch_embed` and `rotary_pos_emb`. A torch
function mode open only in that window records the right operand of the one addition whose left
operand is the patch embedding, so what is recorded is exactly what transformers added.
"""
from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

from tensordiff.format.capture import MemoryRecorder
from tensordiff.format.taps import tap

ADDS = {torch.Tensor.add, torch.Tensor.__add__, torch.add}


def points(model) -> dict[str, str]:
    """Boundary tensor name -> module path (with `[i]` for an element of a tuple output)."""
    out = {"rope.cos": "rotary_pos_emb[0]", "rope.sin": "rotary_pos_emb[1]", "block0": "blocks.0",
           "final_norm": "merger.norm", "aligner": "merger"}
    for k in range(len(model.deepstack_merger_list)):
        out[f"deepstack.{k}"] = f"deepstack_merger_list.{k}"
    return out


class _AddedTo(TorchFunctionMode):
    def __init__(self, left: torch.Tensor, rec: MemoryRecorder):
        super().__init__()
        self.left, self.rec = left, rec

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in ADDS and len(args) >= 2 and args[0] is self.left and "pos_embed" not in self.rec.tensors:
            self.rec.record("pos_embed", args[1])
        return func(*args, **kwargs)


class Taps:
    """Registers the hooks; `tensors` fills in forward order; `close()` removes every hook."""

    def __init__(self, model):
        self._rec = MemoryRecorder()
        self.tensors: dict[str, torch.Tensor] = self._rec.tensors
        self._mode: _AddedTo | None = None
        self._tap = tap(model, points(model), self._rec)
        self._handles = [model.patch_embed.register_forward_hook(self._after_patch_embed),
                         model.rotary_pos_emb.register_forward_pre_hook(self._before_rotary)]

    def _after_patch_embed(self, mod, inp, out):
        self._mode = _AddedTo(out, self._rec)
        self._mode.__enter__()

    def _before_rotary(self, mod, inp):
        self._leave()

    def _leave(self):
        if self._mode is not None:
            mode, self._mode = self._mode, None
            mode.__exit__(None, None, None)

    def close(self):
        self._leave()
        self._tap.close()
        for h in self._handles:
            h.remove()
        self._handles.clear()
