"""The capture API: how an oracle or an engine records tensors at named boundaries.

    with Recorder("out/engine", model="qwen3-vl", producer={"name": "my-engine"}) as rec:
        rec.record("patches", pixel_values)
        rec.record("rope.cos", cos)        # boundary "rope", tensor "rope.cos"

`record` copies at once (a later kernel may overwrite the buffer it was handed); the
directory appears only when the recorder closes cleanly (written under a temporary name, then
renamed), and an existing dump is never replaced unless `overwrite=True`.

Recording is refused while a CUDA graph is being captured (`refuse_in_graph_capture`): what a
record takes then is the capture's placeholder, and every replay writes that one buffer again, so
each decode step would hold the last step's values. Serving engines (SGLang, vLLM) capture decode.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

from tensordiff.format.dtypes import BY_NAME, DType
from tensordiff.errors import BadInput
from tensordiff.format.storage import fsync_dir, write_hdf5, write_safetensors
from tensordiff.warmup import warm_if_torch
from tensordiff.format.shard import parse_layout

FORMAT = "tensordiff-dump"
VERSION = 1
# \Z, not $: "$" also matches before a trailing newline, and "patches\n" is not a name
NAME_RE = re.compile(r"\A[A-Za-z0-9_][A-Za-z0-9_.\-]*\Z")


IN_GRAPH = ("it ran while a CUDA graph was being captured: it would record the capture's placeholder, and every "
            "replay would overwrite that one buffer; dump decode eagerly (SGLang --disable-cuda-graph, vLLM "
            "--enforce-eager) or record outside the graph (its static outputs, after each replay)")


def refuse_in_graph_capture(what: str) -> None:
    """BadInput when the current CUDA stream is capturing a graph (`what` names the record or
    tap). A process that never touched CUDA is not capturing: the query is skipped there."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return
    if torch.cuda.is_current_stream_capturing():
        raise BadInput(f"{what}: {IN_GRAPH}")


def default_boundary(name: str) -> str:
    return name.split(".", 1)[0]


def check_name(name: str) -> None:
    if not isinstance(name, str) or not NAME_RE.match(name) or ".." in name:
        raise BadInput(f"tensor name {name!r} is not allowed (letters, digits, '_', '-', single '.'; no paths)")


def to_raw(tensor: Any) -> tuple[np.ndarray, DType]:
    """Copy a torch tensor or numpy array into a C-contiguous little-endian numpy array."""
    if isinstance(tensor, np.ndarray):
        arr = np.array(tensor, copy=True, order="C")
        for dt in BY_NAME.values():
            if dt.name != "bfloat16" and arr.dtype.newbyteorder("<") == dt.storage.newbyteorder("<") and arr.dtype.kind == dt.storage.kind:
                return arr.astype(dt.storage, copy=False), dt
        raise BadInput(f"cannot record numpy dtype {arr.dtype}")
    import torch

    if not isinstance(tensor, torch.Tensor):
        raise BadInput(f"record() takes a torch.Tensor or numpy array, not {type(tensor).__name__}")
    t = tensor.detach()
    name = str(t.dtype).replace("torch.", "")
    if name not in BY_NAME:
        raise BadInput(f"cannot record torch dtype {t.dtype}")
    dt = BY_NAME[name]
    # .to(cpu) from a GPU is already a copy; on the CPU, clone so no storage is shared.
    t = t.to("cpu").contiguous() if t.device.type != "cpu" else t.contiguous().clone()
    if dt.name == "bfloat16":
        arr = t.view(torch.int16).numpy().view(np.uint16)
    else:
        arr = t.numpy()
    return np.ascontiguousarray(arr).astype(dt.storage, copy=False), dt


