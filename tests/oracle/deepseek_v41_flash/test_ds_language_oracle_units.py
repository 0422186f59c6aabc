"""Oracle language units: the dual-bias gate's hand-worked table, Engram's DEAD image
positions, the Sinkhorn mix, the image-span overlay."""
import math

import pytest
import torch

from oracle.deepseek_v41_flash.config import ModelArgs
from oracle.deepseek_v41_flash.engram import EngramLayout, NgramHasher
from oracle.deepseek_v41_flash.model import Gate, hc_split_sinkhorn
from oracle.deepseek_v41_flash.tokens import build_prompt, compressed_token_map
from tensordiff.models.deepseek_v41_flash.synthetic_language import language_config


def logit_for(score: float) -> float:
    """The gate logit whose sqrt(softplus(.)) is `score`."""
    return math.log(math.expm1(score * score))


def four_expert_gate() -> Gate:
    args = ModelArgs(dim=4, n_routed_experts=4, n_activated_experts=2, route_scale=1.5)
    gate = Gate(args)
    raw = [0.60, 0.55, 0.50, 0.45]
    with torch.no_grad():
        gate.weight.copy_(torch.diag(torch.tensor([logit_for(s) for s in raw])))
        gate.bias.copy_(torch.tensor([0.0, 0.10, 0.0, 0.0]))
        gate.bias_vl.copy_(torch.tensor([0.0, 0.0, 0.20, 0.0]))
    return gate


def test_routing_table_text_and_image_rows():
    gate = four_expert_gate()
    x = torch.ones(2, 4)  # row 0 text, row 1 image
    weights, ids = gate(x, torch.tensor([False, True]))
    order = ids.sort(-1)
    assert order.values.tolist() == [[0, 1], [0, 2]]
    w = weights.gather(-1, order.indices)
    # weights from the UNBIASED scores: E2 weighs 0.50 (not 0.70), E1 0.55 (not 0.65)
    torch.testing.assert_close(w[0], torch.tensor([0.60, 0.55]) / 1.15 * 1.5)
    torch.testing.assert_close(w[1], torch.tensor([0.60, 0.50]) / 1.10 * 1.5)
    assert not torch.allclose(w[1], torch.tensor([0.60, 0.70]) / 1.30 * 1.5)


def test_routing_without_mask_uses_text_bias_everywhere():
    weights, ids = four_expert_gate()(torch.ones(2, 4), None)
    assert ids.sort(-1).values.tolist() == [[0, 1], [0, 1]]


def test_start_newline_end_rows_count_as_image():
    args = ModelArgs(**{k: v for k, v in language_config(64).items()})
    ids, types, (start,) = build_prompt("x <image> y", args, (2, 3))
    span = types[start:start + 10]
    assert span.tolist() == [0, 1, 1, 1, 2, 1, 1, 1, 2, 3]
    assert ((types >= 0).nonzero().flatten() == torch.arange(start, start + 10)).all()
    assert (ids[start:start + 10] == args.image_token_id).all()


@pytest.fixture(scope="module")
def hasher():
    args = ModelArgs(**language_config(64))
    token_map, n = compressed_token_map(args.vocab_size)
    assert n == args.engram_compressed_vocab_size
    return NgramHasher(EngramLayout.from_args(args), token_map, args.engram_pad_id, n), args


def test_engram_no_ngram_crosses_an_image(hasher):
    h, args = hasher
    ids, types, (start,) = build_prompt("ab <image> cd", args, (1, 2))
    mask = types < 0
    out = h(ids[None], mask[None])[0]  # [S, layers, cols]
    after = start + int((types >= 0).sum())  # first text position after the span
    # the first token after an image hashes as if it opened a sequence: look-back stops at DEAD
    fresh = h(ids[after:after + 1][None], None)[0, 0]
    torch.testing.assert_close(out[after], fresh)
    # without the DEAD state the same position would hash differently
    crossed = h(ids[None], None)[0]
    assert not torch.equal(crossed[after], out[after])
    # the text before the image is untouched by it
    torch.testing.assert_close(out[:start], crossed[:start])


def test_engram_folds_case_like_the_normaliser(hasher):
    h, args = hasher
    a, _, _ = build_prompt("Hello World", args, None)
    b, _, _ = build_prompt("hello\tworld", args, None)
    torch.testing.assert_close(h(a[None], None), h(b[None], None))


def test_hash_ids_stay_inside_each_layers_table(hasher):
    h, args = hasher
    ids = torch.randint(0, args.vocab_size, (1, 64), generator=torch.Generator().manual_seed(1))
    out = h(ids, None)[0]
    for k, rows in enumerate(args.engram_num_embeddings):
        assert int(out[:, k].min()) >= 0 and int(out[:, k].max()) < rows


def test_sinkhorn_comb_is_doubly_stochastic():
    g = torch.Generator().manual_seed(0)
    mixes = torch.randn(5, 24, generator=g)
    pre, post, comb = hc_split_sinkhorn(mixes, torch.ones(3), torch.zeros(24), 4, 20, 1e-6)
    torch.testing.assert_close(comb.sum(-2), torch.ones(5, 4), atol=1e-4, rtol=0)
    torch.testing.assert_close(comb.sum(-1), torch.ones(5, 4), atol=1e-3, rtol=0)
    assert (pre > 0).all() and (pre < 1 + 1e-5).all() and (post > 0).all() and (post < 2).all()


def test_candidate_blocks_pin_the_newest_block_and_keep_the_best_other():
    from oracle.deepseek_v41_flash.model import candidate_blocks

    inf = float("inf")
    score = torch.tensor([[0.1, 0.9, 0.0, 0.2, 0.3, 0.1, 0.4, 0.2, 0.0, -inf],   # 9 visible
                          [0.5, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf]])  # 1 visible
    keep = candidate_blocks(score, torch.tensor([[9], [1]]), topk_blocks=2, block=4)
    assert keep[0].tolist() == [True] * 4 + [False] * 4 + [True] * 2  # block 0 (0.9) + pinned block 2
    assert keep[1].tolist() == [True] * 4 + [False] * 6  # nothing else reachable: never kept


def test_blocked_sparse_attention_equals_one_softmax_with_a_sink():
    from oracle.deepseek_v41_flash.model import sparse_attention

    g = torch.Generator().manual_seed(4)
    q, kv = torch.randn(1, 3, 2, 8, generator=g), torch.randn(1, 200, 8, generator=g)
    sink = torch.tensor([0.5, -1.0])
    idx = torch.randint(0, 200, (1, 3, 150), generator=g)
    idx[0, 1, 70:] = -1  # a row with fewer positions, spanning two blocks
    idx[0, 2] = -1  # a row with nothing: zeros, not NaN
    out = sparse_attention(q, kv, sink, idx, 0.3)
    for r in range(2):
        sel = idx[0, r][idx[0, r] >= 0]
        s = (q[0, r] @ kv[0, sel].T) * 0.3  # [H, k]
        p = torch.softmax(torch.cat([s, sink.view(2, 1)], -1), -1)[:, :-1]
        torch.testing.assert_close(out[0, r], p @ kv[0, sel], atol=1e-5, rtol=1e-5)
    assert torch.equal(out[0, 2], torch.zeros(2, 8))


def test_index_ties_go_to_the_earlier_position():
    from oracle.deepseek_v41_flash.model import top_k_earliest

    score = torch.tensor([[-1.0, 0.0, 0.0, 0.5, 0.0, 0.0]])
    assert top_k_earliest(score, 3).indices.tolist() == [[3, 1, 2]]
