"""DeepSeek V4.1 Flash's options reach both runners typed. The language numerics follow the dtype:
in bf16 the official numerics (the whole model in bf16, the kernels' rounding on), so `-o
kernel_quant=on` is the default bf16 run tensor for tensor; in float32 the semantic mode (no
rounding), so `-o kernel_quant=false` (a string "false" read as a bool would be ON) and an
explicit `-o language_numerics=semantic` are that run, and `kernel_quant=true` really changes the
dump there, so the equalities below could fail."""
from __future__ import annotations

import dataclasses

import pytest

from tensordiff.format.dump import open_dump
from tensordiff.pipeline.runs import make_request, run_side

MODEL = "deepseek-v4.1-flash"
PROMPT = "Describe <image> briefly."


def digests(path) -> dict[str, str]:
    d = open_dump(path)
    return {e.name: e.sha256 for e in d.entries}


@pytest.fixture(scope="module", params=["engine", "oracle"])
def dumps(request, module_tmp):
    side = request.param
    tmp = module_tmp(f"ds-options-{side}")
    out = {}
    sem = "language_numerics=semantic"
    for label, extra, dtype in (("official", (), "bfloat16"), ("official-true", ("kernel_quant=true",), "bfloat16"),
                                ("default", (), "float32"), ("semantic", (sem,), "float32"),
                                ("false", (sem, "kernel_quant=false"), "float32"),
                                ("true", (sem, "kernel_quant=true"), "float32")):
        ad, req = make_request(MODEL, weights="synthetic:tiny", prompt=PROMPT, extra=extra, dtype=dtype)
        out[label] = digests(run_side(ad, side, req, tmp / label))
    # a hand-built request still holding the user's string: the runner types it the same way
    raw = dataclasses.replace(req, options={**req.options, "kernel_quant": "false", "language_numerics": "semantic"})
    out["raw-false"] = digests(run_side(ad, side, raw, tmp / "raw-false"))
    return side, out


def test_kernel_quant_false_is_the_default_dump(dumps):
    side, d = dumps
    assert d["false"] == d["default"] == d["semantic"] == d["raw-false"], side
    assert d["official-true"] == d["official"], side
    assert all(d["default"].values())  # every tensor carries a digest: the equality compares content


def test_kernel_quant_true_changes_the_language_boundaries(dumps):
    side, d = dumps
    changed = {n for n in d["default"] if d["true"].get(n) != d["default"][n]}
    assert changed and all(not n.startswith(("patches", "rope", "block0", "final_norm", "aligner")) for n in changed)
    assert any(n.startswith("attn.") for n in changed), (side, sorted(changed))
