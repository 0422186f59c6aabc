"""Dump files as SGLang's dumper writes them, for a model that is not served by SGLang.

SGLang's `sglang.srt.debug_utils.dumper` is what people running DeepSeek on SGLang dump with:
`DUMPER_ENABLE=1` (and `DUMPER_NON_INTRUSIVE_MODE=all` for every module). This file writes the
same files without SGLang, following its conventions:

- one file per value, `<dir>/<exp_name>/step=S___rank=R___dump_index=K___name=N___recompute_status=disabled[___tag=v...].pt`
  (`dump_index` counts every dump of the process from 1; `step` counts `step()` calls from 0);
- each a `torch.save` of {"value": tensor, "meta": {those tags, "world_rank", "world_size",
  "sglang_parallel_info": {"tp_rank", "tp_size", ...}, and "dims" when given}};
- the non-intrusive hooks name a module's positional inputs `non_intrusive__PATH.inputs.<i>`,
  its keyword inputs `...inputs.<keyword>`, its output `non_intrusive__PATH.output` (a tuple of
  several tensors: `.output.<i>`); a module at `...layers.N` sets the tag `layer_id=N` while it
  runs.

    d = Dumper(root, "exp")
    with d.non_intrusive(model):
        model(x)
    d.dump("hidden", h, dims="t h[tp]")
    d.step()
"""
from __future__ import annotations

import contextlib
import re
from pathlib import Path

import torch

LAYER = re.compile(r"(?:.+\.)?layers\.(\d+)")


class Dumper:
    def __init__(self, root, exp_name: str, *, rank: int = 0, world_size: int = 1, tp_rank: int = 0, tp_size: int = 1):
        self.dir = Path(root) / exp_name
        self.rank, self.world_size = rank, world_size
        self.parallel = {"tp_rank": tp_rank, "tp_size": tp_size, "pp_rank": 0, "pp_size": 1,
                         "moe_ep_rank": 0, "moe_ep_size": 1}
        self.steps = 0
        self.index = 0
        self.ctx: dict = {}

    def step(self) -> None:
        self.steps += 1

    def dump(self, name: str, value, *, dims: str | None = None, **tags) -> Path:
        """One file; a tensor is saved as a copy, anything else (a list of request ids) as it is."""
        self.index += 1
        fields = {"step": self.steps, "rank": self.rank, "dump_index": self.index, "name": name,
                  "recompute_status": "disabled", **tags, **self.ctx}
        path = self.dir / ("___".join(f"{k}={v}" for k, v in fields.items()) + ".pt")
        meta = {**fields, "world_rank": self.rank, "world_size": self.world_size,
                "sglang_parallel_info": dict(self.parallel)}
        if dims is not None:
            meta["dims"] = dims
        self.dir.mkdir(parents=True, exist_ok=True)
        if isinstance(value, torch.Tensor):
            value = value.detach().clone()
        torch.save({"value": value, "meta": meta}, path)
        return path

    def _value(self, path: str, what: str, value) -> None:
        if isinstance(value, torch.Tensor):
            self.dump(f"non_intrusive__{'.'.join(p for p in (path, what) if p)}", value)
        elif isinstance(value, (tuple, list)):
            tensors = [t for t in value if isinstance(t, torch.Tensor)]
            if len(tensors) == 1:
                self._value(path, what, tensors[0])
            else:
                for i, t in enumerate(tensors):
                    self._value(path, f"{what}.{i}", t)

    @contextlib.contextmanager
    def non_intrusive(self, model: torch.nn.Module):
        """Every module's inputs and output dumped while the block runs."""
        handles = []
        for path, mod in model.named_modules():
            m = LAYER.fullmatch(path)
            if m:
                def enter(*_, n=int(m.group(1))):
                    self.ctx["layer_id"] = n

                def leave(*_):
                    self.ctx.pop("layer_id", None)

                handles.append(mod.register_forward_pre_hook(enter))
                handles.append(mod.register_forward_hook(leave))

            def pre(mod, args, kwargs, path=path):
                for i, a in enumerate(args):
                    self._value(path, f"inputs.{i}", a)
                for k, a in kwargs.items():
                    self._value(path, f"inputs.{k}", a)

            def post(mod, args, out, path=path):
                self._value(path, "output", out)

            handles.append(mod.register_forward_pre_hook(pre, with_kwargs=True))
            handles.append(mod.register_forward_hook(post))
        try:
            yield self
        finally:
            for h in handles:
                h.remove()
