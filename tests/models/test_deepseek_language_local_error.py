"""Local error for the language backbone: each engine stage on the oracle's own tensors. The
clean engine's stages all match; each planted fault's stage is the origin. Semantic numerics
(fp32); the official bf16 mode's local error is in test_deepseek_language_quantised.py."""
import dataclasses

import pytest
import torch

from tensordiff.pipeline.adapter import ModelAdapter, RunRequest
from tensordiff.format.capture import Recorder
from tensordiff.pipeline.compare import compare_dumps
from tensordiff.judge.contract import Contract
from tensordiff.pipeline.local_error import local_error
import tensordiff.models.deepseek_v41_flash.contract as C
from tensordiff.models.deepseek_v41_flash.synthetic_language import tiny_language_checkpoint
from tensordiff.judge.tolerance import load
import tensordiff.models.deepseek_v41_flash.faults as D

# as the adapter builds it (tensordiff/models/deepseek_v41_flash/adapter.py): a generated token is derived from its logits
CONTRACT = Contract("deepseek-v4.1-flash", (), C.RULES, resolver=C.make_resolver(()), boundary_of=C.boundary_of,
                    scores_source=C.scores_source)


def _runners():
    from engine.deepseek_v41_flash.language_run import run as engine_run
    from oracle.deepseek_v41_flash.model import run as oracle_run

    return oracle_run, engine_run


@pytest.fixture(scope="module")
def base():
    rows = torch.randn(6, 64, generator=torch.Generator().manual_seed(7))
    return RunRequest(weights="synthetic:tiny-language", weights_dir=tiny_language_checkpoint(),
                      prompt="A picture: <image> What does it show?", decode=1,
                      options={"image_rows": rows, "cells": (2, 3), "language_numerics": "semantic"})


@pytest.fixture(scope="module")
def oracle_dump(base, module_tmp):
    path = module_tmp("lang-local") / "oracle"
    rec = Recorder(path, model="deepseek-v4.1-flash")
    _runners()[0](base, rec)
    return rec.close()


def _engine_run(base, oracle_dump, tmp_path, fault, chunk):
    """The engine's run of `base` with a fault and chunk, its report against the oracle's dump,
    and the adapter local error runs the stages through."""
    oracle_run, engine_run = _runners()
    req = dataclasses.replace(base, fault=fault, chunk=chunk)
    rec = Recorder(tmp_path / "engine", model="deepseek-v4.1-flash")
    engine_run(req, rec)
    report = compare_dumps(oracle_dump, rec.close(), contract=CONTRACT)
    adapter = ModelAdapter("deepseek-v4.1-flash", CONTRACT, D.LANGUAGE_FAULTS, oracle=lambda: oracle_run,
                           engine=lambda: engine_run)
    return req, report, adapter


@pytest.mark.parametrize("fault,chunk", [(None, 7), (D.ROUTER_TEXT_BIAS_FOR_IMAGES, None),
                                         (D.ROUTER_BIASED_WEIGHTS, None), (D.ENGRAM_NGRAM_ACROSS_IMAGE, 5)])
def test_local_origin(base, oracle_dump, tmp_path, fault, chunk):
    from engine.deepseek_v41_flash.language_stages import make_language_stages

    req, report, adapter = _engine_run(base, oracle_dump, tmp_path, fault, chunk)
    local = local_error(adapter, req, oracle_dump, report, load(None), tmp_path, make_stages=make_language_stages)
    want = None if fault is None else next(f.boundary for f in D.LANGUAGE_FAULTS if f.name == fault)
    assert local.origin == want, local.summary()
    stageless = {r.boundary for r in local.boundaries if r.status == "no-stage"}
    assert stageless == set()  # decode steps too: the engine's step on the teacher-forced cache
    # the generated token has no stage of its own: it is its logits' argmax, judged through them
    assert {r.boundary for r in local.boundaries if r.status == "derived"} == {"token.step.1"}


def _prefilled_per_layer(self):
    """The decode steps' caches as they were made before the chain served them: every layer's
    attention run again down the stack on the reference's streams."""
    state: dict = {}
    self._attention(self.last, False, state)
    return state["caches"], state["key_owner"]


@pytest.mark.parametrize("fault,chunk,own_indexer", [(None, 7, False), (D.ENGRAM_NGRAM_ACROSS_IMAGE, 5, False),
                                                     (None, 3, True)])
