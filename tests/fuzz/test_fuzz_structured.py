"""Structure-aware fuzzing of the readers: valid inputs with one to three values replaced by any
JSON or TOML value (wrong types, zero, negative, huge, NaN, Inf, nested), where test_fuzz.py
mutates bytes. Property: the reader returns a usable result or raises BadInput (one line), never
another exception, and writes nothing (`targets.check`). Seeded (derandomize) and bounded
(max_examples, no database), so a run is the same every time and takes seconds.
"""
import json
import math
import os
import struct
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))
from targets import SEEDS, check  # noqa: E402

from tensordiff.errors import BadInput  # noqa: E402

SETTINGS = settings(max_examples=int(os.environ.get("TD_FUZZ_EXAMPLES", "150")), deadline=None, database=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70),
                    st.sampled_from([0, 1, -1, 2, 3, 4, 7, 2 ** 31, 2 ** 63, 10 ** 12]),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6))
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner,
                                                                                         max_size=3), max_leaves=8)


def _set(obj, path: tuple, value):
    """A copy of `obj` with the value at `path` (keys and list indices) replaced."""
    if not path:
        return value
    out = dict(obj) if isinstance(obj, dict) else {}  # a table where an earlier edit put a non-table
    out[path[0]] = _set(out.get(path[0]), path[1:], value)
    return out


def _paths(obj, prefix=()) -> list[tuple]:
    """Every key path of a nested JSON object (tables and their scalar leaves)."""
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.append(prefix + (k,))
            out += _paths(v, prefix + (k,))
    return out


@st.composite
def edited(draw, base):
    """`base` with 1 to 3 of its values (or a new key) replaced by any JSON value."""
    obj = base
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(obj)
        path = draw(st.sampled_from(paths)) if paths and draw(st.integers(0, 4)) else (draw(st.text(max_size=5)),)
        obj = _set(obj, path, draw(JSON))
    return obj


def _assert_clean(target: str, data: bytes, work: Path) -> None:
    found = check(target, data, work)
    assert found is None, found


# ----------------------------------------------------------------------------- checkpoint configs

def test_deepseek_config_values(tmp_path):
    base = json.loads(SEEDS["ds-config"][0])

    @SETTINGS
    @given(edited(base))
    def prop(cfg):
        _assert_clean("ds-config", json.dumps(cfg).encode(), tmp_path / "w")

    prop()


def test_qwen_config_values(tmp_path):
    config, pre = json.loads(SEEDS["qwen-config"][0])

    @SETTINGS
    @given(edited({"c": config, "p": pre}))
    def prop(both):
        _assert_clean("qwen-config", json.dumps([both["c"], both["p"]]).encode(), tmp_path / "w")

    prop()


# ----------------------------------------------------------------------------- tolerance and contract files

def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return "{ " + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + " }"


TOML_SCALARS = st.one_of(st.booleans(), st.integers(-2 ** 63, 2 ** 63 - 1),
                         st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0, 1, 0.5, 1.5, -0.1, 2.0]),
                         st.text(max_size=6), st.sampled_from(["rms", "none", "values", "exact", "grid"]))
TOML_VALUES = st.recursive(TOML_SCALARS, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6)
TOL_KEYS = st.sampled_from(["atol", "rtol", "max_mismatch", "min_cosine", "floor", "atol_scale", "source", "x"])
TABLES = st.sampled_from(["float32", "bfloat16", "float16", "int", "boundaries.rope", 'boundaries."block*"',
                          "boundaries.rope.float32", "nonsense"])


@st.composite
def tolerance_files(draw) -> str:
    lines = []
    for _ in range(draw(st.integers(1, 3))):
        lines.append(f"[tolerances.{draw(TABLES)}]")
        for key in draw(st.lists(TOL_KEYS, min_size=1, max_size=4, unique=True)):
            lines.append(f"{key} = {_toml_value(draw(TOML_VALUES))}")
    return "\n".join(lines) + "\n"


def test_tolerance_values(tmp_path):
    from tensordiff.judge.tolerance import load

    @SETTINGS
    @given(tolerance_files())
    def prop(text):
        _assert_clean("tolerance", text.encode(), tmp_path / "w")
        p = tmp_path / "t.toml"
        p.write_text(text)
        try:
            tols = load(p)
        except BadInput:
            return
        for b in ("rope", "block0", "x"):  # whatever a file says, a tolerance it gives is in range
            for dt in ("float32", "bfloat16", "int64"):
                t = tols.for_(b, dt)
                assert t.atol >= 0 and t.rtol >= 0 and math.isfinite(t.atol) and math.isfinite(t.rtol), t
                assert 0 <= t.max_mismatch <= 1, t
                assert t.min_cosine is None or 0 <= t.min_cosine <= 1, t

    prop()


