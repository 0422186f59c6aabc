"""Fuzz targets for the readers that face untrusted files.

Each target takes arbitrary bytes, puts them where the reader looks (a file in `work`), and runs
the reader: it must return a result or raise BadInput, never another exception, and write
nothing (the directory holds exactly what the target put there). `SEEDS` are valid inputs that
mutations start from; `check(target, data, work)` returns None or a description of a finding.
"""
from __future__ import annotations

import io
import json
import struct
import sys
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tensordiff.format.capture import FORMAT  # noqa: E402
from tensordiff.format.dtypes import BY_NAME  # noqa: E402
from tensordiff.errors import BadInput  # noqa: E402
from tensordiff.format.storage import write_hdf5, write_safetensors  # noqa: E402
from tests.samples import sglang_sample  # noqa: E402


def _safetensors_bytes() -> bytes:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "x.safetensors"
        write_safetensors(p, {"a": (np.arange(6, dtype=np.float32).reshape(2, 3), BY_NAME["float32"]),
                              "b": (np.array([1, 2], dtype=np.uint16), BY_NAME["bfloat16"])}, {"format": FORMAT})
        return p.read_bytes()


def _hdf5_bytes() -> bytes:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "x.h5"
        write_hdf5(p, {"a": (np.arange(6, dtype=np.float32).reshape(2, 3), BY_NAME["float32"]),
                       "b": (np.array([1, 2], dtype=np.uint16), BY_NAME["bfloat16"])})
        return p.read_bytes()


