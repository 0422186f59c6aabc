"""The language indexer where the tiny default config does not go: fewer candidates than
`index_topk`, exact score ties, and decode steps whose index keys were published by a later layer.
Engine against oracle on small language-only checkpoints (fixed aligner rows, CPU, fp32)."""
from __future__ import annotations

import hashlib
import json

import pytest
import torch

from tensordiff.adapter import RunRequest
from tensordiff.capture import Recorder
from tensordiff.compare import compare_dumps
from tensordiff.contract import Contract
from tensordiff.dump import open_dump
from tensordiff.models import deepseek_language_contract as C
from tensordiff.synthetic import cache_root
from tensordiff.synthetic.deepseek_v41_flash_language import language_config, write_checkpoint

CELLS = (2, 3)
PROMPT = "A picture: <image> What does it show? Tell me all about it, please."
CONTRACT = Contract("deepseek-v4.1-flash", (), C.RULES, resolver=C.make_resolver(()), boundary_of=C.boundary_of)


def checkpoint(**overrides):
    cfg = {**language_config(64), **overrides}
    key = hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:12]
    return write_checkpoint(cache_root() / f"test-ds-indexer-{key}", cfg)


def rows():
    return torch.randn(CELLS[0] * CELLS[1], 64, generator=torch.Generator().manual_seed(7))


def dump(side, ckpt, path, decode=0, **options):
    if side == "oracle":
        from oracle.deepseek_v41_flash.model import run
    else:
        from engine.deepseek_v41_flash.language.run import run
    req = RunRequest(weights="test", weights_dir=ckpt, prompt=PROMPT, decode=decode,
                     options={"image_rows": rows(), "cells": CELLS, **options})
    rec = Recorder(path, model="deepseek-v4.1-flash", producer={"name": side, "side": side})
    run(req, rec)
    rec.close()
    return path


def mismatches(report):
    return [(b.name, b.status) for b in report.boundaries if b.status != "match"]


def ids(path, name):
    return torch.from_numpy(open_dump(path).load(name).astype("int64"))


# ---------------------------------------------------------------- fewer candidates than index_topk

SHORT = dict(candidate_topk_blocks=1, candidate_block_size=4, index_topk=8)  # 1 block x 4 < 8


def test_config_reaches_picks_outside_the_candidate_blocks(tmp_path):
    """The oracle keeps visible non-candidate picks: some row of the candidate user (layer 5)
    keeps more groups than one block of candidates holds."""
    o = dump("oracle", checkpoint(**SHORT), tmp_path / "oracle")
    kept = (ids(o, "index.5.ids") >= 0).sum(-1)
    assert int(kept.max()) > SHORT["candidate_block_size"]


def test_engine_keeps_the_visible_non_candidate_picks(tmp_path):
    ckpt = checkpoint(**SHORT)
    o = dump("oracle", ckpt, tmp_path / "oracle")
    e = dump("engine", ckpt, tmp_path / "engine")
    assert mismatches(compare_dumps(o, e, contract=CONTRACT)) == []
