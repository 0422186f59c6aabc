"""DeepSeek V4.1 Flash language boundaries: a per-layer DAG, built from the names a run dumped.

    aligner ─> embeddings ─> [engram.L] ─> [index.L.ids] ─> attn.L ─> router.L.ids ─> router.L.weights ─> hidden.L ─> ...
                                                                           ... hidden.(n-1) ─> logits ─> token.step.1 ─> logits.step.1 ─> ...

Every tensor is its own boundary except `engram.L.gate` (boundary `engram.L`), so the report
names the earliest divergent layer AND stage: a wrong bias choice roots at `router.L.ids`, wrong
mixture weights at `router.L.weights`, a wrong n-gram at `engram.L`. Router ids are dumped sorted
ascending per row with the weights aligned to them, and compared as sets per row.

No torch here: the core compare imports this without model code.
"""
from __future__ import annotations

import re
from typing import Sequence

from tensordiff.judge.contract import Boundary, TensorRule
from tensordiff.models import decode_tokens
from tensordiff.models.decode_tokens import scores_source  # noqa: F401 - the contract's `scores_source`

# Both top-k choices are dumped with the key they ranked (`router.L.scores`: the biased router
# scores [S, experts]; `index.L.scores`: the indexer's scores [S, groups], -inf where a group is not
# eligible). A row whose set differs is then judged by the reference's own margin (tensordiff.judge.ties):
# repeated image content makes near-ties (seen: 0.23574823 vs 0.23574818, 2e-7 relative) that
# summation order decides, and those flips are benign; every other difference is a divergence of
# the choice. No fraction of rows is allowed to differ blindly.
# A generated token is a top-1 choice too: `token.step.K.ids` [1, 1] is the token fed to decode
# step K, `token.step.K.scores` [1, vocab] the logits row it is the argmax of (the prompt's last
# row for K = 1, else `logits.step.(K-1)`), recorded by both sides. A near-tie there (two tokens'
# logits within the floor run's error) picks another token on a right route, and every later
# step is fed something else: that flip is benign and its cascade is judged by local error.
RULES = (TensorRule("router.*.ids", "topk-sets"), TensorRule("index.*.ids", "topk-sets"),
         TensorRule("router.*.scores", "scores"), TensorRule("index.*.scores", "scores")) + decode_tokens.RULES
# The fp32 logits are a 4096-term reduction (final norm . head): their absolute error is in units
# of the logits' RMS, as for Qwen3-VL (`tensordiff.judge.tolerance`, `atol_scale`). With the synthetic
# head (std 1/sqrt(dim)) that RMS is ~1 (H200, tiny: 1.007, error 2.0e-6 of it, max|d| 2.6e-5),
# where max(1, RMS) leaves atol as it was; a checkpoint's larger logits get the scaled atol.
TOLERANCES: dict = {"logits": {"float32": {"atol_scale": "rms"}}, "logits.step.*": {"float32": {"atol_scale": "rms"}}}

_LAYERED = re.compile(r"^(engram|index|attn|router|hidden)\.(\d+)(?:\.(ids|weights|gate|scores))?$")
_STEP = re.compile(r"^logits\.step\.(\d+)$")


def boundary_of(name: str) -> str:
    """Tensor name -> boundary: `engram.3.gate` -> `engram.3`; every other name is its own."""
    m = _LAYERED.match(name)
    if m and m.group(1) == "engram":
        return f"engram.{m.group(2)}"
    if m and m.group(3) == "scores":  # the key behind a choice belongs to the choice
        return f"{m.group(1)}.{m.group(2)}.ids"
    token = decode_tokens.boundary_of(name)
    if token:
        return token
    if "." not in name:
        return name
    if m or _STEP.match(name):
        return name
    return name.split(".", 1)[0]  # the vision side's rule (rope.cos -> rope)


