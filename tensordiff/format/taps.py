"""Taps: record named boundaries of any `torch.nn.Module` with forward hooks.

    with tensordiff.Recorder("out/ref", model="my-model") as rec, \\
         tensordiff.tap(model, {"block0": "blocks.0", "rope.cos": "rotary[0]"}, rec):
        model(x)

Each point names a submodule by its dotted path (`model.named_modules()` names; list indices are
path parts: `layers.3`), optionally followed by `[i]` to pick one element of a tuple output or
`[key]` of a dict-like output (transformers' `ModelOutput`). `@input` instead of the output takes
the module's first positional input; `@input[i]` its i-th positional, `@input[name]` its keyword
argument `name` (`self_attn@input[hidden_states]`). `@return` taps a method rather than a module:
`PATH.method@return` records what the bound method `method` of the module at PATH returns, for
computations a model writes as a method, not a submodule (transformers' `_deepstack_process`);
the method is wrapped on that one instance for the tap's life, its body runs unchanged. What a hook sees goes straight into the recorder, which
copies it at once (`Recorder.record`): a later in-place op cannot change what was recorded, and
the dump still appears only when the recorder closes cleanly. A tap that fires while a CUDA graph
is being captured is refused (`capture.refuse_in_graph_capture`): tap an eager decode, or record
outside the graph.

A module that runs twice while tapped (reused in one forward, or a second forward) would silently
record its first or its last call, so a second call is refused, unless `every_call=True`, which
names the calls `NAME.0`, `NAME.1`, ...  `Tap.enabled = False` stops recording (and counting)
without removing the hooks: a caller records a prefill, then decodes untapped.

torch is imported inside the functions: importing `tensordiff` stays free of it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from tensordiff.errors import BadInput
from tensordiff.format.capture import check_name, refuse_in_graph_capture

_ABSENT = object()

# "blocks.0", "rotary[1]", "model.layers.2@input", "merger[pooler_output]"
POINT_RE = re.compile(r"\A(?P<path>[A-Za-z0-9_.]*?)(?P<at>@input|@return)?(?:\[(?P<sel>[A-Za-z0-9_]+)\])?\Z")


@dataclass(frozen=True)
class Point:
    """One tap point, parsed: which module, its output or input, which element of it."""

    name: str
    path: str
    use_input: bool = False
    select: str | None = None
    method: bool = False  # `@return`: the path's last part is a method of the module before it

    @classmethod
    def parse(cls, name: str, spec: str) -> "Point":
        m = POINT_RE.match(spec) if isinstance(spec, str) else None
        if m is None:
            raise BadInput(f"tap point {name!r}: {spec!r} is not a module path (e.g. 'blocks.0', 'rotary[0]', "
                           "'layers.2@input', 'mlp.act@return')")
        if m["at"] == "@return" and not m["path"]:
            raise BadInput(f"tap point {name!r}: {spec!r} names no method (e.g. 'layers.0.mlp.forward_part@return')")
        return cls(name, m["path"], m["at"] == "@input", m["sel"], m["at"] == "@return")

    def pick(self, value: Any, *, selected: bool = False) -> Any:
        """The tensor this point records out of what the hook saw (`selected`: already picked)."""
        import torch

        if self.select is not None and not selected:
            value = _select(value, self.select, self)
        if isinstance(value, torch.Tensor):
            return value
        what = type(value).__name__
        if isinstance(value, (tuple, list)):
            what = f"a {what} of {len(value)}"
        at = "@return" if self.method else ""
        hint = f"name an element, e.g. '{self.path or '(root)'}{at}[0]'" if self.select is None else "pick a tensor"
        src = "method" if self.method else "module"
        raise BadInput(f"tap point {self.name!r}: {src} {self.path or '(root)'!r} gave {what}, not a tensor; {hint}")


def _select(value: Any, sel: str, p: Point) -> Any:
    try:
        if sel.isdigit():
            return value[int(sel)]
        return value[sel]
    except (IndexError, KeyError, TypeError):
        raise BadInput(f"tap point {p.name!r}: module {p.path or '(root)'!r} gave a {type(value).__name__} "
                       f"with no element [{sel}]") from None


def _module(root: Any, path: str, name: str) -> Any:
    if not path:
        return root
    mods = dict(root.named_modules())
    if path in mods:
        return mods[path]
    head = path.rsplit(".", 1)[0] if "." in path else ""
    near = sorted(n for n in mods if n and (n.startswith(head + ".") if head else "." not in n))[:8]
    raise BadInput(f"tap point {name!r}: the module has no submodule {path!r}"
                   + (f" (near it: {', '.join(near)})" if near else ""))


def _method(root: Any, path: str, name: str) -> tuple[Any, str]:
    """(the module that owns the method, the method's name) of a `@return` point."""
    import torch

    head, _, attr = path.rpartition(".")
    owner = _module(root, head, name)
    fn = getattr(owner, attr, None)
    if fn is None or not callable(fn) or isinstance(fn, torch.nn.Module):
        what = "a submodule: tap it without @return" if isinstance(fn, torch.nn.Module) else "no such method"
        raise BadInput(f"tap point {name!r}: {head or '(root)'!r} has {what} ({attr!r})")
    return owner, attr


class Tap:
    """Forward hooks on a module tree; a context manager that removes them on exit."""

    def __init__(self, module: Any, points: Mapping[str, str], recorder: Any, *, every_call: bool = False):
        import torch


        if not isinstance(module, torch.nn.Module):
            raise BadInput(f"tap() hooks a torch.nn.Module, not {type(module).__name__}")
        if not isinstance(points, Mapping) or not points:
            raise BadInput("tap() needs at least one point: {boundary name: module path}")
        self.recorder = recorder
        self.every_call = every_call
        self.enabled = True
        self.calls: dict[str, int] = {}
        self._handles: list[Any] = []
        self._wrapped: list[tuple[Any, str, Any]] = []  # (owner, method name, what its __dict__ held)
        parsed = []
        for name, spec in points.items():
            check_name(name)
            p = Point.parse(name, spec)  # every path checked before any hook
            parsed.append((p, _method(module, p.path, name) if p.method else _module(module, p.path, name)))
        for p, mod in parsed:
            if p.method:
                self._wrap(p, *mod)
            elif p.use_input:
                self._handles.append(mod.register_forward_pre_hook(self._hook(p, input_=True), with_kwargs=True))
            else:
                self._handles.append(mod.register_forward_hook(self._hook(p, input_=False)))

    def _wrap(self, p: Point, owner: Any, attr: str) -> None:
        original = getattr(owner, attr)  # bound: an instance attribute shadowing it needs no self

        def wrapped(*args, **kwargs):
            out = original(*args, **kwargs)
            self._record(p, out)
            return out

        self._wrapped.append((owner, attr, owner.__dict__.get(attr, _ABSENT)))
        setattr(owner, attr, wrapped)

    def _hook(self, p: Point, *, input_: bool):
        def record_input(mod, args, kwargs):
            if not self.enabled:
                return None
            if p.select is None and not args:
                raise BadInput(f"tap point {p.name!r}: module {p.path!r} was called with no positional input; "
                               f"name a keyword argument: '{p.path}@input[{next(iter(kwargs), 'name')}]'")
            if p.select is None:
                value = args[0]
            elif p.select.isdigit():
                value = args[int(p.select)] if int(p.select) < len(args) else None
            else:
                value = kwargs.get(p.select)
            if value is None:
                raise BadInput(f"tap point {p.name!r}: module {p.path!r} got no input [{p.select}] "
                               f"({len(args)} positional; keywords: {', '.join(kwargs) or 'none'})")
            self._record(p, value, selected=True)
            return None

        def record_output(mod, args, out):
            if self.enabled:
                self._record(p, out)

        return record_input if input_ else record_output

    def _record(self, p: Point, value: Any, selected: bool = False) -> None:
        if not self.enabled:
            return
        refuse_in_graph_capture(f"tap point {p.name!r}")  # before counting: the refused call is not a call
        k = self.calls.get(p.name, 0)
        self.calls[p.name] = k + 1
        if k and not self.every_call:
            raise BadInput(f"tap point {p.name!r}: module {p.path!r} ran more than once while tapped (a module "
                           "reused, or a second forward); tap(..., every_call=True) records every call as "
                           "NAME.0, NAME.1, ...")
        self.recorder.record(f"{p.name}.{k}" if self.every_call else p.name, p.pick(value, selected=selected))

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for owner, attr, held in reversed(self._wrapped):
            if held is _ABSENT:
                owner.__dict__.pop(attr, None)
            else:
                setattr(owner, attr, held)
        self._wrapped.clear()

    def __enter__(self) -> "Tap":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def tap(module: Any, points: Mapping[str, str], recorder: Any, *, every_call: bool = False) -> Tap:
    """Hook `points` ({boundary tensor name: module path}) of `module`, recording into `recorder`
    (a `Recorder`, `MemoryRecorder` or anything with `record(name, tensor, boundary=)`)."""
    return Tap(module, points, recorder, every_call=every_call)
