"""Import Polygraphy's saved results (`polygraphy run ... --save-outputs FILE.json`, or
`RunResults.save`), and its saved inputs (`--save-inputs`: a list of feed dicts).

Polygraphy's JSON marks each encoded object with `"polygraphy_class"` (older files:
`"__polygraphy_encoded_<Class>": "polygraphy_serialized_json_type"`):

    {"lst": [[runner_name, [IterationResult, ...]], ...], "polygraphy_class": "RunResults"}
    IterationResult: {"outputs": {name: LazyArray | ndarray}, "runtime": s, "runner_name": ...}
    LazyArray: {"values": ndarray};  ndarray: {"array": base64 of the .npy file bytes}

Arrays are read with `numpy.load(..., allow_pickle=False)`: an object array is refused, and
so is a `Tensor` entry (Polygraphy encodes a torch tensor with `torch.save`, a pickle).
Names keep Polygraphy's order (the runner's output order); ONNX names like
`/proj/MatMul_output_0` become `proj.MatMul_output_0` (the original is kept in the manifest).
"""
from __future__ import annotations

import base64
import binascii
import io
import json
from pathlib import Path
from typing import Any

import numpy as np

from tensordiff.errors import BadInput
from tensordiff.format.importers import Imported

TOOL = "polygraphy"
MARK = "polygraphy_class"
LEGACY = "polygraphy_serialized_json_type"
MAX_JSON = 1 << 30


def _class(d: Any) -> str | None:
    if not isinstance(d, dict):
        return None
    if isinstance(d.get(MARK), str):
        return d[MARK]
    for k, v in d.items():
        if k.startswith("__polygraphy_encoded_") and v == LEGACY:
            return k.removeprefix("__polygraphy_encoded_")
    return None


def _array(d: Any, name: str, src: Path) -> np.ndarray:
    cls = _class(d)
    if cls in ("LazyArray", "LazyNumpyArray"):
        return _array(d.get("values"), name, src)
    if cls == "Tensor":
        raise BadInput(f"{src}: {name!r} is a torch tensor saved with torch.save (a pickle), which tensordiff never "
                       "loads; save numpy arrays from Polygraphy instead")
    if cls != "ndarray" or not isinstance(d.get("array"), str):
        raise BadInput(f"{src}: {name!r} is not an encoded array (polygraphy_class {cls!r})")
    text = d["array"]
    try:
        data = base64.b64decode(text.encode(), validate=True)
    except (binascii.Error, ValueError):
        try:
            data = text.encode("latin-1")  # the oldest files stored the bytes as latin-1 text
        except UnicodeEncodeError:
            raise BadInput(f"{src}: {name!r} is neither base64 nor latin-1 text (not an encoded array)") from None
    if not data.startswith((b"\x93NUMPY", b"PK\x03\x04")):  # np.load would take anything else for a pickle
        raise BadInput(f"{src}: {name!r} is not a valid .npy payload")
    try:
        arr = np.load(io.BytesIO(data), allow_pickle=False)
    except ValueError as e:
        if "allow_pickle" in str(e):  # an object array needs pickle: refused
            raise BadInput(f"{src}: {name!r} is an object array, which cannot be read without pickle") from None
        raise BadInput(f"{src}: {name!r} is not a valid .npy payload (ValueError)") from None
    except Exception as e:  # noqa: BLE001 - numpy's header parser on damaged bytes (tokenize, syntax, EOF)
        raise BadInput(f"{src}: {name!r} is not a valid .npy payload ({type(e).__name__})") from None
    if not isinstance(arr, np.ndarray):  # an .npz archive (old files): its one array
        with arr:
            values = [arr[k] for k in arr.files]
        if len(values) != 1:
            raise BadInput(f"{src}: {name!r} is an archive of {len(values)} arrays, expected one")
        arr = values[0]
    return arr


def _load(src: Path) -> Any:
    if not src.is_file():
        raise BadInput(f"{src} does not exist or is not a file")
    if src.stat().st_size > MAX_JSON:
        raise BadInput(f"{src} is implausibly large ({src.stat().st_size} bytes)")
    try:
        return json.loads(src.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise BadInput(f"{src} is not valid JSON ({type(e).__name__})") from None


def read(src: str | Path, *, runner: str | None = None, iteration: int | None = None) -> Imported:
    src = Path(src)
    data = _load(src)
    if isinstance(data, list):  # --save-inputs: one feed dict per iteration
        runs = [["inputs", [{"outputs": feed} for feed in data]]]
        kind = "inputs"
    elif _class(data) == "RunResults" and isinstance(data.get("lst"), list):
        runs, kind = data["lst"], "outputs"
    else:
        raise BadInput(f"{src} is neither Polygraphy RunResults (--save-outputs) nor saved inputs (--save-inputs)")
    if not all(isinstance(r, list) and len(r) == 2 and isinstance(r[0], str) and isinstance(r[1], list) for r in runs):
        raise BadInput(f"{src}: RunResults 'lst' must hold [runner name, [iterations]] pairs")
    names = [r[0] for r in runs]
    if runner is None:
        if len(runs) != 1:
            raise BadInput(f"{src} holds {len(runs)} runners ({', '.join(names)}); pick one with --runner")
        runner = names[0]
    if runner not in names:
        raise BadInput(f"{src} has no runner {runner!r} (runners: {', '.join(names)})")
    iters = dict(runs)[runner]
    if iteration is None:
        if len(iters) != 1:
            raise BadInput(f"{src}: runner {runner!r} has {len(iters)} iterations; pick one with --iteration")
        iteration = 0
    if not 0 <= iteration < len(iters):
        raise BadInput(f"{src}: runner {runner!r} has no iteration {iteration} (0..{len(iters) - 1})")
    it = iters[iteration]
    outputs = it.get("outputs") if isinstance(it, dict) else None
    if not isinstance(outputs, dict):
        raise BadInput(f"{src}: iteration {iteration} of {runner!r} has no outputs table")
    imp = Imported(TOOL, src, facts={"kind": kind, "runner": runner, "iteration": iteration})
    for name, enc in outputs.items():
        if name == MARK:
            continue
        imp.add(name, _array(enc, name, src))
    return imp
