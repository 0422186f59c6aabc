"""Import transformers' model-addition debugger output (`model_addition_debugger_context`).

With `use_repr=False` the debugger writes, into its `debug_path`, a call tree
`<Class>_debug_tree_FULL_TENSORS.json` (each node: `module_path`, `inputs` {"args": [...],
"kwargs": {...}}, `outputs`, `children`; a tensor is {"shape", "dtype", "value":
"./file.safetensors"}) and one safetensors file per tensor (key "data"). Leaf modules keep
their outputs; every module its inputs.

The import walks the tree in call order (a node's inputs, its children, its outputs) and names
each tensor by its module path without the class (`model.layers.0.mlp.down_proj.out`,
`...self_attn.in.hidden_states`, `model.rotary_emb.out.0`). A module's call is its boundary
(`model.layers.0.mlp.down_proj`: its inputs and outputs; the model's own inputs: `inputs`), so
in the chain of calls the first module whose output diverges while its inputs match is the root. Only files the tree names are read,
from inside the directory; nothing is unpickled (safetensors only).

The model's own outputs (`logits`, ...) are written to files (`<Class>_outputs_logits.safetensors`;
`_outputs_<key>` of a dict, `_outputs_<i>` of a tuple, nested alike) that the tree no longer names
(the debugger prunes the outputs of every module with children, the model's too); they are
imported last as `out.<key>` (`out.logits`, `out.hidden_states_0`), the boundary `outputs`.

A module called twice writes the same file twice (the debugger keeps the last call): its earlier
nodes are dropped, with a note. A trace written with `use_repr=True` holds printed tensors only
and is refused.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from tensordiff.errors import BadInput
from tensordiff.format.importers import Imported, bf16_from_bits
from tensordiff.format.storage import read_safetensors_header

TOOL = "transformers model-addition debugger"
SUFFIX = "_debug_tree_FULL_TENSORS.json"
MAX_JSON = 256 << 20


def find_trace(d: Path) -> Path:
    if not d.is_dir():
        raise BadInput(f"{d} is not a directory (give the debugger's debug_path)")
    found = sorted(d.glob(f"*{SUFFIX}"))
    if not found:
        raise BadInput(f"{d} has no *{SUFFIX} (not a model-addition debugger output)")
    if len(found) > 1:
        raise BadInput(f"{d} holds traces of {len(found)} models ({', '.join(p.name for p in found)}); "
                       "give a directory with one")
    return found[0]


def _tensors(value: Any, keys: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], dict]]:
    """(key path, tensor record) for every tensor in a serialized input/output structure."""
    if isinstance(value, dict) and "value" in value and "dtype" in value:
        yield keys, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _tensors(v, keys + (str(k),))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _tensors(v, keys + (str(i),))


def _walk(node: dict, root: str, where: str) -> Iterator[tuple[str, dict, str]]:
    """(original name, tensor record, boundary) in call order."""
    if not isinstance(node, dict) or not isinstance(node.get("module_path"), str):
        raise BadInput(f"{where}: a node without a module_path (not a debugger trace)")
    path = node["module_path"].removesuffix(" (top-level)")
    path = path[len(root):].lstrip(".") if path.startswith(root) else path
    for keys, rec in _tensors(node.get("inputs") or {}, ()):
        kind = keys[0] if keys else ""
        rest = keys[1:] if kind in ("args", "kwargs") else keys
        yield ".".join(x for x in (path, "in", *rest) if x), rec, path or "inputs"
    for child in node.get("children") or []:
        yield from _walk(child, root, where)
    for keys, rec in _tensors(node.get("outputs"), ()):
        yield ".".join(x for x in (path, "out", *keys) if x), rec, path or "outputs"


def _read(d: Path, rec: dict, name: str, trace: Path) -> Any:
    v = rec.get("value")
    if isinstance(v, list):
        raise BadInput(f"{trace} was written with use_repr=True (printed tensors only); rerun "
                       "model_addition_debugger_context(..., use_repr=False) to save the tensors")
    if not isinstance(v, str) or not v.endswith(".safetensors"):
        raise BadInput(f"{trace}: tensor {name!r} has value {str(v)[:60]!r}, not a safetensors file")
    f = (d / v).resolve()
    try:
        f.relative_to(d.resolve())
    except ValueError:
        raise BadInput(f"{trace}: tensor {name!r} names {v!r}, outside {d}") from None
    if not f.is_file():
        raise BadInput(f"{trace}: tensor {name!r} names {v!r}, which is missing")
    header, _ = read_safetensors_header(f)
    if list(header) != ["data"]:
        raise BadInput(f"{f}: expected one tensor 'data' (the debugger's layout), found {list(header)[:4]}")
    st = header["data"]
    r = st.reader()
    try:
        raw = np.array(r.read(0, st.numel), copy=True).reshape(st.shape)
    finally:
        r.close()
    return bf16_from_bits(raw) if st.dtype.name == "bfloat16" else raw


def model_outputs(d: Path, root: str, used: set[str]) -> list[Path]:
    """The files of the model's own outputs (`<root>_outputs[_<key>...].safetensors`) the tree
    does not name, in name order."""
    stem = f"{root}_outputs"
    return sorted(p for p in d.glob("*.safetensors") if p.name not in used and root
                  and (p.name == f"{stem}.safetensors" or p.name.startswith(f"{stem}_")))


def read(d: str | Path) -> Imported:
    d = Path(d)
    trace = find_trace(d)
    if trace.stat().st_size > MAX_JSON:
        raise BadInput(f"{trace} is implausibly large ({trace.stat().st_size} bytes)")
    try:
        tree = json.loads(trace.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise BadInput(f"{trace} is not valid JSON ({type(e).__name__})") from None
    if not isinstance(tree, dict):
        raise BadInput(f"{trace}: expected a JSON object (the call tree)")
    root = str(tree.get("module_path", "")).removesuffix(" (top-level)")
    items = list(_walk(tree, root, str(trace)))
    last = {}
    for i, (name, *_) in enumerate(items):
        last[name] = i
    imp = Imported(TOOL, d, facts={"model_class": root})
    repeated = sorted({n for i, (n, *_) in enumerate(items) if last[n] != i})
    if repeated:
        imp.notes.append(f"{len(repeated)} tensor(s) from modules called more than once kept their last call "
                         f"only (the debugger overwrites the file): {', '.join(repeated[:5])}")
    used = set()
    for i, (name, rec, boundary) in enumerate(items):
        if last[name] != i:
            continue
        imp.add(name, _read(d, rec, name, trace), boundary)
        used.add(Path(rec["value"]).name)
    for f in model_outputs(d, root, used):
        key = f.name[len(root) + len("_outputs"):-len(".safetensors")].lstrip("_")
        name = ".".join(x for x in ("out", key) if x)
        imp.add(name, _read(d, {"value": f"./{f.name}"}, name, trace), "outputs")
        used.add(f.name)
    unused = sorted(p.name for p in d.glob("*.safetensors") if p.name not in used)
    if unused:
        imp.notes.append(f"{len(unused)} safetensors file(s) in {d.name} are named by no node of the trace "
                         f"(pruned by the debugger) and were not imported: {', '.join(unused[:3])}")
    return imp