def test_one_pass_down_the_stack_is_the_per_layer_route_bit_for_bit(base, oracle_dump, tmp_path, monkeypatch,
                                                                    fault, chunk, own_indexer):
    """The stages' attention runs the layers once (`_Chain`), where it ran layers 0..L again for
    every L: every stage's output, index choices and scores included, is bit for bit the old
    route's, so every local verdict is too. The tiny model has KV sources of two ratios, three
    index sources and a candidate source, so the chain's cache snapshots and forcing are exercised.
    `own_indexer`: the engine's candidate source ranks by negated head weights, so its own candidate
    blocks are not the reference's and the reference's forced scores decide what the later layers
    may keep (the chain must force them as the old route does)."""
    import engine.deepseek_v41_flash.language_stages as S
    from engine.deepseek_v41_flash.attention import Attention

    if own_indexer:
        select = Attention._select

        def contrary(self, *a):
            if not self.candidate_source:
                return select(self, *a)
            w = self.w
            self.w = dataclasses.replace(w, i_weights=-w.i_weights)
            try:
                return select(self, *a)
            finally:
                self.w = w

        monkeypatch.setattr(Attention, "_select", contrary)
    from tensordiff.format.dump import open_dump

    req, report, adapter = _engine_run(base, oracle_dump, tmp_path, fault, chunk)
    ran = {"chain": 0}
    upto = S._Chain.upto

    def counted(self, L):
        ran["chain"] += 1
        return upto(self, L)

    monkeypatch.setattr(S._Chain, "upto", counted)
    copy = S._copy
    monkeypatch.setattr(S, "_copy", lambda c: (ran.__setitem__("steps", ran.get("steps", 0) + 1), copy(c))[1])
    new = local_error(adapter, req, oracle_dump, report, load(None), tmp_path / "new",
                      make_stages=S.make_language_stages)
    assert ran["chain"] > 0 and ran["steps"] > 0  # the new route is the one that ran, decode steps too
    # the old route: layers 0..L chunk by chunk for every L, and again for the decode steps' caches
    monkeypatch.setattr(S.TeacherForced, "attention", lambda self, L, own_choice=False: self._attention(L, own_choice))
    monkeypatch.setattr(S.TeacherForced, "_prefilled", _prefilled_per_layer)
    old = local_error(adapter, req, oracle_dump, report, load(None), tmp_path / "old",
                      make_stages=S.make_language_stages)

    def digests(d):
        return {e.name: (e.dtype.name, tuple(e.shape), e.sha256) for e in open_dump(d).entries}

    got, want = digests(tmp_path / "new" / "local"), digests(tmp_path / "old" / "local")
    assert any(n.startswith("index.") for n in want) and any(n.startswith("attn.") for n in want)
    print("NAMES", sorted(want)); assert got == want
    assert [(r.boundary, r.status, [t.metrics for t in r.tensors]) for r in new.boundaries] == \
           [(r.boundary, r.status, [t.metrics for t in r.tensors]) for r in old.boundaries]


@pytest.mark.parametrize("fault,numerics", [(None, "semantic"), (D.DECODE_ENGRAM_WINDOW_RESET, "semantic"),
                                            (None, "official")])
def test_decode_steps_on_the_chains_caches_are_the_old_route_bit_for_bit(base, module_tmp, tmp_path, monkeypatch,
                                                                        fault, numerics):
    """Two decode steps continue from the attention stages' chain (copies of its caches and the
    index-key owner the last chunk published), where the prefill ran again for them: each step,
    the one that continues the first included, is bit for bit the old route's. The official
    numerics' decode reads the index keys through the owner the prefill published."""
    import engine.deepseek_v41_flash.language_stages as S
    from tensordiff.format.dump import open_dump

    two = dataclasses.replace(base, decode=2, options={**base.options, "language_numerics": numerics})
    odir = module_tmp("lang-local-2") / f"oracle-{fault}-{numerics}"
    rec = Recorder(odir, model="deepseek-v4.1-flash")
    _runners()[0](two, rec)
    rec.close()
    req, report, adapter = _engine_run(two, odir, tmp_path, fault, 5)
    routes = {}
    for route in ("new", "old"):
        if route == "old":
            monkeypatch.setattr(S.TeacherForced, "_prefilled", _prefilled_per_layer)
        local_error(adapter, req, odir, report, load(None), tmp_path / route, make_stages=S.make_language_stages)
        routes[route] = {e.name: e.sha256 for e in open_dump(tmp_path / route / "local").entries}
    assert {"logits.step.1", "logits.step.2"} <= set(routes["new"]) and routes["new"] == routes["old"]