def is_dump_dir(path: Path) -> bool:
    """A real directory (not a link) holding our manifest: the only thing `--force` replaces."""
    m = path / "manifest.json"
    if path.is_symlink() or not path.is_dir() or m.is_symlink() or not m.is_file():
        return False
    try:
        with open(m, "rb") as f:
            head = json.loads(f.read(64 << 20).decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(head, dict) and head.get("format") == FORMAT


def refuse_unless_dump(path: Path) -> None:
    """`--force` replaces a dump only: a directory holding our manifest and nothing but the files
    that manifest names (what a dump wrote); any other file in it is the user's, and refused."""
    if not is_dump_dir(path):
        kind = "a file" if path.is_file() and not path.is_symlink() else (
            "a link" if path.is_symlink() else "a directory that is not a tensordiff dump")
        raise BadInput(f"{path} is {kind}; --force only replaces a tensordiff dump (a directory with its "
                       "manifest.json), so pick another --out or remove it yourself")
    stranger = _stranger(path)
    if stranger is not None:
        raise BadInput(f"{path} holds {stranger!r}, which its manifest does not name; --force only replaces what a "
                       "dump wrote, so move that file out or pick another --out")


def _stranger(path: Path) -> str | None:
    """The first entry (in name order) of a dump directory that is neither its manifest nor a file
    the manifest names; None when there is none."""
    try:
        with open(path / "manifest.json", "rb") as f:
            tensors = json.loads(f.read(64 << 20).decode("utf-8")).get("tensors")
        names = {"manifest.json"} | {t["file"] for t in tensors if isinstance(t, dict) and isinstance(t.get("file"), str)}
        present = sorted(os.listdir(path))
    except (OSError, UnicodeDecodeError, ValueError, AttributeError, TypeError) as e:
        raise BadInput(f"cannot read the dump {path} that --force would replace ({e})") from None
    return next((n for n in present if n not in names or not (path / n).is_file() or (path / n).is_symlink()), None)


def merge_run(run: dict, fields: dict) -> None:
    """Merge `fields` into the run record in place: tables merge key by key, at every depth, so a
    runner adding `inputs={"grid": ...}` keeps the core's `inputs.image`; any other value replaces."""
    for k, v in fields.items():
        if isinstance(v, dict) and isinstance(run.get(k), dict):
            run[k] = dict(run[k])
            merge_run(run[k], v)
        else:
            run[k] = v


def current_umask() -> int:
    """The process's umask (read by setting it and back)."""
    old = os.umask(0o022)
    os.umask(old)
    return old


def _on_accelerator(tensor: Any) -> bool:
    dev = getattr(tensor, "device", None)
    return dev is not None and getattr(dev, "type", "cpu") not in ("cpu", "meta")


def sha256_of(arr: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(arr).data).hexdigest()


class Recorder:
    """Collects tensors and writes one dump directory atomically on `close()`."""

    def __init__(self, path: str | os.PathLike, *, model: str, producer: dict | None = None,
                 run: dict | None = None, fmt: str = "safetensors", overwrite: bool = False):
        if fmt not in ("safetensors", "hdf5"):
            raise BadInput(f"unknown dump format {fmt!r} (safetensors or hdf5)")
        if not isinstance(model, str) or not model.strip() or not model.isprintable():
            raise BadInput(f"Recorder(model={model!r}): the model must be a non-empty, one-line name "
                           "(a reader refuses a dump without one)")
        warm_if_torch()  # this process computes with torch: settle MKL's dispatch first (warmup.py)
        self.path = Path(path)
        self.model = model
        self.producer = dict(producer or {"name": "tensordiff"})
        self.run = dict(run or {})
        self.fmt = fmt
        self.overwrite = overwrite
        self._tensors: dict[str, tuple[np.ndarray, DType, str]] = {}
        self._pending: dict[str, tuple[Any, str]] = {}  # device copies not yet on the host
        self._names: list[str] = []
        self._layouts: dict[str, dict] = {}  # name -> its rank layout fields (sharded runs)
        self._closed = False
        self._check_target()

    def _check_target(self) -> None:
        if self.path.exists() or self.path.is_symlink():
            if not self.overwrite:
                raise BadInput(f"{self.path} already exists; refusing to overwrite it (pass --force to replace a dump)")
            refuse_unless_dump(self.path)
        parent = self.path.resolve().parent
        for up in (parent, *parent.parents):  # a path under a regular file can never be made
            if up.exists():
                if not up.is_dir():
                    raise BadInput(f"{self.path} cannot be created: {up} is a file, not a directory; "
                                   "pick an --out outside it")
                break
        if not parent.exists():
            try:
                parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise BadInput(f"cannot create {parent}: {e.strerror}") from None
        if not os.access(parent, os.W_OK):
            raise BadInput(f"{parent} is not writable")

    @property
    def enabled(self) -> bool:
        return True

    def record(self, name: str, tensor: Any, *, boundary: str | None = None, layout: dict | None = None) -> None:
        """`layout` (a sharded run's rank dump): the manifest fields saying how this rank's tensor
        makes up the whole, e.g. `{"shard": {"axis": 1, "index": r, "count": W}}`,
        `{"replicated": True}`, `{"partial": "sum"}` (dumps/README.md, `shard`)."""
        if self._closed:
            raise RuntimeError("recorder is closed")
        check_name(name)
        refuse_in_graph_capture(f"record({name!r})")
        if name in self._names:
            raise BadInput(f"tensor {name!r} recorded twice")
        b = boundary or default_boundary(name)
        check_name(b)
        if layout is not None:
            if not isinstance(layout, dict) or parse_layout(f"tensor {name!r}", layout, tensor.dim() if hasattr(
                    tensor, "dim") else np.ndim(tensor), 0, 1) is None:
                raise BadInput(f"tensor {name!r}: layout {layout!r} states no shard, dims, replicated or partial")
            self._layouts[name] = dict(layout)
        self._names.append(name)
        if _on_accelerator(tensor):
            # A device-side copy, queued on the producer's stream: it sees the buffer as it is
            # now (later kernels on that stream run after it) and costs microseconds, so taps
            # do not stall the model with a host round trip per tensor. Moved to the host at close.
            self._pending[name] = (tensor.detach().clone(), b)
            return
        arr, dt = to_raw(tensor)
        self._tensors[name] = (arr, dt, b)

    def _drain(self) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, {}
        done = dict(self._tensors)
        self._tensors.clear()
        for name, (t, b) in pending.items():
            arr, dt = to_raw(t)
            done[name] = (arr, dt, b)
        # keep the order in which the producer recorded
        order = [n for n in self._names if n in done]
        self._tensors = {n: done[n] for n in order}

    def names(self) -> list[str]:
        return list(self._names)

    def update_run(self, **fields: Any) -> None:
        """Add facts to the manifest's run record, merged in deeply (see `merge_run`)."""
        merge_run(self.run, fields)

    def close(self) -> Path:
        if self._closed:
            return self.path
        self._closed = True
        self._check_target()
        self._drain()
        parent = self.path.resolve().parent
        import shutil  # here, not at the top: `import tensordiff` (every command) stays light
        import tempfile

        tmp = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.tmp-", dir=parent))
        try:
            entries = []
            files: dict[str, dict[str, tuple[np.ndarray, DType]]] = {}
            ext = ".safetensors" if self.fmt == "safetensors" else ".h5"
            for name, (arr, dt, b) in self._tensors.items():
                fname = f"{b}{ext}"
                files.setdefault(fname, {})[name] = (arr, dt)
                entries.append({"name": name, "boundary": b, "file": fname, "key": name,
                                "shape": list(arr.shape), "dtype": dt.name, "sha256": sha256_of(arr),
                                **self._layouts.get(name, {})})
            for fname, group in files.items():
                if self.fmt == "safetensors":
                    write_safetensors(tmp / fname, group, {"format": FORMAT})
                else:
                    write_hdf5(tmp / fname, group)
            manifest = {"format": FORMAT, "version": VERSION, "model": self.model, "producer": self.producer,
                        "run": self.run, "tensors": entries}
            (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
            os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp makes 0700; a dump (and a shared cache) is readable
            fsync_dir(tmp)
            if self.path.exists() or self.path.is_symlink():
                if not self.overwrite:
                    raise BadInput(f"{self.path} appeared while recording; refusing to overwrite it")
                refuse_unless_dump(self.path)
                old = self.path.with_name(f".{self.path.name}.old-{os.getpid()}")
                os.rename(self.path, old)
                os.rename(tmp, self.path)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.rename(tmp, self.path)
            fsync_dir(parent)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            self._tensors.clear()
        return self.path

    def abort(self) -> None:
        self._closed = True
        self._tensors.clear()
        self._pending.clear()

    def __enter__(self) -> "Recorder":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


class NullRecorder:
    """A recorder that records nothing: the engine's taps cost a branch, no copy."""

    enabled = False

    def record(self, name: str, tensor: Any, *, boundary: str | None = None, layout: dict | None = None) -> None:
        pass

    def update_run(self, **fields: Any) -> None:
        pass


class MemoryRecorder:
    """Keeps recorded tensors in memory as torch tensors (tests, local-error runs)."""

    enabled = True

    def __init__(self) -> None:
        self.tensors: dict[str, Any] = {}
        self.run: dict = {}

    def record(self, name: str, tensor: Any, *, boundary: str | None = None) -> None:
        check_name(name)
        refuse_in_graph_capture(f"record({name!r})")
        if name in self.tensors:
            raise BadInput(f"tensor {name!r} recorded twice")
        self.tensors[name] = tensor.detach().clone() if hasattr(tensor, "detach") else np.array(tensor, copy=True)

    def update_run(self, **fields: Any) -> None:
        merge_run(self.run, fields)
