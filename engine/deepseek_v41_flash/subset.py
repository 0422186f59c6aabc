"""A layer subset of the language backbone: `layers=0-2` (or `0,2`, `2-4,8`) runs only those
layers, in order, on the embeddings, then the final norm and head, at the checkpoint's real
dimensions; only their tensors are read. A subset must be closed under what its layers read
from earlier ones: the compressed KV source, the index source, the index-key owner and the
candidate source of every compressed layer in it.
"""
from __future__ import annotations

from engine.errors import EngineInputError


def _latest(sources, layer: int) -> int | None:
    """The last of `sources` at or before `layer` (what the stack hands down to it)."""
    before = [s for s in sources if s <= layer]
    return max(before) if before else None


def parse_layers(spec, cfg) -> tuple[int, ...]:
    """`spec` (None: every layer) -> ascending layer ids, or EngineInputError naming the problem."""
    n = cfg.n_layers
    if spec is None or spec == "":
        return tuple(range(n))
    out: set[int] = set()
    for part in str(spec).split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            a, b = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise EngineInputError(f"layers {spec!r}: expected ids and ranges like 0-2 or 0,2") from None
        if a > b >= 0:
            raise EngineInputError(f"layers {spec!r}: {part.strip()} counts down; a range goes up, as {b}-{a}")
        if a > b or a < 0 or b >= n:
            raise EngineInputError(f"layers {spec!r}: {part.strip()} is not a range inside 0-{n - 1}")
        out.update(range(a, b + 1))
    chosen = tuple(sorted(out))
    owners = [k for k in cfg.index_source_layers if k in cfg.kv_source_layers]
    for i in chosen:
        if not cfg.compress_ratios[i]:
            continue
        needs = {"compressed KV source": _latest(cfg.kv_source_layers, i)}
        if i in cfg.index_source_layers or _latest(cfg.index_source_layers, i) is not None:
            src = _latest(cfg.index_source_layers, i)
            needs["index source"] = src
            needs["index-key owner"] = _latest(owners, src) if src is not None else None
            if 0 <= cfg.candidate_source_layer < src:
                needs["candidate source"] = cfg.candidate_source_layer
        for what, k in needs.items():
            if k is None or k not in out:
                raise EngineInputError(f"layers {spec!r}: layer {i} reads its {what} from layer {k}, "
                                       "which the subset leaves out")
    return chosen
