"""Which layers of the language backbone run: all of them, or a subset named like `0-2`, `0,2`
or `2-4,8` (the `layers` run option). The subset runs in layer order on the embeddings, then the
final norm and head, each layer exactly as it is in the whole model (its id decides its
compression ratio, sources and Engram table). Refused when a compressed layer would read the
compressed KV, index selection, index keys or candidate blocks of a layer left out."""
from __future__ import annotations

from tensordiff.errors import BadInput


def layer_ids(spec, args) -> tuple[int, ...]:
    if spec in (None, ""):
        return tuple(range(args.n_layers))
    ids: set[int] = set()
    for piece in str(spec).split(","):
        first, dash, last = piece.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise BadInput(f"layers {spec!r}: write layer ids and ranges such as 0-2 or 0,2")
        a, b = int(first), int(last) if dash else int(first)
        if a > b:
            raise BadInput(f"layers {spec!r}: the range {piece.strip()} runs backwards; write it low to high ({b}-{a})")
        if not a <= b < args.n_layers:
            raise BadInput(f"layers {spec!r}: {piece.strip()} is not inside 0-{args.n_layers - 1}")
        ids.update(range(a, b + 1))
    for layer in sorted(ids):
        for what, source in _reads(layer, args).items():
            if source not in ids:
                raise BadInput(f"layers {spec!r}: layer {layer} reads its {what} from layer {source}, "
                               "which the subset leaves out")
    return tuple(sorted(ids))


def _reads(layer: int, args) -> dict[str, int | None]:
    """What a compressed layer takes from the layers before it (itself included)."""
    if not args.compress_ratios[layer]:
        return {}
    last = lambda layers: max((k for k in layers if k <= layer), default=None)  # noqa: E731
    out = {"compressed KV": last(args.kv_source_layers)}
    index = last(args.index_source_layers)
    if index is not None:
        out["index selection"] = index
        owners = [k for k in args.index_source_layers if k in args.kv_source_layers and k <= index]
        out["index keys"] = max(owners, default=None)
        if 0 <= args.candidate_source_layer < index:
            out["candidate blocks"] = args.candidate_source_layer
    return out
