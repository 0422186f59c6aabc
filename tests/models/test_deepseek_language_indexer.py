"""The language indexer where the tiny default config does not go: fewer candidates than
`index_topk`, exact score ties, and decode steps whose index keys were published by a later layer.
Engine against oracle on small language-only checkpoints (fixed aligner rows, CPU, fp32: the
semantic language numerics, where the two routes agree to the index choices)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from tensordiff.pipeline.adapter import RunRequest
from tensordiff.format.capture import Recorder
from tensordiff.pipeline.compare import compare_dumps
from tensordiff.judge.contract import Contract
from tensordiff.format.dump import open_dump
import tensordiff.models.deepseek_v41_flash.contract as C
from tensordiff.cache import cache_root
from tensordiff.models.deepseek_v41_flash.synthetic_language import language_config, write_checkpoint

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
        from engine.deepseek_v41_flash.language_run import run
    req = RunRequest(weights="test", weights_dir=ckpt, prompt=PROMPT, decode=decode,
                     options={"image_rows": rows(), "cells": CELLS, "language_numerics": "semantic", **options})
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


# ---------------------------------------------------------------- decode index keys

@pytest.fixture(scope="module")
def decoded(module_tmp):
    """Six decode steps on the tiny config, both sides, both index-key rules."""
    root, ckpt = module_tmp("keys"), checkpoint()
    return {(side, mode): dump(side, ckpt, root / f"{side}-{mode}", decode=6, index_keys=mode)
            for side in ("oracle", "engine") for mode in ("official", "own")}


def test_the_prompt_is_one_where_the_index_key_rule_matters(decoded):
    """On a step where the ratio-2 owner (layer 2) completes no group, it reads layer 4's keys
    officially: the oracle's two rules part at a decode step, and only there."""
    report = compare_dumps(decoded["oracle", "official"], decoded["oracle", "own"], contract=CONTRACT)
    bad = mismatches(report)
    # the tokens a differing step chose (token.step.K, the argmax of the step before) part with it
    assert bad and all(name.startswith(("logits.step.", "token.step.")) for name, _ in bad), bad
    assert open_dump(decoded["oracle", "official"]).run["outputs"] != open_dump(decoded["oracle", "own"]).run["outputs"]


@pytest.mark.parametrize("mode", ["official", "own"])
def test_engine_follows_each_index_key_rule(decoded, mode):
    assert mismatches(compare_dumps(decoded["oracle", mode], decoded["engine", mode], contract=CONTRACT)) == []


def test_the_rules_are_stated_in_both_dumps(decoded):
    for (side, mode), path in decoded.items():
        assert open_dump(path).run["semantics"] == {"index_ties": "earlier", "index_keys": mode}, side


@pytest.mark.parametrize("side", ["oracle", "engine"])
def test_unknown_index_key_rule_is_bad_input(side, tmp_path):
    from tensordiff.errors import BadInput

    with pytest.raises(BadInput, match="index_keys"):
        dump(side, checkpoint(), tmp_path / "x", decode=1, index_keys="latest")


# ---------------------------------------------------------------- exact ties

def tied_checkpoint():
    """The tiny config with layer 2's indexer head weights zeroed: every index score of that
    layer is exactly 0, so which 4 of the visible groups are kept is decided by ties alone."""
    from safetensors.torch import load_file, save_file

    src = checkpoint()
    dst = cache_root() / f"{src.name}-tied"
    if not (dst / "model.safetensors.index.json").is_file():
        import shutil

        import tempfile

        # staged under a name unique to this process, then renamed: parallel test processes share
        # the cache, and the first rename wins (the loser's copy, the same bytes, is dropped)
        stage = Path(tempfile.mkdtemp(prefix=f".{dst.name}.tmp-", dir=dst.parent))
        tmp = stage / "ckpt"
        shutil.copytree(src, tmp)
        shard = next(tmp.glob("*.safetensors"))
        t = load_file(str(shard))
        t["layers.2.attn.indexer.weights_proj.weight"].zero_()
        save_file(t, str(shard))
        try:
            tmp.rename(dst)
        except OSError:
            if not (dst / "model.safetensors.index.json").is_file():
                raise
        shutil.rmtree(stage, ignore_errors=True)
    return dst


def test_exact_ties_keep_the_earliest_groups_on_both_sides(tmp_path):
    ckpt = tied_checkpoint()
    o = dump("oracle", ckpt, tmp_path / "oracle", decode=2)
    e = dump("engine", ckpt, tmp_path / "engine", decode=2, chunk=5)
    got = ids(o, "index.2.ids")
    topk = got.shape[1]
    seen = (torch.arange(got.shape[0]) + 1) // 2  # groups visible to each query (ratio 2)
    want = torch.full_like(got, -1)
    for p, n in enumerate(seen.tolist()):
        k = min(n, topk)
        want[p, :k] = torch.arange(k)  # the stated rule: the earliest visible groups
    assert torch.equal(got, want.sort(dim=-1).values)  # dumped ascending, -1 first
    assert mismatches(compare_dumps(o, e, contract=CONTRACT)) == []
