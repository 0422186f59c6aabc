"""A generated token as a top-1 choice: the boundary both language contracts put between a
decode step's logits and the step it feeds.

Greedy decoding feeds step K the argmax of a logits row (the prompt's last row for K = 1, else
`logits.step.(K-1)`). Both sides record `token.step.K.ids` [1, 1] (the token fed) and
`token.step.K.scores` [1, vocab] (the row it is the argmax of), so a differing token is judged as
any top-k choice is (`tensordiff.judge.ties`): a near-tie (two tokens' logits within the rounding of a
right route; in bf16 an exact tie of the rounded logits, which argmax breaks to the lower id)
picks another token on a right route, and every later step is then fed something else. That flip
is benign, its cascade is judged by local error (the engine's decode stages run on the
reference's tokens); a token its own logits do not rank first, or logits that are wrong, is a
divergence of the choice.

No torch here: the core compare imports this without model code.
"""
from __future__ import annotations

import re

from tensordiff.judge.contract import Boundary, TensorRule

TOKEN = re.compile(r"^token\.step\.(\d+)(?:\.(ids|scores))?$")
RULES = (TensorRule("token.step.*.ids", "topk-sets"), TensorRule("token.step.*.scores", "scores"))


def scores_source(name: str) -> str | None:
    """The tensor a token's scores are a row of: `token.step.K.scores` is the last row of the
    logits that chose the token. Its verdict in a pass is that tensor's ("the logits pass their
    own rule"), not the scores' own (a floor-relative pass judges logits against their floor)."""
    m = TOKEN.match(name)
    if not m or m.group(2) != "scores":
        return None
    k = int(m.group(1))
    return "logits" if k == 1 else f"logits.step.{k - 1}"


def boundary_of(name: str) -> str | None:
    """`token.step.K.ids` / `.scores` -> `token.step.K`; None for any other name."""
    m = TOKEN.match(name)
    return f"token.step.{m.group(1)}" if m else None


def token_boundary(k: int, prev: str) -> Boundary:
    """The token fed to decode step `k`, chosen from `prev` (the logits row it is the argmax of)."""
    row = "prompt logits’ last row" if k == 1 else f"logits of step {k - 1}"
    return Boundary(f"token.step.{k}", (prev,), f"the token fed to decode step {k} [1, 1]: the argmax of the {row} "
                    "(token.step.K.scores, the row it ranked)", layout="plain")