BOUNDARY_KEYS = st.sampled_from(["tensors", "inputs", "layout", "mode", "meaning", "probes", "tolerance", "extra"])


@st.composite
def contract_files(draw) -> str:
    out = [f"model = {_toml_value(draw(st.sampled_from(['toy', 'plain', '', 'a b'])))}"]
    if draw(st.booleans()):
        out.append(f"inputs = {_toml_value({'grid': draw(TOML_VALUES)})}")
    for name in draw(st.lists(st.sampled_from(["embed", "hidden.{L}", "patches", "x..y", "b{L}{L}"]), min_size=1,
                              max_size=3, unique=True)):
        out.append(f"[boundaries.{json.dumps(name)}]")
        out.append('tensors = ["embed", "tok", "layers.{L}.out", "blk{L}"]'
                   if draw(st.booleans()) else f"tensors = {_toml_value(draw(TOML_VALUES))}")
        for key in draw(st.lists(BOUNDARY_KEYS, max_size=3, unique=True)):
            if key != "tensors":
                out.append(f"{key} = {_toml_value(draw(TOML_VALUES))}")
    return "\n".join(out) + "\n"


def test_contract_values(tmp_path):
    @SETTINGS
    @given(contract_files())
    def prop(text):
        _assert_clean("contract", text.encode(), tmp_path / "w")

    prop()


# ----------------------------------------------------------------------------- manifest, safetensors header

def test_manifest_values(tmp_path):
    base = json.loads(SEEDS["manifest"][0])

    @st.composite
    def manifests(draw):
        m = dict(base, tensors=[dict(t) for t in base["tensors"]])
        for _ in range(draw(st.integers(1, 3))):
            i = draw(st.integers(0, len(m["tensors"]) - 1))
            key = draw(st.sampled_from(["name", "boundary", "file", "key", "shape", "dtype", "sha256", "rank",
                                        "shard", "replicated", "partial"]))
            m["tensors"][i][key] = draw(JSON)
        if not draw(st.integers(0, 5)):  # a top-level field too, last (it may replace the tensor list)
            m[draw(st.sampled_from(["format", "version", "model", "run", "tensors"]))] = draw(JSON)
        return m

    @SETTINGS
    @given(manifests())
    def prop(m):
        _assert_clean("manifest", json.dumps(m).encode(), tmp_path / "w")

    prop()


def test_safetensors_header_values(tmp_path):
    @st.composite
    def files(draw):
        header = {}
        for k in draw(st.lists(st.text(max_size=4), min_size=1, max_size=3, unique=True)):
            header[k] = {"dtype": draw(st.sampled_from(["F32", "BF16", "I64", "U8", "F8_E4M3", "X"]) | JSON),
                         "shape": draw(st.lists(st.integers(-2, 2 ** 40), max_size=3) | JSON),
                         "data_offsets": draw(st.lists(st.integers(-1, 2 ** 40), min_size=2, max_size=2) | JSON)}
        if draw(st.booleans()):
            header["__metadata__"] = draw(JSON)
        raw = json.dumps(header).encode()
        return struct.pack("<Q", len(raw)) + raw + bytes(draw(st.integers(0, 64)))

    @SETTINGS
    @given(files())
    def prop(data):
        _assert_clean("safetensors", data, tmp_path / "w")

    prop()


def test_the_value_fuzz_trips_on_a_reader_that_crashes(tmp_path, monkeypatch):
    """The property is not vacuous: a reader that lets a wrong type through as a TypeError is a
    finding, and a valid config is not one."""
    import engine.deepseek_v41_flash.config as engine_config

    good = SEEDS["ds-config"][0]
    assert check("ds-config", good, tmp_path / "a") is None
    monkeypatch.setattr(engine_config, "_refusal", lambda key, annotation, value: None)  # no field checks
    found = check("ds-config", json.dumps({**json.loads(good), "vision_n_heads": "2"}).encode(), tmp_path / "b")
    assert found is not None and "TypeError" in found
