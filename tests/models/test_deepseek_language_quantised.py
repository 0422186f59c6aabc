"""DeepSeek V4.1 Flash language backbone on a checkpoint stored as the release stores it
(`synthetic:tiny-fp8`: FP8 dense layers and Engram table with their block scales, FP4 routed
experts), engine against oracle.

Semantic numerics (fp32, exact dequantised weights) must match boundary for boundary. Official
numerics (the default: bf16 with the kernels' quantisation) are compared the way bf16 runs are:
two correct bf16 routes drift by rounding (the first difference is one element of `hidden.0`,
one bf16 ulp, from another summation order), and FP4 rounding of the indexer's q / k turns such
ulps into a few different picks by layer 5 on this random model; so every engine stage is checked
on the oracle's own inputs (local error), and the first four layers end to end. Every planted
checkpoint-reading fault is named at its boundary in both modes, and a missing scale is exit 2.
"""
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

from tensordiff.pipeline.adapter import ModelAdapter, RunRequest
from tensordiff.format.capture import Recorder
from tensordiff.pipeline.compare import compare_dumps
from tensordiff.judge.contract import Contract
import tensordiff.models.deepseek_v41_flash.faults as D
import tensordiff.models.deepseek_v41_flash.contract as C
from tensordiff.models.deepseek_v41_flash.synthetic_language import tiny_language_checkpoint

CELLS = (2, 3)
PROMPT = "A picture: <image> What does it show?"
CONTRACT = Contract("deepseek-v4.1-flash", (), C.RULES, resolver=C.make_resolver(()), boundary_of=C.boundary_of,
                    tolerances=C.TOLERANCES)
QUANT_FAULTS = (D.FP8_SCALE_IGNORED, D.FP8_SCALE_TRANSPOSED, D.FP4_NIBBLES_SWAPPED, D.ENGRAM_SCALE_IGNORED)


def _runners():
    from engine.deepseek_v41_flash.language_run import run as engine_run
    from oracle.deepseek_v41_flash.model import run as oracle_run

    return oracle_run, engine_run


@pytest.fixture(scope="module")
def rows():
    return torch.randn(CELLS[0] * CELLS[1], 64, generator=torch.Generator().manual_seed(7))


def request(rows, numerics=None, **kw):
    opts = {"image_rows": rows, "cells": CELLS}
    if numerics:
        opts["language_numerics"] = numerics
    return RunRequest(weights="synthetic:tiny-fp8-language", weights_dir=tiny_language_checkpoint(quantised=True),
                      prompt=PROMPT, decode=2, options=opts, **kw)


def dump(side, req, path):
    rec = Recorder(path, model="deepseek-v4.1-flash", producer={"name": side, "side": side})
    _runners()[0 if side == "oracle" else 1](req, rec)
    return rec.close()


@pytest.fixture(scope="module")
def oracles(rows, module_tmp):
    base = module_tmp("quant")
    return {m: dump("oracle", request(rows, m), base / m) for m in ("official", "semantic")}


@pytest.mark.parametrize("chunk", [None, 7])
def test_semantic_engine_matches_on_the_quantised_layout(oracles, rows, tmp_path, chunk):
    eng = dump("engine", request(rows, "semantic", chunk=chunk), tmp_path / "engine")
    report = compare_dumps(oracles["semantic"], eng, contract=CONTRACT)
    assert report.verdict == "match", [(b.name, b.reason) for b in report.boundaries if b.status != "match"]
    assert {"attn.0", "engram.1", "index.2.ids", "router.5.weights", "logits.step.2"} <= {b.name for b in report.boundaries}


def test_official_numerics_are_the_default_and_recorded(oracles, rows, tmp_path):
    eng = dump("engine", request(rows), tmp_path / "engine")
    for d in (oracles["official"], eng):
        run = json.loads((d / "manifest.json").read_text())["run"]
        assert run["language_numerics"] == {"mode": "official", "dtype": "bfloat16", "kernel_quant": True}
        assert run["boundary_dtypes"]["attn.*"] == "bfloat16"
    # and the two modes differ from the first FP8 GEMM on (the switch is live)
    assert compare_dumps(oracles["semantic"], oracles["official"], contract=CONTRACT).earliest == ["attn.0"]


