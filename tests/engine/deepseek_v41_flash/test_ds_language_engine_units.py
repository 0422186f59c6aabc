"""Engine language units: the generic MoE's dual-bias routing (hand-worked table and its two
faults), the Engram window carried across chunks, the DEAD image state."""
import math

import pytest
import torch

import engine.backend as backends
from engine.deepseek_v41_flash.config import Config
from engine.deepseek_v41_flash.engram import EngramHashState, EngramTables
from engine.deepseek_v41_flash.moe import ExpertBank, GateWeights, MoE
from engine.deepseek_v41_flash.tokens import compressed_token_map, tokenize
from engine.errors import EngineInputError
from tensordiff.models.deepseek_v41_flash.synthetic_language import language_config
import tensordiff.models.deepseek_v41_flash.faults as D

RAW = [0.60, 0.55, 0.50, 0.45]


def four_expert_moe(fault=None, dim=4, inter=3) -> MoE:
    logits = [math.log(math.expm1(s * s)) for s in RAW]  # sqrt(softplus(l)) == s
    gate = GateWeights(torch.diag(torch.tensor(logits)), torch.tensor([0.0, 0.10, 0.0, 0.0]),
                       torch.tensor([0.0, 0.0, 0.20, 0.0]))
    g = torch.Generator().manual_seed(0)
    bank = lambda e: ExpertBank(torch.randn(e, inter, dim, generator=g), torch.randn(e, inter, dim, generator=g),  # noqa: E731
                                torch.randn(e, dim, inter, generator=g))
    return MoE(gate, bank(4), bank(1), topk=2, route_scale=1.5, gate_temp=1.0, swiglu_limit=10.0,
               score_func="sqrtsoftplus", norm_topk_prob=True, backend=backends.get("torch"), fault=fault)


def routed(moe, image_rows):
    w, ids = moe.route(torch.ones(2, 4), image_rows)
    order = ids.sort(-1)
    return order.values.tolist(), w.gather(-1, order.indices)


def test_routing_table_text_and_image_rows_in_one_batch():
    ids, w = routed(four_expert_moe(), torch.tensor([False, True]))
    assert ids == [[0, 1], [0, 2]]
    torch.testing.assert_close(w[0], torch.tensor([0.60, 0.55]) / 1.15 * 1.5)
    torch.testing.assert_close(w[1], torch.tensor([0.60, 0.50]) / 1.10 * 1.5)  # 0.50, not 0.70


def test_text_only_interface_is_the_same_call():
    ids, _ = routed(four_expert_moe(), None)
    assert ids == [[0, 1], [0, 1]]


def test_fault_text_bias_for_images_changes_the_image_row_only():
    ids, _ = routed(four_expert_moe(D.ROUTER_TEXT_BIAS_FOR_IMAGES), torch.tensor([False, True]))
    assert ids == [[0, 1], [0, 1]]


def test_fault_biased_weights_uses_the_biased_scores():
    ids, w = routed(four_expert_moe(D.ROUTER_BIASED_WEIGHTS), torch.tensor([False, True]))
    assert ids == [[0, 1], [0, 2]]
    torch.testing.assert_close(w[1], torch.tensor([0.60, 0.70]) / 1.30 * 1.5)


def test_moe_output_mixes_chosen_experts_plus_shared():
    moe = four_expert_moe()
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(3))
    y, w, ids = moe(x, torch.tensor([False, True]))
    expect = torch.stack([sum(w[r, j] * _expert(moe.experts, int(ids[r, j]), x[r]) for j in range(2))
                          + _expert(moe.shared, 0, x[r]) for r in range(2)])
    torch.testing.assert_close(y, expect, atol=1e-5, rtol=1e-5)


def _expert(bank, e, x):
    gate = (bank.w1[e] @ x).clamp(max=10.0)
    up = (bank.w3[e] @ x).clamp(-10.0, 10.0)
    return bank.w2[e] @ (torch.nn.functional.silu(gate) * up)