def _hdf5_many_bytes() -> bytes:
    """The same two datasets among 40 more: a root group of several symbol nodes under one B-tree
    node, so that mutations reach the keys and the order of names."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "x.h5"
        write_hdf5(p, {"a": (np.arange(6, dtype=np.float32).reshape(2, 3), BY_NAME["float32"]),
                       "b": (np.array([1, 2], dtype=np.uint16), BY_NAME["bfloat16"]),
                       **{f"t{i}": (np.full(3, i, dtype=np.float32), BY_NAME["float32"]) for i in range(40)}})
        return p.read_bytes()


HDF5_KEYS = (("a", "float32"), ("b", "bfloat16"), *((f"t{i}", "float32") for i in range(40)))


def _manifest_bytes() -> bytes:
    return json.dumps({"format": FORMAT, "version": 1, "model": "toy", "producer": {"name": "fuzz"}, "run": {},
                       "tensors": [{"name": "a", "boundary": "a", "file": "a.safetensors", "key": "a",
                                    "shape": [2, 3], "dtype": "float32"},
                                   {"name": "b.x", "file": "a.safetensors", "key": "b", "shape": [2],
                                    "dtype": "bfloat16"}]}).encode()


def _tolerance_bytes() -> bytes:
    return (b"[tolerances.float32]\natol = 1e-5\nrtol = 1e-5\n[tolerances.boundaries.rope]\natol = 0.0\n"
            b"[tolerances.boundaries.\"block*\".bfloat16]\nmin_cosine = 0.99\n")


def _image_bytes() -> list[bytes]:
    from PIL import Image

    im = Image.new("RGB", (12, 9))
    for x in range(12):
        for y in range(9):
            im.putpixel((x, y), (x * 20, y * 25, (x + y) * 10))
    out = []
    for fmt, kw in (("PNG", {}), ("JPEG", {}), ("GIF", {"save_all": True, "append_images": [im.rotate(90)]}),
                    ("TIFF", {}), ("WEBP", {}), ("BMP", {})):
        b = io.BytesIO()
        im.save(b, fmt, **kw)
        out.append(b.getvalue())
    return out


DATA = ROOT / "tests" / "data" / "import"
HF_SAMPLE = DATA / "hf-debugger"
HF_TRACE = "LlamaForCausalLM_debug_tree_FULL_TENSORS.json"
SGLANG_SAMPLE = sglang_sample() / "tp2" / "exp"
SGLANG_FILE = "step=0___rank=0___dump_index=1___name=x___recompute_status=disabled.pt"


def _contract_bytes() -> list[bytes]:
    return [(ROOT / "examples" / "patch_model" / "contract.toml").read_bytes(),
            b'model = "toy"\n[boundaries.embed]\ntensors = ["embed", "tok"]\ninputs = []\n'
            b'[boundaries."hidden.{L}"]\ntensors = { "hidden.{L}" = ["layers.{L}.out", "blk{L}"] }\n'
            b'inputs = ["hidden.{L-1}", "embed"]\nlayout = "tokens"\nmode = "values"\n'
            b'tolerance = { atol = 1e-3, float32 = { rtol = 0.0 } }\n']


def _sglang_bytes() -> list[bytes]:
    """Two files of the SGLang sample (a tensor with dims, a list) as the runner names them."""
    import torch

    out = []
    for n in ("mlp_up", "rids"):
        obj = torch.load(next(SGLANG_SAMPLE.glob(f"step=0___rank=0___*name={n}___*.pt")), weights_only=True)
        obj["meta"].update(name="x", dump_index=1, rank=0, step=0)
        b = io.BytesIO()
        torch.save(obj, b)
        out.append(b.getvalue())
    return out


def _ds_config_bytes() -> list[bytes]:
    """The tiny synthetic DeepSeek config (every field a checkpoint states) and the empty object
    (every field at its default)."""
    from tensordiff.models.deepseek_v41_flash.synthetic import CONFIGS

    return [json.dumps(CONFIGS["tiny"]()).encode(), b"{}"]


def _qwen_config_bytes() -> list[bytes]:
    """config.json and preprocessor_config.json of the tiny synthetic Qwen3-VL checkpoint, as one
    JSON pair [config, preprocessor] (the runner writes each to its file)."""
    from tensordiff.models.qwen3_vl.synthetic import config_json, preprocessor_json

    return [json.dumps([config_json("tiny"), preprocessor_json("tiny")]).encode()]


SEEDS = {
    "contract": _contract_bytes(),
    "polygraphy": [(DATA / "polygraphy" / n).read_bytes() for n in ("outputs.json", "inputs.json")],
    "hf-debugger": [(HF_SAMPLE / HF_TRACE).read_bytes()],
    "sglang": _sglang_bytes(),
    "manifest": [_manifest_bytes()],
    "safetensors": [_safetensors_bytes()],
    "hdf5": [_hdf5_bytes()],
    "hdf5-layout": [_hdf5_bytes(), _hdf5_many_bytes()],
    "tolerance": [_tolerance_bytes()],
    "image": _image_bytes(),
    "ds-config": _ds_config_bytes(),
    "qwen-config": _qwen_config_bytes(),
}


def _listing(work: Path) -> set[str]:
    return {str(p.relative_to(work)) for p in work.rglob("*")}


def _run_manifest(data: bytes, work: Path) -> None:
    from tensordiff.format.dump import open_dump

    d = work / "dump"
    d.mkdir(exist_ok=True)
    if not (d / "a.safetensors").exists():
        (d / "a.safetensors").write_bytes(SEEDS["safetensors"][0])
    (d / "manifest.json").write_bytes(data)
    dump = open_dump(d)
    for e in dump.entries:  # the offsets the manifest led to must be readable too
        r = e.stored.reader()
        try:
            r.read(0, e.stored.numel)
        finally:
            r.close()


def _run_safetensors(data: bytes, work: Path) -> None:
    from tensordiff.format.storage import read_safetensors_header

    p = work / "x.safetensors"
    p.write_bytes(data)
    tensors, _meta = read_safetensors_header(p)
    for t in tensors.values():
        r = t.reader()
        try:
            r.read(0, t.numel)
        finally:
            r.close()


def _run_hdf5(data: bytes, work: Path) -> None:
    from tensordiff.format.storage import read_hdf5_entry

    p = work / "x.h5"
    p.write_bytes(data)
    for key, dt in (("a", "float32"), ("b", "bfloat16")):
        try:
            t = read_hdf5_entry(p, key, dt)
        except BadInput:
            continue
        r = t.reader()
        try:
            r.read(0, t.numel)
        finally:
            r.close()


def _run_hdf5_layout(data: bytes, work: Path) -> None:
    """The dump opener's own reading of HDF5 metadata (`hdf5_layout`) against h5py's: where it
    locates a dataset in place, h5py must accept the file and give the same entry."""
    import contextlib

    import h5py

    from tensordiff.format.hdf5_layout import Layout
    from tensordiff.format.storage import H5_ERRORS, plain_hdf5_entry, read_hdf5_entry

    p = work / "x.h5"
    p.write_bytes(data)
    with contextlib.closing(Layout(p)) as layout:
        fast = {key: (dt, plain_hdf5_entry(layout, key, dt)) for key, dt in HDF5_KEYS}
    fast = {key: v for key, v in fast.items() if v[1] is not None}  # the rest is left to h5py ("hdf5")
    if not fast:
        return
    try:  # opened once, as open_dump opens a file whose datasets it asks h5py about
        handle = h5py.File(p, "r")
    except H5_ERRORS as e:
        raise AssertionError(f"{sorted(fast)} located in place, but h5py cannot open the file: {e}") from None
    with handle:
        for key, (dt, st) in fast.items():
            try:
                ref = read_hdf5_entry(p, key, dt, handle)
            except BadInput as e:
                raise AssertionError(f"{key} located in place, but h5py refuses it: {e}") from None
            if ref != st:
                raise AssertionError(f"{key}: located at {st}, h5py says {ref}")
            r = st.reader()
            try:
                r.read(0, st.numel)
            finally:
                r.close()


def _run_tolerance(data: bytes, work: Path) -> None:
    from tensordiff.judge.tolerance import load

    p = work / "t.toml"
    p.write_bytes(data)
    tols = load(p)
    for b in ("rope", "block0", "x"):
        for dt in ("float32", "bfloat16", "int64"):
            tols.for_(b, dt)


def _run_image(data: bytes, work: Path) -> None:
    from tensordiff.pipeline.provenance import describe_image

    p = work / "img"
    p.write_bytes(data)
    describe_image(p)  # check_image, and what a dump records of the picture


def _run_contract(data: bytes, work: Path) -> None:
    from safetensors.numpy import save_file

    from tensordiff.judge.contract_file import load
    from tensordiff.format.plain import open_any

    for name, keys in (("a.safetensors", ("embed", "layers.0.out", "layers.1.out", "patches")),
                       ("b.safetensors", ("tok", "blk0", "blk1", "tokens.patches"))):
        if not (work / name).exists():
            save_file({k: np.zeros((2, 3), np.float32) for k in keys}, str(work / name))
    p = work / "c.toml"
    p.write_bytes(data)
    cf = load(p)
    try:
        cf.bind(open_any(work / "a.safetensors"), open_any(work / "b.safetensors"))
    except BadInput:
        pass


def _run_polygraphy(data: bytes, work: Path) -> None:
    from tensordiff.format.importers.polygraphy import read

    p = work / "r.json"
    p.write_bytes(data)
    read(p)


def _run_hf_debugger(data: bytes, work: Path) -> None:
    import shutil

    from tensordiff.format.importers.hf_debugger import read

    d = work / "dbg"
    if not d.exists():
        shutil.copytree(HF_SAMPLE, d)
    (d / HF_TRACE).write_bytes(data)
    read(d)


def _run_sglang(data: bytes, work: Path) -> None:
    from tensordiff.format.importers.sglang import read

    d = work / "sg"
    d.mkdir(exist_ok=True)
    (d / SGLANG_FILE).write_bytes(data)
    try:
        read(d)
    except BadInput as e:
        if "no tensor to import" not in str(e):  # the list seed holds none: a refusal, as it should be
            raise


def _run_ds_config(data: bytes, work: Path) -> None:
    """A DeepSeek checkpoint's config.json, read by each side on its own (oracle ModelArgs, engine
    Config): a config either accepts is one its modules can be sized from."""
    from engine.deepseek_v41_flash.config import Config
    from oracle.deepseek_v41_flash.config import ModelArgs

    (work / "config.json").write_bytes(data)
    for read in (ModelArgs.from_dir, Config.load):
        try:
            cfg = read(work)
        except BadInput:
            continue
        head = cfg.vision_dim // cfg.vision_n_heads
        sizes = (head, cfg.vision_patch_size, cfg.vision_downsample_ratio, cfg.vision_min_pixels, cfg.vision_max_n_token,
                 cfg.max_seq_len, cfg.n_layers, cfg.dim)
        if cfg.vision_n_layers and (min(sizes) < 1 or head % 2 or head * cfg.vision_n_heads != cfg.vision_dim):
            raise AssertionError(f"{read.__qualname__} accepted sizes {sizes} that size no module")
        if len(cfg.compress_ratios) < cfg.n_layers:
            raise AssertionError(f"{read.__qualname__} accepted {len(cfg.compress_ratios)} compress ratios "
                                 f"for {cfg.n_layers} layers")


def _run_qwen_config(data: bytes, work: Path) -> None:
    """A Qwen3-VL checkpoint's config.json and preprocessor_config.json (the input is the JSON pair
    [config, preprocessor]; anything else is written to both files), read by the engine's
    `load_config` and checked by the oracle's own readers before transformers sees them."""
    from engine.qwen3_vl.config import load_config
    from oracle.qwen3_vl.config import check_values
    from oracle.qwen3_vl.processor import check_preprocessor

    try:
        pair = json.loads(data)
    except (ValueError, RecursionError):
        pair = None
    if isinstance(pair, list) and len(pair) == 2:
        parts = [json.dumps(x).encode() for x in pair]
    else:
        parts = [data, data]
    (work / "config.json").write_bytes(parts[0])
    (work / "preprocessor_config.json").write_bytes(parts[1])
    try:
        cfg = load_config(work)
    except BadInput:
        pass
    else:
        v, pr = cfg.vision, cfg.processor
        if v.head_dim < 1 or v.grid_side ** 2 != v.num_position_embeddings or pr.factor < 1 or len(pr.image_std) != 3:
            raise AssertionError(f"the engine accepted a config that sizes nothing: {v} {pr}")
        if cfg.text is not None and sum(cfg.text.mrope_section) * 2 != cfg.text.head_dim:
            raise AssertionError(f"the engine accepted mrope_section {cfg.text.mrope_section}")
    for check, name in ((check_values, "config.json"), (check_preprocessor, "preprocessor_config.json")):
        try:
            check(work / name)
        except BadInput:
            pass


