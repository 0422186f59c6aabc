"""Every boundary whose computation reads another boundary has that edge in its contract.

The language side is derived from the ORACLE's code structure (which layer's selection each
attention reads, which layer's candidate blocks an indexer keeps), built for the tiny and the
released configs; the vision side from what each runner computes from the preprocessing plan.
The faults that prove the edges: a resize bug names `plan` as its one root (both models), and a
wrong index choice names `index.L.ids`, with the attention of a later layer reading it a
consequence (test_deepseek_language_ties)."""
from __future__ import annotations

import pytest
import torch

from tensordiff.judge.contract import ancestors
import tensordiff.models.deepseek_v41_flash.contract as C
import tensordiff.models.deepseek_v41_flash.adapter as DS
import tensordiff.models.qwen3_vl.adapter as QW


def _args(which: str):
    from oracle.deepseek_v41_flash.config import ModelArgs
    from tensordiff.models.deepseek_v41_flash.synthetic import FULL
    from tensordiff.models.deepseek_v41_flash.synthetic_language import language_config

    if which == "full":
        return ModelArgs.from_dict({k: v for k, v in FULL.items() if k in ModelArgs.__dataclass_fields__})
    return ModelArgs.from_dict(language_config())


def oracle_reads(args) -> tuple[set[tuple[str, str]], dict[str, str]]:
    """(direct reads between boundaries, index source -> the stream its keys were computed from),
    from the oracle's attention modules: `SharedAttention.topk_idxs` is written by every index
    source and read by every attention with compressed KV; an indexer with `uses_candidates`
    keeps the candidate source's blocks; one that does not own keys reads the latest owner's."""
    from oracle.deepseek_v41_flash.model import Attention

    edges, keys_from = set(), {}
    last_index = last_keys = None
    for L in range(args.n_layers):
        with torch.device("meta"):
            a = Attention(L, args, torch.float32)
        if a.is_index_source:
            if a.indexer.owns_k:
                last_keys = L
            if a.indexer.uses_candidates:
                edges.add((f"index.{args.candidate_source_layer}.ids", f"index.{L}.ids"))
            keys_from[f"index.{L}.ids"] = "embeddings" if last_keys == 0 else f"hidden.{last_keys - 1}"
            last_index = L
        if a.ratio and last_index is not None:
            edges.add((f"index.{last_index}.ids", f"attn.{L}"))
        edges.add((f"router.{L}.ids", f"hidden.{L}"))  # MoE.forward runs the experts its gate chose
    return edges, keys_from


def present_names(args) -> list[str]:
    names = ["aligner", "embeddings"]
    for L in range(args.n_layers):
        if L in args.index_source_layers:
            names.append(f"index.{L}.ids")
        names += [f"attn.{L}", f"router.{L}.ids", f"router.{L}.weights", f"hidden.{L}"]
    return names + ["logits"]


@pytest.mark.parametrize("which", ["tiny", "full"])
def test_every_read_of_an_index_choice_is_an_edge(which):
    args = _args(which)
    bounds = C.language_boundaries(present_names(args))
    by = {b.name: b for b in bounds}
    edges, keys_from = oracle_reads(args)
    assert edges, "the config has compressed attention"
    missing = [(src, dst) for src, dst in sorted(edges) if src not in by[dst].inputs]
    assert not missing, f"reads with no contract edge: {missing}"
    for idx, stream in keys_from.items():  # the key owner's stream is upstream of every indexer using it
        assert stream in ancestors(bounds, idx) or stream == "embeddings", (idx, stream)


def test_a_layer_reading_another_layers_selection_has_that_edge():
    # tiny: layer 3 (ratio 2) attends to layer 2's choice; layer 5 keeps layer 4's candidate blocks
    args = _args("tiny")
    by = {b.name: b for b in C.language_boundaries(present_names(args))}
    assert "index.2.ids" in by["attn.3"].inputs and "index.4.ids" in by["index.5.ids"].inputs
    assert not any(i.startswith("index.") for i in by["attn.1"].inputs)  # a window-only layer reads none


# What each runner computes from the preprocessing plan (engine and oracle alike): the patches
# are cut on the planned canvas; RoPE tables, the position table and the M-RoPE ids are functions
# of the planned grid.
PLAN_READERS = {DS.NAME: ("patches", "rope"), QW.NAME: ("patches", "pos_embed", "rope", "positions")}


@pytest.mark.parametrize("adapter", [DS.ADAPTER, QW.ADAPTER], ids=lambda a: a.name)
def test_the_plan_feeds_every_boundary_computed_from_it(adapter):
    by = {b.name: b for b in adapter.contract.resolve([])}
    assert by["plan"].inputs == ()
    for name in PLAN_READERS[adapter.name]:
        assert "plan" in by[name].inputs, name
    # everything else is downstream of one of them: a plan bug has exactly one root
    for b in adapter.contract.resolve([]):
        if b.name != "plan":
            assert "plan" in ancestors(list(by.values()), b.name), b.name
