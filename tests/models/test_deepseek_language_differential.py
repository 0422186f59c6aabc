"""DeepSeek V4.1 Flash language backbone: engine against oracle, boundary by boundary.

A fixed random aligner output stands in for the vision tower (its own tests cover it), so the
prompt is text - image - text on the tiny language config (8 experts, top-2, Engram at layers 1
and 3, window 8, compressed KV with an indexer). The clean engine must match in one chunk, in
chunks that cut the image span, and over several decode steps; every language fault must be
named at its own boundary by the comparator. These run the semantic numerics (fp32, no kernel
rounding: `language_numerics=semantic`), where two fp32 routes agree to ~1e-6; the official
default (bf16 with the kernels' quantisation) is tested in test_deepseek_language_quantised.py.
"""
import pytest
import torch

from tensordiff.pipeline.adapter import RunRequest
from tensordiff.format.capture import Recorder
from tensordiff.pipeline.compare import compare_dumps
from tensordiff.judge.contract import Contract
import tensordiff.models.deepseek_v41_flash.contract as C
from tensordiff.models.deepseek_v41_flash.synthetic_language import tiny_language_checkpoint
import tensordiff.models.deepseek_v41_flash.faults as D

CELLS = (2, 3)
PROMPT = "A picture: <image> What does it show?"  # span starts at 12, length 10
DECODE = 3
CONTRACT = Contract("deepseek-v4.1-flash", (), C.RULES, resolver=C.make_resolver(()), boundary_of=C.boundary_of)


@pytest.fixture(scope="module")
def checkpoint():
    return tiny_language_checkpoint()


@pytest.fixture(scope="module")
def rows():
    return torch.randn(CELLS[0] * CELLS[1], 64, generator=torch.Generator().manual_seed(7))


def request(checkpoint, rows, **kw):
    return RunRequest(weights="synthetic:tiny-language", weights_dir=checkpoint, prompt=PROMPT, decode=DECODE,
                      options={"image_rows": rows, "cells": CELLS, "language_numerics": "semantic"}, **kw)


def dump(side, req, path):
    if side == "oracle":
        from oracle.deepseek_v41_flash.model import run
    else:
        from engine.deepseek_v41_flash.language_run import run
    rec = Recorder(path, model="deepseek-v4.1-flash", producer={"name": side, "side": side})
    run(req, rec)
    rec.close()
    return path


@pytest.fixture(scope="module")
def oracle_dump(checkpoint, rows, module_tmp):
    return dump("oracle", request(checkpoint, rows), module_tmp("lang") / "oracle")


@pytest.mark.parametrize("chunk", [None, 7])
def test_clean_engine_matches(oracle_dump, checkpoint, rows, tmp_path, chunk):
    eng = dump("engine", request(checkpoint, rows, chunk=chunk), tmp_path / "engine")
    report = compare_dumps(oracle_dump, eng, contract=CONTRACT)
    assert report.verdict == "match", [(b.name, b.status, b.reason) for b in report.boundaries if b.status != "match"]
    names = {b.name for b in report.boundaries}
    assert {"embeddings", "engram.1", "engram.3", "index.2.ids", "index.5.ids", "router.0.ids", "router.5.weights", "hidden.5", "logits",
            f"logits.step.{DECODE}"} <= names


@pytest.mark.parametrize("fault,chunk", [
    (D.ROUTER_TEXT_BIAS_FOR_IMAGES, None),
    (D.ROUTER_BIASED_WEIGHTS, None),
    (D.ENGRAM_NGRAM_ACROSS_IMAGE, None),
    (D.OVERLAY_CHUNK_SHIFT, 7),
    (D.DECODE_ENGRAM_WINDOW_RESET, 7),  # decode only: the prefill and step 1 match
])
def test_fault_is_localised(oracle_dump, checkpoint, rows, tmp_path, fault, chunk):
    eng = dump("engine", request(checkpoint, rows, chunk=chunk, fault=fault), tmp_path / "engine")
    report = compare_dumps(oracle_dump, eng, contract=CONTRACT)
    assert report.verdict == "diverged"
    want = next(f.boundary for f in D.LANGUAGE_FAULTS if f.name == fault)
    assert report.earliest == [want]  # the first MoE / Engram layer, not a later symptom


def test_overlay_fault_is_invisible_in_one_chunk(oracle_dump, checkpoint, rows, tmp_path):
    eng = dump("engine", request(checkpoint, rows, fault=D.OVERLAY_CHUNK_SHIFT), tmp_path / "engine")
    assert compare_dumps(oracle_dump, eng, contract=CONTRACT).verdict == "match"


def test_kernel_quantisation_matches_on_both_sides(checkpoint, rows, tmp_path):
    """The kernels' FP8 / FP4 activation round trips, switched on for both sides in the fp32
    semantic mode (on long prompts an isolated rounding flip between two fp32 routes is a false
    divergence, so the semantic mode leaves them off)."""
    import dataclasses

    req = dataclasses.replace(request(checkpoint, rows, chunk=7), decode=1,
                              options={"image_rows": rows, "cells": CELLS, "kernel_quant": True,
                                       "language_numerics": "semantic"})
    odir = dump("oracle", dataclasses.replace(req, chunk=None), tmp_path / "oracle")
    edir = dump("engine", req, tmp_path / "engine")
    report = compare_dumps(odir, edir, contract=CONTRACT)
    assert report.verdict == "match", [(b.name, b.reason) for b in report.boundaries if b.status != "match"]
    plain = dump("engine", dataclasses.replace(req, options={"image_rows": rows, "cells": CELLS,
                                                             "language_numerics": "semantic"}), tmp_path / "plain")
    assert compare_dumps(odir, plain, contract=CONTRACT).earliest == ["attn.0"]  # the switch is live