RUNNERS = {"contract": _run_contract, "polygraphy": _run_polygraphy, "hf-debugger": _run_hf_debugger,
           "sglang": _run_sglang,
           "manifest": _run_manifest, "safetensors": _run_safetensors, "hdf5": _run_hdf5,
           "hdf5-layout": _run_hdf5_layout,
           "tolerance": _run_tolerance, "image": _run_image, "ds-config": _run_ds_config,
           "qwen-config": _run_qwen_config}
# What each target itself puts in `work`; anything else appearing there is a write by the reader.
OWN = {"contract": {"a.safetensors", "b.safetensors", "c.toml"}, "polygraphy": {"r.json"},
       "hf-debugger": {"dbg", *(f"dbg/{p.name}" for p in HF_SAMPLE.iterdir())}, "sglang": {"sg", f"sg/{SGLANG_FILE}"},
       "manifest": {"dump", "dump/a.safetensors", "dump/manifest.json"}, "safetensors": {"x.safetensors"},
       "hdf5": {"x.h5"}, "hdf5-layout": {"x.h5"}, "tolerance": {"t.toml"}, "image": {"img"},
       "ds-config": {"config.json"}, "qwen-config": {"config.json", "preprocessor_config.json"}}


def check(target: str, data: bytes, work: Path) -> str | None:
    """None when the reader behaved; else what went wrong (the exception with its traceback)."""
    work.mkdir(parents=True, exist_ok=True)
    try:
        RUNNERS[target](data, work)
    except BadInput as e:
        if "\n" in str(e).strip():
            return f"BadInput message is not one line: {str(e)!r}"
    except BaseException as e:  # noqa: BLE001 - the finding
        if isinstance(e, KeyboardInterrupt):
            raise
        return "".join(traceback.format_exception(e))[-3000:]
    extra = _listing(work) - OWN[target]
    if extra:
        return f"the reader wrote {sorted(extra)}"
    return None


