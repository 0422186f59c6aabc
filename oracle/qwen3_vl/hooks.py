"""Taps on transformers' Qwen3VLVisionModel: forward hooks on its modules, named by boundary.

`pos_embed` (the interpolated learned table as added to the patch embedding) is no module's
output: the forward computes it inline between `patch_embed` and `rotary_pos_emb`. A torch
function mode open only in that window records the right operand of the one addition whose left
operand is the patch embedding, so what is recorded is exactly what transformers added.
"""
from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

ADDS = {torch.Tensor.add, torch.Tensor.__add__, torch.add}


class _AddedTo(TorchFunctionMode):
    def __init__(self, left: torch.Tensor, sink: dict):
        super().__init__()
        self.left, self.sink = left, sink

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in ADDS and len(args) >= 2 and args[0] is self.left and "pos_embed" not in self.sink:
            self.sink["pos_embed"] = args[1]
        return func(*args, **kwargs)


class Taps:
    """Registers the hooks; `tensors` fills in forward order; `close()` removes every hook."""

    def __init__(self, model):
        self.tensors: dict[str, torch.Tensor] = {}
        self._handles = []
        self._mode: _AddedTo | None = None
        hook = self._handles.append

        def after_patch_embed(mod, inp, out):
            self._mode = _AddedTo(out, self.tensors)
            self._mode.__enter__()

        def before_rotary(mod, inp):
            self._leave()

        def rope(mod, inp, out):
            self.tensors["rope.cos"], self.tensors["rope.sin"] = out

        def save(name):
            def fn(mod, inp, out):
                self.tensors[name] = out
            return fn

        hook(model.patch_embed.register_forward_hook(after_patch_embed))
        hook(model.rotary_pos_emb.register_forward_pre_hook(before_rotary))
        hook(model.rotary_pos_emb.register_forward_hook(rope))
        hook(model.blocks[0].register_forward_hook(save("block0")))
        hook(model.merger.norm.register_forward_hook(save("final_norm")))
        hook(model.merger.register_forward_hook(save("aligner")))
        for k, m in enumerate(model.deepstack_merger_list):
            hook(m.register_forward_hook(save(f"deepstack.{k}")))

    def _leave(self):
        if self._mode is not None:
            mode, self._mode = self._mode, None
            mode.__exit__(None, None, None)

    def close(self):
        self._leave()
        for h in self._handles:
            h.remove()
        self._handles.clear()