def test_unsupported_router_is_refused():
    with pytest.raises(EngineInputError):
        MoE(None, None, None, topk=2, route_scale=1.0, gate_temp=1.0, swiglu_limit=0.0, score_func="softmax",
            norm_topk_prob=True, backend=None)


@pytest.fixture(scope="module")
def tables():
    cfg = Config(**{k: tuple(v) if isinstance(v, list) else v for k, v in language_config(64).items()})
    token_map, n = compressed_token_map(cfg.vocab_size)
    assert n == cfg.engram_compressed_vocab_size
    return EngramTables.build(cfg, token_map, n), cfg


@pytest.mark.parametrize("chunk", [1, 3, 7])
def test_engram_window_carries_across_chunks(tables, chunk):
    t, cfg = tables
    ids, types = tokenize("some text <image> and more text", cfg, (2, 2))
    image = types >= 0
    whole = EngramHashState(t).hash(ids, image)
    state = EngramHashState(t)
    parts = [state.hash(ids[i:i + chunk], image[i:i + chunk]) for i in range(0, ids.numel(), chunk)]
    torch.testing.assert_close(torch.cat(parts), whole)


def test_engram_dead_image_positions_stop_look_back(tables):
    t, cfg = tables
    ids, types = tokenize("ab <image> cd", cfg, (1, 2))
    image = types >= 0
    after = int(image.nonzero().max()) + 1
    out = EngramHashState(t).hash(ids, image)
    fresh = EngramHashState(t).hash(ids[after:after + 1], image[after:after + 1])
    torch.testing.assert_close(out[after], fresh[0])
    crossed = EngramHashState(t, fault=D.ENGRAM_NGRAM_ACROSS_IMAGE).hash(ids, image)
    assert not torch.equal(crossed[after], out[after])
    torch.testing.assert_close(crossed[:int(image.nonzero().min())], out[:int(image.nonzero().min())])


def test_tokenizer_refuses_two_images_and_a_tag_without_an_image(tables):
    _, cfg = tables
    with pytest.raises(EngineInputError):
        tokenize("<image> and <image>", cfg, (1, 1))
    with pytest.raises(EngineInputError):
        tokenize("look: <image>", cfg, None)


def test_fp4_grid_rounds_half_to_even_codes():
    from engine.deepseek_v41_flash.quant import e2m1

    v = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0, 0.26, 5.1, 6.0])
    assert e2m1(v).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -4.0, 0.5, 6.0, 6.0]


def test_fp8_quantisation_uses_power_of_two_block_scales():
    from engine.deepseek_v41_flash.quant import fp8, pow2_ceil

    assert pow2_ceil(torch.tensor([1.0, 1.5, 0.25, 0.3])).tolist() == [1.0, 2.0, 0.25, 0.5]
    x = torch.zeros(64)
    x[0], x[1], x[32] = 448.0, 1.0 + 2 ** -6, 3.0  # 1 + 2^-6 is between e4m3 neighbours 1 and 1.125
    y = fp8(x)
    assert y[0] == 448.0 and y[1] == 1.0 and y[32] == 3.0


def test_candidate_blocks_pin_the_newest_block_and_keep_the_best_other(tables):
    from engine.deepseek_v41_flash.attention import Attention

    _, cfg = tables
    attn = Attention.__new__(Attention)
    attn.cfg = cfg  # block 4, two blocks kept
    inf = float("inf")
    score = torch.tensor([[0.1, 0.9, 0.0, 0.2, 0.3, 0.1, 0.4, 0.2, 0.0, -inf],
                          [0.5, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf]])
    keep = attn._blocks(score, torch.tensor([9, 1]))
    assert keep[0].tolist() == [True] * 4 + [False] * 4 + [True] * 2
    assert keep[1].tolist() == [True] * 4 + [False] * 6


def test_index_ties_go_to_the_earlier_position():
    from engine.deepseek_v41_flash.attention import _best_first

    values, order = _best_first(torch.tensor([[-1.0, 0.0, 0.0, 0.5, 0.0, 0.0]]))
    assert order[0, :3].tolist() == [3, 1, 2]