def language_boundaries(present: Sequence[str], upstream: str | Sequence[str] | None = "aligner") -> tuple[Boundary, ...]:
    """The language part of the DAG for the boundaries present; `upstream` (one name or several)
    feeds `embeddings`: the aligner of every image when a vision path ran."""
    layers: set[int] = set()
    steps: set[int] = set()
    names = set(present)
    for n in names:
        m = _LAYERED.match(n)
        if m:
            layers.add(int(m.group(2)))
        s = _STEP.match(n) or decode_tokens.TOKEN.match(n)
        if s:
            steps.add(int(s.group(1)))
    out: list[Boundary] = []
    if "embeddings" in names or layers:
        # every image's aligner feeds the embeddings (`tensordiff.format.images`: image.K.aligner, K >= 1)
        ups = tuple(u for u in ((upstream,) if isinstance(upstream, str) else upstream or ()) if u in names)
        out.append(Boundary("embeddings", ups, "token embeddings after the image-span overlay [S, dim]: START/END/"
                            "NEWLINE learned rows, IMAGE rows = aligner rows in reading order", layout="tokens"))
    prev = "embeddings"
    index_sources = sorted(L for L in layers if f"index.{L}.ids" in names)
    for L in sorted(layers):
        # every stage also reads the residual stream itself (the Engram gate and the attention
        # output do not capture it), so each lists the previous layer's stream as an input
        stream = (prev,)
        first = prev
        if f"engram.{L}" in names:
            out.append(Boundary(f"engram.{L}", stream, f"Engram gate of layer {L} [S, hc_mult]: sigmoid(signed "
                                "sqrt of the normalised stream·key dot), 0 on image rows", layout="tokens"))
            first = f"engram.{L}"
        attn_in = (first,) if first == prev else (first, prev)
        earlier = [S for S in index_sources if S < L]
        if f"index.{L}.ids" in names:
            # an index source may keep only the candidate source's blocks and read an earlier
            # layer's index keys: every earlier choice is an input (the candidate source is not
            # told apart by name, and a missing edge names a wrong root where an extra one cannot)
            out.append(Boundary(f"index.{L}.ids", tuple(f"index.{S}.ids" for S in earlier) + attn_in,
                                f"compressed groups each query keeps at layer {L} [S, index_topk], ascending, -1 "
                                "padded: the indexer's top-k (ties to the earlier group), within the candidate "
                                "blocks where a candidate source runs; index.L.scores is the key it ranked",
                                layout="tokens"))
        # attention reads the selection of the latest index source at or above it (its own, or
        # one it shares down the stack)
        source = max((S for S in index_sources if S <= L), default=None)
        idx_in = (f"index.{source}.ids",) if source is not None else ()
        out.append(Boundary(f"attn.{L}", idx_in + attn_in, f"attention output of layer {L} [S, dim] (window + compressed "
                            "KV, before the hyper-connection expand)", layout="tokens"))
        out.append(Boundary(f"router.{L}.ids", (f"attn.{L}",) + attn_in, f"experts chosen per row at layer {L} "
                            "[S, top-k], ascending; image-span rows ranked with bias_vl, text rows with bias; "
                            "router.L.scores is the biased key it ranked [S, experts]", layout="tokens"))
        out.append(Boundary(f"router.{L}.weights", (f"router.{L}.ids", f"attn.{L}") + attn_in,
                            f"mixture weights at layer {L} [S, top-k] aligned to the ascending ids: unbiased "
                            "scores, normalised, times route_scale", layout="tokens"))
        out.append(Boundary(f"hidden.{L}", (f"router.{L}.ids", f"router.{L}.weights", f"attn.{L}") + attn_in,
                            f"residual stream after block {L} [S, hc_mult, dim]", layout="tokens"))
        prev = f"hidden.{L}"
    if "logits" in names:
        out.append(Boundary("logits", (prev,), "LM head logits for every prompt position [S, vocab] fp32",
                            layout="tokens"))
        prev = "logits"
    for k in sorted(steps):
        token = f"token.step.{k}"
        if token in names:
            out.append(decode_tokens.token_boundary(k, prev))
        if f"logits.step.{k}" in names:
            out.append(Boundary(f"logits.step.{k}", ((token,) if token in names else ()) + (prev,),
                                f"logits after feeding generated token {k} [1, vocab] "
                                "(engine: KV cache; oracle: full recomputation)", layout="tokens"))
            prev = f"logits.step.{k}"
    return tuple(out)


def make_resolver(base: tuple[Boundary, ...], upstream: str | None = "aligner"):
    """A `Contract.resolver`: the fixed `base` boundaries (the vision path), then the language
    boundaries of this run."""
    def resolve(present: Sequence[str]) -> tuple[Boundary, ...]:
        return tuple(base) + language_boundaries(present, upstream if any(b.name == upstream for b in base) else None)

    return resolve
