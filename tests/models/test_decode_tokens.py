"""tensordiff/models/decode_tokens.py: the token fed to each decode step is a top-1 choice in both
language contracts. A bf16 engine whose logits round two tokens to one value picks the lower id
where the fp32 oracle picks the other (seen: Qwen3-VL, synthetic:tiny, the astronaut photograph
at 160 px, step 2 fed 15818 against 129894, margin 0.029): that flip is benign and the steps after
it a cascade; a token its own logits do not rank first is named at the token."""
from __future__ import annotations

import pytest
from token_dumps import token_dumps

from tensordiff.pipeline import registry
from tensordiff.pipeline.compare import three_way
from tensordiff.models import decode_tokens

MODELS = ["deepseek-v4.1-flash", "qwen3-vl"]


def dumps(tmp_path, model: str, cand_token=None):
    """Reference, floor run and candidate (`token_dumps`): the reference leads token 5 over 9 by
    0.02, the floor run errs by 0.05, the candidate leads 9 over 5 by 0.01 and feeds `cand_token`
    (its argmax by default): its step 1 is another token's logits entirely."""
    return token_dumps(tmp_path, 0.01, cand_token=cand_token, model=model)


def contract(model: str):
    return registry.adapter(model).contract


@pytest.mark.parametrize("model", MODELS)
def test_the_token_sits_between_the_logits_it_was_chosen_from_and_the_step_it_feeds(model):
    c = contract(model)
    names = ["logits", "token.step.1.ids", "token.step.1.scores", "logits.step.1", "token.step.2.ids",
             "token.step.2.scores", "logits.step.2"]
    by = {b.name: b for b in c.resolver(sorted({c.boundary_of(n) for n in names}))}
    assert by["token.step.1"].inputs == ("logits",) and by["token.step.2"].inputs == ("logits.step.1",)
    assert by["logits.step.2"].inputs[0] == "token.step.2"
    assert c.boundary_of("token.step.2.scores") == "token.step.2" == c.boundary_of("token.step.2.ids")
    assert c.scores_source("token.step.1.scores") == "logits"
    assert c.scores_source("token.step.2.scores") == "logits.step.1"
    assert c.scores_source("token.step.2.ids") is None and decode_tokens.boundary_of("logits.step.2") is None


@pytest.mark.parametrize("model", MODELS)
def test_a_near_tie_token_flip_is_benign_and_the_step_after_it_a_cascade(tmp_path, model):
    rep = three_way(*dumps(tmp_path, model), contract=contract(model))
    assert rep.boundary("token.step.1").status == "benign", str(rep)
    assert rep.boundary("logits.step.1").status == "cascade" and rep.verdict == "match", str(rep)


@pytest.mark.parametrize("model", MODELS)
def test_a_token_the_logits_do_not_rank_first_is_named_at_the_token(tmp_path, model):
    rep = three_way(*dumps(tmp_path, model, cand_token=6), contract=contract(model))
    assert rep.earliest == ["token.step.1"], str(rep)
    assert rep.boundary("logits.step.1").status == "consequent", str(rep)


@pytest.mark.parametrize("model", MODELS)
def test_without_the_token_rule_the_flip_is_a_divergence(tmp_path, model):
    """The planted fault that proves the rule: the same dumps under a contract without it
    (Qwen3-VL's before this module) diverge at the step the flipped token fed."""
    import dataclasses

    c = contract(model)
    bare = dataclasses.replace(c, rules=tuple(r for r in c.rules if not r.pattern.startswith("token.step")),
                               scores_source=None)
    rep = three_way(*dumps(tmp_path, model), contract=bare)
    assert rep.verdict == "diverged", str(rep)
