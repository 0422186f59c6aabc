"""The language layer is written once: the teacher-forced local-error stages, fed the engine's OWN
tensors, give back the engine's prefill tensors bit for bit (a stage with a copy of the layer that
drifted from prefill's would not); a planted fault in the stages' engine breaks exactly that."""
import dataclasses

import pytest
import torch

from engine.deepseek_v41_flash.layer import LayerOut, index_ids
from engine.deepseek_v41_flash.language_run import run as engine_run
from engine.deepseek_v41_flash.language_stages import make_language_stages
from tensordiff.pipeline.adapter import RunRequest
from tensordiff.format.capture import MemoryRecorder
import tensordiff.models.deepseek_v41_flash.faults as D
from tensordiff.models.deepseek_v41_flash.synthetic_language import tiny_language_checkpoint


@pytest.fixture(scope="module")
def req():
    rows = torch.randn(6, 64, generator=torch.Generator().manual_seed(3))
    return RunRequest(weights="synthetic:tiny-language", weights_dir=tiny_language_checkpoint(),
                      prompt="A picture: <image> What does it show?", options={"image_rows": rows, "cells": (2, 3)})


@pytest.fixture(scope="module")
def prefill(req):
    rec = MemoryRecorder()
    engine_run(req, rec)
    return rec


def test_stages_on_the_engines_own_tensors_reproduce_prefill(req, prefill, stages_on_own_tensors):
    out = stages_on_own_tensors(make_language_stages, req, prefill)
    names = {k for k in out if not k.startswith("logits.step")}
    assert {"embeddings", "logits", "index.2.ids", "index.5.ids", "engram.1.gate", "router.2.weights", "hidden.5"} <= names
    for name in sorted(names):
        assert torch.equal(out[name], prefill.tensors[name]), name


def test_a_planted_router_fault_in_the_stages_breaks_the_match(req, prefill, stages_on_own_tensors):
    out = stages_on_own_tensors(make_language_stages, dataclasses.replace(req, fault=D.ROUTER_BIASED_WEIGHTS), prefill)
    differs = sorted(k for k in out if not torch.equal(out[k], prefill.tensors[k]))
    assert differs and all(k.startswith(("router.", "hidden.", "logits")) for k in differs), differs
    assert any(k.endswith(".weights") for k in differs)


def test_index_ids_pad_short_rows_and_sort():
    sel = torch.tensor([[5, 2], [-1, 7]])
    assert index_ids(sel, 4).tolist() == [[-1, -1, 2, 5], [-1, -1, -1, 7]]


def test_router_boundary_is_ascending_with_weights_aligned():
    ids = torch.tensor([[3, 0, 2]])
    w = torch.tensor([[0.5, 0.3, 0.2]])
    o = LayerOut(None, torch.zeros(1, 2), torch.zeros(1, 1, 2), torch.zeros(1, 1), w, ids)
    assert o.router_ids.tolist() == [[0, 2, 3]]
    assert o.router_weights[0].tolist() == pytest.approx([0.3, 0.2, 0.5])


def test_the_manifest_names_the_language_route(prefill):
    sp = prefill.run["speed_path"]
    assert sp["language"] == {"ran": "eager", "attention": "einsum"} and sp["fallbacks"] == []