def test_official_engine_stages_match_on_the_oracles_inputs(oracles, rows, tmp_path):
    from engine.deepseek_v41_flash.language_stages import make_language_stages
    from tensordiff.pipeline.local_error import local_error
    from tensordiff.judge.tolerance import load

    oracle_run, engine_run = _runners()
    req = request(rows, chunk=7)
    eng = dump("engine", req, tmp_path / "engine")
    report = compare_dumps(oracles["official"], eng, contract=CONTRACT)
    layer = [re.match(r"^(engram|index|attn|router|hidden)\.(\d+)", b.name) for b in report.boundaries]
    early = [b for b, m in zip(report.boundaries, layer) if m and int(m.group(2)) < 4]
    assert len(early) > 12 and all(b.status == "match" for b in early), [(b.name, b.reason) for b in early]
    adapter = ModelAdapter("deepseek-v4.1-flash", CONTRACT, D.LANGUAGE_FAULTS, oracle=lambda: oracle_run,
                           engine=lambda: engine_run)
    local = local_error(adapter, req, oracles["official"], report, load(None), tmp_path,
                        make_stages=make_language_stages)
    assert local.origin is None, local.summary()


@pytest.mark.parametrize("numerics", ["official", "semantic"])
@pytest.mark.parametrize("fault", QUANT_FAULTS)
def test_checkpoint_reading_faults_are_named(oracles, rows, tmp_path, fault, numerics):
    eng = dump("engine", request(rows, numerics, fault=fault), tmp_path / "engine")
    want = next(f.boundary for f in D.LANGUAGE_FAULTS if f.name == fault)
    assert compare_dumps(oracles[numerics], eng, contract=CONTRACT).earliest == [want]


def test_quant_faults_are_invisible_on_a_bf16_checkpoint(rows, tmp_path):
    """The bf16 layout has no scale to misread: the faults need a quantised checkpoint."""
    req = dataclasses.replace(request(rows, "semantic"), weights_dir=tiny_language_checkpoint(), decode=0)
    odir = dump("oracle", req, tmp_path / "oracle")
    eng = dump("engine", dataclasses.replace(req, fault=D.FP8_SCALE_IGNORED), tmp_path / "engine")
    assert compare_dumps(odir, eng, contract=CONTRACT).verdict == "match"


def test_missing_scale_is_exit_2_on_both_sides(tmp_path):
    from tensordiff.models.deepseek_v41_flash.synthetic import resolve

    src = resolve("synthetic:tiny-fp8")
    ckpt = tmp_path / "ckpt"
    shutil.copytree(src, ckpt)
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    del index["weight_map"]["layers.0.ffn.experts.3.w2.scale"]
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    for side in ("oracle", "engine"):
        p = subprocess.run([sys.executable, "-m", "tensordiff.commands.cli", "dump", "deepseek-v4.1-flash", "--side", side,
                            "--out", str(tmp_path / side), "--weights", str(ckpt), "--prompt", "Look: <image> now"],
                           capture_output=True, text=True, env=env, timeout=300)
        assert p.returncode == 2, (side, p.stderr[-2000:])
        assert "layers.0.ffn.experts.3.w2.scale" in p.stderr and "Traceback" not in p.stderr
        assert len(p.stderr.strip().splitlines()) == 1
        assert not (tmp_path / side).exists()


@pytest.mark.parametrize("side", ["oracle", "engine"])
def test_unknown_numerics_is_bad_input(rows, tmp_path, side):
    from tensordiff.errors import BadInput

    with pytest.raises(BadInput, match="language_numerics"):
        dump(side, request(rows, "fp16ish"), tmp_path / side)
    assert not (tmp_path / side).exists()


def test_kernel_quant_overrides_the_official_rounding(oracles, rows, tmp_path):
    """`kernel_quant=False` in the official mode: bf16, no rounding; not the default's numbers."""
    req = request(rows)
    req = dataclasses.replace(req, options={**req.options, "kernel_quant": False}, decode=0)
    odir = dump("oracle", req, tmp_path / "oracle")
    run = json.loads((odir / "manifest.json").read_text())["run"]
    assert run["language_numerics"] == {"mode": "official", "dtype": "bfloat16", "kernel_quant": False}
    assert compare_dumps(oracles["official"], odir, contract=CONTRACT).earliest == ["attn.0"]