def mutate(seed: bytes, rng) -> bytes:
    """One random mutation of `seed`: byte flips, a truncation, a splice, an inserted number, or noise."""
    b = bytearray(seed)
    op = rng.integers(0, 7)
    if op == 0 or not b:
        return bytes(rng.integers(0, 256, size=int(rng.integers(0, 64)), dtype=np.uint8))
    if op == 1:
        return bytes(b[: int(rng.integers(0, len(b)))])
    if op == 2:
        for _ in range(int(rng.integers(1, 8))):
            b[int(rng.integers(0, len(b)))] = int(rng.integers(0, 256))
        return bytes(b)
    if op == 3:
        i, j = sorted(int(x) for x in rng.integers(0, len(b) + 1, size=2))
        return bytes(b[:i] + b[j:] + b[i:j])
    if op == 4:  # an interesting number where a number may be
        nums = [b"-1", b"0", b"nan", b"1e309", b"18446744073709551615", b"-0", b"[]", b"{}", b"\"\"", b"null",
                b"true", b"\x00", b"\n", b"99999999999"]
        i = int(rng.integers(0, len(b) + 1))
        return bytes(b[:i] + nums[int(rng.integers(0, len(nums)))] + b[i + int(rng.integers(0, 4)):])
    if op == 5 and len(b) >= 8:  # the safetensors header length, or any 8 bytes, set to a boundary value
        i = int(rng.integers(0, max(1, len(b) - 8)))
        v = [0, 1, 2 ** 63 - 1, 2 ** 64 - 1, len(b), len(b) - 8, len(b) + 1][int(rng.integers(0, 7))]
        return bytes(b[:i] + struct.pack("<Q", v) + b[i + 8:])
    i = int(rng.integers(0, len(b)))
    return bytes(b[:i] + bytes(rng.integers(0, 256, size=int(rng.integers(1, 32)), dtype=np.uint8)) + b[i:])


CRASHES = Path(__file__).with_name("crashes")


def regression_cases(target: str) -> list[Path]:
    d = CRASHES / target
    return sorted(d.glob("*.crash")) if d.is_dir() else []


if __name__ == "__main__":  # smoke: every seed is accepted
    import tempfile

    for t, seeds in SEEDS.items():
        for s in seeds:
            with tempfile.TemporaryDirectory() as w:
                print(t, check(t, s, Path(w)) or "ok")
